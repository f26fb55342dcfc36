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

import contextlib
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence, Union

from . import schedulers
from .errors import ConfigError, GlaunchError, RunError, SchedulerError
from .runs.layout import RunDir, RunRecord, State, is_terminal

Echo = Callable[[str], None]
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


# A run or sweep id, its directory, or a Run or Sweep.
RunRef = Union[str, "os.PathLike[str]", Run, "Sweep"]


@dataclass(frozen=True)
class Prepared:
    """A resolved and rendered run, not yet written anywhere."""

    plan: Any                          # launcher.resolution.jobplan.JobPlan
    files: Mapping[str, str]           # file name -> content
    scheduler: Any                     # launcher.schedulers.base.Scheduler
    runs_root_from: Any = None         # launcher.runs.bundle.PathSource: who chose the runs directory
    checkpoint_from: Any = None        # ... and checkpoint.dir
    warnings: tuple[str, ...] = ()     # what the user should know before it runs (one line each)
    after: tuple[Any, ...] = ()        # launcher.runs.dependencies.Upstream: the runs it waits for (--after)


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
            runs_dir: str | None = None, run_id: str | None = None, after: Sequence[str] = (),
            dry_run: bool = False) -> Prepared:
    """Load, resolve and render: every check that needs no scheduler; nothing written.
    `after` (RUN[:ok|any]): runs or sweeps to wait for; their state is asked of the
    scheduler unless `dry_run`."""
    from .resolution.jobplan import SubmitContext
    from .resolution.resolve import resolve
    from .runs.registry import new_run_id

    exp, loaded_site = load(experiment, site, overrides)
    upstreams = _upstreams(after, loaded_site.config.scheduler, refresh=not dry_run)
    ctx = SubmitContext(cwd=os.getcwd(), python=sys.executable, environ=dict(os.environ),
                        run_id=run_id or new_run_id(exp.config.name), runs_dir=runs_dir,
                        dependency=_dependency(upstreams, loaded_site.config.scheduler))
    plan = resolve(exp, loaded_site, _with_code_root(exp, loaded_site, ctx, {}))
    scheduler = schedulers.get(plan.scheduler)
    scheduler.check(plan)
    warning = checkpoint_warning(exp, plan)
    runs_from, checkpoint_from = _path_sources(exp, loaded_site, runs_dir)
    return Prepared(plan, scheduler.render(plan), scheduler, runs_from, checkpoint_from,
                    warnings=(warning,) if warning else (), after=tuple(upstreams))


def _with_code_root(exp, loaded_site, ctx, found: dict):
    """ctx with the work tree the code snapshot copies (found on disk; `found` caches it
    by the folder it was looked up from)."""
    import dataclasses

    from .resolution.resolve import code_anchor
    from .runs.snapshot import locate

    anchor = code_anchor(exp, loaded_site, ctx)
    if anchor is None:
        return ctx
    if anchor not in found:
        found[anchor] = locate(anchor, ctx.cwd)
    return dataclasses.replace(ctx, code_root=found[anchor])


def _upstreams(after: Sequence[str], scheduler: str, *, refresh: bool) -> list:
    """The runs and sweeps `--after` names, as they stand now (refreshed from their
    scheduler unless not `refresh`); ConfigError for one that can never be waited for."""
    if not after:
        return []
    from .runs import dependencies

    upstreams = [_upstream(item, refresh) for item in dependencies.parse(after)]
    dependencies.check_for(upstreams, scheduler)
    return upstreams


def _upstream(after, refresh: bool):
    from .runs import dependencies, registry, sweeps

    sweep_dir = sweeps.find_sweep(after.ref)
    try:
        if sweep_dir is None:
            run_dir = registry.find_run(after.ref)
            record = _refreshed(run_dir) if refresh else registry.read(run_dir)
            return dependencies.upstream_of_run(after, record, run_dir)
    except RunError as exc:
        raise ConfigError(f"{after}: {exc}", file="command line", key=dependencies.OPTION) from None
    sweep = sweeps.read(sweep_dir)
    records = _sweep_records(sweep_dir, refresh=refresh)
    states = tuple(r.state if not isinstance(r, GlaunchError) else State.UNKNOWN.value for r in records.values())
    job_ids = tuple(a.job_id for a in sweep.arrays if a.job_id)
    if not job_ids:       # elements submitted one by one (or not at all)
        job_ids = tuple(r.job_id for r in records.values() if not isinstance(r, GlaunchError) and r.job_id)
    return dependencies.Upstream(after, sweep.sweep_id, sweep.scheduler, job_ids, states,
                                 tuple(Path(e.run_dir) for e in sweep.elements))


