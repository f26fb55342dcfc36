"""glaunch resume on the local Slurm cluster (`defaults`), on other resources: runs of 2 nodes x 1 rank
(DDP cancelled in the middle; FSDP2 completed) continue on 1 node x 1 rank (one rank per
node: ONE_RANK_PER_NODE), in their run directories, to a larger step count from their newest complete
checkpoint (DCP reshards DDP and FSDP2 state), with a finite loss lower than at the start."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pytest

from conftest import requires_slurm_defaults
from slurmkit import DEFAULTS, ONE_RANK_PER_NODE, REPO, finish, glaunch, job_id_of, read_json, start_submit, submit, the_run_dir, wait_until

pytestmark = [requires_slurm_defaults, pytest.mark.slurm, pytest.mark.slow]   # every test runs on `defaults`


def losses(run_dir: Path, job_id: str) -> list[tuple[int, float]]:
    text = (run_dir / "logs" / f"{job_id}_0_log.out").read_text(errors="replace")
    return [(int(s), float(v)) for s, v in re.findall(r"^step (\d+)/\d+ loss (\S+)", text, re.M)]


def resume(run_id: str, env, *overrides) -> tuple[subprocess.CompletedProcess, dict]:
    proc = glaunch("resume", "--wait", "--json", run_id, *overrides, env=env, timeout=900)
    try:
        return proc, json.loads(proc.stdout)
    except ValueError:
        return proc, {}


def check_resumed(run_dir: Path, steps: int, expect_from: int | None = None) -> None:
    """run.json: the earlier starts, then the resume's, which loaded the newest checkpoint
    at world size 1 on 1 node and ran to `steps`; the loss finite and lower than at the start."""
    record = read_json(run_dir / "run.json")
    (entry,) = record["resumes"]
    first = record["starts"][:entry["first_start"]]
    later = record["starts"][entry["first_start"]:]
    assert first and later, record["starts"]
    assert entry["ended"]["world_size"] == 2 and entry["ended"]["nodes"] == 2
    assert record["nodes"] == 1 and record["world_size"] == 1 and record["state"] == "COMPLETED"
    resumed = later[0]
    assert resumed["job_id"] != first[-1]["job_id"] and resumed["resumed_from"] is not None
    if expect_from is not None:
        assert resumed["resumed_from"] == expect_from
    assert later[-1]["state"] == "COMPLETED"
    result = read_json(run_dir / "result.json")
    assert result["final_step"] == steps and result["world_size"] == 1
    before = losses(run_dir, first[0]["job_id"])
    after = losses(run_dir, resumed["job_id"])
    assert before and after and after[-1][0] == steps, (before, after)
    assert after[0][0] == resumed["resumed_from"] + 1
    assert all(math.isfinite(v) for _, v in before + after)
    # Every step is logged: the mean over the resumed start against the first five steps' (one step's
    # loss is noisy).
    start, end = [v for _, v in before[:5]], [v for _, v in after]
    assert sum(end) / len(end) < sum(start) / len(start), (before, after)
    # The previous submission's script asked for 2 nodes; the new one for 1.
    assert "--nodes=2" in (run_dir / "resumes" / "1" / "job.sbatch").read_text()
    assert "--nodes=1" in (run_dir / "job.sbatch").read_text()


def test_ddp_cancelled_on_two_nodes_resumes_on_one(tmp_path, slurm_defaults_env):
    runs = tmp_path / "runs"
    proc = start_submit(str(REPO / "examples" / "torch_ddp.yaml"), runs, slurm_defaults_env, "resources.nodes=2",
                        ONE_RANK_PER_NODE, "entrypoint.args=[--steps,200,--seconds-per-step,0.3,--log-every,1,--lr,0.05]", cluster=DEFAULTS)
    run_dir = the_run_dir(runs)
    job_id = job_id_of(run_dir)
    try:
        wait_until(lambda: (run_dir / "checkpoints" / "step-00000020").is_dir(), 600, "a checkpoint at step 20")
        refused, _ = resume(run_dir.name, slurm_defaults_env, "resources.nodes=1", ONE_RANK_PER_NODE)
        assert refused.returncode == 2 and "only a run that ended can be resumed" in refused.stderr, refused.stderr
        cancelled = glaunch("cancel", run_dir.name, env=slurm_defaults_env)
        assert cancelled.returncode == 0, cancelled.stderr
    finally:
        rc, _, _ = finish(proc, job_id, 300, cluster=DEFAULTS)
    assert rc != 0
    newest = max(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*"))
    done, info = resume(run_dir.name, slurm_defaults_env, "resources.nodes=1", ONE_RANK_PER_NODE,
                        "entrypoint.args=[--steps,60,--log-every,1,--lr,0.05]")
    assert done.returncode == 0, done.stderr[-3000:]
    assert info["state"] == "COMPLETED" and info["run_dir"] == str(run_dir)
    check_resumed(run_dir, 60, expect_from=newest)
    assert read_json(run_dir / "run.json")["resumes"][0]["ended"]["state"] == "CANCELLED"


# FSDP's sharded checkpoint read back by half the ranks, through `glaunch resume` on the cluster.
# DeepSpeed ZeRO-2's at another world size (its universal checkpoint) is
# tests/runner/test_resume.py's, without a cluster.
@pytest.mark.parametrize("example", ["fsdp.yaml"])
def test_completed_on_two_nodes_trained_longer_on_one(tmp_path, slurm_defaults_env, example):
    runs = tmp_path / "runs"
    lr = [] if example.startswith("deepspeed") else ["--lr", "0.05"]      # DeepSpeed's example has its own
    proc, info = submit(str(REPO / "examples" / example), runs, slurm_defaults_env, "resources.nodes=2",
                        ONE_RANK_PER_NODE, f"entrypoint.args=[--steps,20,--log-every,1,{','.join(lr)}]".replace(",]", "]"), cluster=DEFAULTS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = runs / info["run_id"]
    assert read_json(run_dir / "result.json")["world_size"] == 2
    done, resumed = resume(info["run_id"], slurm_defaults_env, "resources.nodes=1", ONE_RANK_PER_NODE,
                           f"entrypoint.args=[--steps,40,--log-every,1,{','.join(lr)}]".replace(",]", "]"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert resumed["state"] == "COMPLETED"
    check_resumed(run_dir, 40, expect_from=20)
    log = (run_dir / "logs" / f"{resumed['job_id']}_0_log.err").read_text(errors="replace")
    assert log.count("per-rank RNG streams are not restored") == 1, log[-3000:]
    if example.startswith("deepspeed"):
        manifest = read_json(Path(run_dir) / "checkpoints" / "universal" / "step-00000020" / "manifest.json")
        assert manifest["extra"]["source_world_size"] == 2 and manifest["world_size"] == 1
