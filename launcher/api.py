"""glaunch's Python API: what the command line calls, and what scripts, tests and
benchmarks call instead of the command line.

    from launcher import api
    run = api.submit("exp.yaml", site="mycluster", overrides=["resources.nodes=4"], dry_run=True)
    run.run_id, run.run_dir, run.job_id      # job_id is None for a dry run
    api.status(run.run_id)                   # the same dict as `glaunch status RUN --json`
    api.wait(run.run_id, on_line=print)      # follow to the end; returns the final state
    api.cancel(run.run_id); api.list_runs()
    api.resume(run.run_id, overrides=["resources.nodes=1"])   # continue an ended run

`submit` is `prepare` (load, resolve, render: pure, nothing written) then `launch`
(write the run directory, hand it to the scheduler); `resume` is `prepare_resume` then
`launch_resume`. Errors are `launcher.errors.GlaunchError` subclasses carrying
`exit_code`; bad input writes nothing.

The work is done in launcher.runs: `submission` (one run), `sweep_submission`,
`resume`, and `manage` (status, wait, logs, cancel, list); this module gathers it with
the site and planner calls.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from launcher.errors import ConfigError
from launcher.runner.submission import (
    Echo,
    Prepared,
    Run,
    RunRef,
    checkpoint_warning,
    launch,
    load,
    prepare,
    run,
    submit,
)

if TYPE_CHECKING:
    from launcher.runner.manage import (
        cancel,
        find_sweep,
        format_status,
        list_runs,
        logs,
        run_dir_of,
        status,
        wait,
    )
    from launcher.runner.resume import PreparedResume, launch_resume, prepare_resume, resume
    from launcher.runner.sweep_submission import PreparedSweep, Sweep, launch_sweep, prepare_sweep

# Imported when first used: a single submission (the dry run above all) needs none of them.
_LAZY = {
    "launcher.runner.manage": ("cancel", "find_sweep", "format_status", "list_runs", "logs", "run_dir_of", "status",
                             "wait"),
    "launcher.runner.resume": ("PreparedResume", "launch_resume", "prepare_resume", "resume"),
    "launcher.runner.sweep_submission": ("PreparedSweep", "Sweep", "launch_sweep", "prepare_sweep"),
}
_LAZY_NAMES = {name: module for module, names in _LAZY.items() for name in names}

__all__ = ["Echo", "Prepared", "PreparedResume", "PreparedSweep", "Run", "RunRef", "Sweep", "cancel",
           "check_site", "checkpoint_warning", "detect_site", "find_sweep", "format_plan", "format_status",
           "launch", "launch_resume", "launch_sweep", "list_runs", "load", "logs", "plan", "prepare",
           "prepare_resume", "prepare_sweep", "resume", "run", "run_dir_of", "site_values", "sites", "status",
           "submit", "validate_site", "wait"]


def plan(experiment: str | os.PathLike, *, site: str | None = None, overrides: Sequence[str] = ()):
    """The planner's result (launcher.resolution.planner.PlanResult) for the experiment on the site."""
    from launcher.resolution.strategy import plan_for

    exp, loaded_site = load(experiment, site, overrides)
    return plan_for(exp, loaded_site)


def format_plan(result) -> str:
    from launcher.resolution.planner import format_plan_table

    return format_plan_table(result)


# --- sites ---------------------------------------------------------------------------------


def sites() -> tuple[dict[str, str], list[tuple[str, str]]]:
    """(name -> file of the profile that name finds, [(name, file) of those it shadows])."""
    from launcher.config.sites import site_search_path

    seen: dict[str, str] = {}
    shadowed = []
    for directory in site_search_path(Path.cwd(), os.environ):
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.y*ml")):
            if path.stem in seen:
                shadowed.append((path.stem, str(path)))
            else:
                seen[path.stem] = str(path)
    return seen, shadowed


def site_values(site: str) -> dict[str, Any]:
    """The profile resolved through its extends chain: every key's value and where it came from."""
    from launcher.config.sites import load_site

    loaded = load_site(site, Path.cwd(), os.environ, key="SITE")
    rows = []
    for key, value in _flatten(asdict(loaded.config)).items():
        origin = loaded.provenance.of(key, exact=True)
        rows.append({"key": key, "value": value, "from": origin.file + (f":{origin.line}" if origin.line else "")})
    return {"site": loaded.config.name, "file": str(loaded.path), "chain": [str(p) for p in loaded.chain],
            "values": rows}


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def validate_site(site: str) -> Path:
    """Load and check one profile (a name or a file); its file, or ConfigError."""
    from launcher.config.sites import load_site

    return load_site(site, Path.cwd(), os.environ, key="SITE").path


def check_site(site: str):
    """The profile against the live cluster: a CheckReport (launcher.schedulers.cluster.check)
    with the fatal differences and the warnings, each in profile terms."""
    from launcher.config.sites import load_site
    from launcher.schedulers.cluster.check import check_site as check

    loaded = load_site(site, Path.cwd(), os.environ, key="SITE")
    if loaded.config.scheduler != "slurm":
        # A local profile describes this machine: a Slurm cluster's partitions say nothing about it.
        origin = loaded.provenance.of("scheduler")
        raise ConfigError(f"site {loaded.config.name!r} runs jobs on this machine (scheduler: "
                          f"{loaded.config.scheduler}): there is no Slurm cluster to check it against",
                          file=origin.file if origin.line else str(loaded.path), line=origin.line, key="scheduler")
    return check(loaded.config)


def detect_site(name: str | None = None) -> tuple[str, str]:
    """(profile name, profile text) for the Slurm cluster this machine submits to."""
    from launcher.config.schema import NAME_PATTERN
    from launcher.schedulers.cluster.detect import query_cluster

    if name is not None and not NAME_PATTERN.fullmatch(name):
        raise ConfigError(f"{name!r}: use letters, digits, '.', '_' and '-'", key="--name")
    return query_cluster(name)


def __getattr__(name: str) -> Any:
    module = _LAZY_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