def _dependency(upstreams, scheduler: str) -> str | None:
    if not upstreams:
        return None
    from .runs import dependencies

    return dependencies.clause(upstreams) if scheduler == "slurm" else None


def _refresh_upstream(upstream):
    return _upstream(upstream.after, True)


def checkpoint_warning(exp, plan) -> str | None:
    """A run that may be requeued, from an experiment that sets nothing about checkpoints:
    whether its script saves cannot be told before it runs, so say what a requeue does
    to a script that never saves (`glaunch status` says it again if that happens)."""
    if plan.requeue_max <= 0 or any(key == "checkpoint" or key.startswith("checkpoint.")
                                    for key in exp.provenance.origins):
        return None
    entry = plan.submitted_script or plan.entry_module
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
    survey = bundle.check_inputs(plan, **paths)
    registry.check_state_dir()
    if not dry_run:
        scheduler.require()
    extra = None
    if prepared.after:
        from .runs import dependencies

        extra = {"after": [dependencies.record_of(u) for u in prepared.after]}
    written = bundle.write_bundle(plan, prepared.files, dry_run=dry_run, survey=survey, extra=extra, **paths)
    run_dir = written.path
    try:
        registry.register(plan.run_id, str(run_dir))
    except BaseException:
        written.remove()
        raise
    run = Run(plan.run_id, run_dir, plan.site_name, dry_run, tuple(prepared.files), State.RENDERED.value)
    if dry_run:
        return run
    if prepared.after and scheduler.runs_to_completion:
        blocked = _wait_upstreams(prepared.after, run_dir, echo)
        if blocked is not None:
            return Run(plan.run_id, run_dir, plan.site_name, False, tuple(prepared.files), blocked, None, 1)
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


def _wait_upstreams(upstreams, run_dir: Path, echo: Echo | None) -> str | None:
    """The local site's --after: wait until every run waited for ended. None when this run
    may start; else its state, recorded with the reason it never starts."""
    from .runs import dependencies, registry

    ended = dependencies.wait(upstreams, _refresh_upstream, echo=echo)
    why = dependencies.never_satisfied(ended)
    if why is None:
        return None
    with registry.updating(run_dir) as record:
        record.state = State.CANCELLED.value
        record.reason = "never starts"
        record.detail = why
    if echo is not None:
        echo(f"[glaunch] run {record.run_id} never starts: {why}\n")
    return record.state


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
           echo: Echo | None = None, sweep: Sequence[str] = (), max_parallel: int | None = None,
           after: Sequence[str] = ()) -> Run | Sweep:
    """Resolve, render, write the run bundle and submit it (or stop there with `dry_run`).
    With `sweep` (KEY=V1,V2,... each): a sweep of every combination (see prepare_sweep)."""
    if sweep:
        return launch_sweep(prepare_sweep(experiment, sweep, site=site, overrides=overrides, runs_dir=runs_dir,
                                          max_parallel=max_parallel, after=after, dry_run=dry_run),
                            dry_run=dry_run, check=check, echo=echo)
    if max_parallel is not None:
        raise ConfigError("--max-parallel applies to a sweep (give --sweep)", file="command line",
                          key="--max-parallel")
    return launch(prepare(experiment, site=site, overrides=overrides, runs_dir=runs_dir, after=after,
                          dry_run=dry_run),
                  dry_run=dry_run, check=check, echo=echo)


