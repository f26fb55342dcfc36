"""Write a rendered run bundle to disk (an effect: everything is checked before this).

Every path is checked before anything is written (`check_inputs`); once writing starts, a
failure takes back all of it: the run directory and any directory created for it."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from launcher.errors import ConfigError, GlaunchError
from launcher.resolution.jobplan import JobPlan
from launcher.rundir import claims, registry
from launcher.rundir.files import directory_problem
from launcher.rundir.layout import CODE_DIR, CODE_PATCH, JOB_SCRIPT, RunDir
from launcher.rundir.records import RunRecord, State
from launcher.runner import carried, provenance, snapshot

EXECUTABLE = {JOB_SCRIPT}


@dataclass(frozen=True)
class PathSource:
    """Where the user chose a directory the bundle writes to: the option or key an error
    about that directory names."""

    key: str
    file: str | None = None
    line: int | None = None
    hint: str = ""

    def error(self, message: str) -> ConfigError:
        return ConfigError(message + self.hint, file=self.file, key=self.key, line=self.line)


@dataclass
class Bundle:
    """A written run directory, and what writing it created, so it can be taken back."""

    path: Path
    owns_path: bool = False
    created: list[Path] = field(default_factory=list)   # directories made outside it, outermost first
    claimed: tuple[str, str] | None = None               # (checkpoint directory, run id) claimed for it

    def remove(self) -> None:
        if self.claimed is not None:
            claims.release(*self.claimed)
            self.claimed = None
        if self.owns_path:
            shutil.rmtree(self.path, ignore_errors=True)
            self.owns_path = False
        for directory in reversed(self.created):
            try:
                directory.rmdir()        # only while empty: never what someone else put there
            except OSError:
                pass
        self.created.clear()


def sources(plan: JobPlan, runs_root: PathSource | None,
            checkpoint: PathSource | None) -> tuple[PathSource, PathSource]:
    return (runs_root or PathSource("runs_root", plan.site_file),
            checkpoint or PathSource("checkpoint.dir", plan.experiment_file))


def checkpoint_outside(plan: JobPlan) -> bool:
    run_dir, ckpt = os.path.abspath(plan.run_dir), os.path.abspath(plan.checkpoint_dir)
    return os.path.commonpath([run_dir, ckpt]) != run_dir


def owns_snapshot(plan: JobPlan) -> bool:
    """Whether the run's code snapshot goes into its own directory (a sweep's elements
    share their sweep's)."""
    return plan.code is not None and os.path.normpath(plan.code.dest) == os.path.join(
        os.path.normpath(plan.run_dir), CODE_DIR)


def script_problem(plan: JobPlan) -> str | None:
    """Why the plan's entry script cannot be run as given (it is not a file here), or None;
    a container's script is the image's, not looked for here."""
    script = plan.submitted_script
    if script and plan.launch.container is None and not os.path.isfile(script):
        return f"script {script!r} not found (relative paths are taken from the experiment file's directory)"
    return None


def check_inputs(plan: JobPlan, *, runs_root: PathSource | None = None,
                 checkpoint: PathSource | None = None) -> snapshot.Survey | None:
    """What resolve cannot see without touching the disk: the entry point exists, the run
    directory does not, the directories to write can be made and written, and the code
    snapshot is within its bound (its survey is returned, for write_bundle). Looks only."""
    runs_src, ckpt_src = sources(plan, runs_root, checkpoint)
    problem = script_problem(plan)
    if problem is not None:
        raise ConfigError(problem, file=plan.experiment_file, key="entrypoint.script")
    if os.path.lexists(plan.run_dir):
        raise ConfigError(f"run directory {plan.run_dir!r} already exists", file=plan.experiment_file,
                          key="name")
    problem = directory_problem(os.path.dirname(plan.run_dir))
    if problem:
        raise runs_src.error(f"runs directory {os.path.dirname(plan.run_dir)}: {problem}")
    if checkpoint_outside(plan):
        problem = directory_problem(plan.checkpoint_dir) or _claim_problem(plan)
        if problem:
            raise ckpt_src.error(f"checkpoint directory {plan.checkpoint_dir}: {problem}")
    if plan.code is not None and owns_snapshot(plan):
        return snapshot.check(plan.code, plan.experiment_file)
    return None


def write_bundle(plan: JobPlan, files: Mapping[str, str], *, dry_run: bool,
                 runs_root: PathSource | None = None, checkpoint: PathSource | None = None,
                 survey: snapshot.Survey | None = None, origin: Mapping | None = None,
                 extra: Mapping | None = None) -> Bundle:
    """The run directory with every file of the bundle, the code snapshot (`survey`, from
    check_inputs; surveyed again when not given) and run.json with its provenance
    (`origin`: provenance already collected, for a sweep's elements) and `extra` (more of
    run.json: the sweep an element belongs to, the runs it waits for). A dry run creates
    nothing outside the run directory (a checkpoint.dir elsewhere is made at submission).
    On any failure nothing written stays."""
    runs_src, ckpt_src = sources(plan, runs_root, checkpoint)
    if survey is None and plan.code is not None and owns_snapshot(plan):
        survey = snapshot.check(plan.code, plan.experiment_file)
    bundle = Bundle(Path(plan.run_dir))
    try:
        _make_run_dir(bundle, plan, runs_src)
        try:
            _write_contents(bundle, plan, files, dry_run=dry_run, survey=survey, origin=origin, extra=extra)
        except ConfigError as exc:
            if not (exc.key or "").startswith("code."):
                raise runs_src.error(f"cannot write the run directory {bundle.path}: {exc}") from None
            raise               # the code tree's, not the run directory's
        except (OSError, GlaunchError) as exc:
            raise runs_src.error(f"cannot write the run directory {bundle.path}: "
                                 f"{_why(exc) if isinstance(exc, OSError) else exc}") from None
        if checkpoint_outside(plan) and not dry_run:
            try:
                _make_dirs(Path(plan.checkpoint_dir), bundle.created)
                claims.claim(plan.checkpoint_dir, plan.run_id, plan.run_dir, plan.checkpoint_take_over)
            except OSError as exc:
                raise ckpt_src.error(f"cannot create the checkpoint directory {plan.checkpoint_dir}: "
                                     f"{_why(exc)}") from None
            except (GlaunchError, claims.ClaimTaken) as exc:     # another run claimed it since check_inputs looked
                raise ckpt_src.error(f"checkpoint directory {plan.checkpoint_dir}: {exc}") from None
            bundle.claimed = (plan.checkpoint_dir, plan.run_id)
    except BaseException:
        bundle.remove()
        raise
    return bundle


