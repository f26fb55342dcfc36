"""A job cancelled with a plain `scancel` (not `glaunch cancel`) ends its run CANCELLED:
slurmstepd's line in the batch log says so, while the ranks, stopped by the SIGTERM that
came with it, look just like a start stopped by the time limit's warning, which requeues.
The lines are recorded from Slurm 22.05 (the local clusters) and 24.11 (scripts/slurm-release)."""

from __future__ import annotations

import json

import pytest

from launcher import api
from launcher.jobcontrol.jobend import StepEnd, cancelled_in_log, end_of_start
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
])
def test_a_cancel_is_read_from_slurmstepd_s_own_line_in_this_start(log, job_id, cancelled):
    assert cancelled_in_log(log, job_id) is cancelled


def stopped_by_sigterm(run_dir, batch_log: str) -> None:
    """The ranks saved and stopped at step 29 on the SIGTERM (stop.json of start 0), and
    the batch log ends as `batch_log`."""
    RunDir(run_dir).stop_file.write_text(json.dumps({"restart": 0, "step": 29}))
    RunDir(run_dir).log_dir.mkdir(exist_ok=True)
    RunDir(run_dir).batch_log("1000").write_text(batch_log)


def test_a_plain_scancel_ends_the_run_cancelled_and_nothing_requeues(tmp_path, isolated_env):
    run_dir = started_run(tmp_path)
    with registry.updating(run_dir) as record:
        record.requeue_max = 3
    stopped_by_sigterm(run_dir, f"glaunch: start 0: ...\n{CANCELLED}\n")
    road = end_of_start(run_dir, StepEnd(0), "1000", 0)
    assert road.line() == "done" and road.exit_code == 1
    summary = api.status(str(run_dir))
    assert summary["state"] == "CANCELLED" and summary["reason"] == "cancelled"
    assert summary["starts"][0]["stopped_at"] == 29


def test_a_stop_without_the_cancel_line_is_the_time_limit_s_and_requeues(tmp_path, isolated_env):
    run_dir = started_run(tmp_path)
    with registry.updating(run_dir) as record:
        record.requeue_max = 3
    stopped_by_sigterm(run_dir, f"glaunch: start 0: ...\n{TIME_LIMIT}\n")
    road = end_of_start(run_dir, StepEnd(0), "1000", 0)
    assert road.line() in ("requeue", "resubmit")
    assert registry.read(run_dir).starts[0].reason == "timeout"
