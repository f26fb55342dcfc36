"""A job cancelled with a plain `scancel` (not `glaunch cancel`) ends its run CANCELLED:
slurmstepd's line in the batch log says so, while the ranks, stopped by the SIGTERM that
came with it, look just like a start stopped by the time limit's warning, which requeues.
And a job Slurm took back for a node's failure ends its start as a node failure, not as
the preemption the requeue would otherwise be read as. The lines are recorded from Slurm
22.05 (the local clusters) and 24.11 (scripts/slurm-release)."""

from __future__ import annotations

import json

import pytest

from launcher import api
from launcher.jobcontrol import jobend
from launcher.jobcontrol.jobend import StepEnd, cancelled_in_log, end_of_start, failed_node_in_log
from launcher.rundir import registry
from launcher.rundir.layout import RunDir
from test_plain_script_end import started_run

CANCELLED = "slurmstepd-node1: error: *** JOB 1000 ON node1 CANCELLED AT 2026-12-06T23:50:29 ***"
# What Slurm writes for the ends that are its own: never a cancel of the user's.
TIME_LIMIT = "slurmstepd-node1: error: *** JOB 1000 ON node1 CANCELLED AT 2026-12-06T23:50:29 DUE TO TIME LIMIT ***"
REQUEUE = "slurmstepd-node1: error: *** JOB 1000 ON node1 CANCELLED AT 2026-12-06T23:51:26 DUE TO JOB REQUEUE ***"
PREEMPTION = "slurmstepd-node1: error: *** JOB 1000 ON node1 CANCELLED AT 2026-12-06T23:51:26 DUE TO PREEMPTION ***"
STEP = "slurmstepd-node1: error: *** STEP 1000.0 ON node1 CANCELLED AT 2026-12-06T23:34:17 ***"
EARLIER_START = "glaunch: start 0 of job 1000 ended: REQUEUED (preemption); requeueing\n"


@pytest.mark.parametrize("log, job_id, cancelled", [
    (CANCELLED, "1000", True),
    ("srun: error: node1: task 0: Terminated\n" + CANCELLED + "\n", "1000", True),
    (CANCELLED.replace("slurmstepd-node1", "slurmstepd"), "1000", True),
    (CANCELLED, "1001", False),                           # another job's line: not this job's cancel
    (CANCELLED, "1000_3", True),                          # an array element: its line names its own id
    (TIME_LIMIT, "1000", False),
    (REQUEUE, "1000", False),
    (PREEMPTION, "1000", False),
    (STEP, "1000", False),                                # a step ended (the watchdog's), not the job
    (CANCELLED + "\n" + EARLIER_START, "1000", False),    # an earlier start's end
    ("[r0] " + CANCELLED, "1000", False),                 # not slurmstepd's own line
    ("", "1000", False),
    (CANCELLED, None, True),
    # a slurmd whose SLURM_TIME_FORMAT writes another time
    ("slurmstepd-node1: error: *** JOB 1000 ON node1 CANCELLED AT Sun Dec  6 23:50:29 2026 ***", "1000", True),
    ("slurmstepd-node1: error: *** JOB 1000 ON node1 CANCELLED AT Sun Dec  6 23:50:29 2026 DUE TO TIME LIMIT ***",
     "1000", False),
])
def test_a_cancel_is_read_from_slurmstepd_s_own_line_in_this_start(log, job_id, cancelled):
    assert cancelled_in_log(log, job_id) is cancelled


def stopped_by_sigterm(tmp_path, batch_log: str, *, preempted: bool = False):
    """A run whose ranks saved and stopped at step 29 on the SIGTERM (stop.json of start 0),
    its batch log ending as `batch_log`: the road its start's end takes, and the run."""
    run_dir = started_run(tmp_path)
    with registry.updating(run_dir) as record:
        record.requeue_max = 3
    RunDir(run_dir).stop_file.write_text(json.dumps({"restart": 0, "step": 29}))
    RunDir(run_dir).log_dir.mkdir(exist_ok=True)
    RunDir(run_dir).batch_log("1000").write_text(f"glaunch: start 0: ...\n{batch_log}\n")
    return end_of_start(run_dir, StepEnd(0, preempted=preempted), "1000", 0), run_dir


