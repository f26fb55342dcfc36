"""Schedulers: one interface (`base.Scheduler`), the local machine (`local`) and Slurm
(`slurm/`) behind it, and what the live cluster says (`cluster/`: `sites check`, `sites
detect`)."""

from __future__ import annotations

from launcher.schedulers.base import Scheduler

NAMES = ("local", "slurm")


def get(name: str) -> Scheduler:
    """The scheduler a site's `scheduler:` names (already checked by loading). Only that
    backend is imported: a local run never loads the Slurm client, nor a Slurm submit the
    local runner."""
    if name == "local":
        from launcher.schedulers.local import LocalScheduler

        return LocalScheduler()
    if name == "slurm":
        from launcher.schedulers.slurm.scheduler import SlurmScheduler

        return SlurmScheduler()
    raise ValueError(f"unknown scheduler {name!r}")