def run(experiment: str | os.PathLike, *, site: str | None = None, overrides: Sequence[str] = (),
        runs_dir: str | None = None, echo: Echo | None = None, environ: Mapping[str, str] | None = None) -> Run:
    """`glaunch run`: inside an existing Slurm allocation (salloc, an interactive job),
    start the ranks on its nodes with srun, no sbatch: the same environment, rendezvous
    and runtime as a batch job, in a run directory like any other. Returns when the run
    ended (never requeued: its checkpoints resume in a later run). ConfigError outside an
    allocation or for a plan it cannot hold."""
    from .schedulers.slurm import Allocation, AllocationScheduler

    allocation = Allocation.of(os.environ if environ is None else environ)
    if allocation is None:
        raise ConfigError("glaunch run starts the ranks inside a Slurm allocation, and this shell is in none "
                          "(SLURM_JOB_ID is not set): run it in salloc or an interactive job, or use glaunch submit",
                          file="environment", key="SLURM_JOB_ID")
    prepared = prepare(experiment, site=site, overrides=overrides, runs_dir=runs_dir)
    plan = prepared.plan
    if plan.scheduler != "slurm":
        raise ConfigError(f"site {plan.site_name!r} is not a Slurm site (scheduler: {plan.scheduler}); glaunch run "
                          "needs the profile of the cluster whose allocation this is", file=plan.site_file,
                          key="scheduler")
    scheduler = AllocationScheduler(allocation)
    scheduler.check(plan)
    return launch(Prepared(plan, scheduler.render(plan), scheduler, prepared.runs_root_from,
                           prepared.checkpoint_from, prepared.warnings), echo=echo)


# --- sweeps --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sweep:
    """A submitted (or rendered) sweep: its elements are runs."""

    sweep_id: str
    sweep_dir: Path
    site: str
    dry_run: bool
    runs: tuple[Run, ...]
    arrays: tuple[dict[str, Any], ...]      # Slurm: {script, job_id, elements, error}
    files: Mapping[str, str]                # the sweep directory's own (array scripts)
    state: str

    def to_json(self) -> dict[str, Any]:
        return {"sweep_id": self.sweep_id, "sweep_dir": str(self.sweep_dir), "site": self.site,
                "dry_run": self.dry_run, "state": self.state, "arrays": list(self.arrays),
                "files": sorted(self.files), "runs": [r.to_json() for r in self.runs]}


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

    @property
    def scheduler(self):
        return self.prepared[0].scheduler

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.prepared[0].warnings


def prepare_sweep(experiment: str | os.PathLike, sweep: Sequence[str], *, site: str | None = None,
                  overrides: Sequence[str] = (), runs_dir: str | None = None, max_parallel: int | None = None,
                  after: Sequence[str] = (), dry_run: bool = False) -> PreparedSweep:
    """Every combination of the `sweep` values (KEY=V1,V2,... each; the first varies
    slowest), each resolved and checked as its own run would be, its values applied after
    `overrides`: one element that cannot run refuses the whole sweep, naming it. Nothing
    written."""
    import dataclasses

    from .config.load import load_experiment
    from .resolution.jobplan import SubmitContext
    from .resolution.resolve import resolve
    from .resolution.sweep import expand, parse_axes
    from .runs import sweeps

    if max_parallel is not None and max_parallel < 1:
        raise ConfigError(f"must be 1 or more, got {max_parallel}", file="command line", key="--max-parallel")
    axes = parse_axes(sweep)
    elements = expand(axes)
    first = elements[0]
    with _naming(first):
        exp0, loaded_site = load(experiment, site, [*overrides, *first.overrides])
    scheduler_name = loaded_site.config.scheduler
    upstreams = _upstreams(after, scheduler_name, refresh=not dry_run)
    sweep_id = sweeps.new_sweep_id(exp0.config.name)
    base = SubmitContext(cwd=os.getcwd(), python=sys.executable, environ=dict(os.environ), run_id=sweep_id,
                         runs_dir=runs_dir, dependency=_dependency(upstreams, scheduler_name))
    # The sweep's directory is where a run with the sweep's id would go.
    with _naming(first):
        sweep_dir = Path(resolve(exp0, loaded_site, base).run_dir)
    roots: dict = {}
    prepared = []
    for element in elements:
        with _naming(element):
            exp = exp0 if element is first else load_experiment(experiment, [*overrides, *element.overrides])
            ctx = dataclasses.replace(base, run_id=sweeps.element_run_id(sweep_id, element.index),
                                      runs_dir=str(sweep_dir).replace("$", "$$"),
                                      code_dir=str(sweep_dir / "code"), sweep_id=sweep_id)
            plan = resolve(exp, loaded_site, _with_code_root(exp, loaded_site, ctx, roots))
            scheduler = schedulers.get(plan.scheduler)
            scheduler.check(plan)
            files = scheduler.render(plan)
        warning = checkpoint_warning(exp, plan)
        runs_from, checkpoint_from = _path_sources(exp, loaded_site, runs_dir)
        prepared.append(Prepared(plan, files, scheduler, runs_from, checkpoint_from,
                                 warnings=(warning,) if warning else (), after=tuple(upstreams)))
    sources = {p.plan.code.source for p in prepared if p.plan.code is not None}
    if len(sources) > 1:
        raise ConfigError(f"the elements run code from different work trees ({', '.join(sorted(sources))}); "
                          "a sweep snapshots one", file="command line", key="--sweep")
    return PreparedSweep(sweep_id, sweep_dir, tuple(elements), tuple(prepared), tuple(axes), max_parallel,
                         str(exp0.path), tuple(upstreams))


