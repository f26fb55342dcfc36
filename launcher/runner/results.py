"""What a submission returns: a `Run` (one run directory) or a `Sweep` (its elements are
runs); `RunRef`, how the commands after it name either; and `StateChange`, what following
one reports."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Union


@dataclass(frozen=True)
class Run:
    """A submitted (or rendered) run."""

    run_id: str
    run_dir: Path
    site: str
    dry_run: bool
    files: tuple[str, ...]
    state: str
    job_id: str | None = None
    exit_code: int | None = None      # set when the scheduler ran the job to its end (local)
    job_ids: tuple[str, ...] = ()     # ... and then the job of each of its starts
    warnings: tuple[str, ...] = ()    # what the user should know before it ran (one line each)
    # Submitted over SSH: the login host and the run's directory there (run_dir is then
    # this machine's record of the run).
    cluster_host: str | None = None
    cluster_dir: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The run as `--json` prints it."""
        found = {"run_id": self.run_id, "run_dir": str(self.run_dir), "site": self.site, "dry_run": self.dry_run,
                 "files": sorted(self.files), "state": self.state, "job_id": self.job_id,
                 "exit_code": self.exit_code}
        if self.cluster_dir is not None:
            found["cluster"] = self.cluster()
        return found

    def cluster(self) -> dict[str, str | None] | None:
        """Where a run submitted over SSH lives, as `status --json` says it; None for others."""
        return None if self.cluster_dir is None else {"host": self.cluster_host, "run_dir": self.cluster_dir}


@dataclass(frozen=True)
class Sweep:
    """A submitted (or rendered) sweep: its elements are runs."""

    sweep_id: str
    sweep_dir: Path
    site: str
    dry_run: bool
    runs: tuple[Run, ...]
    arrays: tuple[dict[str, Any], ...]      # Slurm: {script, job_id, elements, error}
    files: Mapping[str, str]                # the sweep directory's own (array scripts)
    state: str

    def to_json(self) -> dict[str, Any]:
        return {"sweep_id": self.sweep_id, "sweep_dir": str(self.sweep_dir), "site": self.site,
                "dry_run": self.dry_run, "state": self.state, "arrays": list(self.arrays),
                "files": sorted(self.files), "runs": [r.to_json() for r in self.runs]}


# A run or sweep id, its directory, or a Run or Sweep.
RunRef = Union[str, "os.PathLike[str]", Run, Sweep]


@dataclass(frozen=True)
class StateChange:
    """A change of state that following a run saw: its job's, or a sweep element's."""

    state: str
    job_id: str | None
    sweep: bool = False
    element: int | None = None        # the element's index in its sweep
