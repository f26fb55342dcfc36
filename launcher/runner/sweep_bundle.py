"""A sweep's directory written whole or not at all: its paths checked, then sweep.json,
the array scripts, the code snapshot once, and every element's run directory (used by
launcher.runner.sweep_submission here and launcher.runner.remote_sweep over SSH)."""

from __future__ import annotations

from typing import Any

from launcher.rundir import registry
from launcher.runner.prepared import PreparedSweep
from launcher.runner import bundle, dependencies, provenance, snapshot, sweeps
from launcher.schedulers.base import SweepPlan


def checked_inputs(prepared: PreparedSweep) -> snapshot.Survey | None:
    """Every element's paths checked; the code snapshot's survey (None without one)."""
    for item in prepared.prepared:
        bundle.check_inputs(item.plan, runs_root=item.runs_root_from, checkpoint=item.checkpoint_from)
    code = prepared.prepared[0].plan.code
    survey = snapshot.check(code, prepared.experiment_file) if code is not None else None
    registry.check_state_dir()
    return survey


def write_sweep(prepared: PreparedSweep, sweep_plan: SweepPlan, survey: snapshot.Survey | None, *, dry_run: bool,
                register: bool = True) -> None:
    """The sweep directory, written whole or not at all: sweep.json, the array scripts, the
    code snapshot and every element's run directory; with `register`, each in the run index."""
    plans = [p.plan for p in prepared.prepared]
    code = plans[0].code
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
        taken = (snapshot.take(code, survey, prepared.sweep_dir / "code.patch", prepared.experiment_file)
                 if code and survey else None)
        origin = provenance.collect(survey, taken)
        for name, text in sweep_plan.files.items():
            bundle.write_file(prepared.sweep_dir / name, text, executable=True)
        sweeps.write(prepared.sweep_dir, record)
        if register:
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
            if register:
                registry.register(item.plan.run_id, item.plan.run_dir)
                written.registered.append((item.plan.run_id, item.plan.run_dir))
    except BaseException as exc:
        written.remove()
        if isinstance(exc, OSError):
            one = prepared.prepared[0]
            runs_root, _ = bundle.sources(one.plan, one.runs_root_from, one.checkpoint_from)
            raise runs_root.error(
                f"cannot write the sweep directory {prepared.sweep_dir}: {exc.strerror or exc}") from None
        raise
