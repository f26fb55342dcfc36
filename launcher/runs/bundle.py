"""Write a rendered run bundle to disk (an effect: everything is checked before this)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from ..errors import ConfigError
from ..resolution.jobplan import JobPlan
from . import registry
from .layout import JOB_SCRIPT, RunRecord, State

EXECUTABLE = {JOB_SCRIPT}


def check_inputs(plan: JobPlan) -> None:
    """What resolve cannot see without touching the disk: the entry point exists."""
    if plan.entry_script and plan.container is None and not os.path.isfile(plan.entry_script):
        raise ConfigError(f"script {plan.entry_script!r} not found (relative paths are taken from the "
                          "experiment file's directory)", file=plan.experiment_file, key="entrypoint.script")
    if os.path.exists(plan.run_dir):
        raise ConfigError(f"run directory {plan.run_dir!r} already exists", file=plan.experiment_file,
                          key="name")


def write_bundle(plan: JobPlan, files: Mapping[str, str], *, dry_run: bool) -> Path:
    run_dir = Path(plan.run_dir)
    try:
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        run_dir.mkdir()
    except FileExistsError:
        raise ConfigError(f"run directory {plan.run_dir!r} already exists", file=plan.experiment_file,
                          key="name") from None
    except OSError as exc:
        raise ConfigError(f"cannot create the run directory: {exc}", file=plan.site_file,
                          key="runs_root") from None
    Path(plan.log_dir).mkdir()
    Path(plan.checkpoint_dir).mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = run_dir / name
        path.write_text(text, encoding="utf-8")
        if name in EXECUTABLE:
            path.chmod(0o755)
    registry.write(run_dir, initial_record(plan, dry_run=dry_run))
    return run_dir


def initial_record(plan: JobPlan, *, dry_run: bool) -> RunRecord:
    return RunRecord(
        run_id=plan.run_id, name=plan.name, site=plan.site_name, scheduler=plan.scheduler,
        run_dir=plan.run_dir, experiment_file=plan.experiment_file, created=registry.now(), dry_run=dry_run,
        nodes=plan.nodes, world_size=plan.world_size, partition=plan.partition, requeue_max=plan.requeue_max,
        crash_retries=plan.crash_retries, state=(State.RENDERED if dry_run else State.SUBMITTING).value,
        job_id=None)
