"""A start's beginning on the real local Slurm cluster (`main`): a bundle written by --dry-run and
submitted with plain sbatch is taken on by its job and completes as a run; its job script
started once more after the run completed (what Slurm 24.11 does to a job it requeued after a
preemption) exits at once, changing nothing; a rank killed by SIGKILL ends the start as a
crash that names the signal, not as a cancel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import requires_slurm
from slurmkit import MAIN, final_sacct_state, glaunch, out, read_json, sacct_rows, squeue_state, submit, wait_until

pytestmark = [requires_slurm, pytest.mark.slurm, pytest.mark.slow]


def sbatch(script: Path) -> str:
    """`sbatch RUN_DIR/job.sbatch`, as a user types it; the job id."""
    return out("sbatch", "--parsable", str(script), cluster=MAIN).strip().split(";")[0]


def ended(job_id: str, timeout: float = 600) -> str:
    wait_until(lambda: squeue_state(job_id, MAIN) == "", timeout, f"job {job_id} to leave the queue", interval=2)
    return final_sacct_state(job_id, cluster=MAIN)


def rank_logs(run_dir: Path, job_id: str) -> list[Path]:
    return sorted((run_dir / "logs").glob(f"{job_id}_*_log.*"))


def test_a_dry_run_bundle_sbatched_by_hand_runs_and_a_start_after_its_end_changes_nothing(tmp_path, isolated_env):
    runs = tmp_path / "runs"
    dry = glaunch("submit", "examples/torch_ddp.yaml", "--site", "local-slurm", "--dry-run", "--runs-dir", str(runs),
                  "entrypoint.args=[--steps,6]", env=isolated_env, cluster=MAIN)
    assert dry.returncode == 0, dry.stderr
    (run_dir,) = runs.iterdir()
    assert read_json(run_dir / "run.json")["state"] == "RENDERED"

    # The habit: sbatch the bundle. Its job takes the run on and trains it to the end.
    job = sbatch(run_dir / "job.sbatch")
    assert ended(job) == "COMPLETED"
    record = read_json(run_dir / "run.json")
    assert (record["state"], record["job_id"], record["dry_run"]) == ("COMPLETED", job, False), record
    assert [(s["job_id"], s["restart"], s["state"]) for s in record["starts"]] == [(job, 0, "COMPLETED")]
    assert read_json(run_dir / "result.json")["final_step"] == 6
    assert rank_logs(run_dir, job)
    status = json.loads(glaunch("status", record["run_id"], "--json", env=isolated_env, cluster=MAIN).stdout)
    assert status["state"] == "COMPLETED" and status["job_id"] == job

    # The completed run's job script started once more: it exits at once, and changes nothing.
    before = {name: (run_dir / name).read_bytes() for name in ("run.json", "result.json")}
    again = sbatch(run_dir / "job.sbatch")
    assert ended(again) == "COMPLETED"
    (row,) = sacct_rows(again, MAIN)
    assert row["exit_code"] == "0:0"
    assert {name: (run_dir / name).read_bytes() for name in before} == before
    assert rank_logs(run_dir, again) == []
    log = (run_dir / "logs" / f"{again}_batch.log").read_text()
    assert f"glaunch: run {record['run_id']} has ended (COMPLETED): job {again} does nothing" in log, log
    assert "srun" not in log and "Traceback" not in log, log


def test_a_rank_killed_by_sigkill_is_a_crash_on_slurm(tmp_path, isolated_env):
    (tmp_path / "oom.py").write_text("import os, signal, time\n"
                                     "if os.environ['RANK'] == '1':\n"
                                     "    os.kill(os.getpid(), signal.SIGKILL)\n"
                                     "time.sleep(120)\n")
    (tmp_path / "exp.yaml").write_text("name: oom\nentrypoint: {script: oom.py}\nresources: {nodes: 1, time: '5'}\n"
                                       "requeue: {max: 0}\n")
    proc, info = submit(str(tmp_path / "exp.yaml"), tmp_path / "runs", isolated_env, cluster=MAIN)
    assert info.get("state") == "FAILED", proc.stdout + proc.stderr
    record = read_json(tmp_path / "runs" / info["run_id"] / "run.json")
    assert record["state"] == "FAILED" and record["reason"] == "crash", record
    (start,) = record["starts"]
    assert start["state"] == "FAILED" and start["reason"] == "crash"
    assert start["detail"] == "rank 1 killed by SIGKILL (out of memory?)", start