def _claim_problem(plan: JobPlan) -> str | None:
    """Why the run cannot own its checkpoint directory (another run's, or holding files no
    run claims), or None."""
    try:
        return claims.claim_problem(plan.checkpoint_dir, plan.run_id, plan.checkpoint_take_over)
    except GlaunchError as exc:
        return str(exc)


def _make_run_dir(bundle: Bundle, plan: JobPlan, runs_src: PathSource) -> None:
    """The runs directory as needed (what it made goes into `bundle.created`), then the run
    directory itself, new."""
    try:
        _make_dirs(bundle.path.parent, bundle.created)
    except OSError as exc:
        raise runs_src.error(f"cannot create the runs directory {bundle.path.parent}: {_why(exc)}") from None
    try:
        bundle.path.mkdir()
    except FileExistsError:
        raise ConfigError(f"run directory {plan.run_dir!r} already exists", file=plan.experiment_file,
                          key="name") from None
    except OSError as exc:
        raise runs_src.error(f"cannot create the run directory {bundle.path}: {_why(exc)}") from None
    bundle.owns_path = True


def _write_contents(bundle: Bundle, plan: JobPlan, files: Mapping[str, str], *, dry_run: bool,
                    survey: snapshot.Survey | None, origin: Mapping | None, extra: Mapping | None) -> None:
    """Inside the new run directory: logs/, checkpoints/ (unless checkpoint.dir is
    elsewhere), the bundle's files, lib/ (the job side the nodes import), the code
    snapshot, run.json."""
    Path(plan.log_dir).mkdir()
    if not checkpoint_outside(plan):
        Path(plan.checkpoint_dir).mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        write_file(bundle.path / name, text, executable=name in EXECUTABLE)
    carried.write_lib(RunDir(bundle.path).lib_dir)
    if origin is None:
        origin = _provenance(plan, survey, bundle.path)
    if "profiles" not in origin:
        # Per run, not in the provenance a sweep's elements share: each element names its own profile.
        origin = {**origin, "profiles": _profiles(plan)}
    record = initial_record(plan, dry_run=dry_run, origin=origin)
    record.extra.update(extra or {})
    registry.write(bundle.path, record)


def _provenance(plan: JobPlan, survey: snapshot.Survey | None, run_dir: Path) -> dict:
    """The run's provenance: its code snapshot taken now (from `survey`), or, where it
    runs from the work tree as it is, the commit and state of that tree."""
    taken = None
    if survey is not None and plan.code is not None:
        taken = snapshot.take(plan.code, survey, run_dir / CODE_PATCH, plan.experiment_file)
    elif plan.code is None:
        # No copy: the commit and the state of the tree it runs from, as at submit.
        script = plan.submitted_script
        survey = snapshot.tree_state(os.path.dirname(script) if script else plan.workdir)
    return provenance.collect(survey, taken)


def _profiles(plan: JobPlan) -> list[dict] | None:
    """The site profile's files as they were read when the run was resolved; None for a
    profile not read from files (a run resolved again from its recorded config)."""
    return provenance.profile_files(plan.profile_files) if plan.profile_files else None


def write_file(path: Path, text: str, *, executable: bool = False) -> None:
    """A new file of the bundle: never written into something already there."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o755 if executable else 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    if executable:
        path.chmod(0o755)       # whatever the umask took away


def _make_dirs(path: Path, created: list[Path]) -> None:
    """mkdir -p, appending each directory it makes to `created` (outermost first)."""
    missing = []
    probe = path
    while not probe.is_dir():
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir()
        except FileExistsError:
            if not directory.is_dir():
                raise
            continue
        created.append(directory)


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def initial_record(plan: JobPlan, *, dry_run: bool, origin: Mapping | None = None) -> RunRecord:
    return RunRecord(
        run_id=plan.run_id, name=plan.name, site=plan.site_name, scheduler=plan.scheduler,
        transport=plan.transport.name, run_dir=plan.run_dir, experiment_file=plan.experiment_file,
        created=registry.now(), dry_run=dry_run,
        nodes=plan.allocation.nodes, world_size=plan.launch.world_size, partition=plan.allocation.partition,
        requeue_max=plan.recovery.requeue_max, crash_retries=plan.recovery.crash_retries,
        state=(State.RENDERED if dry_run else State.SUBMITTING).value, job_id=None,
        extra={"provenance": dict(origin)} if origin is not None else {})
