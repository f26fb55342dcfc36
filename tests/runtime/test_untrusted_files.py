"""Files the runtime opens by name that someone replaced by a FIFO (or a directory): each
reads as damaged or absent, with a message naming it, and never blocks a rank. A FIFO
opened for reading waits for a writer forever; each call here runs in a thread that must
be done within BOUND_S."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from launcher.runtime.checkpoint.directory import CheckpointError, read_latest
from launcher.runtime.checkpoint.selection import latest_complete, resume_checkpoint
from launcher.runtime.checkpoint.save import stage_checkpoint
from launcher.runtime.checkpoint.staging import read_markers
from launcher.runtime.checkpoint.verify import verify_checkpoint

BOUND_S = 5.0

pytestmark = pytest.mark.usefixtures("single_rank_env")


def within_bound(call, *fifos: Path):
    """call() in a thread: its result, or its exception raised here; fails when it is not
    done within BOUND_S (then a writer is opened on each FIFO to let the thread go)."""
    out: dict = {}

    def run():
        try:
            out["value"] = call()
        except BaseException as exc:      # handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND_S)
    if thread.is_alive():
        for fifo in fifos:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        thread.join(BOUND_S)
        pytest.fail(f"still blocked after {BOUND_S} s")
    if "error" in out:
        raise out["error"]
    return out["value"]


def save(step: int, payload: bytes = b"x" * 100):
    with stage_checkpoint(step) as st:
        st.file("rank-00000.bin").write_bytes(payload)
    return st.committed


def ckpt_dir(tmp_path: Path) -> Path:
    return tmp_path / "ckpt"


def test_a_fifo_named_latest_neither_blocks_resume_nor_hides_the_checkpoint(tmp_path, capsys):
    done = save(3)
    latest = ckpt_dir(tmp_path) / "latest"
    latest.unlink()
    os.mkfifo(latest)
    found = within_bound(resume_checkpoint, latest)
    assert found is not None and found.path == done.path
    assert within_bound(lambda: read_latest(ckpt_dir(tmp_path)), latest) is None
    err = capsys.readouterr().err
    assert f"{latest}" in err and "not a regular file" in err


def test_latest_as_a_directory_reads_as_absent_with_its_name(tmp_path, capsys):
    save(3)
    latest = ckpt_dir(tmp_path) / "latest"
    latest.unlink()
    latest.mkdir()
    assert within_bound(lambda: latest_complete(ckpt_dir(tmp_path))).step == 3
    assert f"{latest}" in capsys.readouterr().err


def test_a_fifo_manifest_makes_its_checkpoint_incomplete(tmp_path, capsys):
    older, newer = save(1), save(2)
    manifest = newer.path / "manifest.json"
    manifest.unlink()
    os.mkfifo(manifest)
    found = within_bound(lambda: latest_complete(ckpt_dir(tmp_path)), manifest)
    assert found is not None and found.path == older.path
    assert "manifest.json is not a regular file" in capsys.readouterr().err


def test_a_fifo_shard_fails_verification_instead_of_blocking(tmp_path):
    done = save(4, payload=b"")
    shard = done.path / "rank-00000.bin"
    shard.unlink()
    os.mkfifo(shard)
    manifest, why = within_bound(lambda: verify_checkpoint(done.path), shard)
    assert manifest is None and "rank-00000.bin is not a regular file" in why


def test_a_fifo_done_marker_is_an_unreadable_marker(tmp_path):
    staging = tmp_path / "staging"
    staging.mkdir()
    marker = staging / ".done-rank-00000.json"
    os.mkfifo(marker)
    with pytest.raises(CheckpointError, match=r"rank 0's done marker is unreadable: .*not a regular file"):
        within_bound(lambda: read_markers(staging, 1, 1, timeout_s=1.0), marker)


def test_a_fifo_failure_marker_still_fails_the_commit(tmp_path):
    staging = tmp_path / "staging"
    staging.mkdir()
    marker = staging / ".failed-rank-00001.json"
    os.mkfifo(marker)
    with pytest.raises(CheckpointError, match="rank 1 failed writing its shards"):
        within_bound(lambda: read_markers(staging, 1, 2, timeout_s=1.0), marker)


def test_a_fifo_rank_file_is_refused_at_load(tmp_path):
    torch = pytest.importorskip("torch")
    from launcher.runtime.torchstate import load_torch_state, restore_rng, save_torch_state

    model = torch.nn.Linear(2, 2)
    done = save_torch_state(5, model)
    rank_file = done.path / "rank-00000.pt"
    rank_file.unlink()
    os.mkfifo(rank_file)
    with pytest.raises(CheckpointError, match=r"rank-00000\.pt.*not a regular file"):
        within_bound(lambda: load_torch_state(done, model), rank_file)
    rng = done.path / "rng-rank-00000.pt"
    os.mkfifo(rng)
    with pytest.raises(CheckpointError, match=r"rng-rank-00000\.pt.*not a regular file"):
        within_bound(lambda: restore_rng(done, 0, 1), rng)


def test_a_fifo_model_file_is_refused_at_load(tmp_path):
    torch = pytest.importorskip("torch")
    from launcher.runtime.torchstate import load_torch_state, save_torch_state

    model = torch.nn.Linear(2, 2)
    done = save_torch_state(6, model, per_rank_model=True)
    files = [p for p in done.path.iterdir() if p.name.startswith("model")]
    assert files
    for path in files:
        path.unlink()
        os.mkfifo(path)
    with pytest.raises(CheckpointError, match="not a regular file"):
        within_bound(lambda: load_torch_state(done, model), *files)


def test_a_fifo_deepspeed_config_is_named(tmp_path, monkeypatch):
    from launcher.runtime.deepspeed import ds_config
    from launcher.rundir.rankcontext import RuntimeConfigError

    path = tmp_path / "ds_config.json"
    os.mkfifo(path)
    monkeypatch.setenv("GLAUNCH_DS_CONFIG", str(path))
    with pytest.raises(RuntimeConfigError, match=f"GLAUNCH_DS_CONFIG={str(path)!r}: .*not a regular file"):
        within_bound(lambda: ds_config({}), path)
    path.unlink()
    path.write_text("[1, 2]")
    with pytest.raises(RuntimeConfigError, match="not an object"):
        ds_config({})
    path.write_text(json.dumps({"train_batch_size": 8}))
    assert ds_config({})["train_batch_size"] == 8


@pytest.mark.parametrize("resume", [{"restart": 0, "step": 10**30}, {"restart": False, "step": 7},
                                    {"restart": 0, "step": [7]}, {"restart": 0, "step": -3}])
def test_a_resume_record_out_of_bounds_counts_steps_from_zero(tmp_path, resume):
    from launcher.rundir.heartbeatrecord import checked_heartbeat
    from launcher.rundir.layout import RunDir
    from launcher.rundir.rankcontext import context
    from launcher.runtime import heartbeats, trackers

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    RunDir(run_dir).resume_file.write_text(json.dumps(resume))
    beats = heartbeats.Beats(run_dir=run_dir, interval_s=1, checkpoint_every=0)
    beats.beat()
    assert beats.step == 1
    assert trackers.resumed_step(context()) is None
    checked_heartbeat(beats.record(), world_size=1)


# --- the start's end: what the ranks left, read back ----------------------------------------


def test_the_start_summary_skips_what_no_rank_could_have_measured(tmp_path):
    """A huge integer time (float() would overflow), `restart: true` (equal to 1), mixed
    rank types: the summary keeps what reads back and never raises."""
    from launcher.rundir.layout import RunDir
    from launcher.rundir.startsummary import start_summary

    rd = RunDir(tmp_path)
    files = [{"job_id": "7", "restart": 1, "rank": 0, "last_time": 10 ** 400, "last_step": 5,
              "memory": {"peak_gb": 1.5}},
             {"job_id": "7", "restart": 1, "rank": "one", "memory": {"peak_gb": 2.0}},
             {"job_id": "7", "restart": True, "rank": 2, "last_time": 100.0, "last_step": 9}]
    for index, record in enumerate(files):
        path = rd.telemetry("7", 1, index)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record))
    summary = within_bound(lambda: start_summary(tmp_path, "7", 1))
    assert summary["peak_memory_gb"] == 2.0
    assert [m.get("rank") for m in summary["memory"]["ranks"]] == ["one", 0]
    assert "last_step" not in summary            # neither the overflowing time nor restart: true counts


@pytest.mark.parametrize("name", ["stop", "resume", "crash"])
def test_a_record_of_restart_true_is_no_starts(tmp_path, name):
    from launcher.jobcontrol import jobend

    (tmp_path / f"{name}.json").write_text(json.dumps({"restart": True, "step": 3, "rank": 0}))
    reader = {"stop": jobend.stopped_in, "resume": jobend.resumed_in, "crash": jobend.crash_in}[name]
    assert reader(tmp_path, 1) is None


def test_a_fifo_where_a_rank_dumps_its_stack_never_holds_it(tmp_path):
    from launcher.rundir.layout import RunDir
    from launcher.runtime.stackdump import arm_stack_dump

    dump = RunDir(tmp_path).stack_dump(0)
    dump.parent.mkdir(parents=True)
    os.mkfifo(dump)
    assert within_bound(lambda: arm_stack_dump(tmp_path, 0), dump) is False


def test_only_heartbeat_files_named_as_glaunch_names_them_are_read():
    from launcher.rundir.layout import HEARTBEAT

    assert HEARTBEAT.match("rank-00003.json") and not HEARTBEAT.match("rank-3.json")
    assert not HEARTBEAT.match("rank-\uff10\uff10\uff10\uff10\uff13.json")       # fullwidth digits


@pytest.mark.parametrize("owner, loads", [("this-run", True), ("another-run", False), (None, True)])
def test_a_rank_loads_only_from_a_checkpoint_directory_its_run_owns(tmp_path, monkeypatch, owner, loads):
    from launcher.rundir import claims

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("GLAUNCH_RUN_ID", "this-run")
    ckpt = Path(os.environ["GLAUNCH_CHECKPOINT_DIR"])
    ckpt.mkdir(parents=True)
    if owner is not None:
        claims.claim(ckpt, owner, f"/runs/{owner}")
    if loads:
        assert resume_checkpoint() is None
    else:
        with pytest.raises(CheckpointError, match="holds the checkpoints of run another-run"):
            resume_checkpoint()


def test_a_rank_that_never_dumped_its_stack_leaves_no_empty_file(tmp_path):
    import subprocess
    import sys

    script = ("import sys; from launcher.runtime.stackdump import arm_stack_dump; "
              "assert arm_stack_dump(sys.argv[1], 0)")
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=60)
    assert not (tmp_path / "stack-dumps").exists()
