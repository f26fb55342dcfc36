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

import dataclasses
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from launcher import schedulers
from launcher.config.load import experiment_from_data
from launcher.config.sites import site_from_layers
from launcher.config.typed import NULLS
from launcher.config.yamlfile import Scalar, read_yaml
from launcher.errors import ConfigError, GlaunchError, RunError, SchedulerError
from launcher.resolution.jobplan import CodeRoot, SubmitContext
from launcher.resolution.resolve import resolve
from launcher.rundir import claims, registry
from launcher.rundir.files import atomic_write_text
from launcher.rundir.layout import (
    TASK_FILE,
    CRASH_FILE,
    DS_CONFIG_FILE,
    ENV_FILE,
    HEARTBEAT_DIR,
    HPARAMS_FILE,
    JOB_SCRIPT,
    LIB_DIR,
    RESOLVED_FILE,
    RESULT_FILE,
    RESUME_FILE,
    STOP_FILE,
    RunDir,
)
from launcher.rundir.lifecycle import resubmit
from launcher.rundir.records import IN_FLIGHT, LIVE, RunRecord, State, is_known_state
from launcher.runner import bundle, carried, frameworks
from launcher.runner.inputs import items
from launcher.runner.lookup import find_sweep, is_remote, refreshed, refuse_copy, run_dir_of
from launcher.runner.prepared import PreparedResume
from launcher.runner.results import Run, RunRef
from launcher.runner.submission import job_ids
from launcher.runner.inputs import run_ref
from launcher.schedulers.base import Echo

# Moved to resumes/N/: the previous submission's files (its lib/ too: the new job.sbatch
# runs the job side of the glaunch that renders it), and the files a start leaves for the
# next one (a new start would take an old result.json for its own end).
MOVED_ASIDE = (JOB_SCRIPT, ENV_FILE, DS_CONFIG_FILE, RESOLVED_FILE, HPARAMS_FILE, TASK_FILE, LIB_DIR,
               RESULT_FILE, STOP_FILE, RESUME_FILE, CRASH_FILE, HEARTBEAT_DIR)
# run.json keys about the previous job that the new one's scheduler writes afresh.
_PREVIOUS_JOB_KEYS = ("scheduler_history", "accounting", "request", "warnings", "pending_reason", "blocked",
                      "unreachable", "submission")
