"""A crash or a hang restarted inside the job's allocation, decided without a cluster: which
nodes the new step runs on (spares replace the node the failure points at), when the job
requeues instead, how starts are numbered across steps and requeues, and what run.json
keeps of each restart."""

from __future__ import annotations

import json

import pytest

from launcher.rundir import registry
from launcher.rundir.records import RunRecord, StartRecord
from launcher.jobcontrol import jobend
from launcher.jobcontrol.jobend import NextStep, Outcome, restart_in_allocation

CRASH = Outcome("REQUEUED", "crash", True, 0, "exit status 1; retry 1 of 2")
HANG = Outcome("REQUEUED", "hang", True, 0, "the watchdog ended the step; retry 1 of 2")
TIMEOUT = Outcome("REQUEUED", "timeout", True, 0)
FAILED = Outcome("FAILED", "crash", False, 1, "exit status 1; crash_retries (1) used up")


def step(outcome=CRASH, *, bad="n1", avoid_bad=True, allocation=("n1", "n2"), in_use=("n1",), before=(), needed=1):
    return restart_in_allocation(outcome, bad=bad, avoid_bad=avoid_bad, allocation=list(allocation),
                                 in_use=list(in_use), left_out_before=list(before), needed=needed)


def test_a_spare_takes_the_place_of_the_node_a_crash_or_a_hang_points_at():
    assert step() == NextStep(("n2",), "n1", "n1 left out of the next step in the allocation; n2 took its place")
    assert step(HANG) == step()
    # Two of four training nodes, one spare: the healthy node stays, in the allocation's order.
    assert step(bad="n3", allocation=("n1", "n2", "n3", "n4"), in_use=("n1", "n3"), needed=2).nodes == ("n1", "n2")


def test_the_same_nodes_when_the_failure_points_at_none_or_exclusion_is_off():
    assert step(bad=None) == NextStep(("n1",), None, "restarted in its allocation on the same nodes")
    assert step(avoid_bad=False) == NextStep(("n1",), None, "restarted in its allocation on the same nodes")
    # Without a spare, too: the allocation keeps every node the step needs.
    assert step(bad=None, allocation=("n1",)).nodes == ("n1",)


def test_requeue_when_the_allocation_cannot_spare_the_node():
    assert step(allocation=("n1",)) is None                                   # no spare
    assert step(allocation=("n1", "n2"), in_use=("n1", "n2"), needed=2) is None
    # The spare was used by an earlier restart; the node it replaced stays out.
    assert step(bad="n2", in_use=("n2",), before=("n1",)) is None
    assert step(bad="n2", allocation=("n1", "n2", "n3"), in_use=("n2",), before=("n1",)).nodes == ("n3",)


@pytest.mark.parametrize("outcome", [TIMEOUT, FAILED])
def test_only_a_crash_or_a_hang_within_its_retries_restarts_in_the_allocation(outcome):
    assert step(outcome) is None


def test_no_restart_outside_a_batch_job():
    assert step(allocation=()) is None


def _start(restart, state, job_id="7", **values):
    return StartRecord(job_id=job_id, restart=restart, state=state, ended="2026-12-04T10:00:00", **values)


def test_start_numbers_go_on_past_the_steps_restarted_in_an_allocation():
    record = RunRecord(run_id="r", starts=[_start(0, "RESTARTED", left_out="n1"), _start(1, "REQUEUED"),
                                           StartRecord(job_id="7", restart=2)])
    # Slurm requeued the job once; steps 0 and 1 ran in the first allocation.
    assert record.next_restart("7", 1) == 2
    assert record.next_restart("8", 0) == 0                       # another job: its own numbers
    assert RunRecord(run_id="r", starts=[StartRecord(job_id="7", restart=0)]).next_restart("7", 0) == 0
    assert record.requeues_before("7", 2) == 1 and record.requeues_before("7", 1) == 0
    # sacct's rows are allocations: the second began with start 2.
    assert [record.allocation_start("7", i) for i in range(3)] == [0, 2, 3]
    assert record.left_out_in_allocation("7", 1) == ["n1"]
    assert record.left_out_in_allocation("7", 2) == []


