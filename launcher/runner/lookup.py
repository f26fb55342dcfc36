"""Finding the run or sweep a command names, and reading it with its scheduler's current
view folded in: what status, wait, logs, cancel, resume and --after all start from."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from launcher import schedulers
from launcher.errors import ConfigError, GlaunchError
from launcher.rundir import registry
from launcher.rundir.records import RunRecord
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


def refreshed(run_dir: Path) -> RunRecord:
    """run.json with the scheduler's current view folded in (a copy of a run directory is
    read as it is: the job it names is another directory's)."""

    record = registry.read(run_dir)
    if record.scheduler in schedulers.NAMES and not record.dry_run and copied_from(run_dir, record) is None:
        record = schedulers.get(record.scheduler).refresh(run_dir, record)
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
    """run id -> each element's record (refreshed together by its scheduler), or the error
    reading it."""
    record = sweeps.read(sweep_dir)
    if refresh and not record.dry_run and record.scheduler in schedulers.NAMES:
        return sweeps.element_records(sweep_dir, schedulers.get(record.scheduler).refresh_many)
    return sweeps.element_records(sweep_dir, lambda runs: [r for _, r in runs])