def test_a_plain_scancel_ends_the_run_cancelled_and_nothing_requeues(tmp_path, isolated_env):
    road, run_dir = stopped_by_sigterm(tmp_path, CANCELLED)
    assert road.line() == "done" and road.exit_code == 1
    summary = api.status(str(run_dir))
    assert summary["state"] == "CANCELLED" and summary["reason"] == "cancelled"
    assert summary["starts"][0]["stopped_at"] == 29


def test_a_stop_without_the_cancel_line_is_the_time_limit_s_and_requeues(tmp_path, isolated_env):
    road, run_dir = stopped_by_sigterm(tmp_path, TIME_LIMIT)
    assert road.line() in ("requeue", "resubmit")
    assert registry.read(run_dir).starts[0].reason == "timeout"


# --- a node's failure (Slurm 22.05's lines, as a node set DOWN under a running job left them) ---

NODE_FAILED = ("srun: error: Node failure on dnode2\n"
               "slurmstepd-dnode1: error: *** JOB 501158 ON dnode1 CANCELLED AT 2026-12-07T00:06:14 DUE TO NODE "
               "FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***\n")


@pytest.mark.parametrize("log, node", [
    (NODE_FAILED, "dnode2"),
    (NODE_FAILED.splitlines()[1], ""),                   # the job's end alone: a node failed, which not said
    (NODE_FAILED + EARLIER_START, None),                 # an earlier start's
    ("srun: error: Node failure on dnode[2-3]\n", "dnode[2-3]"),    # a hostlist: no one node to blame
    (PREEMPTION, None),
    ("[r1] srun: error: Node failure on dnode2\n", None),
])
def test_a_node_s_failure_is_read_from_srun_and_slurmstepd(log, node):
    assert failed_node_in_log(log) == node


def test_a_start_slurm_took_back_for_a_node_s_failure_is_no_preemption(tmp_path, isolated_env, monkeypatch):
    """Slurm requeues a job whose node failed as it does a preempted one: the start ends
    with reason "node failure", naming the node, which is the one the start blames."""
    run_dir = started_run(tmp_path)
    with registry.updating(run_dir) as record:
        record.requeue_max = 3
    RunDir(run_dir).log_dir.mkdir(exist_ok=True)
    RunDir(run_dir).batch_log("1000").write_text(f"glaunch: start 0: ...\n{NODE_FAILED}")
    monkeypatch.setattr(jobend, "exclude_bad_nodes_setting", lambda run_dir: (True, ""))
    monkeypatch.setattr(jobend, "partition_nodes", lambda partition: (["dnode1", "dnode2", "dnode3"], ""))
    road = end_of_start(run_dir, StepEnd(143, preempted=True), "1000", 0)
    assert road.line() == "requeue dnode2"
    start = registry.read(run_dir).starts[0]
    assert (start.state, start.reason, start.detail) == ("REQUEUED", "node failure", "node dnode2 failed")
    assert start.exclusion == "dnode2 excluded from later starts"


# --- a task a signal ended first, which could write no crash.json --------------------------------

KILLED_FIRST = ("srun: error: dnode2: task 2: Killed\n"
                "srun: error: dnode2: task 3: Exited with exit code 1\n"
                "srun: error: dnode1: tasks 0-1: Exited with exit code 1\n")
PEER_ERROR = {"restart": 0, "job_id": "1000", "task": 3, "node": "dnode2",
              "error": "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"}


@pytest.mark.parametrize("log, first", [
    (KILLED_FIRST, (2, "dnode2", "Killed")),
    ("srun: error: dnode1: tasks 0-1: Segmentation fault\n", (0, "dnode1", "Segmentation fault")),
    (KILLED_FIRST.split("\n", 1)[1], None),            # the first ended by itself
    ("glaunch: start 0\n" + KILLED_FIRST + "glaunch: start 1: a new step on dnode3\n", None),
    ("[r2] srun: error: dnode2: task 2: Killed\n", None),
])
def test_the_first_task_srun_says_a_signal_ended(log, first):
    assert jobend.first_task_line(log) == first


