"""The submission path: load and resolve an experiment, render its run bundle (`prepare`:
pure, nothing written), then write the run directory and hand it to the scheduler
(`launch`). `submit` is both; `run` starts the ranks inside an existing allocation.
Everything heavy (loading, resolution, rendering, the registry) is imported where it is
used, so a dry run imports only what it needs."""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence, Union

from launcher import schedulers
from launcher.errors import ConfigError, GlaunchError, RunError, SchedulerError
from launcher.rundir.records import State

if TYPE_CHECKING:
    from launcher.runner.sweep_submission import Sweep

Echo = Callable[[str], None]


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
    runs_root_from: Any = None         # launcher.runner.bundle.PathSource: who chose the runs directory
    checkpoint_from: Any = None        # ... and checkpoint.dir
    warnings: tuple[str, ...] = ()     # what the user should know before it runs (one line each)
    after: tuple[Any, ...] = ()        # launcher.runner.dependencies.Upstream: the runs it waits for (--after)


def items(value: str | os.PathLike | Sequence[str], key: str) -> tuple[Any, ...]:
    """Overrides, sweeps, --after runs as given to the API: one string alone is one item
    (overrides="resources.nodes=4"), not a sequence of its characters. ConfigError naming
    the parameter `key` for what is neither; each item's type is its parser's to check."""
    if isinstance(value, (str, os.PathLike)):     # a run directory (--after) is one item too
        return (value,)
    if isinstance(value, (bytes, bytearray, Mapping)) or not isinstance(value, Iterable):
        raise ConfigError(f"must be a string or a list of strings, got {type(value).__name__} ({value!r:.80})",
                          file="command line", key=key)
    return tuple(value)


def load(experiment: str | os.PathLike, site: str | None = None, overrides: Sequence[str] = (),
         *, cwd: Path | None = None, environ: Mapping[str, str] | None = None):
    """(LoadedExperiment, LoadedSite): the experiment's own `site:` unless `site` is given,
    else the local site."""
    from launcher.config.load import load_experiment
    from launcher.config.sites import load_site
    from launcher.config.provenance import Origin

    cwd = cwd or Path.cwd()
    environ = os.environ if environ is None else environ
    exp = load_experiment(experiment, list(items(overrides, "overrides")))
    if site is not None:
        return exp, load_site(site, cwd, environ)
    name = exp.config.site or "local"
    referrer = exp.provenance.of("site") if exp.config.site else Origin("(default site)")
    return exp, load_site(name, cwd, environ, referrer=referrer, key="site")


def prepare(experiment: str | os.PathLike, *, site: str | None = None, overrides: Sequence[str] = (),
            runs_dir: str | None = None, run_id: str | None = None, after: Sequence[str] = (),
            dry_run: bool = False) -> Prepared:
    """Load, resolve and render: every check that needs no scheduler; nothing written.
    `after` (RUN[:ok|any]): runs or sweeps to wait for; their state is asked of the
    scheduler unless `dry_run`."""
    from launcher.resolution.jobplan import SubmitContext
    from launcher.resolution.resolve import resolve
    from launcher.rundir.registry import new_run_id

    exp, loaded_site = load(experiment, site, overrides)
    upstreams = upstreams_of(after, loaded_site.config.scheduler, refresh=not dry_run)
    ctx = SubmitContext(cwd=os.getcwd(), python=sys.executable, environ=dict(os.environ),
                        run_id=run_id or new_run_id(exp.config.name), runs_dir=runs_dir,
                        dependency=dependency_clause(upstreams, loaded_site.config.scheduler))
    plan = resolve(exp, loaded_site, with_code_root(exp, loaded_site, ctx, {}))
    scheduler = schedulers.get(plan.scheduler)
    scheduler.check(plan)
    warning = checkpoint_warning(exp, plan)
    runs_from, checkpoint_from = path_sources(exp, loaded_site, runs_dir)
    return Prepared(plan, scheduler.render(plan), scheduler, runs_from, checkpoint_from,
                    warnings=(warning,) if warning else (), after=tuple(upstreams))


