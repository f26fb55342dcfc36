"""A sweep's submission: every combination of the swept values resolved and checked as
its own run (`prepare_sweep`, nothing written), then the sweep directory, its elements'
run directories and one submission per allocation shape (`launch_sweep`)."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import sys
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from launcher import schedulers
from launcher.config.load import load_experiment
from launcher.errors import ConfigError
from launcher.resolution.jobplan import JobPlan, SubmitContext
from launcher.resolution.resolve import resolve
from launcher.resolution.sweep import Element, expand, parse_axes
from launcher.rundir import registry
from launcher.runner import bundle, dependencies, sweep_bundle, sweeps, unseen
from launcher.runner.inputs import folder_of, items
from launcher.runner.prepared import PreparedSweep
from launcher.runner.results import Run, Sweep
from launcher.runner.submission_road import SubmissionRoad, road_of
from launcher.runner.submission import (
    Prepared,
    checkpoint_warning,
    load,
    path_sources,
    require_script,
    upstreams_of,
    with_code_root,
)
from launcher.schedulers.base import Echo


def prepare_sweep(experiment: str | os.PathLike, sweep: Sequence[str], *, site: str | None = None,
                  overrides: Sequence[str] = (), runs_dir: str | None = None, max_parallel: int | None = None,
                  after: Sequence[str] = (), dry_run: bool = False) -> PreparedSweep:
    """Every combination of the `sweep` values (KEY=V1,V2,... each; the first varies
    slowest), each resolved and checked as its own run would be, its values applied after
    `overrides`: one element that cannot run refuses the whole sweep, naming it. Nothing
    written."""
    runs_dir = folder_of(runs_dir)
    if max_parallel is not None:
        # bool is an int to Python, but max_parallel=True is no count of jobs.
        if isinstance(max_parallel, bool) or not isinstance(max_parallel, int):
            raise ConfigError(f"must be a whole number, 1 or more, got {type(max_parallel).__name__} "
                              f"({max_parallel!r:.80})", file="command line", key="max_parallel")
        if max_parallel < 1:
            raise ConfigError(f"must be 1 or more, got {max_parallel}", file="command line", key="--max-parallel")
    overrides = items(overrides, "overrides")
    axes = parse_axes(items(sweep, "sweep"))
    elements = expand(axes)
    first = elements[0]
    with _naming(first):
        exp0, loaded_site = load(experiment, site, [*overrides, *first.overrides])
    if exp0.config.checkpoint.take_over is not None:
        raise exp0.provenance.error("checkpoint.take_over", "one run's checkpoints go to one run: a sweep's "
                                    "elements cannot take them over (submit the run that continues it alone)")
    road = road_of(loaded_site, runs_dir, dry_run=dry_run)
    try:
        return _prepare_elements(experiment, elements, axes, exp0, loaded_site, overrides, runs_dir, max_parallel,
                                 after, dry_run, road)
    except BaseException:
        road.close()
        raise


def _prepare_elements(experiment, elements, axes, exp0, loaded_site, overrides, runs_dir, max_parallel, after,
                      dry_run, road: SubmissionRoad) -> PreparedSweep:
    first = elements[0]
    upstreams, dependency = upstreams_of(after, loaded_site.config.scheduler, dry_run=dry_run)
    road.check_upstreams(upstreams)
    environ = road.environ(os.environ)
    sweep_id = sweeps.new_sweep_id(exp0.config.name)
    base = SubmitContext(cwd=os.getcwd(), python=sys.executable, environ=environ, run_id=sweep_id,
                         runs_dir=runs_dir, dependency=dependency)
    # The sweep's directory is where a run with the sweep's id would go.
    with _naming(first):
        sweep_dir = Path(resolve(exp0, loaded_site, base).run_dir)
    roots: dict = {}
    exps = [exp0 if element is first else _loaded(element, experiment, overrides) for element in elements]
    ctxs = [dataclasses.replace(base, run_id=sweeps.element_run_id(sweep_id, element.index),
                                runs_dir=str(sweep_dir).replace("$", "$$"), code_dir=str(sweep_dir / "code"),
                                sweep_id=sweep_id) for element in elements]
    plans = []
    for element, exp, ctx in zip(elements, exps, ctxs):
        with _naming(element):
            plans.append(road.plan(resolve(exp, loaded_site, with_code_root(exp, loaded_site, ctx, roots))))
    shared = _shared_checkpoint_dirs(plans)
    prepared = []
    for element, exp, ctx, plan in zip(elements, exps, ctxs, plans):
        notes: tuple[str, ...] = ()
        with _naming(element):
            if plan.checkpoint_dir in shared:
                notes = (f"checkpoint.dir {plan.checkpoint_dir} would be shared by the sweep's elements: each "
                         "checkpoints in a directory of its own below it, named by its run id",)
                exp = _checkpoints_below(exp, ctx.run_id)
                plan = road.plan(resolve(exp, loaded_site, with_code_root(exp, loaded_site, ctx, roots)))
            require_script(exp, plan)
            scheduler = schedulers.get(plan.scheduler)
            scheduler.check(plan)
            files = road.files(scheduler.render(plan))
        warning = checkpoint_warning(exp, plan)
        runs_from, checkpoint_from = path_sources(exp, loaded_site, runs_dir)
        prepared.append(Prepared(plan, files, scheduler, runs_from, checkpoint_from,
                                 warnings=notes + ((warning,) if warning else ()), after=tuple(upstreams)))
    sources = {p.plan.code.source for p in prepared if p.plan.code is not None}
    if len(sources) > 1:
        raise ConfigError(f"the elements run code from different work trees ({', '.join(sorted(sources))}); "
                          "a sweep snapshots one", file="command line", key="--sweep")
    swept = unseen.unseen_axes(axes, first, lambda element: _bundle_files(experiment, element, overrides,
                                                                          loaded_site, ctxs[0], roots, road))
    overridden = unseen.unseen_overrides(overrides, lambda subset: _bundle_files(experiment, first, subset,
                                                                                 loaded_site, ctxs[0], roots, road),
                                         loaded_site.config.env)
    return PreparedSweep(sweep_id, sweep_dir, tuple(elements), tuple(prepared), tuple(axes), max_parallel,
                         str(exp0.path), tuple(upstreams), road=road, unseen=swept,
                         unseen_overrides=overridden)


def _bundle_files(experiment, element: Element, overrides: Sequence[str], loaded_site, ctx: SubmitContext,
               roots: dict, road: SubmissionRoad) -> Mapping[str, str]:
    """The run bundle of `element` resolved under `ctx`."""
    exp = _loaded(element, experiment, overrides)
    with _naming(element):
        plan = road.plan(resolve(exp, loaded_site, with_code_root(exp, loaded_site, ctx, roots)))
        return schedulers.get(plan.scheduler).render(plan)


def _loaded(element, experiment: str | os.PathLike, overrides: Sequence[str]):
    with _naming(element):
        return load_experiment(experiment, [*overrides, *element.overrides])


def _shared_checkpoint_dirs(plans: Sequence[JobPlan]) -> set[str]:
    """Checkpoint directories outside the run directories that more than one element would
    use: each element owns its checkpoints."""
    counts = collections.Counter(p.checkpoint_dir for p in plans if bundle.checkpoint_outside(p))
    return {directory for directory, count in counts.items() if count > 1}


def _checkpoints_below(exp, run_id: str):
    """`exp` with its checkpoint.dir one level deeper, in a directory named by `run_id`
    (a run id holds no `$` or `/`: the text stays a path of the same shape)."""
    config = exp.config
    checkpoint = dataclasses.replace(config.checkpoint, dir=os.path.join(config.checkpoint.dir, run_id))
    return dataclasses.replace(exp, config=dataclasses.replace(config, checkpoint=checkpoint))


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
    per allocation shape (over SSH, on the sweep's road: launcher.runner.remote_sweep); on
    the local site the elements run one after another (`max_parallel` at a time)."""
    return prepared.road.launch_sweep(prepared, dry_run=dry_run, check=check,
                                      here=lambda seen, written: _launch_here(seen, written, dry_run=dry_run,
                                                                              check=check, echo=echo))