def ended_under_srun(tmp_path, monkeypatch, batch_log: str, status: int, crash: dict | None = None,
                     started_again: tuple[int, ...] = ()):
    """A run of 4 ranks under launcher srun whose start 0 ended with `status`, its batch log
    ending as `batch_log`, crash.json as `crash` wrote it (none: no rank wrote one), the
    ranks `started_again` asked for by their peers (recovery.peer); the run directory, once
    the start's end is recorded."""
    run_dir = started_run(tmp_path)
    if crash is not None:
        RunDir(run_dir).crash_file.write_text(json.dumps(crash))
    for rank in started_again:
        request = RunDir(run_dir).peer_replace_request("1000", 0, 1, rank)
        request.parent.mkdir(parents=True, exist_ok=True)
        request.write_text("{}")
    RunDir(run_dir).log_dir.mkdir(exist_ok=True)
    RunDir(run_dir).batch_log("1000").write_text("glaunch: start 0: ...\n" + batch_log)
    spec = type("Spec", (), {"launcher": "srun", "world_size": 4, "ranks_per_node": 2, "exclude_bad_nodes": False})()
    monkeypatch.setattr(jobend, "read_task_spec", lambda path: spec)
    end_of_start(run_dir, StepEnd(status), "1000", 0)
    return run_dir


def test_a_task_killed_first_is_the_start_s_first_failure_not_the_peer_that_lost_it(tmp_path, isolated_env,
                                                                                   monkeypatch):
    """kill -9 of rank 2: srun names it first; rank 3's crash.json says only that its peer
    went away. The start's end names rank 2, killed, and blames its node."""
    run_dir = ended_under_srun(tmp_path, monkeypatch, KILLED_FIRST, 137, PEER_ERROR)
    start = registry.read(run_dir).starts[0]
    assert (start.state, start.reason) == ("FAILED", "crash")
    assert start.detail == "exit status 137; task 2 on dnode2: killed by SIGKILL (out of memory?)"
    crash = json.loads(RunDir(run_dir).crash_file.read_text())
    assert crash["followed_by"] == f"task 3 on dnode2: {PEER_ERROR['error']}"
    assert jobend.killed_first(PEER_ERROR, (3, "dnode2", "Killed"), 0) is None      # crash.json's own task


def test_a_sweep_element_s_cancel_is_read_from_its_array_task_s_log(tmp_path, isolated_env):
    """slurmstepd writes an array task's cancel into the array's output (the sweep's
    logs/%A_%a.log), not the element's own batch log."""
    run_dir = tmp_path / "sweep" / "sweep-0"
    (run_dir / "logs").mkdir(parents=True)
    (tmp_path / "sweep" / "logs").mkdir()
    RunDir(run_dir).batch_log("2396_1").write_text("glaunch: start 0: ...\n")

    def scancelled(job_id):
        logs = jobend.batch_log_tail(RunDir(run_dir).batch_log(job_id)), jobend.array_log_tail(run_dir, job_id)
        return jobend.scancelled(*logs, job_id)

    assert not scancelled("2396_1")
    (tmp_path / "sweep" / "logs" / "2396_1.log").write_text(CANCELLED.replace("1000", "2398") + "\n")
    assert scancelled("2396_1")
    assert not scancelled("2396_2")


def test_a_rank_killed_then_started_again_by_its_peers_is_not_the_later_crash_s_first_failure(
        tmp_path, isolated_env, monkeypatch):
    """recovery.peer: rank 3 was lost (srun: Killed) and started again; rank 1 crashed later
    on its own. crash.json (rank 1's) stands."""
    own = {"restart": 0, "job_id": "1000", "task": 1, "node": "dnode1", "error": "ValueError: bad batch"}
    run_dir = ended_under_srun(tmp_path, monkeypatch, "srun: error: dnode2: task 3: Killed\n"
                               "srun: error: dnode1: task 1: Exited with exit code 1\n", 1, own, started_again=(3,))
    assert json.loads(RunDir(run_dir).crash_file.read_text()) == own
    assert registry.read(run_dir).starts[0].detail == "exit status 1; task 1 on dnode1: ValueError: bad batch"


