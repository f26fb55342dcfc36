"""The submission path: load and resolve an experiment, render its run bundle (`prepare`:
pure, nothing written), then write the run directory and hand it to the scheduler
(`launch`); `run` starts the ranks inside an existing allocation.
Everything heavy (loading, resolution, rendering, the registry) is imported where it is
used, so a dry run imports only what it needs."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from launcher import schedulers
from launcher.config.load import load_experiment
from launcher.config.sourcemap import Origin
from launcher.config.sites import load_site
from launcher.errors import ConfigError, GlaunchError, RunError, SchedulerError
from launcher.resolution.jobplan import JobPlan, SubmitContext
from launcher.resolution.resolve import code_anchor, resolve
from launcher.rundir import registry
from launcher.rundir.records import IN_FLIGHT, State
from launcher.rundir.registry import find_run, new_run_id
from launcher.runner import bundle, frameworks, shared_folder, unseen
from launcher.runner.bundle import PathSource
from launcher.runner.gitview import locate
from launcher.runner.inputs import folder_of, items
from launcher.runner.prepared import Prepared
from launcher.runner.results import Run
from launcher.runner.submission_road import SubmissionRoad, road_of
from launcher.schedulers.base import Echo


def load(experiment: str | os.PathLike, site: str | None = None, overrides: Sequence[str] = (),
         *, cwd: Path | None = None, environ: Mapping[str, str] | None = None):
    """(LoadedExperiment, LoadedSite): the experiment's own `site:` unless `site` is given,
    else the local site."""

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
    runs_dir = folder_of(runs_dir)
    exp, loaded_site = load(experiment, site, overrides)
    road = road_of(loaded_site, runs_dir, dry_run=dry_run)
    try:
        prepared = _prepare(exp, loaded_site, runs_dir, run_id, after, dry_run, road)
        return _warn_unseen(prepared, experiment, site, overrides, runs_dir)
    except BaseException:
        road.close()
        raise


def _warn_unseen(prepared: Prepared, experiment, site: str | None, overrides: Sequence[str],
                 runs_dir: str | None) -> Prepared:
    """`prepared`, with a warning for each override that changes nothing the job sees."""
    roots: dict = {}
    keys = unseen.unseen_overrides(list(items(overrides, "overrides")), lambda subset: _bundle_files(
        experiment, site, subset, runs_dir, prepared.plan, roots), prepared.plan.site.get("env") or {})
    if not keys:
        return prepared
    warnings = prepared.warnings + tuple(unseen.warning(key, "overriding") for key in keys)
    return dataclasses.replace(prepared, warnings=warnings)


def _bundle_files(experiment, site: str | None, overrides: Sequence[str], runs_dir: str | None, plan: JobPlan,
                  roots: dict) -> Mapping[str, str]:
    """The run bundle of the experiment with `overrides`, under `plan`'s run id, as this
    machine renders it (only compared with another rendering of the same kind)."""
    exp, loaded_site = load(experiment, site, overrides)
    ctx = SubmitContext(cwd=os.getcwd(), python=sys.executable, environ=dict(os.environ), run_id=plan.run_id,
                        runs_dir=runs_dir)
    plan = resolve(exp, loaded_site, with_code_root(exp, loaded_site, ctx, roots))
    return schedulers.get(plan.scheduler).render(plan)


def _prepare(exp, loaded_site, runs_dir: str | None, run_id: str | None, after: Sequence[str], dry_run: bool,
             road: SubmissionRoad) -> Prepared:
    upstreams, dependency = upstreams_of(after, loaded_site.config.scheduler, dry_run=dry_run)
    road.check_upstreams(upstreams)
    ctx = SubmitContext(cwd=os.getcwd(), python=sys.executable, environ=road.environ(os.environ),
                        run_id=run_id or new_run_id(exp.config.name), runs_dir=runs_dir, dependency=dependency)
    plan = road.plan(resolve(exp, loaded_site, with_code_root(exp, loaded_site, ctx, {})))
    require_script(exp, plan)
    scheduler = schedulers.get(plan.scheduler)
    scheduler.check(plan)
    warnings = [w for w in (take_over_warning(exp, plan, upstreams, dry_run=dry_run), checkpoint_warning(exp, plan),
                            shared_folder.warning(plan),
                            road.python_warning(loaded_site, plan)) if w]
    runs_from, checkpoint_from = path_sources(exp, loaded_site, runs_dir)
    return Prepared(plan, road.files(scheduler.render(plan)), scheduler, runs_from, checkpoint_from,
                    warnings=tuple(warnings), after=tuple(upstreams), road=road)


def with_code_root(exp, loaded_site, ctx, found: dict):
    """ctx with the work tree the code snapshot copies (found on disk; `found` caches it
    by the folder it was looked up from)."""

    anchor = code_anchor(exp, loaded_site, ctx)
    if anchor is None:
        return ctx
    if anchor not in found:
        found[anchor] = locate(anchor, ctx.cwd)
    return dataclasses.replace(ctx, code_root=found[anchor])


def upstreams_of(after: Sequence[str], scheduler: str, *, dry_run: bool) -> tuple[list, str | None]:
    """(the runs and sweeps `--after` names, as they stand now: asked of their scheduler
    unless `dry_run`; the job script's --dependency for them). Nothing is imported for a
    submission that waits for none."""
    if not after:
        return [], None
    from launcher.runner import dependencies
    upstreams = dependencies.upstreams_of(after, scheduler, refresh=not dry_run)
    return upstreams, dependencies.dependency_clause(upstreams, scheduler)


def take_over_warning(exp, plan: JobPlan, upstreams: Sequence[Any], *, dry_run: bool) -> str | None:
    """checkpoint.take_over: the run named exists and has ended (or this one waits for it
    with --after), so two runs never write the directory at once; what the take-over
    means, said. ConfigError naming the key otherwise."""
    name = plan.checkpoint_take_over
    if name is None:
        return None
    where = exp.provenance
    try:
        run_dir = find_run(name)
        if dry_run:
            record = registry.read(run_dir)
        else:
            from launcher.runner.lookup import refreshed     # asks the scheduler: a real submission only
            record = refreshed(run_dir)
    except GlaunchError as exc:
        raise where.error("checkpoint.take_over", exc.message) from None
    waited = any(u.name == record.run_id for u in upstreams)
    if record.state in IN_FLIGHT and not waited:
        raise where.error("checkpoint.take_over", f"run {record.run_id} is {record.state} and writes its checkpoints "
                          f"there: take them over once it has ended, or wait for it (--after {record.run_id})")
    return (f"checkpoint.dir {plan.checkpoint_dir}: taken over from run {record.run_id}: this run starts from its "
            f"newest checkpoint, and {record.run_id} can no longer be resumed from it")


def require_script(exp, plan: JobPlan) -> None:
    """ConfigError naming the experiment's file, line and key where its entry script is not
    there (bundle.check_inputs looks again as the bundle is written, with no line to name)."""
    problem = bundle.script_problem(plan)
    if problem is not None:
        raise exp.provenance.error("entrypoint.script", problem)


def checkpoint_warning(exp, plan: JobPlan) -> str | None:
    """A run that may be requeued, from an experiment that says nothing of how it resumes
    (no checkpoint settings, no `entrypoint.resume_args`): whether its script saves cannot
    be told before it runs, so say so, what a requeue does to a script that never saves,
    and how to tell glaunch otherwise (`glaunch status` says it again if that happens). A
    plain Lightning script (launcher.runner.frameworks) saves and resumes by itself at the
    warning: nothing to say."""
    if plan.recovery.requeue_max <= 0 or plan.launch.entry_resume_args or any(
            key == "checkpoint" or key.startswith("checkpoint.") for key in exp.provenance.origins):
        return None
    if plan.recovery.warning_signal == frameworks.LIGHTNING_SIGNAL:
        return None
    entry = plan.submitted_script or plan.launch.entry_module
    return (f"{exp.path}: no checkpoint settings and requeue.max={plan.recovery.requeue_max}: glaunch cannot tell "
            f"before it runs whether {entry} saves and resumes. If it uses glaunch's runtime (rt.save_torch_state, "
            "rt.resume_torch_state), or resumes by itself and entrypoint.resume_args says how (e.g. "
            "[\"--init_from=resume\"]), a requeue goes on from its checkpoint; otherwise each requeue restarts it "
            "from step 0")


def path_sources(exp, loaded_site, runs_dir: str | None):
    """Who chose the runs directory and the checkpoint directory: what an error about
    either names."""

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
    """Write the run directory and, unless `dry_run`, hand it to the scheduler, on the run's
    road (over SSH: sent to the cluster and queued there, launcher.runner.remote). The local
    scheduler runs the job to its end here, shown on the console `echo` makes (none
    without it)."""
    return prepared.road.launch(prepared, dry_run=dry_run, check=check,
                                here=lambda it: _launch_here(it, dry_run=dry_run, check=check, echo=echo))


def _launch_here(prepared: Prepared, *, dry_run: bool, check: bool, echo: Echo | None) -> Run:
    plan, scheduler = prepared.plan, prepared.scheduler
    runs_root, checkpoint = prepared.runs_root_from, prepared.checkpoint_from
    survey = bundle.check_inputs(plan, runs_root=runs_root, checkpoint=checkpoint)
    registry.check_state_dir()
    if not dry_run:
        scheduler.require()
    extra = None
    if prepared.after:
        from launcher.runner import dependencies
        extra = {"after": [dependencies.record_of(u) for u in prepared.after]}
    written = bundle.write_bundle(plan, prepared.files, dry_run=dry_run, survey=survey, extra=extra,
                                  runs_root=runs_root, checkpoint=checkpoint)
    run_dir = written.path
    try:
        registry.register(plan.run_id, str(run_dir))
    except BaseException:
        written.remove()
        raise
    run = Run(plan.run_id, run_dir, plan.site_name, dry_run, tuple(prepared.files), State.RENDERED.value,
              warnings=prepared.warnings)
    if dry_run:
        return run
    if prepared.after and scheduler.runs_to_completion:
        from launcher.runner import dependencies
        blocked = dependencies.wait_before_start(prepared.after, run_dir, echo)
        if blocked is not None:
            return dataclasses.replace(run, state=blocked, exit_code=1)
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
    return dataclasses.replace(run, state=launched.state, job_id=launched.job_id, exit_code=launched.exit_code,
                               job_ids=job_ids(run_dir, launched.exit_code))


def job_ids(run_dir: Path, exit_code: int | None) -> tuple[str, ...]:
    """The job of each start of a run the scheduler ran to its end (`exit_code` set);
    () for one it queued."""

    if exit_code is None:
        return ()
    return tuple(start.job_id for start in registry.read(run_dir).starts)


def _nothing_queued(run_dir: Path) -> bool:
    """Whether the run's record says the scheduler never got a job for it. A run directory
    whose record names a job (or cannot be read) stays, whatever failed after."""

    try:
        return registry.read(run_dir).job_id is None
    except GlaunchError:
        return False


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
    return launch(dataclasses.replace(prepared, files=scheduler.render(plan), scheduler=scheduler), echo=echo)
