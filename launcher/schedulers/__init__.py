"""Schedulers: one interface (`base.Scheduler`), the local machine and Slurm behind it,
and cluster detection for `glaunch sites detect`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.schedulers.local import LocalScheduler
from launcher.schedulers.slurm.scheduler import SlurmScheduler

if TYPE_CHECKING:
    from launcher.schedulers.base import Scheduler

NAMES = ("local", "slurm")


def get(name: str) -> Scheduler:
    """The scheduler a site's `scheduler:` names (already checked by loading)."""
    if name == "local":
        return LocalScheduler()
    if name == "slurm":
        return SlurmScheduler()
    raise ValueError(f"unknown scheduler {name!r}")
