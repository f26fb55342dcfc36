"""How a run goes on after a start, decided without a cluster: requeue or a new job
(requeue.mode), and what run.json records of a resubmitted job, so that status, sacct
folding and cancel follow the run's current job."""

from __future__ import annotations

import pytest

from launcher.rundir import registry
from launcher.errors import GlaunchError
from launcher.rundir.records import CANCEL_REQUESTED, RunRecord
from launcher.jobcontrol.jobend import Outcome, next_start, record_successor
from launcher.schedulers.slurm.recording import settled
from launcher.schedulers.slurm.state import merge_history


@pytest.mark.parametrize("outcome, mode, road", [
    (Outcome("REQUEUED", "timeout", True, 0), "resubmit", "resubmit"),
    (Outcome("REQUEUED", "timeout", True, 0), "requeue", "requeue"),
    # A stop on a SIGTERM nothing explains goes on as after the limit.
    (Outcome("REQUEUED", "terminated", True, 0), "resubmit", "resubmit"),
    (Outcome("REQUEUED", "terminated", True, 0), "requeue", "requeue"),
    (Outcome("REQUEUED", "requeued", True, 0), "resubmit", "requeue"),
    # Slurm requeues a preempted job itself; a crash's bad node is kept off with ExcNodeList.
    (Outcome("REQUEUED", "preemption", True, 0), "resubmit", "requeue"),
    (Outcome("REQUEUED", "crash", True, 0, "exit status 1; retry 1 of 2"), "resubmit", "requeue"),
    (Outcome("REQUEUED", "hang", True, 0), "resubmit", "requeue"),
    (Outcome("TIMEOUT", "timeout", False, 1, "requeue.max (3) reached"), "resubmit", None),
    (Outcome("COMPLETED", None, False, 0), "resubmit", None),
])
def test_only_the_time_limit_resubmits(outcome, mode, road):
    assert next_start(outcome, mode) == road


def a_run(tmp_path, **values) -> RunRecord:
    (tmp_path / "logs").mkdir()
    record = RunRecord.from_dict({"run_id": "r", "scheduler": "slurm", "state": "REQUEUED", "job_id": "41",
                                  "starts": [{"job_id": "41", "restart": 0, "state": "REQUEUED", "reason": "timeout",
                                              "ended": "2026-01-01T00:01:00+00:00"}], **values})
    registry.write(tmp_path, record)
    return record


def test_a_successor_becomes_the_runs_job_with_the_next_restart(tmp_path):
    a_run(tmp_path)
    (tmp_path / "logs" / "41_submitted.pkl").write_bytes(b"task")
    assert record_successor(tmp_path, "42", "41", 0)
    record = registry.read(tmp_path)
    assert record.job_id == "42"
    assert [(s.job_id, s.restart, s.state) for s in record.starts] == [("41", 0, "REQUEUED"), ("42", 1, "PENDING")]
    assert record.starts[1].get("resubmitted_after") == "41" and record.first_restart("42") == 1
    # submitit's loader in the new job's tasks finds the task under the new id.
    assert (tmp_path / "logs" / "42_submitted.pkl").read_bytes() == b"task"
    # Recorded twice (a retried call): one start still.
    assert record_successor(tmp_path, "42", "41", 0) and len(registry.read(tmp_path).starts) == 2


@pytest.mark.parametrize("values", [{"state": "CANCELLED"}, {CANCEL_REQUESTED: "41"}],
                         ids=["ended", "cancel-asked"])
def test_a_successor_of_a_cancelled_run_is_not_recorded(tmp_path, values):
    a_run(tmp_path, **values)
    assert not record_successor(tmp_path, "42", "41", 0)
    assert registry.read(tmp_path).job_id == "41"


def test_a_cancel_asked_of_an_earlier_job_does_not_stop_a_successor(tmp_path):
    a_run(tmp_path, **{CANCEL_REQUESTED: "7"})     # a cancel of the run before `glaunch resume`
    assert record_successor(tmp_path, "42", "41", 0)


@pytest.mark.parametrize("lines, asked", [
    ("41\n", True),                        # `glaunch cancel` asked this job to end
    ("7\n41\n", True),                     # after an earlier one (a cancel before a resume)
    ("7\n", False),                        # another job's
    ("41", True),                           # the last line unended
    ("x41\n41x\n$(id)\n", False),           # nothing that is not the job's id
])
def test_the_cancel_file_written_where_the_run_lives_stops_a_successor_of_the_job_it_names(tmp_path, lines, asked):
    a_run(tmp_path)
    (tmp_path / "cancel-requested").write_text(lines)
    assert registry.cancel_asked(tmp_path, registry.read(tmp_path), "41") is asked
    assert record_successor(tmp_path, "42", "41", 0) is not asked


