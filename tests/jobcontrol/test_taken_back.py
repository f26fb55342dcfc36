"""Whether Slurm took the job back while a start ran, read from `scontrol show job` of the
controller's own job once its step ended: a preemption (PreemptTime set) or a requeue
(`scontrol requeue`: the job is pending again, or requeued), or its end by the time limit
(Reason=TimeLimit), or otherwise ended (a cancel: its processes are being ended). A job
still running is none of them."""

import pytest

from launcher.jobcontrol.controller import TakenBack, taken_back


REQUEUED, PREEMPTED, TIMED_OUT, ENDED = TakenBack.REQUEUED, TakenBack.PREEMPTED, TakenBack.TIMED_OUT, TakenBack.ENDED


@pytest.mark.parametrize("shown, taken", [
    ("JobId=7 JobState=PENDING Reason=BeginTime Requeue=1 Restarts=1 PreemptTime=None", REQUEUED),
    ("JobId=7 JobState=REQUEUED Reason=None Restarts=1 PreemptTime=None", REQUEUED),
    ("JobId=7 JobState=REQUEUE_HOLD Reason=JobHeldUser PreemptTime=None", REQUEUED),
    ("JobId=7 JobState=PENDING Restarts=1 PreemptTime=2026-12-05T15:34:11", REQUEUED),
    ("JobId=7 JobState=RUNNING Reason=None Restarts=0 PreemptTime=2026-12-05T15:34:11", PREEMPTED),
    ("JobId=7 JobState=COMPLETING Reason=None Restarts=0 PreemptTime=2026-12-05T15:34:11", PREEMPTED),
    ("JobId=7 JobState=RUNNING Reason=None Restarts=0 PreemptTime=None", None),
    ("JobId=7 JobState=COMPLETING Reason=NonZeroExitCode PreemptTime=None", ENDED),
    # Recorded on Slurm 22.05 after `scancel` of a running job: while its processes end, then after.
    ("JobId=7 JobState=COMPLETING Reason=None Dependency=(null) Requeue=1 Restarts=0 PreemptTime=None", ENDED),
    ("JobId=7 JobState=CANCELLED Reason=None Dependency=(null) Requeue=1 Restarts=0 PreemptTime=None", ENDED),
    ("JobId=7 JobState=COMPLETINGX Reason=None", None),
    ("JobId=7 JobState=RUNNINGPENDING PreemptTime=Nonsense", None),
    # Recorded on Slurm 22.05 at a time limit: while its processes end, then after.
    ("JobId=7 JobState=COMPLETING Reason=TimeLimit Dependency=(null) Requeue=1 Restarts=0 PreemptTime=None",
     TIMED_OUT),
    ("JobId=7 JobState=TIMEOUT Reason=TimeLimit Restarts=0 PreemptTime=None", TIMED_OUT),
    ("JobId=7 JobState=PENDING Reason=BeginTime Restarts=1 PreemptTime=None", REQUEUED),  # requeued at it
    ("JobId=7 JobState=RUNNING Reason=TimeLimitX Restarts=0", None),
    ("", None),
])
def test_a_job_slurm_took_back(shown, taken):
    assert taken_back(shown, "0") is taken


@pytest.mark.parametrize("shown, restart_count, taken", [
    # Recorded on Slurm 22.05: `scontrol show job` in the batch script after `scontrol requeue`.
    ("JobState=COMPLETING Reason=None Restarts=1 PreemptTime=None", "0", REQUEUED),
    ("JobState=RUNNING Restarts=1 PreemptTime=None", "0", REQUEUED),     # requeued while its processes end
    ("JobState=COMPLETING Restarts=3 PreemptTime=None", "2", REQUEUED),
    ("JobState=RUNNING Restarts=1 PreemptTime=None", "1", None),         # the start of that requeue
    ("JobState=RUNNING Restarts=0 PreemptTime=None", "", None),
    ("JobState=RUNNING PreemptTime=None", "0", None),
])
def test_a_requeue_counted_since_the_start_began_is_a_job_taken_back(shown, restart_count, taken):
    assert taken_back(shown, restart_count) is taken
