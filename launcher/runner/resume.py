"""`glaunch resume RUN [KEY=VALUE ...]`: continue an ended run from its newest complete
checkpoint, in its own run directory, on the same or other resources.

The run's recorded configuration (resolved.yaml: the experiment as it ran, and its site)
with the new overrides on top is resolved and checked again as a submission is
(`prepare_resume`: nothing written, no scheduler asked on a dry run). Values in
resolved.yaml are final: an interpolation such as `${hparams.steps}` was resolved when the
run was submitted, so an override names the key the job reads (`entrypoint.args`, or
`hparams.*` for a script that reads GLAUNCH_HPARAMS). The run keeps its id, its run
directory, its checkpoint directory (`checkpoint.dir` cannot change) and its code
snapshot.

`launch_resume` then, under the run's lock: moves the previous submission's files
(job.sbatch, env.sh, ds_config.json, resolved.yaml, hparams.json) and what its last start
left for the next one to read (result.json, stop.json, resume.json, crash.json,
heartbeats/) to `resumes/N/` (N = 1, 2, ...), writes the newly rendered files, appends a
`resumes` entry to run.json (when, the overrides, where the previous files went, the
state the run ended in, the new shape, and `first_start`: the index in `starts` of this
resume's first start) and hands the run to its scheduler, which appends the new starts
after the earlier ones. The ranks find the newest complete checkpoint in the unchanged
checkpoint directory as after any requeue; one saved at another world size is resharded
(torch.distributed.checkpoint) or converted (DeepSpeed's universal checkpoint)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from launcher import schedulers
from launcher.errors import ConfigError, GlaunchError, RunError, SchedulerError
from launcher.resolution.jobplan import JobPlan
from launcher.resolution.resolve import resolve
from launcher.rundir import registry
from launcher.rundir.layout import LIB_DIR, RunDir
from launcher.rundir.records import RunRecord, State
from launcher.runner import bundle, carried
from launcher.runner.direct import refuse_copy
from launcher.runner.inputs import items, run_ref
from launcher.runner.lookup import find_sweep, refreshed, run_dir_of
from launcher.runner.prepared import PreparedResume
from launcher.runner.results import Run, RunRef
from launcher.runner.resumable import MOVED_ASIDE, WHERE, RecordedConfig, record_resume, refuse_unless_ended
from launcher.runner.road import road_to
from launcher.runner.submission import job_ids
from launcher.schedulers.base import Echo


def resume(run: RunRef, *, overrides: Sequence[str] = (), dry_run: bool = False, check: bool = True,
           echo: Echo | None = None) -> Run:
    """Continue the ended run `run` (a run id or directory, or a Run) from its newest
    complete checkpoint with `overrides` (KEY=VALUE) on its recorded configuration;
    `dry_run` renders and checks only, writing nothing. The local site runs it to its end
    here, shown on the console `echo` makes. ConfigError (exit 2) for a run that is still
    queued or running, or bad overrides."""
    return launch_resume(prepare_resume(run, overrides=overrides, dry_run=dry_run), dry_run=dry_run, check=check,
                         echo=echo)


def prepare_resume(run: RunRef, *, overrides: Sequence[str] = (), dry_run: bool = False) -> PreparedResume:
    """Read the run, refuse it unless it ended, resolve its recorded configuration with
    `overrides` and render it, on the run's road (over SSH: launcher.runner.remote). Nothing
    written; the scheduler is asked for the run's state unless `dry_run`."""
    run = run_ref(run)
    sweep_dir = find_sweep(run)
    if sweep_dir is not None:
        raise ConfigError(f"{sweep_dir.name} is a sweep: resume its elements one by one (glaunch resume "
                          "ELEMENT_RUN_DIR)", file=WHERE, key="RUN")
    run_dir = run_dir_of(run)
    return road_to(run_dir).prepare_resume(run_dir, overrides, dry_run, here=_prepare_here)


def _prepare_here(run_dir: Path, overrides: Sequence[str], dry_run: bool) -> PreparedResume:
    refuse_copy(run_dir, registry.read(run_dir), "resume")
    record = registry.read(run_dir) if dry_run else refreshed(run_dir)
    refuse_unless_ended(record, run_dir)
    recorded = RecordedConfig.read(run_dir)
    overrides = items(overrides, "overrides")
    exp, site = recorded.load(overrides)
    recorded.check_site_kept(exp, site)
    plan = recorded.conventions(resolve(exp, site, recorded.context(exp, site)))
    recorded.check_kept(plan, exp)
    scheduler = schedulers.get(plan.scheduler)
    scheduler.check(plan)
    return PreparedResume(run_dir, record, overrides, plan, scheduler.render(plan), scheduler,
                          _warnings(plan, record))