@contextlib.contextmanager
def _naming(element) -> Iterator[None]:
    """A ConfigError while preparing `element` names the element and its values."""
    try:
        yield
    except ConfigError as exc:
        raise ConfigError(f"sweep element {element.index} ({element.label()}): {exc.message}", file=exc.file,
                          key=exc.key, line=exc.line) from None


def launch_sweep(prepared: PreparedSweep, *, dry_run: bool = False, check: bool = True,
                 echo: Echo | None = None) -> Sweep:
    """Write the sweep directory (its code snapshot once, every element's run directory,
    sweep.json, the array scripts) and, unless `dry_run`, submit it: on Slurm one array job
    per allocation shape; on the local site the elements run one after another
    (`max_parallel` at a time)."""
    from .runs import bundle, dependencies, provenance, registry, snapshot, sweeps

    plans = [p.plan for p in prepared.prepared]
    scheduler = prepared.scheduler
    for item in prepared.prepared:
        bundle.check_inputs(item.plan, runs_root=item.runs_root_from, checkpoint=item.checkpoint_from)
    code = plans[0].code
    survey = snapshot.check(code, prepared.experiment_file) if code is not None else None
    registry.check_state_dir()
    if not dry_run:
        scheduler.require()
    sweep_plan = scheduler.plan_sweep(plans, sweep_id=prepared.sweep_id, sweep_dir=str(prepared.sweep_dir),
                                      max_parallel=prepared.max_parallel, dry_run=dry_run)
    first = plans[0]
    record = sweeps.SweepRecord(
        sweep_id=prepared.sweep_id, name=first.name, site=first.site_name, scheduler=first.scheduler,
        sweep_dir=str(prepared.sweep_dir), experiment_file=prepared.experiment_file, created=registry.now(),
        dry_run=dry_run, axes=[{"key": a.key, "values": list(a.values)} for a in prepared.axes],
        max_parallel=prepared.max_parallel,
        elements=[sweeps.SweepElement(e.index, p.run_id, p.run_dir, dict(e.params))
                  for e, p in zip(prepared.elements, plans)],
        arrays=[sweeps.SweepArray(list(b.elements), b.script) for b in sweep_plan.batches if b.script],
        after=[str(u.after) for u in prepared.after])
    after = [dependencies.record_of(u) for u in prepared.after]
    written = sweeps.create_dir(prepared.sweep_dir, prepared.experiment_file)
    try:
        taken = snapshot.take(code, survey, prepared.sweep_dir / "code.patch") if code and survey else None
        origin = provenance.collect(survey, taken)
        for name, text in sweep_plan.files.items():
            bundle.write_file(prepared.sweep_dir / name, text, executable=True)
        sweeps.write(prepared.sweep_dir, record)
        registry.register(prepared.sweep_id, str(prepared.sweep_dir))
        written.registered.append((prepared.sweep_id, str(prepared.sweep_dir)))
        for element, item in zip(prepared.elements, prepared.prepared):
            extra: dict[str, Any] = {"sweep": {"id": prepared.sweep_id, "index": element.index,
                                               "params": dict(element.params)}}
            if after:
                extra["after"] = after
            written.bundles.append(bundle.write_bundle(
                item.plan, item.files, dry_run=dry_run, runs_root=item.runs_root_from,
                checkpoint=item.checkpoint_from, origin=origin, extra=extra))
            registry.register(item.plan.run_id, item.plan.run_dir)
            written.registered.append((item.plan.run_id, item.plan.run_dir))
    except BaseException:
        written.remove()
        raise
    if not dry_run:
        if prepared.after and scheduler.runs_to_completion:
            blocked = [_wait_upstreams(prepared.after, Path(p.run_dir), echo) for p in plans]
            if any(blocked):
                return _sweep_result(prepared, dry_run)
        batches = scheduler.launch_sweep(plans, sweep_plan, prepared.sweep_dir, max_parallel=prepared.max_parallel,
                                         check=check, echo=echo)
        sweeps.record_launch(prepared.sweep_dir, batches)
    return _sweep_result(prepared, dry_run, sweep_plan.files)