def test_a_cancelled_start_keeps_crash_json_as_the_ranks_wrote_it(tmp_path, isolated_env, monkeypatch):
    run_dir = ended_under_srun(tmp_path, monkeypatch, KILLED_FIRST + CANCELLED + "\n", 137, PEER_ERROR)
    assert registry.read(run_dir).starts[0].state == "CANCELLED"
    assert json.loads(RunDir(run_dir).crash_file.read_text()) == PEER_ERROR


def test_a_step_cancelled_by_hand_is_said_so_not_as_an_out_of_memory_kill(tmp_path, isolated_env, monkeypatch):
    """`scancel JOB.0` (an administrator ending one step): srun's tasks end by SIGKILL; the
    start's crash names the cancelled step (slurmstepd's STEP line), not the OOM killer."""
    run_dir = ended_under_srun(tmp_path, monkeypatch, STEP + "\nsrun: error: node1: tasks 0-1: Killed\n", 137)
    start = registry.read(run_dir).starts[0]
    assert (start.state, start.reason) == ("FAILED", "crash")
    assert start.detail == "job step 1000.0 was cancelled (scancel of the step, not of the job)"
    assert jobend.cancelled_step_in_log(STEP + "\n" + EARLIER_START) is None


# --- a step glaunch ended after every rank had exited (a node's slurmstepd gone) -----------

# What srun 22.05 wrote when the step was ended with its two SIGINTs, node2's slurmstepd killed.
OUTLIVED_STEP = """srun: interrupt (one more within 1 sec to abort)
srun: StepId=1000.0 tasks 2-3: running
srun: StepId=1000.0 tasks 0-1: exited
srun: sending Ctrl-C to StepId=1000.0
srun: forcing job termination
srun: Job step aborted: Waiting up to 12 seconds for job step to finish.
srun: error: Timed out waiting for job step to complete"""


@pytest.mark.parametrize("log, crashed, status", [
    (OUTLIVED_STEP, False, 0),                                          # no task failed: srun's 1 says only it was ended
    (OUTLIVED_STEP, True, 1),                                           # a rank's crash.json: srun's status stands
    ("srun: error: node2: task 3: Exited with exit code 3\n" + OUTLIVED_STEP, False, 1),
    ("srun: error: node2: task 3: Exited with exit code 3\n" + EARLIER_START + OUTLIVED_STEP, False, 0),
    # a rank stuck in its teardown, which glaunch's interrupt ended: not a failure of its own
    (OUTLIVED_STEP + "\nsrun: error: node2: task 3: Killed", False, 0),
])
def test_a_step_ended_after_its_ranks_exited_keeps_a_failure_srun_or_a_rank_reported(log, crashed, status):
    assert jobend.outlived_step_status(1, log, crashed) == status


def test_a_step_that_outlived_its_ranks_ends_as_they_did_and_says_why_glaunch_ended_it(tmp_path, isolated_env):
    run_dir = started_run(tmp_path)
    RunDir(run_dir).log_dir.mkdir(exist_ok=True)
    RunDir(run_dir).batch_log("1000").write_text(f"glaunch: start 0: ...\n{OUTLIVED_STEP}\n")
    road = end_of_start(run_dir, StepEnd(1, outlived=True), "1000", 0)
    assert road.line() == "done" and road.exit_code == 0
    summary = api.status(str(run_dir))
    assert summary["state"] == "COMPLETED"
    assert jobend.OUTLIVED in summary["starts"][0]["detail"]
    # A crash stays one: the ranks' own word.
    (tmp_path / "crashed").mkdir()
    run_dir = started_run(tmp_path / "crashed")
    RunDir(run_dir).log_dir.mkdir(exist_ok=True)
    RunDir(run_dir).batch_log("1000").write_text(f"glaunch: start 0: ...\n{OUTLIVED_STEP}\n")
    RunDir(run_dir).crash_file.write_text(json.dumps({"restart": 0, "job_id": "1000", "task": 1, "node": "node1",
                                                      "error": "ValueError: boom"}))
    end_of_start(run_dir, StepEnd(1, outlived=True), "1000", 0)
    start = registry.read(run_dir).starts[0]
    assert (start.state, start.reason) == ("FAILED", "crash") and jobend.OUTLIVED in start.detail