def test_a_cancel_is_said_in_the_cancel_file_once_per_job_asked(tmp_path):
    a_run(tmp_path)
    registry.request_cancel(tmp_path, "41")
    registry.request_cancel(tmp_path, "42_3")
    assert (tmp_path / "cancel-requested").read_text() == "41\n42_3\n"
    with pytest.raises(GlaunchError):
        registry.request_cancel(tmp_path, "41\n42")
    assert (tmp_path / "cancel-requested").read_text() == "41\n42_3\n"


@pytest.mark.parametrize("job_id", ["", "42;x", "42_1", "../42"])
def test_a_successor_must_be_a_plain_job_id(tmp_path, job_id):
    a_run(tmp_path)
    with pytest.raises(ValueError):
        record_successor(tmp_path, job_id, "41", 0)


def test_sacct_rows_of_a_resubmitted_job_fold_into_its_own_restarts():
    record = RunRecord.from_dict({"run_id": "r", "job_id": "42", "starts": [
        {"job_id": "41", "restart": 0, "state": "REQUEUED", "ended": "x"},
        {"job_id": "42", "restart": 1, "state": "PENDING", "resubmitted_after": "41"}]})
    row = {"job_id": "42", "state": "RUNNING", "start": "2026-01-01T00:02:00", "end": "Unknown", "nodes": "node1"}
    merge_history(record, [row, dict(row, state="PENDING", start="Unknown")])
    assert [(s.job_id, s.restart) for s in record.starts] == [("41", 0), ("42", 1), ("42", 2)]
    assert record.starts[1].state == "RUNNING" and record.first_restart("42") == 1


def test_a_resubmitted_job_that_recorded_its_ends_is_settled():
    ended = {"state": "COMPLETED", "ended": "2026-01-01T00:03:00+00:00"}
    record = RunRecord.from_dict({"run_id": "r", "job_id": "42", "state": "COMPLETED", "starts": [
        {"job_id": "41", "restart": 0, "state": "REQUEUED", "ended": "2026-01-01T00:01:00+00:00"},
        {"job_id": "42", "restart": 1, "resubmitted_after": "41", **ended}]})
    assert settled(record)
    record.starts.append(RunRecord.from_dict({"run_id": "r", "starts": [{"job_id": "42", "restart": 3, **ended}]})
                         .starts[0])
    assert not settled(record)       # restart 2 is missing: sacct may know it


def test_a_resubmitted_job_numbers_its_starts_after_its_predecessor_and_shares_its_budgets(tmp_path):
    """Both roads in one run: job 41 restarted once in its allocation (start 1), then hit
    the time limit and handed the run to job 42. Job 42's batch script begins at start 3
    (Slurm's requeue count says 0), a later requeue of 42 at 4 past a step it restarted,
    sacct's rows of 42 map onto those starts, and requeue.max and crash_retries count the
    whole chain, not job 42 alone."""
    a_run(tmp_path)
    record = registry.read(tmp_path)
    record.starts[0].update(state="RESTARTED", reason="crash")
    record.starts.append(registry.new_start("41", 1, state="REQUEUED", reason="timeout",
                                            ended="2026-01-01T00:02:00+00:00"))
    registry.write(tmp_path, record)
    assert record_successor(tmp_path, "42", "41", 1)
    record = registry.read(tmp_path)
    assert record.first_restart("42") == 2
    assert record.next_restart("42", 0) == 2
    record.starts[-1].update(state="RESTARTED", reason="hang", ended="2026-01-01T00:03:00+00:00")
    record.starts.append(registry.new_start("42", 3, state="REQUEUED", reason="preemption",
                                            ended="2026-01-01T00:04:00+00:00"))
    assert record.next_restart("42", 1) == 4
    assert [record.allocation_start("42", index) for index in (0, 1)] == [2, 4]
    assert record.requeues_before("42", 4) == 2      # 41's time limit and 42's preemption
    assert record.crash_count(job_id="42") == 2      # 41's crash and 42's hang
    assert record.resubmission_chain("42") == {"41", "42"} and record.resubmission_chain("41") == {"41"}


def test_a_resubmitted_job_is_kept_off_every_node_excluded_so_far(tmp_path, monkeypatch):
    """A time-limit start whose watchdog named a slow node (slow_node: exclude): the new job
    is submitted with --exclude of the nodes kept off before and the slow one."""
    from launcher.jobcontrol import jobend
    monkeypatch.setattr(jobend, "requeue_mode_setting", lambda run_dir: "resubmit")
    ending = Outcome("REQUEUED", "timeout", True, 0)
    assert jobend.next_start_line(ending, tmp_path, ["n1", "n3"], ["n1"]) == "resubmit n1,n3"
    assert jobend.next_start_line(ending, tmp_path, None, ["n1"]) == "resubmit n1"
    assert jobend.next_start_line(ending, tmp_path, None, []) == "resubmit"