WHERE = "command line"


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
    `overrides` and render it. Nothing written; the scheduler is asked for the run's
    state unless `dry_run`."""
    run = run_ref(run)
    sweep_dir = find_sweep(run)
    if sweep_dir is not None:
        raise ConfigError(f"{sweep_dir.name} is a sweep: resume its elements one by one (glaunch resume "
                          "ELEMENT_RUN_DIR)", file=WHERE, key="RUN")
    run_dir = run_dir_of(run)
    if is_remote(run_dir):
        return _prepare_remote(run_dir, items(overrides, "overrides"), dry_run)
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


def refuse_unless_ended(record: RunRecord, run_dir: Path) -> None:
    """ConfigError for a run that may still be queued or running, or that never ran;
    RunError (a damaged record) for a state that is neither glaunch's nor Slurm's."""
    state = str(record.state)
    if record.dry_run or state == State.RENDERED.value:
        raise ConfigError(f"run {record.run_id} is a dry run: nothing ran to continue (glaunch submit the "
                          "experiment instead)", file=WHERE, key="RUN")
    uncertain = state == State.UNKNOWN.value and any(k in record.extra for k in ("submission", "unreachable"))
    if not is_known_state(state):
        raise RunError(f"damaged run record: {state!r} is no state of glaunch's or Slurm's, so whether run "
                       f"{record.run_id} ended is not known: it is not resumed", file=str(RunDir(run_dir).run_file),
                       key="state")
    if state in IN_FLIGHT or state in LIVE or uncertain:
        job = f" (job {record.job_id})" if record.job_id else ""
        raise ConfigError(f"run {record.run_id} is {state}{job}: only a run that ended can be resumed; wait for "
                          f"its end or cancel it (glaunch cancel {record.run_id})", file=WHERE, key="RUN")


def _warnings(plan, record: RunRecord) -> tuple[str, ...]:
    """What the user should know before it starts: no checkpoint to continue from."""
    # The in-job runtime's own reader of the checkpoint directory; loaded only here, so
    # that submitting never loads the runtime.
    from launcher.runtime.checkpoint.selection import latest_complete

    if latest_complete(plan.checkpoint_dir, verify="size", quiet=True) is not None:
        return ()
    if plan.entry_resume_args:
        # The script keeps its own checkpoints, where glaunch does not look: it is told to resume.
        return ()
    return (f"run {record.run_id}: no complete checkpoint in {plan.checkpoint_dir}: the resumed run starts "
            "again from step 0 (a script that keeps its own checkpoints is told to resume by "
            "entrypoint.resume_args)",)


@dataclass(frozen=True)
class RecordedConfig:
    """resolved.yaml of a run: the experiment and site it ran with, and what its
    submission derived (working directory, run and checkpoint directories, code snapshot)."""

    path: Path
    doc: Any                           # launcher.config.yamlfile.YamlDoc

    @classmethod
    def read(cls, run_dir: Path) -> RecordedConfig:
        path = Path(run_dir) / RESOLVED_FILE
        doc = read_yaml(path)
        for key in ("experiment", "site", "derived"):
            if not isinstance(doc.data.get(key), dict):
                raise ConfigError("not a resolved.yaml written by glaunch (no mapping here)", file=str(path), key=key,
                                  line=doc.lines.get(key))
        return cls(path, doc)

    def text(self, dotted: str) -> str | None:
        """A scalar of the document by dotted key (None when absent or null)."""

        value: Any = self.doc.data
        for part in dotted.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if not isinstance(value, Scalar) or (value.plain and value.text in NULLS):
            return None
        return value.text

    def load(self, overrides: tuple[str, ...]):
        """(LoadedExperiment, LoadedSite) of the recorded sections, `overrides` on the
        experiment's; checked as loading an experiment and a profile checks them."""

        doc = self.doc
        # Relative paths (entrypoint.script) are taken from the experiment file's folder, as at submit.
        exp_file = self.text("experiment_file") or str(self.path)
        site_file = Path(self.text("site_file") or self.path)
        exp = experiment_from_data(doc.data["experiment"], lambda key: doc.origin(f"experiment.{key}"),
                                   file=str(self.path), path=exp_file, overrides=overrides)
        site = site_from_layers([(doc.data["site"], lambda key: doc.origin(f"site.{key}"))], file=str(self.path),
                                path=site_file, chain=(site_file,))
        return exp, site

    def conventions(self, plan):
        """`plan` with the entry script's conventions the submission found (its warning
        signal, launcher.runner.frameworks), which the script's text need not give again."""
        return dataclasses.replace(plan, warning_signal=frameworks.recorded_signal(self.text("derived.warning_signal")))

    def context(self, exp, site):
        """The submission's context again: its working directory and run directory, the
        code snapshot it took; no sweep (an element resumes as a job of its own)."""

        workdir = self.text("derived.workdir") or os.getcwd()
        run_dir = self.text("derived.run_dir") or str(self.path.parent)
        code_root = code_dir = None
        source, script = self.text("derived.code.source"), self.text("derived.code.script")
        if source is not None:
            code_dir = self.text("derived.code.snapshot")
            anchor = os.path.dirname(script) if script else workdir
            code_root = CodeRoot(source, self.text("derived.code.git") == "true", _below(anchor, source) or ".",
                                 _below(workdir, source))
        return SubmitContext(cwd=workdir, python=sys.executable, environ=dict(os.environ),
                             run_id=os.path.basename(run_dir), runs_dir=os.path.dirname(run_dir).replace("$", "$$"),
                             code_root=code_root, code_dir=code_dir)

    def check_site_kept(self, exp, site) -> None:
        """The run resumes on the profile recorded with it: `site` cannot change."""
        wanted = exp.config.site
        if wanted is None or wanted in (self.text("experiment.site"), site.config.name):
            return
        raise exp.provenance.error("site", f"the run ran on site {site.config.name!r}; a resumed run keeps its site "
                                   f"(to run on {wanted!r}, submit the experiment again)")

    def check_kept(self, plan, exp, files: Any = os.path) -> None:
        """The run keeps its run directory, its checkpoint directory and its code snapshot
        (`files`: where they are looked for, with isdir and isfile; this machine's by default)."""
        where = exp.provenance
        checkpoint_dir = self.text("derived.checkpoint_dir")
        if checkpoint_dir is not None and os.path.normpath(plan.checkpoint_dir) != os.path.normpath(checkpoint_dir):
            raise where.error("checkpoint.dir", f"the run's checkpoints are in {checkpoint_dir}; a resumed run keeps "
                              f"its checkpoint directory (this would be {plan.checkpoint_dir})")
        problem = _claim_problem(plan)
        if problem:
            raise where.error("checkpoint.dir", f"checkpoint directory {plan.checkpoint_dir}: {problem}")
        run_dir = self.text("derived.run_dir")
        if run_dir is not None and os.path.normpath(plan.run_dir) != os.path.normpath(run_dir):
            raise ConfigError(f"the run directory would move to {plan.run_dir}", file=str(self.path),
                              key="derived.run_dir")
        if plan.code is not None and not files.isdir(plan.code.dest):
            raise where.error("code.snapshot", f"the run has no code snapshot in {plan.code.dest} to run from "
                              "(it was submitted without one)")
        script = plan.entry_script
        if script and plan.container is None and not files.isfile(script):
            raise where.error("entrypoint.script", f"script {script!r} not found")


