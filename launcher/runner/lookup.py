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
    """run.json with the scheduler's current view folded in."""

    record = registry.read(run_dir)
    if record.scheduler in schedulers.NAMES and not record.dry_run:
        record = schedulers.get(record.scheduler).refresh(run_dir, record)
    return record


def sweep_records(sweep_dir: Path, *, refresh: bool = True) -> dict[str, RunRecord | GlaunchError]:
    """run id -> each element's record (refreshed together by its scheduler), or the error
    reading it."""
    record = sweeps.read(sweep_dir)
    if refresh and not record.dry_run and record.scheduler in schedulers.NAMES:
        return sweeps.element_records(sweep_dir, schedulers.get(record.scheduler).refresh_many)
    return sweeps.element_records(sweep_dir, lambda runs: [r for _, r in runs])
