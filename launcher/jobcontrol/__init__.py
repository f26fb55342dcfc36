"""The job controller: glaunch's Python on the batch host.

``controller`` is job.sbatch's one command: it runs the job's steps and, after each, goes on
as the run needs (:mod:`.jobstart` before the first step, :mod:`.jobend` after each: a
restart in the allocation, a requeue, a resubmission, or the end); the hang watchdog
(:mod:`.watchdog`, with :mod:`.logprogress` for a script without the runtime) watches the
ranks' heartbeats beside each step. It reads what the ranks leave in the run directory and
imports no torch.

The local scheduler uses it through :func:`end_of_local_start` alone (:mod:`.localstart`):
the end of a local start decided as the controller decides a Slurm one.
"""

from launcher.jobcontrol.localstart import LocalEnd, end_of_local_start

__all__ = ["LocalEnd", "end_of_local_start"]