def _sweep_result(prepared: PreparedSweep, dry_run: bool, files: Mapping[str, str] | None = None) -> Sweep:
    from .runs import registry, sweeps

    record = sweeps.read(prepared.sweep_dir)
    runs = []
    for item in prepared.prepared:
        rec = registry.read(item.plan.run_dir)
        runs.append(Run(rec.run_id, Path(item.plan.run_dir), item.plan.site_name, dry_run, tuple(item.files),
                        rec.state, rec.job_id))
    state = sweeps.sweep_state([r.state for r in runs])
    return Sweep(prepared.sweep_id, prepared.sweep_dir, record.site, dry_run, tuple(runs),
                 tuple(a.__dict__ for a in record.arrays), dict(files or {}), state)


def _sweep_records(sweep_dir: Path, *, refresh: bool = True) -> dict:
    """run id -> each element's record (refreshed together by its scheduler), or the error
    reading it."""
    from .runs import sweeps

    record = sweeps.read(sweep_dir)
    if refresh and not record.dry_run and record.scheduler in schedulers.NAMES:
        return sweeps.element_records(sweep_dir, schedulers.get(record.scheduler).refresh_many)
    return sweeps.element_records(sweep_dir, lambda runs: [r for _, r in runs])


def find_sweep(ref: Any) -> Path | None:
    """The sweep directory `ref` (a sweep id or directory, or a Sweep) names; None for a run."""
    from .runs import sweeps

    if isinstance(ref, Sweep):
        return ref.sweep_dir
    if isinstance(ref, Run):
        return None
    return sweeps.find_sweep(ref)


def plan(experiment: str | os.PathLike, *, site: str | None = None, overrides: Sequence[str] = ()):
    """The planner's result (launcher.resolution.planner.PlanResult) for the experiment on the site."""
    from .resolution.strategy import plan_for

    exp, loaded_site = load(experiment, site, overrides)
    return plan_for(exp, loaded_site)


def format_plan(result) -> str:
    from .resolution.planner import format_plan_table

    return format_plan_table(result)


# --- runs ----------------------------------------------------------------------------------


def run_dir_of(run: RunRef) -> Path:
    from .runs.registry import find_run

    if isinstance(run, Run):
        return run.run_dir
    if isinstance(run, Sweep):
        raise RunError(f"{run.sweep_id} is a sweep, not a run")
    return find_run(os.fspath(run))


def _refreshed(run_dir: Path):
    """run.json with the scheduler's current view folded in."""
    from .runs import registry

    record = registry.read(run_dir)
    if record.scheduler in schedulers.NAMES and not record.dry_run:
        record = schedulers.get(record.scheduler).refresh(run_dir, record)
    return record


def status(run: RunRef) -> dict[str, Any]:
    """What `glaunch status RUN --json` prints. For a sweep: its elements' table (each one's
    swept values, state, step, result), its arrays and the counts of each state."""
    from .runs import sweeps
    from .runs.status import summarize

    sweep_dir = find_sweep(run)
    if sweep_dir is not None:
        return sweeps.summarize(sweep_dir, _sweep_records(sweep_dir))
    run_dir = run_dir_of(run)
    return summarize(run_dir, _refreshed(run_dir))


def format_status(summary: Mapping[str, Any]) -> str:
    from .runs import sweeps
    from .runs.status import format_status as fmt

    if "sweep_id" in summary:
        return sweeps.format_status(summary)
    return fmt(dict(summary))


def wait(run: RunRef, *, on_line: Echo | None = None,
         on_state: Echo | None = None, poll_s: float = FOLLOW_POLL_S, console: Any = None) -> str:
    """Follow the run to its end across requeues: rank 0's log to `on_line` (as it grows),
    each change of state to `on_state`; or everything to `console`
    (launcher.runs.console.Console: log, status line, requeue events, the outcome), which
    is updated several times per scheduler poll. Returns the final state."""
    from .runs.logs import LogFollower

    sweep_dir = find_sweep(run)
    if sweep_dir is not None:
        return _wait_sweep(sweep_dir, on_state=on_state, poll_s=poll_s)
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