@pytest.fixture
def job(tmp_path, monkeypatch, isolated_env):
    """A run of one training node and one spare, with jobend's cluster calls stubbed."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    registry.write(run_dir, RunRecord(run_id="r", state="RUNNING", nodes=1, requeue_max=3, crash_retries=2,
                                      job_id="7", starts=[StartRecord(job_id="7", restart=0)]))
    monkeypatch.setattr(jobend, "exclude_bad_nodes_setting", lambda run_dir: (True, ""))
    monkeypatch.setattr(jobend, "partition_nodes", lambda partition: (None, "no sinfo here"))
    monkeypatch.setenv("GLAUNCH_JOB_ID", "7")
    return run_dir


def _end(run_dir, monkeypatch, capsys, restart, node, in_use):
    monkeypatch.setenv("GLAUNCH_RESTART", str(restart))
    (run_dir / "crash.json").write_text(json.dumps({"restart": restart, "task": 0, "node": node, "error": "x"}))
    code = jobend.main([str(run_dir), "--status", "1", "--allocation", "n1,n2", "--step-nodes", in_use])
    return code, capsys.readouterr().out.strip()


def test_jobend_restarts_on_the_spare_then_requeues_with_none_left(job, monkeypatch, capsys):
    assert _end(job, monkeypatch, capsys, 0, "n1", "n1") == (0, "restart n2")
    record = registry.read(job)
    first = record.start("7", 0)
    assert (first.state, first.reason, first.bad_node, first.left_out, first.spare_nodes, first.get("nodes")) == (
        "RESTARTED", "crash", "n1", "n1", 1, "n1")
    assert first.exclusion == "n1 left out of the next step in the allocation; n2 took its place"
    assert record.state == "RUNNING" and record.excluded_nodes == []

    # The new step's node fails too: n1 stays out, nothing is left to spare, the job requeues.
    assert _end(job, monkeypatch, capsys, 1, "n2", "n2") == (0, "requeue")
    second = registry.read(job).start("7", 1)
    assert (second.state, second.left_out, second.spare_nodes) == ("REQUEUED", None, 1)
    assert second.exclusion == "n2 not excluded: the partition's nodes are not known (no sinfo here)"

    # The requeued job's batch script begins start 2, though Slurm requeued it once.
    monkeypatch.setenv("GLAUNCH_RESTART", "1")
    assert jobend.main([str(job), "--begin"]) == 0
    assert capsys.readouterr().out.strip() == "start 2"


def test_a_lost_rank_that_could_not_be_started_again_is_the_node_left_out(job, monkeypatch, capsys):
    """Peer recovery ended the step for rank 3, lost on n2 past its bound of new processes;
    rank 1's crash.json (its node written as n1) says only how the step's end stopped it.
    n2 is the bad node, and the spare n1 takes its place."""
    from launcher.jobcontrol.replace import note_not_started

    monkeypatch.setenv("GLAUNCH_RESTART", "0")
    note_not_started(job, "7", 0, 3, "n2", "4 processes were already started again in this start")
    (job / "crash.json").write_text(json.dumps({"restart": 0, "task": 1, "node": "n1",
                                                "error": "KeyboardInterrupt"}))
    assert jobend.main([str(job), "--status", "1", "--allocation", "n1,n2", "--step-nodes", "n2"]) == 0
    assert capsys.readouterr().out.strip() == "restart n1"
    first = registry.read(job).start("7", 0)
    assert (first.reason, first.bad_node, first.left_out) == ("crash", "n2", "n2")


def test_jobend_without_the_allocation_requeues_as_before(job, monkeypatch, capsys):
    monkeypatch.setenv("GLAUNCH_RESTART", "0")
    (job / "crash.json").write_text(json.dumps({"restart": 0, "task": 0, "node": "n1", "error": "x"}))
    assert jobend.main([str(job), "--status", "1"]) == 0
    assert capsys.readouterr().out.strip() == "requeue"


@pytest.mark.parametrize("partition, line, exclusion", [
    (["n1", "n2", "n3"], "requeue n2", "n2 excluded from later starts"),
    (["n1", "n2"], "requeue", "n2 not excluded: partition (default) would keep 1 usable node(s), the job needs 2"),
])
def test_a_requeue_excludes_no_node_that_the_job_with_its_spares_needs(partition, line, exclusion, job,
                                                                      monkeypatch, capsys):
    """A job of 1 node + 1 spare whose restarts in the allocation are used up: the requeue
    may exclude the failing node only while 2 usable nodes remain for the job's request
    (nodes + spares); fewer would keep the requeued job pending for ever."""
    monkeypatch.setattr(jobend, "partition_nodes", lambda names: (partition, ""))
    assert _end(job, monkeypatch, capsys, 0, "n1", "n1") == (0, "restart n2")
    assert _end(job, monkeypatch, capsys, 1, "n2", "n2") == (0, line)
    record = registry.read(job)
    assert record.start("7", 1).exclusion == exclusion
    assert record.excluded_nodes == (["n2"] if line != "requeue" else [])


def test_a_start_on_its_whole_allocation_keeps_slurms_form_of_the_node_list(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    assert jobend.step_node_list(["node1", "node2"], ["node2", "node1"]) == "node[1-2]"
    assert jobend.step_node_list(["node2"], ["node1", "node2"]) == "node2"          # a step beside a spare
    assert jobend.step_node_list(["node1"], []) == "node1"                          # inside salloc: the step's own
    assert jobend.step_node_list([], []) == "node[1-2]"