def _claim_problem(plan) -> str | None:
    """Why the run may not load its checkpoint directory any more (another run took it
    over), or None. A directory with no claim is the run's (submitted before claims)."""
    if not bundle.checkpoint_outside(plan):
        return None
    try:
        owner = claims.owner_of(plan.checkpoint_dir)
    except GlaunchError as exc:
        return str(exc)
    if owner is None or owner.run_id == plan.run_id:
        return None
    return (f"it belongs to run {owner.run_id} now (run directory {owner.run_dir}), which writes its checkpoints "
            f"there; continue that run (glaunch resume {owner.run_id}) or submit this experiment again")


def _below(path: str, root: str) -> str | None:
    """`path` relative to `root` when inside it (as written: the tree may be gone)."""
    rel = os.path.relpath(os.path.normpath(path), os.path.normpath(root))
    return None if rel == ".." or rel.startswith("../") else rel


def launch_resume(prepared: PreparedResume, *, dry_run: bool = False, check: bool = True,
                  echo: Echo | None = None) -> Run:
    """Unless `dry_run`: move the previous files aside, write the new ones, record the
    resume in run.json and hand the run to its scheduler (the local one runs it to its end
    here, shown on the console `echo` makes). A dry run writes nothing."""
    plan, scheduler, run_dir = prepared.plan, prepared.scheduler, prepared.run_dir
    files = tuple(prepared.files)
    if dry_run:
        if prepared.remote is not None:
            prepared.remote.close()
        return Run(prepared.record.run_id, run_dir, plan.site_name, True, files, str(prepared.record.state),
                   warnings=prepared.warnings)
    if prepared.remote is not None:
        return _launch_remote(prepared, check=check)
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
    return Run(record.run_id, run_dir, plan.site_name, False, files, launched.state, launched.job_id,
               launched.exit_code, job_ids(run_dir, launched.exit_code), prepared.warnings)


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
        _record_resume(record, prepared, number, aside)
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


def _record_resume(record: RunRecord, prepared: PreparedResume, number: int, aside: Path) -> None:
    """run.json: the resume entry, the new shape, the state back to SUBMITTING; the keys
    about the previous job go into the entry (its scheduler writes them afresh)."""

    plan = prepared.plan
    ended: dict[str, Any] = {"state": str(record.state), "reason": record.reason, "detail": record.detail,
                             "job_id": record.job_id, "nodes": record.nodes, "world_size": record.world_size,
                             "partition": record.partition}
    for key in _PREVIOUS_JOB_KEYS:
        if key in record.extra:
            value = record.extra.pop(key)
            if key == "scheduler_history":
                ended[key] = value
    entry = {"number": number, "at": registry.now(), "overrides": list(prepared.overrides),
             "previous_files": os.path.relpath(aside, prepared.run_dir), "ended": ended,
             "nodes": plan.nodes, "world_size": plan.world_size, "partition": plan.partition,
             "first_start": len(record.starts)}
    resumes = record.extra.get("resumes")
    record.extra["resumes"] = [*(resumes if isinstance(resumes, list) else []), entry]
    resubmit(record)
    record.job_id = None
    record.nodes, record.world_size, record.partition = plan.nodes, plan.world_size, plan.partition
    record.requeue_max, record.crash_retries = plan.requeue_max, plan.crash_retries


