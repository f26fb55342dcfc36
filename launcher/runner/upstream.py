"""A run or sweep a submission waits for (`--after`): what was asked (`After`) and how it
stands now (`Upstream`). Plain data below the roads: a prepared submission carries them to
its road (launcher.runner.prepared), which checks it can wait for them;
launcher.runner.dependencies finds them and makes the job's dependency of them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from launcher.rundir.records import TERMINAL, State


@dataclass(frozen=True)
class After:
    ref: str          # a run id or run directory, a sweep id or sweep directory
    kind: str         # ok: it must have completed | any: whatever its end

    def __str__(self) -> str:
        return f"{self.ref}:{self.kind}"


@dataclass(frozen=True)
class Upstream:
    """A run or sweep waited for, as it stands now."""

    after: After
    name: str                     # its run or sweep id
    scheduler: str | None
    job_ids: tuple[str, ...]      # the Slurm jobs to depend on (a sweep: its arrays)
    states: tuple[str, ...]       # its state, or each element's
    run_dirs: tuple[Path, ...]

    @property
    def ended(self) -> bool:
        return all(s in TERMINAL for s in self.states)

    @property
    def satisfied(self) -> bool:
        """Ended as `after.kind` asks."""
        return self.ended and (self.after.kind == "any" or all(s == State.COMPLETED.value for s in self.states))

    def describe(self) -> str:
        states = sorted(set(self.states))
        return f"{self.name} ended {'/'.join(states)}"
