"""What the Slurm scheduler writes in a run's run.json: a refused or queued submission,
the job's request in the words a pending reason is said in, and squeue's and sacct's
view of the job folded in (state, starts, a pending reason that never clears).
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

from launcher.errors import GlaunchError, SchedulerError
from launcher.resolution.jobplan import JobPlan
from launcher.rundir import registry
from launcher.rundir.lifecycle import ENDS, move
from launcher.rundir.records import LIVE, RunRecord, State, is_terminal
from launcher.schedulers.slurm.array import task_rows
from launcher.schedulers.slurm.client import Unreachable
from launcher.schedulers.slurm.state import HELD, current_state, merge_history, pending_verdict, unlisted_verdict

# What refresh writes in run.json for a pending job that will never start.
NEVER_STARTS = "never starts"
# run.json: the job glaunch queued held and could not release (nor cancel): its hold
# (squeue's JobHeldUser) never clears by itself.
LEFT_HELD = "left_held"
# ... and for a job Slurm no longer knows, that left no record of its end.
UNKNOWN_TO_SLURM = "unknown to Slurm"
# run.json of a sweep's element while its array is being queued: how to find the array (its
# script and marker) and the element's task in it, should the submitting process stop.
QUEUEING = "queueing"
# run.json: the held job it names (queued by glaunch on this machine) is not yet released.
RELEASING = "releasing"
# run.json: accounting was folded in once the run had ended ({"job_id", "at"}): sacct has
# nothing to add to that job's starts any more, so no later reader asks it.
AFTER_END = "accounting_after_end"

# A heterogeneous job's component (12+1) and a step (12.batch, 12.extern, 12+0.0).
_COMPONENT = re.compile(r"^(?P<job>[^.+]+)\+(?P<n>\d+)$")


def job_rows(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """sacct's rows, one per start of a job glaunch knows by its id: an array's pending
    rows expanded to one per task, steps dropped, a heterogeneous job's leader (N+0) as
    the job N (it carries the job's state), its other components dropped."""
    out = []
    for row in task_rows(rows):
        row_id = str(row.get("job_id", ""))
        m = _COMPONENT.match(row_id)
        if m is not None:
            if m["n"] == "0":
                out.append(dict(row, job_id=m["job"]))
        elif "." not in row_id:
            out.append(row)
    return out


def own_rows(rows: list[dict[str, str]], job_id: str | None) -> list[dict[str, str]]:
    """sacct's rows of exactly this job (job_rows), one per start."""
    return [row for row in job_rows(rows) if row["job_id"] == job_id]


def fold_job(run_dir: Path, live: str | None, reason: str | None, history: list[dict[str, str]] | None) -> RunRecord:
    """squeue's state and reason and sacct's rows of one job, folded into its run.json."""
    with registry.updating(run_dir) as rec:
        rec.extra.pop("unreachable", None)
        rec.extra["accounting"] = history is not None
        if history is not None:
            history = own_rows(history, rec.job_id)
        if history:
            rec.extra["scheduler_history"] = history
            merge_history(rec, history)
            _cancels_of_glaunch(run_dir, rec)
        move(rec, current_state(rec.state, live, history), why="what Slurm says now")
        _reason_of_last_start(rec)
        record_unlisted(rec, live, history)
        record_pending_reason(rec, live, reason)
        if history is not None and rec.state in ENDS:
            rec.extra[AFTER_END] = {"job_id": rec.job_id, "at": registry.now()}
    return rec


def _cancels_of_glaunch(run_dir: Path, rec: RunRecord) -> None:
    """A start sacct says a uid cancelled, whose job `glaunch cancel` asked to end (the run's
    cancel file): said so, not as an administrator's or Slurm's cancel."""
    for start in rec.starts:
        if (start.state == State.CANCELLED.value and (start.detail or "").startswith("cancelled by uid ")
                and registry.cancel_asked(run_dir, rec, start.job_id)):
            start.detail = "cancelled with glaunch cancel"


def _reason_of_last_start(rec: RunRecord) -> None:
    """An ended run's reason and detail are its last start's, where that start ended as the
    run did (accounting told how: an earlier start's reason, a crash restarted in the
    allocation, would stand for a run a cancel ended)."""
    if rec.state not in ENDS or not rec.starts:
        return
    last = rec.starts[-1]
    if last.state == rec.state and last.reason is not None:
        rec.reason, rec.detail = last.reason, last.detail


def has_ended(record: RunRecord) -> bool:
    """The run ended (not a dry run): its job will not start again by itself."""
    return record.state in ENDS


def settled(record: RunRecord) -> bool:
    """An ended run's record that sacct can add nothing to: accounting was folded in after
    the end, or the job recorded the end of each of its starts itself (restarts first..n, none
    missing, each with its end: what sacct's rows would fill in is there)."""
    folded = record.extra.get(AFTER_END)
    if isinstance(folded, dict) and folded.get("job_id") == record.job_id:
        return True
    own = [s for s in record.starts if s.job_id == record.job_id]
    first = record.first_restart(record.job_id)
    return ([s.restart for s in own] == list(range(first, first + len(own)))
            and all(s.ended and s.state not in (None, State.PENDING, State.RUNNING) for s in own))


def record_unlisted(rec: RunRecord, live: str | None, history: list[dict[str, str]] | None) -> None:
    """A job squeue no longer lists: since when (run.json `unlisted_since`); once nothing
    can tell how it ended, state UNKNOWN, reason "unknown to Slurm" and why in `detail`."""
    if live is not None:
        rec.extra.pop("unlisted_since", None)
        unlisted_s = None
    else:
        since = rec.extra.get("unlisted_since")
        try:
            unlisted_s = max(0.0, dt.datetime.now(dt.timezone.utc).timestamp()
                             - dt.datetime.fromisoformat(str(since)).timestamp())
        except ValueError:
            rec.extra["unlisted_since"] = registry.now()
            unlisted_s = 0.0
    lost = None
    if rec.state == State.UNKNOWN or rec.state in LIVE:
        lost = unlisted_verdict(str(rec.job_id), history, unlisted_s)
    if lost:
        move(rec, State.UNKNOWN.value, reason=UNKNOWN_TO_SLURM, detail=lost)
    elif rec.reason == UNKNOWN_TO_SLURM:
        rec.reason = rec.detail = None
    if is_terminal(rec.state):
        rec.extra.pop("unlisted_since", None)      # an end is known: nothing is waited for


def record_refused(run_dir: Path, exc: SchedulerError, warnings: list[str]) -> None:
    with registry.updating(run_dir) as record:
        move(record, State.REFUSED.value, reason="unreachable" if isinstance(exc, Unreachable) else "refused",
             detail=exc.message)
        if isinstance(exc, Unreachable):
            record.extra["unreachable"] = {"at": registry.now(), "message": exc.message}
        if warnings:
            record.extra["warnings"] = warnings


def record_queued(run_dir: Path, plan: JobPlan, job_id: str, warnings: list[str], version: str | None, *,
                  releasing: bool = False) -> None:
    """run.json names the held job; `releasing`: it says so until record_released (a
    submission stopped before then leaves the job to the next status to release)."""
    with registry.updating(run_dir) as record:
        move(record, State.PENDING.value)
        record.job_id = job_id
        if releasing:
            record.extra[RELEASING] = job_id
        record.starts.append(registry.new_start(job_id, 0))
        record.extra["request"] = request_values(plan)
        record.extra.pop(QUEUEING, None)      # the element's array is queued: found by its job id
        if warnings:
            record.extra["warnings"] = warnings
        origin = record.extra.get("provenance")
        if isinstance(origin, dict) and version:
            origin["scheduler_version"] = version


def record_released(run_dir: Path) -> None:
    """run.json: its job was released (RELEASING gone). A record that cannot be written
    keeps it: the next status asks Slurm to release the job again, which finds it released."""
    try:
        with registry.updating(run_dir) as record:
            record.extra.pop(RELEASING, None)
    except (GlaunchError, OSError):
        pass


def request_values(plan: JobPlan) -> dict[str, Any]:
    """What the job asked, and the profile's limits for it: the words a pending reason is
    said in (run.json `request`)."""
    alloc = plan.allocation
    part = (plan.site.get("partitions") or {}).get(alloc.partition or "") or {}
    return {"partition": alloc.partition, "nodes": alloc.allocated_nodes, "gpus_per_node": alloc.gpus_per_node,
            "time": alloc.time, "account": alloc.account, "qos": alloc.qos, "constraint": alloc.constraint,
            "max_time": part.get("max_time"), "max_nodes": part.get("max_nodes")}


def record_pending_reason(rec: RunRecord, live: str | None, reason: str | None) -> None:
    """A pending job's reason in run.json; one that never clears by itself as
    reason "never starts", detail in the profile's terms, and `blocked: true`."""
    if live == "PENDING" and reason:
        rec.extra["pending_reason"] = reason
    else:
        rec.extra.pop("pending_reason", None)
    request = rec.extra.get("request")
    values = dict(request) if isinstance(request, dict) else {"partition": rec.partition, "nodes": rec.nodes}
    verdict: str | None
    if live == "PENDING" and reason == "JobHeldUser" and rec.extra.get(LEFT_HELD) == rec.job_id:
        verdict = (f"glaunch queued it held and could not release it (`scontrol release {rec.job_id}` lets it "
                   "start)")
    elif live == "PENDING":
        verdict = pending_verdict(reason, values)
    else:
        verdict = HELD.get(live or "", "").format(job_id=rec.job_id) or None
    if verdict:
        rec.reason = NEVER_STARTS
        rec.detail = (f"job {rec.job_id} {NEVER_STARTS}: {verdict}. It stays queued until cancelled "
                      f"(glaunch cancel {rec.run_id})")
        rec.extra["blocked"] = True
    else:
        rec.extra.pop("blocked", None)
        if rec.reason == NEVER_STARTS:
            rec.reason = rec.detail = None