def with_code_root(exp, loaded_site, ctx, found: dict):
    """ctx with the work tree the code snapshot copies (found on disk; `found` caches it
    by the folder it was looked up from)."""
    import dataclasses

    from launcher.resolution.resolve import code_anchor
    from launcher.runner.gitview import locate

    anchor = code_anchor(exp, loaded_site, ctx)
    if anchor is None:
        return ctx
    if anchor not in found:
        found[anchor] = locate(anchor, ctx.cwd)
    return dataclasses.replace(ctx, code_root=found[anchor])


def upstreams_of(after: Sequence[str], scheduler: str, *, refresh: bool) -> list:
    """The runs and sweeps `--after` names, as they stand now (refreshed from their
    scheduler unless not `refresh`); ConfigError for one that can never be waited for."""
    if not after:
        return []
    from launcher.runner import dependencies

    upstreams = [_upstream(item, refresh) for item in dependencies.parse(items(after, "after"))]
    dependencies.check_for(upstreams, scheduler)
    return upstreams


def _upstream(after, refresh: bool):
    from launcher.runner import dependencies, sweeps
    from launcher.rundir import registry
    from launcher.runner.manage import refreshed, sweep_records

    sweep_dir = sweeps.find_sweep(after.ref)
    try:
        if sweep_dir is None:
            run_dir = registry.find_run(after.ref)
            record = refreshed(run_dir) if refresh else registry.read(run_dir)
            return dependencies.upstream_of_run(after, record, run_dir)
    except (RunError, ConfigError) as exc:      # no such run (said as RUN's), or its record is damaged (its file)
        what = exc.message if isinstance(exc, ConfigError) else str(exc)
        raise ConfigError(f"{after}: {what}", file="command line", key=dependencies.OPTION) from None
    sweep = sweeps.read(sweep_dir)
    records = sweep_records(sweep_dir, refresh=refresh)
    states = tuple(r.state if not isinstance(r, GlaunchError) else State.UNKNOWN.value for r in records.values())
    job_ids = tuple(a.job_id for a in sweep.arrays if a.job_id)
    if not job_ids:       # elements submitted one by one (or not at all)
        job_ids = tuple(r.job_id for r in records.values() if not isinstance(r, GlaunchError) and r.job_id)
    return dependencies.Upstream(after, sweep.sweep_id, sweep.scheduler, job_ids, states,
                                 tuple(Path(e.run_dir) for e in sweep.elements))


def dependency_clause(upstreams, scheduler: str) -> str | None:
    if not upstreams:
        return None
    from launcher.runner import dependencies

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


def path_sources(exp, loaded_site, runs_dir: str | None):
    """Who chose the runs directory and the checkpoint directory: what an error about
    either names."""
    from launcher.runner.bundle import PathSource

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
    from launcher.runner import bundle
    from launcher.rundir import registry

    plan, scheduler = prepared.plan, prepared.scheduler
    paths = dict(runs_root=prepared.runs_root_from, checkpoint=prepared.checkpoint_from)
    survey = bundle.check_inputs(plan, **paths)
    registry.check_state_dir()
    if not dry_run:
        scheduler.require()
    extra = None
    if prepared.after:
        from launcher.runner import dependencies

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
        blocked = wait_upstreams(prepared.after, run_dir, echo)
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


def wait_upstreams(upstreams, run_dir: Path, echo: Echo | None) -> str | None:
    """The local site's --after: wait until every run waited for ended. None when this run
    may start; else its state, recorded with the reason it never starts."""
    from launcher.runner import dependencies
    from launcher.rundir import registry

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
    from launcher.rundir import registry

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
        from launcher.runner.sweep_submission import launch_sweep, prepare_sweep

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
    from launcher.schedulers.slurm.allocation import Allocation, AllocationScheduler

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