def _warnings(plan: JobPlan, record: RunRecord) -> tuple[str, ...]:
    """What the user should know before it starts: no checkpoint to continue from."""
    # The in-job runtime's own reader of the checkpoint directory; loaded only here, so
    # that submitting never loads the runtime.
    from launcher.runtime.checkpoint.selection import latest_complete

    if latest_complete(plan.checkpoint_dir, verify="size", quiet=True) is not None:
        return ()
    if plan.launch.entry_resume_args:
        # The script keeps its own checkpoints, where glaunch does not look: it is told to resume.
        return ()
    return (f"run {record.run_id}: no complete checkpoint in {plan.checkpoint_dir}: the resumed run starts "
            "again from step 0 (a script that keeps its own checkpoints is told to resume by "
            "entrypoint.resume_args)",)




def launch_resume(prepared: PreparedResume, *, dry_run: bool = False, check: bool = True,
                  echo: Echo | None = None) -> Run:
    """Unless `dry_run`: move the previous files aside, write the new ones, record the
    resume in run.json and hand the run to its scheduler (the local one runs it to its end
    here, shown on the console `echo` makes), on the run's road (over SSH, in one call on
    the cluster: launcher.runner.remote). A dry run writes nothing."""
    if dry_run:
        prepared.road.close()
        return Run(prepared.record.run_id, prepared.run_dir, prepared.plan.site_name, True, tuple(prepared.files),
                   str(prepared.record.state), warnings=prepared.warnings)
    return prepared.road.launch_resume(prepared, check=check, here=lambda it: _launch_here(it, check, echo))


def _launch_here(prepared: PreparedResume, check: bool, echo: Echo | None) -> Run:
    plan, scheduler, run_dir = prepared.plan, prepared.scheduler, prepared.run_dir
    scheduler.require()
    record, switch = _switch_bundle(prepared)
    try:
        launched = scheduler.launch(plan, run_dir, check=check, echo=echo)
    except SchedulerError:
        raise                   # refused: run.json says so
    except (OSError, RunError) as exc:
        # Nothing started: the run goes back to how it ended, not left SUBMITTING.
        if _revert_switch(prepared, switch):
            raise RunError(f"run {record.run_id}: the resume did not start ({exc}); the run is as it was") from None
        raise RunError(f"run {record.run_id}: {exc}") from None
    return Run(record.run_id, run_dir, plan.site_name, False, tuple(prepared.files), launched.state,
               launched.job_id, launched.exit_code, job_ids(run_dir, launched.exit_code), prepared.warnings)


@dataclass(frozen=True)
class _Switch:
    """What `_switch_bundle` changed, so that a resume that never started can be undone."""

    before: dict[str, Any]             # run.json as it was
    aside: Path
    moved: tuple[str, ...]
    written: tuple[str, ...]


def _switch_bundle(prepared: PreparedResume) -> tuple[RunRecord, _Switch]:
    """Under the run's lock: the run still ended and its job gone, the previous files moved
    to resumes/N/, the new ones written, run.json's resume entry appended. On failure
    everything moves back and run.json is unchanged."""

    run_dir = prepared.run_dir
    with registry.updating(run_dir) as record:
        refuse_unless_ended(record, run_dir)
        still = prepared.scheduler.job_still_there(run_dir, record)
        if still:
            raise ConfigError(f"run {record.run_id}: {still}; resume it once that has ended", file=WHERE, key="RUN")
        before = record.to_dict()
        previous = record.extra.get("resumes")
        number = (len(previous) if isinstance(previous, list) else 0) + 1
        aside = RunDir(run_dir).previous_files(number)
        moved: list[str] = []
        written: list[str] = []
        try:
            aside.mkdir(parents=True)
            for name in MOVED_ASIDE:
                if os.path.lexists(run_dir / name):
                    os.rename(run_dir / name, aside / name)
                    moved.append(name)
            for name, text in prepared.files.items():
                bundle.write_file(run_dir / name, text, executable=name in bundle.EXECUTABLE)
                written.append(name)
            written.append(LIB_DIR)
            carried.write_lib(RunDir(run_dir).lib_dir)
        except (OSError, GlaunchError) as exc:
            _undo(run_dir, aside, moved, written)
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise RunError(f"run {record.run_id}: cannot prepare its run directory for the resume: {why}") from None
        record_resume(record, prepared, number, aside)
    return record, _Switch(before, aside, tuple(moved), tuple(written))


def _revert_switch(prepared: PreparedResume, switch: _Switch) -> bool:
    """Undo `_switch_bundle` when its job never started (run.json still SUBMITTING with no
    start of its own); False, and nothing touched, otherwise."""
    with registry.updating(prepared.run_dir) as record:
        first = switch.before.get("starts")
        if record.state != State.SUBMITTING or len(record.starts) != (len(first) if isinstance(first, list) else 0):
            return False
        _undo(prepared.run_dir, switch.aside, list(switch.moved), list(switch.written))
        restored = RunRecord.from_dict(switch.before)
        for name in vars(record):
            setattr(record, name, getattr(restored, name))
    return True


def _undo(run_dir: Path, aside: Path, moved: list[str], written: list[str]) -> None:
    for name in written:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)      # lib/, written whole or in part
            continue
        try:
            os.unlink(path)
        except OSError:
            pass
    for name in moved:
        try:
            os.rename(aside / name, run_dir / name)
        except OSError:
            pass
    for directory in (aside, aside.parent):
        try:
            directory.rmdir()
        except OSError:
            pass
