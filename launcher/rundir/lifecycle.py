"""A run's states as one state machine: where each state may go, checked wherever run.json's
state changes (always inside `registry.updating`, under the run's lock, so a move that is
refused leaves the record as it was).

    SUBMITTING ──> PENDING ⇄ RUNNING ⇄ REQUEUED ──> an end (COMPLETED, FAILED, CANCELLED, ...)
        │             └───────── UNKNOWN ─────────┘         │
        └──> REFUSED, an end                                 └──> SUBMITTING (glaunch resume)
    RENDERED (a dry run) ──> RUNNING, only by `adopt`: its job.sbatch submitted by hand

An end may be corrected by the scheduler's accounting (FAILED -> NODE_FAIL) but never comes
back to life by itself: only `glaunch resume` takes an ended run back to SUBMITTING. Every
state is one a command acts on: in flight, `cancel` (and the next reader brings a record
whose job has gone to its end); ended, `resume`. Imports the standard library only (and
`records`): the in-job runtime moves states too.
"""

from __future__ import annotations

from typing import Any, Mapping

from launcher.rundir.records import TERMINAL, RecordError, RunRecord, StartRecord, State

ENDS = frozenset(TERMINAL - {State.RENDERED})
_QUEUED_OR_RUNNING = frozenset({State.PENDING, State.RUNNING, State.REQUEUED, State.UNKNOWN})

MOVES: Mapping[State, frozenset[State]] = {
    State.RENDERED: frozenset(),
    State.SUBMITTING: frozenset({State.SUBMITTING} | _QUEUED_OR_RUNNING | ENDS),
    State.PENDING: _QUEUED_OR_RUNNING | ENDS,
    State.RUNNING: _QUEUED_OR_RUNNING | ENDS,
    State.REQUEUED: _QUEUED_OR_RUNNING | ENDS,
    # A start's end, never a run's (the run is RUNNING its next step): read as running.
    State.RESTARTED: _QUEUED_OR_RUNNING | ENDS,
    # A job the scheduler lost track of: whatever it says next; or a resume.
    State.UNKNOWN: _QUEUED_OR_RUNNING | ENDS | {State.SUBMITTING},
    **{end: ENDS | {State.SUBMITTING} for end in ENDS},
}


class IllegalMove(RecordError):
    """A change of state the state machine does not allow: the record is left as it was."""

    def __init__(self, run_id: str, was: str, to: str, why: str) -> None:
        super().__init__("state", f"run {run_id}: {was} cannot become {to} ({why})")
        self.was, self.to = was, to


def _known(state: str) -> State | None:
    try:
        return State(state)
    except ValueError:
        return None


def may_move(was: str, to: str) -> bool:
    """Whether a run in state `was` may move to `to`. A state Slurm reports that glaunch
    does not name (one of squeue's, say) counts as queued or running."""
    source, target = _known(was) or State.RUNNING, _known(to) or State.RUNNING
    return target in MOVES[source]


_KEEP: Any = object()


def move(record: RunRecord, to: str, *, reason: str | None = _KEEP, detail: str | None = _KEEP,
         why: str = "not a move a run makes") -> None:
    """Put `record` in state `to` (with `reason` and `detail` where given); IllegalMove, and
    nothing changed, when the state machine does not allow it. Staying is always allowed."""
    was = str(record.state)
    if was != str(to) and not may_move(was, str(to)):
        raise IllegalMove(record.run_id, was, str(to), why)
    record.state = str(to)
    if reason is not _KEEP:
        record.reason = reason
    if detail is not _KEEP:
        record.detail = detail


def resubmit(record: RunRecord) -> None:
    """An ended run (or one whose job the scheduler lost) taken back to SUBMITTING by
    `glaunch resume`: IllegalMove for a run that may still be queued or running."""
    if _known(str(record.state)) not in ENDS | {State.UNKNOWN}:
        raise IllegalMove(record.run_id, str(record.state), State.SUBMITTING.value,
                          "only a run that ended can be resumed")
    record.state, record.reason, record.detail = State.SUBMITTING.value, None, None


def adopt(record: RunRecord, job_id: str, started: str) -> None:
    """A dry run's record (RENDERED) taken on by the job its job.sbatch became when submitted
    by hand: RUNNING, with `job_id` as its first start, as `glaunch submit` would have
    recorded it. IllegalMove for any other record: a bundle is adopted once, by one job."""
    if str(record.state) != State.RENDERED.value:
        raise IllegalMove(record.run_id, str(record.state), State.RUNNING.value,
                          "only a dry run's bundle is taken on by the job it was submitted as")
    record.state, record.reason, record.detail = State.RUNNING.value, None, None
    record.dry_run = False
    record.job_id = job_id
    record.starts.append(StartRecord(job_id=job_id, restart=0, started=started, state=State.RUNNING.value))
