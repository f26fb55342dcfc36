"""The run's state machine (launcher.rundir.lifecycle) and the local scheduler bringing a
record whose job has gone to its end: every state is one a command acts on."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from launcher import api
from launcher.rundir import registry
from launcher.rundir.layout import RunDir
from launcher.rundir.lifecycle import ENDS, IllegalMove, move, resubmit
from launcher.rundir.records import RunRecord, State
from launcher.schedulers.local import CANCEL_KEY, SUBMIT_GRACE_S, hold_job_lock

MOVES = [
    ("SUBMITTING", "PENDING", True), ("SUBMITTING", "RUNNING", True), ("SUBMITTING", "REFUSED", True),
    ("PENDING", "RUNNING", True), ("RUNNING", "REQUEUED", True), ("REQUEUED", "RUNNING", True),
    ("RUNNING", "COMPLETED", True), ("RUNNING", "UNKNOWN", True), ("UNKNOWN", "COMPLETED", True),
    ("FAILED", "NODE_FAIL", True),            # accounting corrects an end
    ("COMPLETED", "RUNNING", False),          # an end never comes back to life by itself
    ("CANCELLED", "PENDING", False), ("TIMEOUT", "REQUEUED", False),
    ("RENDERED", "SUBMITTING", False), ("RENDERED", "RUNNING", False),
    ("PENDING", "SUBMITTING", False),         # only an ended run is resubmitted
    ("COMPLETED", "SUBMITTING", True),
]


@pytest.mark.parametrize("was, to, allowed", MOVES)
def test_moves(was, to, allowed):
    record = RunRecord(run_id="r", state=was, reason="before", detail="kept")
    if allowed:
        move(record, to, reason="after")
        assert (record.state, record.reason, record.detail) == (to, "after", "kept")
    else:
        with pytest.raises(IllegalMove, match=f"{was} cannot become {to}"):
            move(record, to, reason="after")
        assert (record.state, record.reason, record.detail) == (was, "before", "kept")


@pytest.mark.parametrize("state", ["PENDING", "RUNNING", "REQUEUED", "SUBMITTING", "RENDERED", "WHATEVER"])
def test_resubmit_refuses_a_run_that_did_not_end(state):
    record = RunRecord(run_id="r", state=state)
    with pytest.raises(IllegalMove, match="only a run that ended can be resumed"):
        resubmit(record)
    assert record.state == state


@pytest.mark.parametrize("state", sorted(str(s) for s in ENDS) + ["UNKNOWN"])
def test_resubmit_takes_an_ended_run_back(state):
    record = RunRecord(run_id="r", state=state, reason="x", detail="y")
    resubmit(record)
    assert (record.state, record.reason, record.detail) == ("SUBMITTING", None, None)


def test_an_illegal_move_inside_updating_leaves_the_file_as_it_was(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    registry.write(run_dir, RunRecord(run_id="r", state="COMPLETED"))
    before = RunDir(run_dir).run_file.read_bytes()
    with pytest.raises(IllegalMove), registry.updating(run_dir) as record:
        record.extra["touched"] = True
        move(record, "RUNNING")
    assert RunDir(run_dir).run_file.read_bytes() == before


# --- a local record whose job has gone -----------------------------------------------------


def local_run(tmp_path: Path, state: str, **extra) -> Path:
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    record = {"run_id": "r", "site": "local", "scheduler": "local", "dry_run": False, "state": state,
              "job_id": "1000", "run_dir": str(run_dir), "starts": [{"job_id": "1000", "restart": 0, "state": state}],
              **extra}
    (run_dir / "run.json").write_text(json.dumps(record))
    registry.register("r", str(run_dir))
    return run_dir


@pytest.mark.parametrize("state", ["RUNNING", "PENDING", "REQUEUED"])
def test_a_record_in_flight_with_nobody_running_its_job_ends_failed_lost(tmp_path, isolated_env, state):
    run_dir = local_run(tmp_path, state)
    status = api.status("r")
    assert (status["state"], status["reason"]) == ("FAILED", "lost")
    record = registry.read(run_dir)
    assert record.state == "FAILED" and record.starts[-1].ended and record.starts[-1].state == "FAILED"


def test_a_record_whose_job_left_its_result_ends_completed(tmp_path, isolated_env):
    run_dir = local_run(tmp_path, "RUNNING")
    RunDir(run_dir).result_file.write_text("{}")
    assert api.status("r")["state"] == "COMPLETED"


def test_a_cancel_asked_of_a_job_that_then_went_ends_cancelled(tmp_path, isolated_env):
    run_dir = local_run(tmp_path, "RUNNING", **{CANCEL_KEY: {"at": "now", "job_id": "1000"}})
    assert (api.status("r")["state"], api.status("r")["reason"]) == ("CANCELLED", "cancelled")
    assert CANCEL_KEY not in registry.read(run_dir).extra


def test_a_record_whose_job_holds_its_lock_stays_in_flight(tmp_path, isolated_env):
    run_dir = local_run(tmp_path, "RUNNING")
    lock = hold_job_lock(RunDir(run_dir))
    try:
        assert api.status("r")["state"] == "RUNNING"
    finally:
        os.close(lock)


def test_a_submission_in_progress_is_left_alone_then_ends_once_stale(tmp_path, isolated_env):
    run_dir = local_run(tmp_path, "SUBMITTING", job_id=None, starts=[])
    assert api.status("r")["state"] == "SUBMITTING"
    old = time.time() - SUBMIT_GRACE_S - 5
    os.utime(RunDir(run_dir).run_file, (old, old))
    assert api.status("r")["state"] == "FAILED"


def test_a_copy_is_read_as_it_is_and_never_settled(tmp_path, isolated_env):
    run_dir = local_run(tmp_path, "RUNNING")
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "run.json").write_text(RunDir(run_dir).run_file.read_text())
    assert api.status(str(copy))["state"] == "RUNNING"
    assert registry.read(copy).state == State.RUNNING
