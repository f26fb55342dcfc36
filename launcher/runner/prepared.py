"""What a submission road resolved and rendered, before anything is written: a run
(`Prepared`), an ended run resolved again (`PreparedResume`), a sweep's elements
(`PreparedSweep`). The roads (launcher.runner.submission, resume, sweep_submission; over
SSH launcher.runner.remote and remote_sweep) meet at these types."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from launcher.resolution.jobplan import JobPlan
from launcher.rundir.records import RunRecord
from launcher.runner import unseen


@dataclass(frozen=True)
class Prepared:
    """A resolved and rendered run, not yet written anywhere."""

    plan: JobPlan
    files: Mapping[str, str]           # file name -> content
    scheduler: Any                     # launcher.schedulers.base.Scheduler
    runs_root_from: Any = None         # launcher.runner.bundle.PathSource: who chose the runs directory
    checkpoint_from: Any = None        # ... and checkpoint.dir
    warnings: tuple[str, ...] = ()     # what the user should know before it runs (one line each)
    after: tuple[Any, ...] = ()        # launcher.runner.dependencies.Upstream: the runs it waits for (--after)
    remote: Any = None                 # launcher.schedulers.ssh.connection.Connection: submitted over SSH
    login: Any = None                  # launcher.config.login.Login: the login node it goes through (over SSH)


@dataclass(frozen=True)
class PreparedResume:
    """An ended run resolved again with the new overrides and rendered, nothing written."""

    run_dir: Path
    record: RunRecord                  # run.json as it was read (refreshed from the scheduler)
    overrides: tuple[str, ...]
    plan: JobPlan
    files: Mapping[str, str]
    scheduler: Any                     # launcher.schedulers.base.Scheduler
    warnings: tuple[str, ...] = ()
    remote: Any = None                 # launcher.schedulers.ssh.connection.Connection: a run on a cluster over SSH


@dataclass(frozen=True)
class PreparedSweep:
    """Every element of a sweep resolved and rendered, nothing written."""

    sweep_id: str
    sweep_dir: Path
    elements: tuple[Any, ...]        # launcher.resolution.sweep.Element
    prepared: tuple[Prepared, ...]   # one per element
    axes: tuple[Any, ...]            # launcher.resolution.sweep.Axis
    max_parallel: int | None
    experiment_file: str
    after: tuple[Any, ...] = ()
    remote: Any = None               # launcher.schedulers.ssh.connection.Connection: submitted over SSH
    login: Any = None                # launcher.config.login.Login: the login node it goes through (over SSH)
    unseen: tuple[str, ...] = ()     # swept keys that change no file the job reads
    unseen_overrides: tuple[str, ...] = ()   # and KEY=VALUE overrides' keys

    @property
    def scheduler(self):
        return self.prepared[0].scheduler

    @property
    def warnings(self) -> tuple[str, ...]:
        return (self.prepared[0].warnings + tuple(unseen.warning(key) for key in self.unseen)
                + tuple(unseen.warning(key, "overriding") for key in self.unseen_overrides))
