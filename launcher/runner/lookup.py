"""Finding the run or sweep a command names, and reading it with its scheduler's current
view folded in: what status, wait, logs, cancel, resume and --after all start from."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

from launcher import schedulers
from launcher.errors import ConfigError, GlaunchError, SchedulerError
from launcher.rundir import registry
from launcher.rundir.lifecycle import ENDS
from launcher.rundir.records import RunRecord
from launcher.rundir.layout import REMOTE_FILE
from launcher.rundir.registry import find_run
from launcher.runner import sweeps
from launcher.runner.results import Run, RunRef, Sweep


def find_sweep(ref: Any) -> Path | None:
    """The sweep directory `ref` (a sweep id or directory, or a Sweep) names; None for a run."""
    if isinstance(ref, Sweep):
        return ref.sweep_dir
    if isinstance(ref, Run):
        return None
    return sweeps.find_sweep(ref)


def run_dir_of(run: RunRef) -> Path:
    if isinstance(run, Run):
        return run.run_dir
    if isinstance(run, Sweep):
        raise ConfigError(f"{run.sweep_id} is a sweep, not a run", file="command line", key="RUN")
    return find_run(os.fspath(run))


class NotRefreshed(SchedulerError):
    """The scheduler could not say how a run in flight stands now: why, and the state its
    run.json last recorded (`record`, read again: it says since when it is unreachable)."""

    def __init__(self, cause: SchedulerError, record: RunRecord) -> None:
        super().__init__(f"{cause.message}; {last_recorded(record)}", file=cause.file, key=cause.key)
        self.cause, self.record = cause, record


def last_recorded(record: RunRecord) -> str:
    """The run's state as run.json has it, with its job and where its last start stood."""
    said = [f"job {record.job_id}"] if record.job_id else []
    start = record.starts[-1] if record.starts else None
    if start is not None:
        when = f"ended {start.ended}" if start.ended else f"started {start.started}" if start.started else "not started"
        said.append(f"start {start.restart} {start.state}, {when}")
    return f"run {record.run_id} was last recorded {record.state}" + (f" ({'; '.join(said)})" if said else "")


def refreshed(run_dir: Path) -> RunRecord:
    """run.json with the scheduler's current view folded in. Read as it is: a copy of a run
    directory (the job it names is another directory's), and an ended run whose record
    holds all its scheduler could add (its record is authoritative: no scheduler is asked,
    so it answers at once with the controller down). NotRefreshed (exit 3) for a run whose
    scheduler cannot be reached, naming the state last recorded."""

    if is_remote(run_dir):
        return _remote(run_dir)
    record = registry.read(run_dir)
    if not _asks_scheduler(run_dir, record):
        return record
    try:
        return schedulers.get(str(record.scheduler)).refresh(run_dir, record)
    except NotRefreshed:
        raise
    except SchedulerError as exc:
        raise NotRefreshed(exc, _reread(run_dir, record)) from None


def is_remote(run_dir: Path) -> bool:
    """Whether `run_dir` is the local record of a run that lives on a cluster reached over SSH."""
    return (Path(run_dir) / REMOTE_FILE).is_file()


def _remote(run_dir: Path) -> RunRecord:
    """A run submitted over SSH: its record read from the cluster, Slurm asked there."""
    from launcher.runner import remote

    try:
        return remote.refreshed(run_dir)
    except SchedulerError as exc:
        raise NotRefreshed(exc, registry.read(run_dir)) from None


def _asks_scheduler(run_dir: Path, record: RunRecord) -> bool:
    if record.scheduler not in schedulers.NAMES or record.dry_run or copied_from(run_dir, record) is not None:
        return False
    return not (record.state in ENDS and schedulers.get(str(record.scheduler)).settled(record))


def _reread(run_dir: Path, record: RunRecord) -> RunRecord:
    try:
        return registry.read(run_dir)
    except GlaunchError:
        return record


def copied_from(run_dir: Path, record: RunRecord) -> str | None:
    """The directory the run was submitted in, when `run_dir` is not it (a copy, or the run
    moved): its job, checkpoints and files all name that one. None when it is itself, or
    when the record does not say (written by hand)."""
    recorded = record.run_dir
    if not recorded:
        return None
    try:
        if os.path.samefile(recorded, run_dir):
            return None
    except (OSError, ValueError):
        pass
    return recorded


def refuse_copy(run_dir: Path, record: RunRecord, command: str) -> None:
    """ConfigError when `run_dir` is not the directory its run was submitted in: a command
    that changes the run acts on the run's own directory only."""
    original = copied_from(run_dir, record)
    if original is None:
        return
    try:
        there = registry.read(original).run_id if os.path.isdir(original) else None
    except GlaunchError:
        there = None
    if there == record.run_id:
        why = f"it is a copy of run {record.run_id}, whose run directory is {original}"
        fix = f"glaunch {command} {original}"
    else:
        why = f"run {record.run_id} was submitted in {original}, and was moved or copied here"
        fix = f"move it back to {original}"
    raise ConfigError(f"{run_dir}: {why}; its job, checkpoints and files name that directory ({fix})",
                      file=str(Path(run_dir) / "run.json"), key="run_dir")


def sweep_records(sweep_dir: Path, *, refresh: bool = True) -> dict[str, RunRecord | GlaunchError]:
    """run id -> each element's record (those the scheduler may still add to refreshed
    together by it, as `refreshed` says), or the error reading it."""
    if refresh and is_remote(sweep_dir):
        from launcher.runner import remote

        return remote.sweep_element_records(sweep_dir)
    record = sweeps.read(sweep_dir)
    if refresh and not record.dry_run and record.scheduler in schedulers.NAMES:
        scheduler = schedulers.get(record.scheduler)

        def refresh_asked(runs: list[tuple[Path, RunRecord]]) -> list[RunRecord]:
            asks = [_asks_scheduler(d, r) for d, r in runs]
            asked = [run for run, ask in zip(runs, asks) if ask]
            try:
                fresh = iter(scheduler.refresh_many(asked) if asked else [])
            except SchedulerError as exc:
                states = Counter(str(r.state) for _, r in asked)
                last = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
                raise SchedulerError(f"{exc.message}; sweep {sweep_dir.name}: its elements in flight were last "
                                     f"recorded {last}") from None
            return [next(fresh) if ask else r for (_, r), ask in zip(runs, asks)]

        return sweeps.element_records(sweep_dir, refresh_asked)
    return sweeps.element_records(sweep_dir, lambda runs: [r for _, r in runs])
