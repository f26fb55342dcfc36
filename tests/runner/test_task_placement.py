"""Which global ranks each task log holds, and how `glaunch logs` tags it: one rank per
task under srun (`[r2]`), one node's agent and its workers under torchrun (`[node1 r2-3]`),
`!` for stderr; `--rank N` is global rank N in both modes. On the task logs a torchrun job
on the local cluster wrote (2 nodes x 2 workers); no scheduler."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from launcher.rundir import launch
from launcher.rundir.taskspec import Placement, TaskSpec, read_placement, write_task_spec
from launcher.runner.logs import RankLogs

RECORDED = Path(__file__).resolve().parents[1] / "recorded_console" / "slurm_torchrun_logs"
SPEC = TaskSpec(launcher="torchrun", script="/home/alice/exp/torch_ddp.py", module=None, args=("--steps", "40"),
                nodes=2, ranks_per_node=2, world_size=4, run_dir="/", run_id="r", requeue_max=3, crash_retries=0,
                exclude_bad_nodes=True, watchdog_stall_s=0.0, watchdog_first_step_s=0.0)


def recorded_run(tmp_path: Path, launcher: str | None = "torchrun") -> Path:
    """A run directory with the recorded task logs; its task.json says `launcher` (None: no task.json)."""
    run_dir = tmp_path / "run"
    shutil.copytree(RECORDED, run_dir / "logs")
    if launcher is not None:
        write_task_spec(run_dir, dataclasses.replace(SPEC, launcher=launcher, run_dir=str(run_dir)))
    return run_dir


def shown(run_dir: Path, rank: int | None = None) -> list[str]:
    lines: list[str] = []
    reader = RankLogs(run_dir, rank, lines.append)
    reader.poll()
    reader.flush()
    return lines


def tags(lines: list[str]) -> set[str]:
    return {line.split("] ", 1)[0] + "]" for line in lines}


def test_placement_of_each_launch_mode():
    torchrun, srun = Placement("torchrun", 4), Placement("srun", 4)
    assert [torchrun.ranks(t) for t in (0, 1, 2)] == [range(0, 4), range(4, 8), range(8, 12)]
    assert [torchrun.task(r) for r in (0, 3, 4, 11)] == [0, 0, 1, 2]
    assert [torchrun.label(t) for t in (0, 2)] == ["node0 r0-3", "node2 r8-11"]
    assert Placement("torchrun", 1).label(3) == "node3 r3"
    assert [srun.ranks(5), srun.task(5), srun.label(5)] == [range(5, 6), 5, "r5"]


def test_torchrun_s_node_rank_is_the_one_glaunch_passes():
    """Static rendezvous: the node rank given is the one torchrun uses (c10d ignores it)."""
    args = launch.torchrun_args(SPEC, node_rank="$SLURM_NODEID", master_addr="h", master_port="1", job_id="5")
    assert "--rdzv-backend=static" in args and "--node-rank=$SLURM_NODEID" in args


def test_torchrun_logs_are_tagged_with_the_node_and_its_ranks(tmp_path):
    lines = shown(recorded_run(tmp_path))
    assert tags(lines) == {"[node0 r0-1]", "[node0 r0-1!]", "[node1 r2-3]", "[node1 r2-3!]"}
    assert any(line.startswith("[node0 r0-1] done: step 40 param_sha256 ") for line in lines)
    assert "[node1 r2-3!] glaunch[rank 2]: joined gloo: rank 2/4, local rank 0, node 1 (node2) on cpu" in lines
    assert "[node0 r0-1!] glaunch[rank 1]: joined gloo: rank 1/4, local rank 1, node 0 (node1) on cpu" in lines


@pytest.mark.parametrize("rank, tag", [(0, "node0 r0-1"), (1, "node0 r0-1"), (2, "node1 r2-3"), (3, "node1 r2-3")])
def test_a_rank_filter_is_the_global_rank_under_torchrun(tmp_path, rank, tag):
    lines = shown(recorded_run(tmp_path), rank)
    assert tags(lines) == {f"[{tag}]", f"[{tag}!]"}
    assert any(f"glaunch[rank {rank}]: joined gloo: rank {rank}/4" in line for line in lines)


def test_under_srun_a_task_is_one_rank(tmp_path):
    run_dir = recorded_run(tmp_path, "srun")
    assert tags(shown(run_dir)) == {"[r0]", "[r0!]", "[r1]", "[r1!]"}
    assert tags(shown(run_dir, 1)) == {"[r1]", "[r1!]"}
    assert shown(run_dir, 2) == []


def test_without_a_task_spec_each_task_is_shown_as_one_rank(tmp_path):
    run_dir = recorded_run(tmp_path, None)
    assert read_placement(run_dir) == Placement()
    assert tags(shown(run_dir)) == {"[r0]", "[r0!]", "[r1]", "[r1!]"}


# --- one log per worker: what a node's torchrun agent writes, read back by rank -------------------

WORKER = """import os, sys
rank = os.environ["RANK"]
print(f"out of rank {rank}", flush=True)
print(f"err of rank {rank}", file=sys.stderr, flush=True)
"""


def run_torchrun_node(tmp_path: Path, monkeypatch, node: int = 0) -> Path:
    """One node's glaunch task running the real torchrun agent with two workers."""
    import types

    from launcher.rundir.rankcontext import free_port
    from launcher.runtime.task import TrainingTask

    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    spec = dataclasses.replace(SPEC, nodes=1, ranks_per_node=2, world_size=2, script=str(script),
                               run_dir=str(run_dir))
    # 2 nodes x 2 for the reader; the workers run its script (launcher.runtime.worker).
    write_task_spec(run_dir, dataclasses.replace(SPEC, run_dir=str(run_dir), script=str(script)))
    monkeypatch.setenv("GLAUNCH_RUN_DIR", str(run_dir))    # the task sets it for its workers
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    assert TrainingTask(run_dir)._run_torchrun(spec, types.SimpleNamespace(node=node, job_id="7")) == 0
    return run_dir


