"""Whether Slurm took the job back while a start ran, read from `scontrol show job` of the
controller's own job once its step ended: a preemption (PreemptTime set) or a requeue
(`scontrol requeue`: the job is pending again, or requeued). A job still running is neither."""

import pytest

from launcher.jobcontrol.controller import PREEMPTED, taken_back


@pytest.mark.parametrize("shown, taken_back", [
    ("JobId=7 JobState=PENDING Reason=BeginTime Requeue=1 Restarts=1 PreemptTime=None", True),
    ("JobId=7 JobState=REQUEUED Reason=None Restarts=1 PreemptTime=None", True),
    ("JobId=7 JobState=REQUEUE_HOLD Reason=JobHeldUser PreemptTime=None", True),
    ("JobId=7 JobState=RUNNING Reason=None Restarts=0 PreemptTime=2026-12-05T15:34:11", True),
    ("JobId=7 JobState=RUNNING Reason=None Restarts=0 PreemptTime=None", False),
    ("JobId=7 JobState=COMPLETING Reason=NonZeroExitCode PreemptTime=None", False),
    ("", False),
])
def test_a_job_slurm_took_back(shown, taken_back):
    assert (PREEMPTED.search(shown) is not None) is taken_back


@pytest.mark.parametrize("shown, restart_count, taken", [
    ("JobState=RUNNING Restarts=1 PreemptTime=None", "0", True),     # requeued while its processes end
    ("JobState=COMPLETING Restarts=3 PreemptTime=None", "2", True),
    ("JobState=RUNNING Restarts=1 PreemptTime=None", "1", False),    # the start of that requeue
    ("JobState=RUNNING Restarts=0 PreemptTime=None", "", False),
    ("JobState=RUNNING PreemptTime=None", "0", False),
])
def test_a_requeue_counted_since_the_start_began_is_a_job_taken_back(shown, restart_count, taken):
    assert taken_back(shown, restart_count) is taken
