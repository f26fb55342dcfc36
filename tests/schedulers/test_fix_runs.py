"""What run.json and the CLI say at the edges of a run's life: a local start names its node,
a local job cancelled after its `glaunch submit` died ends its start, a submission Slurm
never queued is `refused` with the why in `detail`, and a held job is live (the errors
about runs and sweeps the user named: tests/runner/test_bad_input_runner.py)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import api
from launcher.rundir import registry
from launcher.rundir.records import LIVE, State
from launcher.rundir.rankcontext import node_name
from launcher.schedulers.slurm import queries as slurm_queries, scheduler as slurm, state as slurm_state
from launcher.views.status_text import format_status

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_cancel_safety import group_alive, start_long_run, wait_for  # noqa: E402


def glaunch(*args: str, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def orphaned_job(tmp_path, isolated_env):
    """A real local run whose `glaunch submit` was killed: its job runs on, alone."""
    proc, run_dir, pid = start_long_run(tmp_path / "runs", isolated_env)
    proc.kill()
    proc.wait()
    try:
        yield run_dir, pid
    finally:
        if group_alive(pid):
            os.killpg(pid, signal.SIGKILL)


def test_a_local_start_names_the_node_it_runs_on(orphaned_job):
    run_dir, _ = orphaned_job
    start = registry.read(run_dir).starts[-1]
    assert start.get("nodes") == node_name()
    assert json.loads((run_dir / "run.json").read_text())["starts"][-1]["nodes"] == node_name()


def test_cancel_of_a_job_whose_glaunch_died_ends_its_start(orphaned_job, isolated_env):
    run_dir, pid = orphaned_job
    assert group_alive(pid)
    assert "cancelled job" in api.cancel(str(run_dir))
    assert wait_for(lambda: not group_alive(pid), timeout=120)
    assert registry.read(run_dir).state == "RUNNING"      # nobody was left to record the end ...
    api.status(str(run_dir))                              # ... so the next command reading it does
    record = registry.read(run_dir)
    assert (record.state, record.reason) == ("CANCELLED", "cancelled")
    start = record.starts[-1]
    assert (start.state, start.reason) == ("CANCELLED", "cancelled")
    assert start.ended and start.ended >= start.started
    out = glaunch("status", run_dir.name, env=isolated_env)
    assert "RUNNING" not in out.stdout, out.stdout


def test_cancel_leaves_an_ended_start_as_its_loop_recorded_it(tmp_path, isolated_env, monkeypatch):
    """A start whose end is recorded keeps it. The job's process is a stand-in (no run is
    needed to prove what is written): _job_process is replaced by one naming a sleeping
    process group of this test's own."""
    from launcher.schedulers import local

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    record = {"run_id": "r", "scheduler": "local", "requeue_max": 0, "crash_retries": 0, "state": "RUNNING",
              "job_id": "1001", "reason": "timeout", "detail": "requeued after the time limit",
              "starts": [{"job_id": "1000", "restart": 0, "state": "REQUEUED", "reason": "timeout",
                          "started": "2026-01-01T00:00:00+00:00", "ended": "2026-01-01T01:00:00+00:00"},
                         {"job_id": "1001", "restart": 1, "state": "COMPLETED",
                          "started": "2026-01-01T01:00:01+00:00", "ended": "2026-01-01T02:00:00+00:00"}]}
    (run_dir / "run.json").write_text(json.dumps(record))
    sleeper = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        monkeypatch.setattr(local, "_job_process", lambda *_: (sleeper.pid, ""))
        local.LocalScheduler().cancel(run_dir, registry.read(run_dir))
        sleeper.wait(timeout=60)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
    assert registry.read(run_dir).state == "RUNNING"      # until the job has gone: the reader ends it
    local.LocalScheduler().refresh(run_dir, registry.read(run_dir))
    after = registry.read(run_dir)
    assert (after.state, after.reason, after.detail) == ("CANCELLED", "cancelled", None)
    assert [(s.state, s.ended) for s in after.starts] == [(s["state"], s["ended"]) for s in record["starts"]]


def test_a_submission_slurm_never_queued_is_refused_in_one_word(tmp_path, isolated_env, monkeypatch):
    """Slurm cannot run here: find_submitted is replaced by a stand-in answering that no job
    carries the run's id."""
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    record = {"run_id": "r", "scheduler": "slurm", "requeue_max": 0, "crash_retries": 0, "state": "UNKNOWN",
              "job_id": None, "reason": "submission uncertain", "detail": "sbatch did not answer",
              "submission": {"script": str(run_dir / "job.sbatch"), "marker": "glaunch-run=r"}}
    (run_dir / "run.json").write_text(json.dumps(record))
    registry.register("r", str(run_dir))
    monkeypatch.setattr(slurm_queries, "find_submitted", lambda client, script, marker: None)
    slurm._settle_uncertain(slurm.SlurmScheduler(), run_dir, registry.read(run_dir))
    after = registry.read(run_dir)
    assert (after.state, after.reason) == (State.REFUSED.value, "refused")
    assert "sbatch did not queue the job" in after.detail
    assert "submission" not in after.extra
    assert "  reason: refused; sbatch did not queue the job" in format_status(api.status("r"))


def test_a_job_slurm_requeued_held_is_live():
    assert "SPECIAL_EXIT" in LIVE
    assert slurm_state.current_state("RUNNING", "SPECIAL_EXIT", None) == "SPECIAL_EXIT"
    # Accounting still shows it held and squeue lost it long ago: the controller lost it.
    assert slurm_state.unlisted_verdict("12", [{"state": "SPECIAL_EXIT"}], slurm_state.UNLISTED_GRACE_S)
