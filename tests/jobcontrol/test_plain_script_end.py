"""A script without glaunch's runtime that exits 0 has ended, and says so cleanly: no
"the entry point wrote no result.json" (result.json is the runtime's, and such a script
never writes one), which stays for a script that used the runtime and did not write its
result. And what no start counted (its steps lost) reads as not known, never as 0."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher import api
from launcher.rundir import registry
from launcher.rundir.layout import RunDir, heartbeat_bytes
from launcher.jobcontrol.jobend import NO_RESULT, Outcome, StepEnd, decide, end_of_start, used_runtime
from launcher.views.status_text import format_status

REPO = Path(__file__).resolve().parents[2]
BASE = dict(step_status=0, finished=False, stopped=False, preempted=False, timed_out=False, restart=0,
            requeue_max=3, crashes=0, crash_retries=0)
PLAIN = "print('iter 1: loss 0.5')\n"


# --- the decision -------------------------------------------------------------------------------


@pytest.mark.parametrize("changes, expected", [
    ({"runtime": False}, Outcome("COMPLETED", None, False, 0)),
    ({"runtime": False, "crash_retries": 2, "restart": 1}, Outcome("COMPLETED", None, False, 0)),
    ({"runtime": True}, Outcome("COMPLETED", None, False, 0, NO_RESULT)),
    ({"runtime": False, "finished": True}, Outcome("COMPLETED", None, False, 0)),
    # what is not a clean end reads as before, runtime or not
    ({"runtime": False, "step_status": 1}, Outcome("FAILED", "crash", False, 1, "exit status 1")),
    ({"runtime": False, "hung": True, "step_status": 137},
     Outcome("FAILED", "hang", False, 137, "the watchdog ended the step")),
    ({"runtime": False, "preempted": True}, Outcome("REQUEUED", "preemption", True, 0)),
])
def test_a_clean_exit_is_noted_only_for_a_script_that_used_the_runtime(changes, expected):
    assert decide(**{**BASE, **changes}) == expected


# --- the evidence: this start's heartbeats ------------------------------------------------------


def beat(run_dir: Path, rank: int, **fields) -> None:
    record = {"rank": rank, "restart": 0, "job_id": "1000", "state": "starting", "world_size": 2, **fields}
    path = RunDir(run_dir).heartbeat(rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(heartbeat_bytes(record))


def test_no_heartbeat_is_no_runtime(tmp_path):
    assert not used_runtime(tmp_path, "1000", 0)
    assert not used_runtime(tmp_path, None, 0)


def test_the_tasks_starting_records_are_no_runtime(tmp_path):
    beat(tmp_path, 0)
    beat(tmp_path, 1)
    assert not used_runtime(tmp_path, "1000", 0)


def test_a_beat_taken_from_the_log_is_no_runtime(tmp_path):
    now = time.time()
    beat(tmp_path, 0, state="running", source="log", step=3, time=now, announced_at=now)
    assert not used_runtime(tmp_path, "1000", 0)


def test_a_rank_that_announced_itself_used_the_runtime(tmp_path):
    beat(tmp_path, 0)
    beat(tmp_path, 1, state="running", step=3, time=time.time(), announced_at=time.time())
    assert used_runtime(tmp_path, "1000", 0)
    assert not used_runtime(tmp_path, "1000", 1)        # another start's evidence is not this one's
    assert not used_runtime(tmp_path, "1001", 0)


# --- the end of a start on Slurm (launcher.jobcontrol.jobend.end_of_start) -------------------------


def started_run(tmp_path: Path) -> Path:
    """A run whose job 1000 began its first start (the bundle of a dry run on the local site)."""
    (tmp_path / "train.py").write_text(PLAIN)
    (tmp_path / "exp.yaml").write_text("name: plain\nentrypoint: {script: train.py}\n"
                                       "resources: {nodes: 1, gpus_per_node: 0}\n")
    run = api.submit(str(tmp_path / "exp.yaml"), site="local", runs_dir=str(tmp_path / "runs"), dry_run=True)
    with registry.updating(run.run_dir) as record:
        record.dry_run, record.state, record.job_id = False, "RUNNING", "1000"
        record.starts = [registry.new_start("1000", 0, state="RUNNING", started="2026-01-01T00:00:00+00:00")]
    return Path(run.run_dir)


def test_a_plain_script_that_exits_0_ends_completed_without_a_note(tmp_path, isolated_env):
    run_dir = started_run(tmp_path)
    road = end_of_start(run_dir, StepEnd(0), "1000", 0)
    assert road.line() == "done" and road.exit_code == 0
    summary = api.status(str(run_dir))
    assert summary["state"] == "COMPLETED"
    assert summary["detail"] is None and summary["reason"] is None
    assert summary["starts"][0]["detail"] is None
    text = format_status(summary)
    assert "result.json" not in text and "reason:" not in text


def test_a_runtime_script_that_exits_0_without_its_result_keeps_the_note(tmp_path, isolated_env):
    run_dir = started_run(tmp_path)
    beat(run_dir, 0, state="running", step=5, time=time.time(), announced_at=time.time(), world_size=1)
    end_of_start(run_dir, StepEnd(0), "1000", 0)
    summary = api.status(str(run_dir))
    assert summary["state"] == "COMPLETED" and summary["detail"] == NO_RESULT
    assert f"reason: {NO_RESULT}" in format_status(summary)


# --- the local site (launcher.schedulers.local passes the same evidence to decide) --------------


def test_a_plain_script_on_the_local_site_reads_cleanly_in_status(tmp_path, isolated_env):
    (tmp_path / "train.py").write_text(PLAIN)
    (tmp_path / "exp.yaml").write_text("name: plain\nentrypoint: {script: train.py}\n"
                                       "resources: {nodes: 1, gpus_per_node: 0}\nrequeue: {max: 0}\n")
    env = dict(isolated_env, PYTHONPATH=str(REPO))

    def glaunch(*args):
        return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)

    proc = glaunch("submit", "exp.yaml", "--site", "local")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "result.json" not in proc.stdout + proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    status = glaunch("status", str(run_dir), "--json")
    summary = json.loads(status.stdout)
    assert summary["state"] == "COMPLETED" and summary["detail"] is None
    assert summary["starts"][0]["detail"] is None
    text = glaunch("status", str(run_dir)).stdout
    assert "COMPLETED" in text and "result.json" not in text


# --- goodput's lost steps in status: not known is "?", never 0 or None --------------------------


def goodput_report(lost, rows):
    return {"goodput": {"ettr": None, "lost_steps": lost, "interruptions": 1, "starts": rows}}


def goodput_line(report) -> str:
    summary = {"run_id": "r", "state": "COMPLETED", "site": "local", "job_id": "1000", "restarts": 1,
               "run_dir": "/runs/r", "starts": [], **report}
    (line,) = [line for line in format_status(summary).splitlines() if line.startswith("  goodput: ")]
    return line


def test_lost_steps_that_no_start_counted_read_as_not_known():
    uncounted = [{"restart": 0, "reason": "preemption", "steps_done": None, "lost_steps": None},
                 {"restart": 1, "reason": None, "steps_done": None, "lost_steps": None}]
    line = goodput_line(goodput_report(None, uncounted))
    assert "lost steps ? (no start counted its steps: entrypoint.progress" in line
    assert "None" not in line


def test_lost_steps_not_known_where_steps_were_counted_read_as_a_bare_question_mark():
    counted = [{"restart": 0, "reason": "crash", "steps_done": 40, "lost_steps": None}]
    line = goodput_line(goodput_report(None, counted))
    assert "lost steps ? over" in line


def test_lost_steps_that_are_known_read_as_the_number():
    rows = [{"restart": 0, "reason": "preemption", "steps_done": 40, "lost_steps": 0}]
    assert "lost steps 0 over 1 interruption(s)" in goodput_line(goodput_report(0, rows))
