"""The scheduler interface. The rest of glaunch talks to a `Scheduler` and never asks
which one it is: `local` (this machine) and `slurm` sit behind it.

A scheduler says what differs in the rendered files (`job_shell`), checks a plan against
what it can run (`check`, pure), makes sure it can be reached (`require`), starts a
written run directory (`launch`), folds its own view of a run into run.json (`refresh`;
never again once the run ended and its record holds all it can add: `settled`) and
cancels a run (`cancel`). A sweep's elements are submitted as it says
(`plan_sweep`: Slurm makes job arrays of them) and started together (`launch_sweep`).

One that runs a job to its end (`runs_to_completion`) reports it while it runs to a
`RunConsole`; the caller says how to make one (`Echo`), so that what the user sees is
decided above the schedulers (launcher.views.console).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar, Mapping, Protocol, Sequence

from launcher.rundir.records import RunRecord

if TYPE_CHECKING:       # following a run (status, list, cancel) renders nothing: loaded where rendering is
    from launcher.rendering.render import JobShell
    from launcher.resolution.jobplan import JobPlan


class RunConsole(Protocol):
    """What follows a run for its user while it runs: each fresh run.json (`observe`), a
    call a few times a second (`pump`: its logs and status grew), a line of glaunch's own
    (`event`), the end (`finish`), and `clear` before other output."""

    def observe(self, record: RunRecord) -> None: ...

    def pump(self) -> None: ...

    def event(self, text: str) -> None: ...

    def finish(self, record: RunRecord) -> None: ...

    def clear(self) -> None: ...


class Silent:
    """A RunConsole that shows nothing."""

    def observe(self, record: RunRecord) -> None:
        pass

    def pump(self) -> None:
        pass

    def event(self, text: str) -> None:
        pass

    def finish(self, record: RunRecord) -> None:
        pass

    def clear(self) -> None:
        pass


# How a run is shown while it runs: called with the run directory once the run's files are
# written, it makes the console that follows that run.
Echo = Callable[[Path], RunConsole]


def console_of(echo: Echo | None, run_dir: Path) -> RunConsole:
    """The console `echo` makes for the run in `run_dir`; without `echo`, one that shows
    nothing."""
    return echo(run_dir) if echo is not None else Silent()


@dataclass(frozen=True)
class Launched:
    """What `launch` returns: the job id, the run's state, and the exit status when the
    scheduler ran the job to its end (the local one does)."""

    job_id: str | None
    state: str
    exit_code: int | None = None


@dataclass(frozen=True)
class SweepBatch:
    """One submission of a sweep: the sweep directory's file it hands the scheduler (a
    Slurm array script; None where each element is started on its own) and the elements
    it starts (their indices in the sweep), in task order."""

    script: str | None
    elements: tuple[int, ...]


@dataclass(frozen=True)
class SweepPlan:
    """How a sweep is submitted: its batches, and the sweep directory's own files."""

    batches: tuple[SweepBatch, ...]
    files: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LaunchedBatch:
    script: str | None
    job_id: str | None               # the array job's id
    elements: tuple[int, ...]
    launched: tuple[Launched | None, ...]      # per element; None: not started (an earlier failure)
    error: str | None = None


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
        from launcher.rendering.render import render

        return render(plan, self.job_shell(plan))

    def require(self) -> None:  # noqa: B027 - optional hook
        """Raise SchedulerError when the scheduler cannot be used from here."""

    @abstractmethod
    def launch(self, plan: JobPlan, run_dir: Path, *, check: bool, echo: Echo | None) -> Launched:
        """Start the run whose bundle is written in `run_dir`; one that runs it to its end
        reports to the console `echo` makes."""

    def refresh(self, run_dir: Path, record: RunRecord) -> RunRecord:
        """The run's record with the scheduler's view folded in (written back if changed)."""
        return record

    def settled(self, record: RunRecord) -> bool:
        """Whether the record of an ended run holds all this scheduler could still add to it:
        then it is read as it is, without asking the scheduler (which may be unreachable
        long after the end). By default an end is the scheduler's last word."""
        return True

    def job_still_there(self, run_dir: Path, record: RunRecord) -> str | None:
        """Why the run's job may still be running though its record says it ended (a
        scheduler that can tell beyond the record), else None."""
        return None

    def refresh_many(self, runs: Sequence[tuple[Path, RunRecord]]) -> list[RunRecord]:
        """`refresh` of several runs (a sweep's elements), in order; a scheduler may ask
        about all of them at once."""
        return [self.refresh(run_dir, record) for run_dir, record in runs]

    def cancel_many(self, runs: Sequence[tuple[Path, RunRecord]], job_ids: Sequence[str] = ()) -> list[str]:
        """Cancel several runs (a sweep's elements; `job_ids`: jobs that run several of
        them, Slurm's arrays); a sentence for each thing done."""
        return [self.cancel(run_dir, record) for run_dir, record in runs]

    @abstractmethod
    def cancel(self, run_dir: Path, record: RunRecord) -> str:
        """Cancel the run's job; a sentence saying what was done."""

    # --- sweeps ------------------------------------------------------------------------

    def plan_sweep(self, plans: Sequence[JobPlan], *, sweep_id: str, sweep_dir: str,
                   max_parallel: int | None, dry_run: bool) -> SweepPlan:
        """How the sweep's elements (rendered, in order) are submitted. By default each on
        its own, in order."""
        return SweepPlan(tuple(SweepBatch(None, (i,)) for i in range(len(plans))))

    def launch_sweep(self, plans: Sequence[JobPlan], sweep: SweepPlan, sweep_dir: Path, *,
                     max_parallel: int | None, check: bool, echo: Echo | None) -> list[LaunchedBatch]:
        """Start every batch of a written sweep directory. By default each element with
        `launch`, `max_parallel` at a time (one when None); an element that fails does not
        stop the others."""
        def one(batch: SweepBatch) -> LaunchedBatch:
            (index,) = batch.elements
            plan = plans[index]
            try:
                launched = self.launch(plan, Path(plan.run_dir), check=check, echo=echo)
            except Exception as exc:   # the element's record says what happened; the others go on
                return LaunchedBatch(None, None, batch.elements, (None,), f"{plan.run_id}: {exc}")
            return LaunchedBatch(None, launched.job_id, batch.elements, (launched,))

        workers = max(1, max_parallel or 1)
        if workers == 1:
            return [one(batch) for batch in sweep.batches]
        from concurrent.futures import ThreadPoolExecutor   # a sweep's batches only

        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(one, sweep.batches))