def _launch_here(seen: PreparedSweep, prepared: PreparedSweep, *, dry_run: bool, check: bool,
                 echo: Echo | None) -> Sweep:
    """The sweep written on this machine (`prepared`; `seen`: as its jobs see it, its files
    as its road shows them) and, unless `dry_run`, submitted here."""
    plans = [p.plan for p in seen.prepared]
    scheduler = prepared.scheduler
    sweep_dir = str(seen.sweep_dir)         # as the jobs see it
    survey = sweep_bundle.checked_inputs(prepared)
    if not dry_run:
        scheduler.require()
    sweep_plan = scheduler.plan_sweep(plans, sweep_id=prepared.sweep_id, sweep_dir=sweep_dir,
                                      max_parallel=prepared.max_parallel, dry_run=dry_run)
    sweep_plan = dataclasses.replace(sweep_plan, files=seen.road.files(sweep_plan.files))
    sweep_bundle.write_sweep(prepared, sweep_plan, survey, dry_run=dry_run)
    if not dry_run:
        if prepared.after and scheduler.runs_to_completion and _never_start(prepared, echo):
            return _sweep_result(prepared, dry_run)
        batches = scheduler.launch_sweep(plans, sweep_plan, prepared.sweep_dir, max_parallel=prepared.max_parallel,
                                         check=check, echo=echo)
        sweeps.record_launch(prepared.sweep_dir, batches)
    return _sweep_result(prepared, dry_run, sweep_plan.files)


def _never_start(prepared: PreparedSweep, echo: Echo | None) -> bool:
    """The local site's --after, for every element: whether they never start (each one's
    record says why)."""

    blocked = [dependencies.wait_before_start(prepared.after, Path(item.plan.run_dir), echo)
               for item in prepared.prepared]
    return any(blocked)


def _sweep_result(prepared: PreparedSweep, dry_run: bool, files: Mapping[str, str] | None = None) -> Sweep:
    record = sweeps.read(prepared.sweep_dir)
    runs = []
    for item in prepared.prepared:
        rec = registry.read(item.plan.run_dir)
        runs.append(Run(rec.run_id, Path(item.plan.run_dir), item.plan.site_name, dry_run, tuple(item.files),
                        rec.state, rec.job_id))
    state = sweeps.sweep_state([r.state for r in runs])
    return Sweep(prepared.sweep_id, prepared.sweep_dir, record.site, dry_run, tuple(runs),
                 tuple(a.__dict__ for a in record.arrays), dict(files or {}), state)