def _wait_sweep(sweep_dir: Path, *, on_state: Echo | None, poll_s: float) -> str:
    """Follow every element of a sweep to its end; the sweep's state. SchedulerError when
    the elements still waiting can never start."""
    from .runs import sweeps

    index = {e.run_id: e.index for e in sweeps.read(sweep_dir).elements}
    last: dict[str, str] = {}
    while True:
        records = _sweep_records(sweep_dir)
        states = []
        blocked = []
        for run_id, record in records.items():
            state = record.state if not isinstance(record, GlaunchError) else State.UNKNOWN.value
            states.append(state)
            if not isinstance(record, GlaunchError) and record.extra.get("blocked"):
                blocked.append(f"element {index.get(run_id)}: {record.detail}")
            if on_state is not None and last.get(run_id) != state:
                job = record.job_id if not isinstance(record, GlaunchError) else None
                on_state(f"[glaunch] element {index.get(run_id)} (job {job}): {state}")
            last[run_id] = state
        waiting = [s for s in states if not (is_terminal(s) or s == State.UNKNOWN)]
        if not waiting:
            return sweeps.sweep_state(states)
        if blocked and len(blocked) == len(waiting):
            raise SchedulerError(f"sweep {sweep_dir.name}: " + "; ".join(blocked))
        time.sleep(poll_s)


def logs(run: RunRef, *, rank: int | None = None, follow: bool = False,
         echo: Echo = print, poll_s: float = 1.0) -> None:
    """Per-rank logs of the run with a rank prefix, across requeues; with `follow`, until it
    ends. A sweep's: every element's, `[ELEMENT]` before the rank."""
    from .runs import sweeps
    from .runs.logs import RankLogs

    sweep_dir = find_sweep(run)
    if sweep_dir is not None:
        elements = sweeps.read(sweep_dir).elements
        readers = [RankLogs(Path(e.run_dir), rank, _prefixed(echo, f"[{e.index}]")) for e in elements]
        while True:
            for reader in readers:
                reader.poll()
            if not follow:
                for reader in readers:
                    reader.flush()
                return
            states = [r.state if not isinstance(r, GlaunchError) else State.UNKNOWN.value
                      for r in _sweep_records(sweep_dir).values()]
            if all(is_terminal(s) or s == State.UNKNOWN for s in states):
                follow = False
            time.sleep(poll_s)
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


def cancel(run: RunRef) -> str:
    """Cancel the run's job; a sentence saying what was done. A sweep's: every element's
    (on Slurm, its array jobs, with one scancel)."""
    from .runs import registry, sweeps

    sweep_dir = find_sweep(run)
    if sweep_dir is not None:
        sweep = sweeps.read(sweep_dir)
        records = _sweep_records(sweep_dir, refresh=False)
        live = [(Path(e.run_dir), r) for e in sweep.elements
                if isinstance(r := records.get(e.run_id), RunRecord) and r.job_id
                and not is_terminal(r.state)]
        if sweep.dry_run or sweep.scheduler not in schedulers.NAMES or not live:
            return f"sweep {sweep.sweep_id}: nothing to cancel"
        arrays = [a.job_id for a in sweep.arrays if a.job_id]
        done = schedulers.get(sweep.scheduler).cancel_many(live, arrays)
        return f"sweep {sweep.sweep_id}: " + "; ".join(done)
    run_dir = run_dir_of(run)
    record = registry.read(run_dir)
    if not record.job_id or record.scheduler not in schedulers.NAMES or is_terminal(record.state):
        return f"run {record.run_id}: nothing to cancel ({record.state})"
    return schedulers.get(record.scheduler).cancel(run_dir, record)


def list_runs(limit: int = 20, sweep: Any = None) -> list[dict[str, Any]]:
    """The newest runs: id, state, site, nodes, age, run directory (a sweep is one row,
    its elements are not listed). A run whose record is damaged, and bad lines of the run
    index, come as rows with `error` (the file and what is wrong) instead of stopping the
    listing. With `sweep` (its id or directory): its elements' rows, as `status` has them."""
    from .runs.status import recent

    if sweep is not None:
        sweep_dir = find_sweep(sweep)
        if sweep_dir is None:
            raise RunError(f"no sweep {sweep!r} (`glaunch list` shows runs and sweeps)")
        return list(status(sweep_dir)["elements"])
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


def _prefixed(echo: Echo, prefix: str) -> Echo:
    """`echo` with `prefix` before every line (a sweep element's index)."""
    return lambda line: echo(f"{prefix}{line}")