# --- a run that lives on a cluster reached over SSH ----------------------------------------


def _prepare_remote(run_dir: Path, overrides: tuple[str, ...], dry_run: bool) -> PreparedResume:
    """`prepare_resume` of a run submitted over SSH: its record and resolved.yaml read from
    the cluster (the local copies refreshed), resolved with the cluster account's HOME and
    USER, its directories checked there. The connection stays open for the launch."""
    from launcher.runner import remote

    where = remote.where_of(run_dir)
    conn = remote.connect(where.login)
    try:
        record = registry.read(run_dir) if dry_run else remote.refreshed_over(conn, run_dir, where)
        refuse_unless_ended(record, run_dir)
        remote.copy_here(conn, where, RESOLVED_FILE, run_dir)
        recorded = RecordedConfig.read(run_dir)
        exp, site = recorded.load(overrides)
        recorded.check_site_kept(exp, site)
        environ = remote.cluster_environ(conn, os.environ, submitting=True)
        ctx = dataclasses.replace(recorded.context(exp, site), environ=environ)
        plan = remote.on_cluster(recorded.conventions(resolve(exp, site, ctx)))
        recorded.check_kept(plan, exp, files=remote.ClusterFiles(conn))
        scheduler = schedulers.get(plan.scheduler)
        scheduler.check(plan)
        return PreparedResume(run_dir, record, overrides, plan, scheduler.render(plan), scheduler, remote=conn)
    except BaseException:
        conn.close()
        raise


def _launch_remote(prepared: PreparedResume, *, check: bool) -> Run:
    """On the cluster, in one call: the previous files to resumes/N/, the new ones and
    run.json (SUBMITTING, with its resume entry) in place; then the job queued held, its
    record and task put in place, and released. A failure before the release puts the
    previous files and run.json back on both sides."""
    from launcher.runner import remote

    conn, plan, here = prepared.remote, prepared.plan, prepared.run_dir
    try:
        before, record = _resumed_record(prepared, conn)
    except BaseException:
        conn.close()
        raise
    aside = os.path.relpath(RunDir(plan.run_dir).previous_files(len(record.extra["resumes"])), plan.run_dir)
    try:
        job_id = remote.queue_resume(prepared, conn, aside, MOVED_ASIDE, before, check=check)
    except BaseException:
        atomic_write_text(RunDir(here).run_file, before)
        conn.close()
        raise
    conn.close()
    atomic_write_text(here / RESOLVED_FILE, prepared.files[RESOLVED_FILE])
    return Run(record.run_id, here, plan.site_name, False, tuple(prepared.files), State.PENDING.value, job_id,
               warnings=prepared.warnings, cluster_host=conn.login.host, cluster_dir=plan.run_dir)


def _resumed_record(prepared: PreparedResume, conn: Any) -> tuple[str, RunRecord]:
    """run.json here read again from the cluster (its text, as the cluster has it), checked
    to have ended with its job gone from the queue, and given its resume entry (SUBMITTING)."""
    from launcher.runner import remote

    where = remote.where_of(prepared.run_dir)
    remote.refreshed_over(conn, prepared.run_dir, where)
    before = RunDir(prepared.run_dir).run_file.read_text(encoding="utf-8")
    there = dataclasses.replace(prepared, run_dir=Path(prepared.plan.run_dir))
    with registry.updating(prepared.run_dir) as record:
        refuse_unless_ended(record, prepared.run_dir)
        if record.job_id and remote.job_queued(conn, record.job_id):
            raise ConfigError(f"run {record.run_id}: its job {record.job_id} is still in the queue (its ranks may "
                              "be saving a checkpoint); resume it once that has ended", file=WHERE, key="RUN")
        previous = record.extra.get("resumes")
        number = (len(previous) if isinstance(previous, list) else 0) + 1
        _record_resume(record, there, number, RunDir(prepared.plan.run_dir).previous_files(number))
    return before, record
