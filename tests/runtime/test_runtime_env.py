"""The environment the runtime reads on every rank: a value it cannot use is named with the
variable and the value as set (escaped), never called "not set", never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.rundir.heartbeatrecord import MAX_INTERVAL_S
from launcher.rundir.rankcontext import RuntimeConfigError, context, node_name
from launcher.runtime import heartbeats
from launcher.runtime.distributed import export_rendezvous_env

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("single_rank_env")

BAD = [
    ("RANK", "abc", "not an integer"),
    ("RANK", "\u0663", "not an integer"),             # an Arabic-Indic three: int() takes it, the shell does not
    ("RANK", "1_0", "not an integer"),
    ("WORLD_SIZE", "0", "must be >= 1"),
    ("WORLD_SIZE", str(2**40), "must be <= "),
    ("LOCAL_RANK", "-1", "must be >= 0"),
    ("GLAUNCH_RESTART", "once", "not an integer"),
    ("GLAUNCH_CHECKPOINT_EVERY", "1e3", "not an integer"),
    ("GLAUNCH_JOB_ID", "abc\x1b[2J", "not a job id"),
    ("SLURM_JOB_ID", "abc", "not a Slurm job id"),
    ("MASTER_PORT", "http", "not a port number"),
    ("MASTER_PORT", "70000", "not a port number"),
]


@pytest.mark.parametrize(("name", "value", "why"), BAD, ids=[f"{n}={v!r}" for n, v, _ in BAD])
def test_an_invalid_value_is_named_with_its_variable_and_value(monkeypatch, name, value, why):
    monkeypatch.delenv("GLAUNCH_JOB_ID", raising=False)
    monkeypatch.setenv(name, value)
    with pytest.raises(RuntimeConfigError) as caught:
        context()
    message = str(caught.value)
    assert f"{name}={value!r}" in message and why in message and "not set" not in message
    assert "\x1b" not in message


def test_a_local_rank_beyond_the_node_s_ranks(monkeypatch):
    for name, value in {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "4"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(RuntimeConfigError, match="LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4"):
        context()


def test_valid_values_still_read(monkeypatch):
    for name, value in {"RANK": " 3 ", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GLAUNCH_JOB_ID": "123_4",
                        "SLURM_JOB_ID": "123", "MASTER_PORT": "29500", "GLAUNCH_RESTART": "2"}.items():
        monkeypatch.setenv(name, value)
    ctx = context()
    assert (ctx.rank, ctx.local_rank, ctx.job_id, ctx.master_port, ctx.restart) == (3, 3, "123_4", 29500, 2)
    monkeypatch.setenv("MASTER_PORT", "")
    monkeypatch.setenv("GLAUNCH_JOB_ID", "")
    assert context().master_port is None and context().job_id == "123"


def test_a_set_but_invalid_master_port_is_not_called_missing(monkeypatch):
    monkeypatch.setenv("MASTER_PORT", "abc")
    with pytest.raises(RuntimeConfigError, match="MASTER_PORT='abc': not a port number"):
        export_rendezvous_env()


def test_a_node_name_from_slurm_that_is_no_node_name_is_not_written(monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "n1\nfake: line")
    assert node_name() == os.uname().nodename
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-012")
    assert node_name() == "gpu-012"


def test_a_job_step_that_is_no_step_is_not_written(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_STEP_ID", "x" * 1000)
    assert heartbeats.Beats(run_dir=tmp_path, interval_s=1, checkpoint_every=0).job_step is None
    monkeypatch.setenv("SLURM_STEP_ID", "12")
    assert heartbeats.Beats(run_dir=tmp_path, interval_s=1, checkpoint_every=0).job_step == "12"


def test_a_heartbeat_interval_beyond_the_watchdog_s_bound_is_capped(monkeypatch, capsys):
    monkeypatch.setenv("GLAUNCH_HEARTBEAT_S", "1e9")
    assert heartbeats.interval_from_env() == MAX_INTERVAL_S
    assert "GLAUNCH_HEARTBEAT_S=" in capsys.readouterr().err


def test_the_watchdog_with_a_bad_rank_environment_says_so_and_exits_0(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GLAUNCH_", "SLURM_"))}
    env.update(PYTHONPATH=str(REPO), GLAUNCH_JOB_ID="7", GLAUNCH_RESTART="first", SLURM_JOB_ID="7")
    # The job controller runs the watchdog in a thread of its own process: watch_slurm.
    watch = "import sys; from launcher.jobcontrol import watchdog; sys.exit(watchdog.watch_slurm(sys.argv[1], stop=lambda: True))"
    proc = subprocess.run([sys.executable, "-c", watch, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "GLAUNCH_RESTART='first': not an integer" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("version", "names"), [
    ("2.13.0+cpu", {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_TEMP_FILE"}),
    ("2.9.1", {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_TEMP_FILE"}),
    ("2.1.2", {"TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}),
    ("2.8.0a0+git1234", {"TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
                         "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}),
])
def test_the_flight_recorder_is_named_as_the_node_torch_names_it(tmp_path, version, names):
    from launcher.runtime.task import flight_recorder_environment

    found = flight_recorder_environment(str(tmp_path), {"SLURM_GPUS_ON_NODE": "4"}, torch_version=version)
    assert set(found) == names
    assert flight_recorder_environment(str(tmp_path), {}, torch_version=version) == {}


def test_a_free_port_lies_below_the_ephemeral_range_and_binds(monkeypatch):
    """Below the kernel's ephemeral range no outgoing connection is handed the port between
    its pick and rank 0's bind; a port someone listens on is never picked."""
    import socket

    from launcher.rundir import rankcontext

    first = rankcontext._ephemeral_first()
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        ports = [rankcontext.free_port() for _ in range(50)]
        assert all(rankcontext.FREE_PORT_FLOOR <= p < first for p in ports), ports
        # Every pick but one is the busy port: the one that binds is taken.
        picks = iter([busy] * (rankcontext.FREE_PORT_TRIES - 1) + [busy + 1])
        monkeypatch.setattr(rankcontext.random, "randrange", lambda a, b: next(picks))
        monkeypatch.setattr(rankcontext, "port_taken", lambda port: port == busy)
        assert rankcontext.free_port() == busy + 1
        # None of the tries binds: the system picks one.
        monkeypatch.setattr(rankcontext.random, "randrange", lambda a, b: busy)
        assert rankcontext.free_port() != busy


@pytest.mark.parametrize("text,first", [("32768\t60999\n", 32768), ("20000 60999", 20000), ("", 32768),
                                        ("x 1", 32768), ("80 1000", 32768), ("99999 1", 32768)])
def test_the_ephemeral_range_is_read_strictly(tmp_path, monkeypatch, text, first):
    from launcher.rundir import rankcontext

    (tmp_path / "range").write_text(text)
    monkeypatch.setattr(rankcontext, "EPHEMERAL_RANGE", str(tmp_path / "range"))
    assert rankcontext._ephemeral_first() == first
