"""What a submission road resolved and rendered, before anything is written: a run
(`Prepared`), an ended run resolved again (`PreparedResume`), a sweep's elements
(`PreparedSweep`), each with the road it goes by (`Road`, `ResumeRoad`: on this machine
launcher.runner.direct; over SSH launcher.runner.submission_road and launcher.runner.road).
The runner's pipelines (launcher.runner.submission, resume, sweep_submission) and the
roads meet at these types."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Protocol

from launcher.resolution.jobplan import JobPlan
from launcher.resolution.sweep import Axis, Element
from launcher.rundir.records import RunRecord
from launcher.runner import unseen
from launcher.runner.direct import DIRECT
from launcher.runner.results import Run, Sweep
from launcher.runner.upstream import Upstream
from launcher.schedulers.base import Scheduler

if TYPE_CHECKING:
    # Named only: launcher.runner.bundle loads the code snapshot's subprocess machinery.
    from launcher.runner.bundle import PathSource


class Road(Protocol):
    """What a prepared submission asks of the road it goes by. Each launching method is
    given `here`, this machine's pipeline for it, which the direct road runs; the SSH road
    sends the submission to its cluster instead (and runs `here` for a dry run's files)."""

    def files(self, files: Mapping[str, str]) -> dict[str, str]:
        """The rendered files as they are written and shown."""

    def close(self) -> None:
        """The road's connection closed (when it holds one)."""

    def launch(self, prepared: Prepared, *, dry_run: bool, check: bool, here: Callable[[Prepared], Run]) -> Run:
        """The run written, and queued unless `dry_run`."""

    def launch_sweep(self, prepared: PreparedSweep, *, dry_run: bool, check: bool,
                     here: Callable[[PreparedSweep, PreparedSweep], Sweep]) -> Sweep:
        """The sweep written, and queued unless `dry_run`; `here` gets the sweep as its jobs
        see it and as it is written on this machine."""


class ResumeRoad(Protocol):
    """What a prepared resume asks of the road of its run (launcher.runner.road)."""

    def close(self) -> None:
        """The road's connection closed (when it holds one)."""

    def launch_resume(self, prepared: PreparedResume, *, check: bool,
                      here: Callable[[PreparedResume], Run]) -> Run:
        """The resumed run's files switched and its job queued; `here` does it on this
        machine."""


@dataclass(frozen=True)
class Prepared:
    """A resolved and rendered run, not yet written anywhere."""

    plan: JobPlan
    files: Mapping[str, str]           # file name -> content
    scheduler: Scheduler
    runs_root_from: PathSource | None = None     # who chose the runs directory
    checkpoint_from: PathSource | None = None    # ... and checkpoint.dir
    warnings: tuple[str, ...] = ()     # what the user should know before it runs (one line each)
    after: tuple[Upstream, ...] = ()   # the runs it waits for (--after)
    road: Road = DIRECT                # how it reaches its cluster


@dataclass(frozen=True)
class PreparedResume:
    """An ended run resolved again with the new overrides and rendered, nothing written."""

    run_dir: Path
    record: RunRecord                  # run.json as it was read (refreshed from the scheduler)
    overrides: tuple[str, ...]
    plan: JobPlan
    files: Mapping[str, str]
    scheduler: Scheduler
    warnings: tuple[str, ...] = ()
    road: ResumeRoad = DIRECT          # how the run's cluster is reached


@dataclass(frozen=True)
class PreparedSweep:
    """Every element of a sweep resolved and rendered, nothing written."""

    sweep_id: str
    sweep_dir: Path
    elements: tuple[Element, ...]
    prepared: tuple[Prepared, ...]   # one per element
    axes: tuple[Axis, ...]
    max_parallel: int | None
    experiment_file: str
    after: tuple[Upstream, ...] = ()
    road: Road = DIRECT              # how it reaches its cluster
    unseen: tuple[str, ...] = ()     # swept keys that change no file the job reads
    unseen_overrides: tuple[str, ...] = ()   # and KEY=VALUE overrides' keys

    @property
    def scheduler(self) -> Scheduler:
        return self.prepared[0].scheduler

    @property
    def warnings(self) -> tuple[str, ...]:
        return (self.prepared[0].warnings + tuple(unseen.warning(key) for key in self.unseen)
                + tuple(unseen.warning(key, "overriding") for key in self.unseen_overrides))
