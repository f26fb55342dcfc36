"""glaunch's Python API: what the command line calls, and what scripts, tests and
benchmarks call instead of the command line.

    from launcher import api
    run = api.submit("exp.yaml", site="mycluster", overrides=["resources.nodes=4"], dry_run=True)
    run.run_id, run.run_dir, run.job_id      # job_id is None for a dry run
    api.status(run.run_id)                   # the same dict as `glaunch status RUN --json`
    api.wait(run.run_id, on_line=print)      # follow to the end; returns the final state
    api.cancel(run.run_id); api.list_runs()

`submit` is `prepare` (load, resolve, render: pure, nothing written) then `launch`
(write the run directory, hand it to the scheduler). Errors are
`launcher.errors.GlaunchError` subclasses carrying `exit_code`; bad input writes nothing.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from . import schedulers
from .errors import ConfigError, GlaunchError, RunError, SchedulerError
from .runs.layout import RunDir, State, is_terminal

Echo = Callable[[str], None]
RunRef = "str | os.PathLike | Run"
FOLLOW_POLL_S = 2.0
CONSOLE_POLL_S = 0.25       # the console's log and status line, between two scheduler polls


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

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["run_dir"] = str(self.run_dir)
        data["files"] = sorted(self.files)
        return data


@dataclass(frozen=True)
class Prepared:
    """A resolved and rendered run, not yet written anywhere."""

    plan: Any                          # launcher.resolution.jobplan.JobPlan
    files: Mapping[str, str]           # file name -> content
    scheduler: Any                     # launcher.schedulers.base.Scheduler
    runs_root_from: Any = None         # launcher.runs.bundle.PathSource: who chose the runs directory
    checkpoint_from: Any = None        # ... and checkpoint.dir
    warnings: tuple[str, ...] = ()     # what the user should know before it runs (one line each)


# --- configuration ---------------------------------------------------------------------


def load(experiment: str | os.PathLike, site: str | None = None, overrides: Sequence[str] = (),
         *, cwd: Path | None = None, environ: Mapping[str, str] | None = None):
    """(LoadedExperiment, LoadedSite): the experiment's own `site:` unless `site` is given,
    else the local site."""
    from .config.load import load_experiment, load_site
    from .config.provenance import Origin

    cwd = cwd or Path.cwd()
    environ = os.environ if environ is None else environ
    exp = load_experiment(experiment, list(overrides))
    if site is not None:
        return exp, load_site(site, cwd, environ)
    name = exp.config.site or "local"
    referrer = exp.provenance.of("site") if exp.config.site else Origin("(default site)")
    return exp, load_site(name, cwd, environ, referrer=referrer)


def prepare(experiment: str | os.PathLike, *, site: str | None = None, overrides: Sequence[str] = (),
            runs_dir: str | None = None, run_id: str | None = None) -> Prepared:
    """Load, resolve and render: every check that needs no scheduler; nothing written."""
    from .resolution.jobplan import SubmitContext
    from .resolution.resolve import resolve
    from .runs.registry import new_run_id

    exp, loaded_site = load(experiment, site, overrides)
    ctx = SubmitContext(cwd=os.getcwd(), python=sys.executable, environ=dict(os.environ),
                        run_id=run_id or new_run_id(exp.config.name), runs_dir=runs_dir)
    plan = resolve(exp, loaded_site, ctx)
    scheduler = schedulers.get(plan.scheduler)
    scheduler.check(plan)
    warning = checkpoint_warning(exp, plan)
    runs_from, checkpoint_from = _path_sources(exp, loaded_site, runs_dir)
    return Prepared(plan, scheduler.render(plan), scheduler, runs_from, checkpoint_from,
                    warnings=(warning,) if warning else ())


def checkpoint_warning(exp, plan) -> str | None:
    """A run that may be requeued, from an experiment that sets nothing about checkpoints:
    whether its script saves cannot be told before it runs, so say what a requeue does
    to a script that never saves (`glaunch status` says it again if that happens)."""
    if plan.requeue_max <= 0 or any(key == "checkpoint" or key.startswith("checkpoint.")
                                    for key in exp.provenance.origins):
        return None
    entry = plan.entry_script or plan.entry_module
    return (f"{exp.path}: no checkpoint settings and requeue.max={plan.requeue_max}: unless {entry} saves and "
            "resumes checkpoints (rt.save_torch_state, rt.resume_checkpoint), each requeue restarts it from step 0")


def _path_sources(exp, loaded_site, runs_dir: str | None):
    """Who chose the runs directory and the checkpoint directory: what an error about
    either names."""
    from .runs.bundle import PathSource

    if runs_dir:
        runs = PathSource("--runs-dir", "command line")
    elif loaded_site.config.runs_root:
        origin = loaded_site.provenance.of("runs_root")
        runs = PathSource("runs_root", origin.file, origin.line)
    else:
        runs = PathSource("--runs-dir", hint=" (the default is ./runs in the current directory: choose another "
                          "with --runs-dir or the site's runs_root)")
    origin = exp.provenance.of("checkpoint.dir")
    return runs, PathSource("checkpoint.dir", origin.file, origin.line)


def launch(prepared: Prepared, *, dry_run: bool = False, check: bool = True,
           echo: Echo | None = None) -> Run:
    """Write the run directory and, unless `dry_run`, hand it to the scheduler. The local
    scheduler runs the job to its end here (rank 0's log goes to `echo`)."""
    from .runs import bundle, registry

    plan, scheduler = prepared.plan, prepared.scheduler
    paths = dict(runs_root=prepared.runs_root_from, checkpoint=prepared.checkpoint_from)
    bundle.check_inputs(plan, **paths)
    registry.check_state_dir()
    if not dry_run:
        scheduler.require()
    written = bundle.write_bundle(plan, prepared.files, dry_run=dry_run, **paths)
    run_dir = written.path
    try:
        registry.register(plan.run_id, str(run_dir))
    except BaseException:
        written.remove()
        raise
    run = Run(plan.run_id, run_dir, plan.site_name, dry_run, tuple(prepared.files), State.RENDERED.value)
    if dry_run:
        return run
    try:
        launched = scheduler.launch(plan, run_dir, check=check, echo=echo)
    except SchedulerError:
        raise                   # refused: run.json says so, and the run directory is the user's record of it
    except BaseException as exc:
        if _nothing_queued(run_dir):
            written.remove()
            registry.unregister(plan.run_id, str(run_dir))
        if isinstance(exc, OSError):
            raise RunError(f"run {plan.run_id}: {exc}") from None
        raise
    return Run(plan.run_id, run_dir, plan.site_name, False, tuple(prepared.files), launched.state,
               launched.job_id, launched.exit_code)


def _nothing_queued(run_dir: Path) -> bool:
    """Whether the run's record says the scheduler never got a job for it. A run directory
    whose record names a job (or cannot be read) stays, whatever failed after."""
    from .runs import registry

    try:
        return registry.read(run_dir).job_id is None
    except GlaunchError:
        return False


def submit(experiment: str | os.PathLike, *, site: str | None = None, overrides: Sequence[str] = (),
           dry_run: bool = False, runs_dir: str | None = None, check: bool = True,
           echo: Echo | None = None) -> Run:
    """Resolve, render, write the run bundle and submit it (or stop there with `dry_run`)."""
    return launch(prepare(experiment, site=site, overrides=overrides, runs_dir=runs_dir),
                  dry_run=dry_run, check=check, echo=echo)


def plan(experiment: str | os.PathLike, *, site: str | None = None, overrides: Sequence[str] = ()):
    """The planner's result (launcher.resolution.planner.PlanResult) for the experiment on the site."""
    from .resolution.strategy import plan_for

    exp, loaded_site = load(experiment, site, overrides)
    return plan_for(exp, loaded_site)


def format_plan(result) -> str:
    from .resolution.planner import format_plan_table

    return format_plan_table(result)


# --- runs ----------------------------------------------------------------------------------


def run_dir_of(run: RunRef) -> Path:  # type: ignore[valid-type]
    from .runs.registry import find_run

    if isinstance(run, Run):
        return run.run_dir
    return find_run(os.fspath(run))


def _refreshed(run_dir: Path):
    """run.json with the scheduler's current view folded in."""
    from .runs import registry

    record = registry.read(run_dir)
    if record.scheduler in schedulers.NAMES and not record.dry_run:
        record = schedulers.get(record.scheduler).refresh(run_dir, record)
    return record


def status(run: RunRef) -> dict[str, Any]:  # type: ignore[valid-type]
    """What `glaunch status RUN --json` prints."""
    from .runs.status import summarize

    run_dir = run_dir_of(run)
    return summarize(run_dir, _refreshed(run_dir))


def format_status(summary: Mapping[str, Any]) -> str:
    from .runs.status import format_status as fmt

    return fmt(dict(summary))


def wait(run: RunRef, *, on_line: Echo | None = None,  # type: ignore[valid-type]
         on_state: Echo | None = None, poll_s: float = FOLLOW_POLL_S, console: Any = None) -> str:
    """Follow the run to its end across requeues: rank 0's log to `on_line` (as it grows),
    each change of state to `on_state`; or everything to `console`
    (launcher.runs.console.Console: log, status line, requeue events, the outcome), which
    is updated several times per scheduler poll. Returns the final state."""
    from .runs.logs import LogFollower

    run_dir = run_dir_of(run)
    followers: dict[str, LogFollower] = {}
    last = None
    while True:
        record = _refreshed(run_dir)
        state = record.state
        if record.extra.get("blocked"):
            # A pending reason that never clears by itself (launcher.schedulers.slurm_state).
            raise SchedulerError(f"run {record.run_id}: {record.detail}")
        if console is not None:
            console.observe(record)
        if on_line is not None:
            if record.job_id and record.job_id not in followers:
                followers[record.job_id] = LogFollower(RunDir(run_dir).task_log(record.job_id, 0), on_line)
            for follower in followers.values():
                follower.poll()
        if state != last and on_state is not None:
            on_state(f"[glaunch] job {record.job_id}: {state}")
        last = state
        if is_terminal(state) or state == State.UNKNOWN:
            for follower in followers.values():
                follower.poll()
            if console is not None:
                console.finish(record)
            return str(state)
        if console is None:
            time.sleep(poll_s)
            continue
        until = time.monotonic() + poll_s
        while time.monotonic() < until:
            console.pump()
            time.sleep(CONSOLE_POLL_S)


def logs(run: RunRef, *, rank: int | None = None, follow: bool = False,  # type: ignore[valid-type]
         echo: Echo = print, poll_s: float = 1.0) -> None:
    """Per-rank logs of the run with a rank prefix, across requeues; with `follow`, until it ends."""
    from .runs.logs import RankLogs

    run_dir = run_dir_of(run)
    reader = RankLogs(run_dir, rank, echo)
    while True:
        reader.poll()
        if not follow:
            reader.flush()
            return
        state = _refreshed(run_dir).state
        if is_terminal(state) or state == State.UNKNOWN:
            follow = False
        time.sleep(poll_s)


def cancel(run: RunRef) -> str:  # type: ignore[valid-type]
    """Cancel the run's job; a sentence saying what was done."""
    from .runs import registry

    run_dir = run_dir_of(run)
    record = registry.read(run_dir)
    if not record.job_id or record.scheduler not in schedulers.NAMES or is_terminal(record.state):
        return f"run {record.run_id}: nothing to cancel ({record.state})"
    return schedulers.get(record.scheduler).cancel(run_dir, record)


def list_runs(limit: int = 20) -> list[dict[str, Any]]:
    """The newest runs: id, state, site, nodes, age, run directory. A run whose record is
    damaged, and bad lines of the run index, come as rows with `error` (the file and what
    is wrong) instead of stopping the listing."""
    from .runs.status import recent

    return recent(limit)


# --- sites ---------------------------------------------------------------------------------


def sites() -> tuple[dict[str, str], list[tuple[str, str]]]:
    """(name -> file of the profile that name finds, [(name, file) of those it shadows])."""
    from .config.sites import site_search_path

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
    from .config.load import load_site

    loaded = load_site(site, Path.cwd(), os.environ)
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
    from .config.load import load_site

    return load_site(site, Path.cwd(), os.environ).path


def check_site(site: str):
    """The profile against the live cluster: a CheckReport (launcher.schedulers.cluster_check)
    with the fatal differences and the warnings, each in profile terms."""
    from .config.load import load_site
    from .schedulers.cluster_check import check_site as check

    return check(load_site(site, Path.cwd(), os.environ).config)


def detect_site(name: str | None = None) -> tuple[str, str]:
    """(profile name, profile text) for the Slurm cluster this machine submits to."""
    from .config.schema import NAME_PATTERN
    from .schedulers.detect import query_cluster

    if name is not None and not NAME_PATTERN.fullmatch(name):
        raise ConfigError(f"{name!r}: use letters, digits, '.', '_' and '-'", key="--name")
    return query_cluster(name)