# --- a job someone requeued (scontrol requeue), not a preemption ---------------------------

OWN_REQUEUE_AFTER_START_0 = ("glaunch: start 0 of job 1000 ended: REQUEUED (timeout); requeueing\n"
                             + REQUEUE + "\nglaunch: start 1 of job 1000 begins\n")


@pytest.mark.parametrize("log, requeued", [
    (REQUEUE, True),
    ("glaunch: start 1 of job 1000 begins\n" + REQUEUE, True),
    # glaunch's own requeue of the start before: its line precedes this start's first
    (OWN_REQUEUE_AFTER_START_0, False),
    (OWN_REQUEUE_AFTER_START_0 + REQUEUE, True),
    (PREEMPTION, False),
    (CANCELLED, False),
    ("[r0] " + REQUEUE, False),
])
def test_a_requeue_is_read_from_slurmstepd_s_line_in_this_start_only(log, requeued):
    assert jobend.requeued_in_log(log) is requeued


def test_a_start_someone_requeued_says_so_not_preemption(tmp_path, isolated_env):
    _, run_dir = stopped_by_sigterm(tmp_path, REQUEUE, preempted=True)
    start = registry.read(run_dir).starts[0]
    assert (start.state, start.reason) == ("REQUEUED", "requeued")
    # Without the line, a start Slurm took back was preempted.
    (tmp_path / "other").mkdir()
    run_dir = started_run(tmp_path / "other")
    RunDir(run_dir).log_dir.mkdir(exist_ok=True)
    RunDir(run_dir).batch_log("1000").write_text(OWN_REQUEUE_AFTER_START_0)
    end_of_start(run_dir, StepEnd(0, preempted=True), "1000", 0)
    assert registry.read(run_dir).starts[0].reason == "preemption"


ARRAY_TASK_BEGINS = "glaunch: start of array task 1000_2 begins (Slurm restart count {n})\n"


@pytest.mark.parametrize("dispatch, reason", [
    (ARRAY_TASK_BEGINS.format(n=0) + REQUEUE + "\n", "requeued"),
    # glaunch's own requeue of the start before, in the task's log before this start began
    (ARRAY_TASK_BEGINS.format(n=0) + REQUEUE + "\n" + ARRAY_TASK_BEGINS.format(n=1), "preemption"),
    (ARRAY_TASK_BEGINS.format(n=0) + PREEMPTION + "\n", "preemption"),
])
def test_a_sweep_element_someone_requeued_is_read_from_its_array_task_s_log(tmp_path, isolated_env, dispatch,
                                                                             reason):
    # An element's batch log is its own; slurmstepd writes its lines about the array task in
    # the sweep's logs/%A_%a.log, where array.sbatch begins each start with its own line.
    run_dir = started_run(tmp_path)
    with registry.updating(run_dir) as record:
        record.requeue_max, record.job_id = 3, "1000_2"
        record.starts = [registry.new_start("1000_2", 0, state="RUNNING", started="2026-01-01T00:00:00+00:00")]
    RunDir(run_dir).stop_file.write_text(json.dumps({"restart": 0, "step": 29}))
    RunDir(run_dir).log_dir.mkdir(exist_ok=True)
    RunDir(run_dir).batch_log("1000_2").write_text("glaunch: start 0 of job 1000_2 begins\n")
    (run_dir.parent / "logs").mkdir()
    (run_dir.parent / "logs" / "1000_2.log").write_text(dispatch)
    end_of_start(run_dir, StepEnd(0, preempted=True), "1000_2", 0)
    start = registry.read(run_dir).starts[0]
    assert (start.state, start.reason) == ("REQUEUED", reason)
