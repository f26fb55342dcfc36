"""Finding the run or sweep a command names, and reading it with its scheduler's current
view folded in: what status, wait, logs, cancel, resume and --after all start from."""

from __future__ import annotations

import os
from pathlib import Path

from launcher.errors import ConfigError, GlaunchError
from launcher.rundir.records import RunRecord
from launcher.rundir.registry import find_run
from launcher.runner import sweeps
from launcher.runner.direct import recorded_elements
from launcher.runner.results import Run, RunRef, Sweep
from launcher.runner.road import road_to


def find_sweep(ref: RunRef) -> Path | None:
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
    """run.json with the scheduler's current view folded in, asked on the run's road
    (launcher.runner.direct says when the record is read as it is). NotRefreshed (exit 3)
    for a run whose scheduler cannot be reached, naming the state last recorded."""
    return road_to(run_dir).refreshed(run_dir)


def sweep_records(sweep_dir: Path, *, refresh: bool = True) -> dict[str, RunRecord | GlaunchError]:
    """run id -> each element's record (with `refresh`, those the scheduler may still add
    to refreshed together by it, on the sweep's road), or the error reading it."""
    if not refresh:
        return recorded_elements(sweep_dir)
    return road_to(sweep_dir).sweep_records(sweep_dir)
