"""Asking Slurm about jobs: squeue for what is queued or running now (and why a pending
job waits), sacct for every start a job had, and the lookup of a submission by its
marker or script.
"""

from __future__ import annotations

import getpass
import re
import subprocess

from launcher.errors import SchedulerError
from launcher.processes import without_tool_prefix
from launcher.schedulers.slurm.client import ACCOUNTING_POLICY, Client, Unreachable
from launcher.schedulers.slurm.state import (
    ORIGIN_FORMAT,
    SACCT_FORMAT,
    SQUEUE_FORMAT,
    foreign_job,
    parse_sacct,
    parse_squeue,
    parse_squeue_reason,
    squeue_error,
)


def find_submitted(client: Client, script: str, marker: str, *, deadline: float | None = None,
                   user: str | None = None) -> str | None:
    """The id of the job `user` (default: this process's) submitted from `script` or
    carrying comment `marker`, if Slurm (asked through `client`) has it (pending, running or
    recently ended); None when it has no such job. Of several (a run's earlier jobs, ended
    or cancelled, carry its marker and script too: each resume queues one more), the one
    queued last."""
    proc = client.call("squeue", "-h", "--states=all", "-u", user or getpass.getuser(), "-o", "%i|%k|%o",
                       deadline=deadline)
    if proc.returncode != 0:
        raise SchedulerError(f"squeue failed: {without_tool_prefix('squeue', proc.stderr or proc.stdout)}")
    found = []
    for line in proc.stdout.splitlines():
        # ID|COMMENT|SCRIPT, where a user's comment may hold "|" too: matched from each end.
        job_id, sep, rest = line.strip().partition("|")
        if sep and ((marker and rest.startswith(f"{marker}|")) or (script and rest.endswith(f"|{script}"))):
            found.append(job_id)
    return max(found, key=_queued_order, default=None)


def _queued_order(job_id: str) -> int:
    """Slurm's ids grow as jobs are queued: an id's number (an array task's, its array's)."""
    digits = re.match(r"\d+", job_id)
    return int(digits.group()) if digits else -1


def squeue_job(client: Client, job_id: str) -> tuple[str | None, str | None]:
    """(state, pending reason) of the job as squeue lists it; (None, None) once it is gone."""
    proc = client.call("squeue", "-h", "-j", job_id, "-o", SQUEUE_FORMAT)
    if proc.returncode != 0:
        _raise_unless_gone(proc, job_id)
        return None, None
    return parse_squeue(proc.stdout), parse_squeue_reason(proc.stdout)


def refuse_foreign_job(client: Client, job_id: str, run_id: str, run_dir: str) -> None:
    """Before a job named in a run's record is cancelled: SchedulerError when Slurm says the
    job is another's, or does not list it (:func:`refuse_foreign_origin`)."""
    refuse_foreign_origin(job_origin(client, job_id), job_id, run_id, run_dir)


def job_origin(client: Client, job_id: str) -> str | None:
    """squeue's ORIGIN_FORMAT line of the job (its script and comment); None when squeue
    does not list it."""
    proc = client.call("squeue", "-h", "-j", job_id, "-o", ORIGIN_FORMAT)
    if proc.returncode != 0:
        _raise_unless_gone(proc, job_id)
        return None
    return proc.stdout if proc.stdout.strip() else None


def refuse_foreign_origin(origin: str | None, job_id: str, run_id: str, run_dir: str) -> None:
    """SchedulerError when the job whose squeue origin is `origin` is another's
    (:func:`launcher.schedulers.slurm.state.foreign_job`: a run.json edited or swapped names
    another run's job, and scancel must not end it), and when squeue did not list it
    (`origin` None): it has ended (nothing to cancel), or the commands reach another cluster
    than the run's, whose scancel (Slurm 22.05's exits 0 for a job it does not know) would
    end nothing while the cancel mark would turn the run's next end into a cancel."""
    if origin is None:
        raise SchedulerError(f"run {run_id}: Slurm does not list its job {job_id} (squeue): the job has ended, or "
                             "these Slurm commands reach another cluster than the one the run was submitted to "
                             "(SLURM_CONF); nothing was cancelled")
    why = foreign_job(origin, run_id, run_dir)
    if why is not None:
        raise SchedulerError(f"run {run_id}: its record names job {job_id}, but {why}: the record was edited or "
                             "replaced; nothing was cancelled")


def squeue_jobs(client: Client, job_ids: list[str]) -> dict[str, tuple[str | None, str | None]]:
    """(state, pending reason) of every job or array task squeue lists for these ids (an
    array's tasks one by one, ARRAYJOB_TASK); jobs it no longer lists are left out."""
    proc = client.call("squeue", "-h", "-r", "-j", ",".join(job_ids), "-o", "%i|" + SQUEUE_FORMAT)
    if proc.returncode != 0:
        _raise_unless_gone(proc, ",".join(job_ids))
        return {}           # none of them is known any more ("Invalid job id specified")
    out = {}
    for line in proc.stdout.splitlines():
        job_id, sep, rest = line.strip().partition("|")
        job_id, _, component = job_id.partition("+")
        if sep and component in ("", "0"):      # a heterogeneous job: its leader's state is the job's
            out[job_id] = (parse_squeue(rest), parse_squeue_reason(rest))
    return out


def _raise_unless_gone(proc: subprocess.CompletedProcess[str], job_ids: str) -> None:
    """squeue failed: fine when it no longer knows the job; any other failure says nothing
    of the job, so the run is not taken for ended."""
    error = squeue_error(proc.stderr or proc.stdout)
    if error is not None:
        raise SchedulerError(f"squeue could not tell the state of job {job_ids}: {error}")


def sacct_records(client: Client, job_id: str) -> list[dict[str, str]] | None:
    """Every start of the job (requeues included), or None without accounting."""
    try:
        proc = client.call("sacct", "-n", "-P", "-D", "-X", "-j", job_id, "-o", ",".join(SACCT_FORMAT),
                           policy=ACCOUNTING_POLICY, controller=False)
    except Unreachable:
        return None
    if proc.returncode != 0 or "not running" in proc.stderr.lower():
        return None
    return parse_sacct(proc.stdout)