def test_each_torchrun_worker_writes_its_own_log_and_a_rank_filter_reads_only_it(tmp_path, monkeypatch, capfd):
    run_dir = run_torchrun_node(tmp_path, monkeypatch)
    out, err = capfd.readouterr()
    # The node's task log (the agent's stdout and stderr) still holds every worker's lines.
    assert {"out of rank 0", "out of rank 1"} <= set(out.splitlines())
    assert {"err of rank 0", "err of rank 1"} <= set(err.splitlines())
    assert sorted(shown(run_dir, 1)) == ["[r1!] err of rank 1", "[r1] out of rank 1"]
    assert sorted(shown(run_dir, 0)) == ["[r0!] err of rank 0", "[r0] out of rank 0"]


def test_logs_of_a_rank_the_run_does_not_have_is_exit_2_naming_its_ranks(tmp_path, isolated_env):
    import subprocess
    import sys

    from launcher import api
    from launcher.errors import ConfigError
    from launcher.rundir import registry
    from launcher.rundir.records import RunRecord

    run_dir = recorded_run(tmp_path)
    registry.write(run_dir, RunRecord.from_dict({"run_id": "r", "run_dir": str(run_dir), "scheduler": "slurm",
                                                 "state": "COMPLETED"}))
    lines: list[str] = []
    api.logs(str(run_dir), rank=3, echo=lines.append)            # the last of 4
    assert lines
    with pytest.raises(ConfigError, match="has 4 rank\\(s\\), 0 to 3: it has no rank 4") as caught:
        api.logs(str(run_dir), rank=4, echo=lines.append)
    assert caught.value.key == "--rank" and caught.value.exit_code == 2
    ended = subprocess.run([sys.executable, "-m", "launcher.cli", "logs", str(run_dir), "--rank", "7"],
                           capture_output=True, text=True, timeout=60, env=isolated_env)
    assert ended.returncode == 2 and "it has no rank 7" in ended.stderr and not ended.stdout, ended
