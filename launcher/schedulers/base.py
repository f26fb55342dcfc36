"""The scheduler interface. The rest of glaunch talks to a `Scheduler` and never asks
which one it is: `local` (this machine) and `slurm` sit behind it.

A scheduler says what differs in the rendered files (`job_shell`), checks a plan against
what it can run (`check`, pure), makes sure it can be reached (`require`), starts a
written run directory (`launch`), folds its own view of a run into run.json (`refresh`)
and cancels a run (`cancel`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar

from ..rendering.render import JobShell, render
from ..resolution.jobplan import JobPlan
from ..runs.layout import RunRecord

Echo = Callable[[str], None]


@dataclass(frozen=True)
class Launched:
    """What `launch` returns: the job id, the run's state, and the exit status when the
    scheduler ran the job to its end (the local one does)."""

    job_id: str | None
    state: str
    exit_code: int | None = None


class Scheduler(ABC):
    name: ClassVar[str]
    # Whether `launch` returns only once the run has ended.
    runs_to_completion: ClassVar[bool] = False

    def check(self, plan: JobPlan) -> None:  # noqa: B027 - optional hook
        """Raise ConfigError for a plan this scheduler cannot run. Pure."""

    @abstractmethod
    def job_shell(self, plan: JobPlan) -> JobShell:
        """The scheduler's part of job.sbatch and env.sh. Pure."""

    def render(self, plan: JobPlan) -> dict[str, str]:
        """The run bundle's files. Pure."""
        return render(plan, self.job_shell(plan))

    def require(self) -> None:  # noqa: B027 - optional hook
        """Raise SchedulerError when the scheduler cannot be used from here."""

    @abstractmethod
    def launch(self, plan: JobPlan, run_dir: Path, *, check: bool, echo: Echo | None) -> Launched:
        """Start the run whose bundle is written in `run_dir`."""

    def refresh(self, run_dir: Path, record: RunRecord) -> RunRecord:
        """The run's record with the scheduler's view folded in (written back if changed)."""
        return record

    @abstractmethod
    def cancel(self, run_dir: Path, record: RunRecord) -> str:
        """Cancel the run's job; a sentence saying what was done."""
