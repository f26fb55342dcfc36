"""Remote submission: a Slurm site whose profile has `login:`, used from a machine where
Slurm's commands do not answer (no `sbatch` on PATH; GLAUNCH_DIRECT=1 keeps the direct
road). The run is rendered here as on the cluster, with the cluster's paths, written to a
local staging folder, sent in one transfer to its directory under runs_root on the
cluster, and queued there with the same job.sbatch bytes; all over one SSH connection per
command. The run's record here is a folder of glaunch's state directory holding
remote.json (the login and the run's directory on the cluster) and copies of what was last
read from there (run.json, checked to be this run's, and the files status and the console
read: MIRRORED, rank 0's log): status, cancel and logs ask the cluster through it.

Queueing: sbatch --hold, then run.json with the job's id and the submitit task are put in
place, then `scontrol release`: the job never starts before its record is whole. Any
failure before the release cancels the job and removes what was sent
(launcher.runner.cluster_undo: one undo for runs, sweeps and resumes): nothing is left on
either side, or, when the link dropped, the error and the record here name what is left
and `glaunch cancel` removes it. A run's record here is opened before anything is sent
and journals each step until the release (left.json, under a lock its process holds):
a glaunch process stopped midway leaves a record that names what it left
(`settled_left`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import posixpath
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from launcher import schedulers
from launcher.config.login import Login
from launcher.config.sites import LoadedSite, where_to_change
from launcher.errors import ConfigError, GlaunchError, RunError, SchedulerError
from launcher.resolution.jobplan import JobPlan
from launcher.resolution.resolve import resolve
from launcher.rundir import registry
from launcher.rundir.files import atomic_write_text, load_bounded_object, parse_json_object
from launcher.rundir.layout import (
    CHECKPOINT_DIR,
    CRASH_FILE,
    HANG_FILE,
    HEARTBEAT,
    HEARTBEAT_DIR,
    HEARTBEAT_FILE,
    LIB_DIR,
    LOG_DIR,
    PEER_NOT_STARTED_FILE,
    PEER_RECOVERY_FILE,
    REMOTE_FILE,
    RESOLVED_FILE,
    RESULT_FILE,
    RESUME_FILE,
    RUN_FILE,
    TASK_FILE,
    TASK_LOG,
    WORKER_LOG,
    WORKER_LOG_DIR,
    RunDir,
)
from launcher.rundir.lifecycle import ENDS
from launcher.rundir.records import RunRecord, State, is_terminal
from launcher.rundir.startsummary import first_failure
from launcher.rundir.taskspec import read_placement
from launcher.runner import bundle, carried, cluster_undo, sweeps
from launcher.runner.cluster_undo import OnCluster, SetAside
from launcher.runner.logs import RankLogs
from launcher.runner.prepared import Prepared, PreparedResume, ResumeRoad
from launcher.runner.resumable import MOVED_ASIDE, WHERE, RecordedConfig, record_resume, refuse_unless_ended
from launcher.runner.results import Run
from launcher.runner.upstream import Upstream
from launcher.schedulers.base import Scheduler
from launcher.schedulers.slurm.array import array_job_id
from launcher.schedulers.slurm.client import Client
from launcher.schedulers.slurm.queries import (
    find_submitted,
    job_origin,
    refuse_foreign_job,
    refuse_foreign_origin,
    sacct_records,
    squeue_job,
)
from launcher.schedulers.slurm.recording import fold_job, has_ended, record_queued, settled
from launcher.schedulers.cluster.facts import accounting_commands
from launcher.schedulers.cluster.scontrol_text import SCONTROL_CALL, SCONTROL_COMMANDS, read_scontrol, split_scontrol
from launcher.schedulers.cluster.torchprobe import probe_plan_call
from launcher.schedulers.slurm.submit import (
    dump_task, preflight, preflight_call, release, submission_marker, submitted_pickle, task_template,
)
from launcher.schedulers.ssh import on_login
from launcher.processes import without_tool_prefix
from launcher.schedulers.ssh.connection import Connection, said
from launcher.schedulers.ssh.transfer import send_tree

if TYPE_CHECKING:
    # Named only: following a run over SSH needs none of Slurm's submitting side.
    from launcher.schedulers.slurm.scheduler import SlurmScheduler

DIRECT = "GLAUNCH_DIRECT"
RECORDS = "remote-runs"


def goes_remote(login: Login | None, scheduler: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether a submission to this site goes over SSH: the site has `login:`, is a Slurm
    site, Slurm's sbatch is not on PATH here, and GLAUNCH_DIRECT is not 1."""
    if login is None or scheduler != "slurm" or environ.get(DIRECT) == "1":
        return False
    return shutil.which("sbatch", path=environ.get("PATH", os.defpath)) is None


class SharedConnection(Connection):
    """A connection that every part of one command asking for the same login shares (the
    run submitted, the runs it waits for): it closes when its last user closes it."""

    def __init__(self, login: Login) -> None:
        super().__init__(login, state_dir=registry.state_dir() / "ssh")
        self.users = 0

    def close(self) -> None:
        self.users -= 1
        if self.users <= 0:
            _OPEN.pop(self.login, None)
            super().close()


_OPEN: dict[Login, SharedConnection] = {}


def connect(login: Login) -> Connection:
    """The one connection of this command to `login` (a `with` block, or close() when done)."""
    conn = _OPEN.get(login)
    if conn is None:
        conn = _OPEN[login] = SharedConnection(login)
    conn.users += 1
    return conn


def check_upstreams(upstreams: Sequence[Upstream], login: Login) -> None:
    """A job queued over SSH waits, through Slurm, only for runs queued on that cluster the
    same way: ConfigError naming --after for one still to end that was not."""
    for up in upstreams:
        if up.ended:
            continue
        for run_dir in up.run_dirs:
            where = where_of(run_dir) if (Path(run_dir) / REMOTE_FILE).is_file() else None
            if where is None or where.login.host != login.host:
                place = f"on {where.login.host}" if where is not None else "where Slurm answers here"
                raise ConfigError(f"{up.after}: {up.name} runs {place}; a job queued through {login.host} can "
                                  f"only wait for runs queued through {login.host}", file="command line",
                                  key="--after")


def cluster_environ(conn: Connection, environ: Mapping[str, str], *, submitting: bool = False) -> dict[str, str]:
    """`environ` with HOME, USER and LOGNAME of the cluster account: what ~, $HOME and $USER
    in runs_root and checkpoint.dir stand for, as the cluster's shell would expand them.
    `submitting`: the cluster's settings, which a submission's checks read, are asked in
    the same round trip."""
    along = [on_login.Asked(SCONTROL_CALL, SCONTROL_COMMANDS)] if submitting else []
    found = on_login.account(conn, along=along)
    return {**environ, "HOME": found.home, "USER": found.user, "LOGNAME": found.user}


# A dry run over SSH asks the cluster nothing, so its account's home and name are not known
# here: paths are resolved with these stand-ins and shown as $HOME and $USER, what the
# cluster's shell would expand. Each is an absolute path or a plain word, as resolution
# needs, and text no real path or name holds.
SHOWN_HOME = "/glaunch-cluster-home-stand-in"
SHOWN_USER = "glaunch-cluster-user-stand-in"


def shown_environ(login: Login, environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` as a dry run over SSH resolves the cluster's paths with: the cluster
    account's home and name (the profile's login.user when it names one) as stand-ins."""
    user = login.user or SHOWN_USER
    return {**environ, "HOME": SHOWN_HOME, "USER": user, "LOGNAME": user}


def shown(text: str) -> str:
    """`text` with the stand-ins of shown_environ as the cluster's shell names them."""
    return text.replace(SHOWN_HOME, "$HOME").replace(SHOWN_USER, "$USER")


def dry_run(prepared: Prepared, *, login: Login) -> Run:
    """The bundle as it would be sent to the cluster, written into this machine's record
    folder (the cluster is not contacted); the run's directory there is shown with $HOME."""
    plan = prepared.plan
    _refuse_checkpoint_elsewhere(prepared)
    registry.check_state_dir()
    records_dir().mkdir(parents=True, exist_ok=True)
    local_plan = relocated(plan, records_dir() / plan.run_id)
    written = _write_bundle(prepared, local_plan, dry_run=True)
    try:
        registry.register(plan.run_id, str(written.path))
    except BaseException:
        written.remove()
        raise
    return Run(plan.run_id, written.path, plan.site_name, True, tuple(prepared.files), State.RENDERED.value,
               warnings=prepared.warnings, cluster_host=login.host, cluster_dir=shown(plan.run_dir))


def check_runs_root(site_runs_root: str | None, runs_dir: str | None, site_file: str) -> None:
    """A remote run's directory is a cluster path: runs_root (or --runs-dir) must give it,
    absolute or from ~ or a variable."""
    value = runs_dir or site_runs_root
    key, file = ("--runs-dir", "command line") if runs_dir else ("runs_root", site_file)
    if not value:
        raise ConfigError("submitting over SSH needs runs_root: the directory on the cluster that holds the runs",
                          file=site_file, key="runs_root")
    if not value.startswith(("/", "~", "$")):
        raise ConfigError(f"{value!r} is relative: on the cluster, give it absolute (or from ~ or $HOME)",
                          file=file, key=key)


def on_cluster(plan: JobPlan) -> JobPlan:
    """The plan as the cluster runs it: from its code snapshot (the only copy of the code
    there), in the snapshot's counterpart of the working directory (else the run
    directory). ConfigError for a run without a snapshot."""
    if plan.code is None:
        raise ConfigError("a run submitted over SSH runs from its code snapshot on the cluster: leave "
                          "code.snapshot on", file=plan.experiment_file, key="code.snapshot")
    return dataclasses.replace(plan, workdir=plan.code.import_path or plan.run_dir)


def python_warning(loaded_site: LoadedSite, plan: JobPlan) -> str | None:
    """Over SSH the nodes run this machine's interpreter path unless the profile names one
    (`python:`) or a container: said, as the cluster may have no such file."""
    if loaded_site.config.python or plan.launch.container is not None:
        return None
    return (f"the nodes run {plan.launch.python[0]} (this machine's interpreter, which must exist on the cluster): "
            f"set python: to the cluster's interpreter {where_to_change(loaded_site.path)}")


# --- the record here --------------------------------------------------------------------


@dataclass(frozen=True)
class Where:
    """Where a run submitted over SSH lives: the login, and its directory on the cluster."""

    login: Login
    run_dir: str

    def to_json(self) -> str:
        return json.dumps({"login": dataclasses.asdict(self.login), "run_dir": self.run_dir}, indent=2) + "\n"


def records_dir() -> Path:
    return registry.state_dir() / RECORDS


def where_of(run_dir: Path) -> Where:
    """remote.json, checked as the profile's `login:` is: RunError naming the file."""
    path = Path(run_dir) / REMOTE_FILE
    try:
        data = load_bounded_object(path)
        login = Login(**data["login"])
        run = data["run_dir"]
    except OSError as exc:
        raise RunError(f"cannot read where the run lives: {exc.strerror or exc}", file=str(path)) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise RunError(f"cannot read where the run lives: {str(exc)[:200]}", file=str(path)) from None
    if login.problems() or not isinstance(run, str) or not run.startswith("/"):
        raise RunError("names no usable login or cluster directory", file=str(path))
    return Where(login, run)


# --- submitting -------------------------------------------------------------------------


def relocated(plan: JobPlan, local_run_dir: Path) -> JobPlan:
    """The plan with its run directory (logs, checkpoints, code snapshot) at `local_run_dir`:
    where the bundle rendered for the cluster is written before it is sent."""
    return relocated_under(plan, plan.run_dir, str(local_run_dir))


def relocated_under(plan: JobPlan, old: str, new: str) -> JobPlan:
    """The plan with each of its directories under `old` (the cluster's) under `new`."""

    def moved(path: str) -> str:
        return new + path[len(old):] if path == old or path.startswith(old + "/") else path

    code = plan.code and dataclasses.replace(plan.code, dest=moved(plan.code.dest))
    return dataclasses.replace(plan, run_dir=moved(plan.run_dir), log_dir=moved(plan.log_dir),
                               checkpoint_dir=moved(plan.checkpoint_dir), code=code)


def launch(prepared: Prepared, conn: Connection, *, check: bool) -> Run:
    """Write, send and queue the prepared run over its connection `conn` (closed at the end)."""
    plan = prepared.plan
    try:
        _refuse_checkpoint_elsewhere(prepared)
        staging = staging_folder()
        try:
            job_id = _stage_send_queue(prepared, conn, staging / plan.run_id, check)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        conn.close()
    return Run(plan.run_id, records_dir() / plan.run_id, plan.site_name, False, tuple(prepared.files),
               State.PENDING.value, job_id=job_id, warnings=prepared.warnings, cluster_host=conn.login.host,
               cluster_dir=plan.run_dir)


# A staging folder this old was left by a glaunch process that stopped mid-submission (a
# submission writes and sends its bundle within minutes).
STALE_STAGING_S = 3600.0
STAGING_PREFIX = ".staging-"


def staging_folder() -> Path:
    """A new folder under the records here to write a submission's bundle in before it is
    sent (removed by its submission); those left by a stopped process removed first."""
    records_dir().mkdir(parents=True, exist_ok=True)
    for old in records_dir().glob(f"{STAGING_PREFIX}*"):
        with contextlib.suppress(OSError):
            if time.time() - old.lstat().st_mtime > STALE_STAGING_S:
                shutil.rmtree(old)
    return Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=records_dir()))


def _refuse_checkpoint_elsewhere(prepared: Prepared) -> None:
    """ConfigError naming who chose checkpoint.dir (its default when the prepared run does not
    say) for a run whose checkpoints would leave its run directory."""
    plan = prepared.plan
    if bundle.checkpoint_outside(plan):
        _, checkpoint = bundle.sources(plan, prepared.runs_root_from, prepared.checkpoint_from)
        raise checkpoint.error("a run submitted over SSH keeps its checkpoints in its run directory on the "
                               "cluster: leave checkpoint.dir out")


def _write_bundle(prepared: Prepared, local_plan: JobPlan, *, dry_run: bool) -> bundle.Bundle:
    """The prepared run's bundle written under `local_plan`'s directories here, its
    inputs checked first."""
    runs_root, checkpoint = prepared.runs_root_from, prepared.checkpoint_from
    survey = bundle.check_inputs(local_plan, runs_root=runs_root, checkpoint=checkpoint)
    return bundle.write_bundle(local_plan, prepared.files, dry_run=dry_run, survey=survey, runs_root=runs_root,
                               checkpoint=checkpoint)


def slurm_of(scheduler: Scheduler, plan: JobPlan, client: Client) -> SlurmScheduler:
    """The Slurm scheduler a submission over SSH goes to, its commands run through `client`
    (the login node's): goes_remote takes only Slurm sites, and queueing there asks what
    only Slurm answers (the cluster's checks, its version)."""
    from launcher.schedulers.slurm.scheduler import SlurmScheduler     # loaded already by schedulers.get

    if not isinstance(scheduler, SlurmScheduler):
        raise ConfigError(f"a run submitted over SSH goes to Slurm, not to the {scheduler.name} scheduler",
                          file=plan.site_file, key="scheduler")
    return SlurmScheduler(client)


def _stage_send_queue(prepared: Prepared, conn: Connection, local: Path, check: bool) -> str:
    """The run written in `local`, its record here opened, then sent, checked, queued held
    and released; the record here journals each step (left.json) until the release, so a
    glaunch process stopped at any point leaves a record that names what it left on the
    cluster (`settled_left`)."""
    plan = prepared.plan
    local_plan = relocated(plan, local)
    written = _write_bundle(prepared, local_plan, dry_run=False)
    with registry.updating(written.path) as record:
        record.run_dir = plan.run_dir
        record.extra = moved_paths(record.extra, str(written.path), plan.run_dir)
    dump_task(plan, task_template(local_plan.log_dir))
    client = on_login.slurm_client(conn, cwd=plan.run_dir)
    where = Where(conn.login, plan.run_dir)
    home = records_dir() / plan.run_id
    with record_opened(home, plan.run_id, where,
                       lambda home: shutil.copyfile(RunDir(written.path).run_file, RunDir(home).run_file)):
        journal = cluster_undo.Journal(home)
        done = OnCluster(journal=journal)
        try:
            done.place(plan.run_dir)
            send_tree(conn, written.path, plan.run_dir, make_parent=True)
            job_id = _check_queue_release(prepared, conn, client, written.path, check, done,
                                          before_release=lambda job_id: _record_queued_here(local, journal, done,
                                                                                            job_id))
        except BaseException as exc:
            cluster_undo.undo_after(exc, conn, client, done, plan.run_id,
                                    keep=lambda left, said: _record_left(local, home, left, said),
                                    clean=lambda: cluster_undo.forget_here(home))
        (home / cluster_undo.LEFT_FILE).unlink()
    return job_id


def _check_queue_release(prepared: Prepared | PreparedResume, conn: Connection, client: Client, staged: Path,
                         check: bool, done: OnCluster, *,
                         before_release: Callable[[str], None] = lambda job_id: None) -> str:
    """The run's files on the cluster: the cluster's checks (`check`; their commands asked
    in one round trip), the job queued held (said in `done`), run.json saying so
    (`staged`'s, recorded here first by `before_release`) and its task put in place and the
    job released in one more round trip. The job's id."""
    plan = prepared.plan
    slurm = slurm_of(prepared.scheduler, plan, client)
    warnings: list[str] = []
    if check:
        _ask_checks_ahead(conn, client, plan)
        warnings = slurm.check_cluster(plan)
        preflight(client, plan, Path(plan.run_dir) / "job.sbatch", {})
    job_id = _sbatch_held(conn, client, plan, done)
    record_queued(staged, plan, job_id, warnings, slurm.version())
    before_release(job_id)
    released = on_login.place_and_release(conn, posixpath.join(plan.run_dir, "run.json"),
                                          RunDir(staged).run_file.read_bytes(),
                                          str(task_template(plan.log_dir)),
                                          str(submitted_pickle(plan.log_dir, job_id)), job_id)
    if released.returncode != 0:
        release(client, [job_id])       # once more, with the client's retries
    return job_id


def _ask_checks_ahead(conn: Connection, client: Client, plan: JobPlan) -> None:
    """The commands of a submission's checks (the account's associations and the QOS, the
    nodes' interpreter, `sbatch --test-only`), asked in one round trip; the cluster's
    settings, which name the cluster the associations are asked for, came with the account."""
    _, _, settings = split_scontrol(read_scontrol(client, "glaunch submit"))
    user = on_login.account(conn).user
    asks = [on_login.Asked(cmd) for cmd in accounting_commands(user, settings.get("ClusterName", ""))]
    probe = probe_plan_call(plan)
    if probe is not None:
        asks.append(on_login.Asked(*probe))
    asks.append(on_login.Asked(preflight_call(Path(plan.run_dir) / "job.sbatch")))
    on_login.ask_ahead(conn, asks, cwd=plan.run_dir)


def moved_paths(value: Any, old: str, new: str) -> Any:
    """`value` (run.json's parts) with each path under `old` named under `new` instead."""
    if isinstance(value, str):
        return new + value[len(old):] if value == old or value.startswith(old + "/") else value
    if isinstance(value, dict):
        return {key: moved_paths(item, old, new) for key, item in value.items()}
    if isinstance(value, list):
        return [moved_paths(item, old, new) for item in value]
    return value


def _sbatch_held(conn: Connection, client: Client, plan: JobPlan, done: OnCluster) -> str:
    """sbatch the run's job held; its id."""
    marker = submission_marker(plan.run_id) if "comment" not in dict(plan.allocation.extra_sbatch) else ""
    return sbatch_held(conn, client, posixpath.join(plan.run_dir, "job.sbatch"), marker, done)


def sbatch_held(conn: Connection, client: Client, script: str, marker: str, done: OnCluster, *,
                array: bool = False) -> str:
    """sbatch `script` (a cluster path) held, with `marker` as its --comment when given; its
    job id (`array`: the array's own), said in `done` as asked, then as answered. A lost
    answer is looked up by the marker or the script."""
    cmd = ["sbatch", "--hold", *([f"--comment={marker}"] if marker else []), script]
    user = on_login.account(conn).user

    def lookup(deadline: float) -> str | None:
        found = find_submitted(client, script, marker, deadline=deadline, user=user)
        return (array_job_id(found) if array else found) if found else None

    asked = done.asked(script, marker, array=array)
    output = client.submit(cmd, lookup=lookup)
    words = output.split()
    if len(words) < 4 or not words[-1].isdigit():
        raise SchedulerError(f"sbatch answered without a job id: {output.strip()[:200]}")
    done.answered(asked, words[-1])
    return words[-1]


@contextlib.contextmanager
def record_opened(home: Path, run_id: str, where: Where, write_record: Callable[[Path], object]) -> Iterator[None]:
    """The local record of run (or sweep) `run_id`, opened before anything reaches the
    cluster and held (`submitting`) for the block: remote.json, run.json (`write_record`:
    SUBMITTING) and an empty journal (left.json), registered under its id. ConfigError
    when a run of that id is recorded here."""
    try:
        home.mkdir()
    except FileExistsError:
        raise ConfigError(f"a run with id {run_id} is recorded here already ({home})", file="command line",
                          key="run id") from None
    try:
        with cluster_undo.submitting(home):
            cluster_undo.Journal(home)(OnCluster())
            atomic_write_text(home / REMOTE_FILE, where.to_json())
            write_record(home)
            registry.register(run_id, str(home))
            yield
    except BaseException:
        if not (home / cluster_undo.LEFT_FILE).is_file():
            raise
        left = cluster_undo.read_left(home, run_id, where.run_dir)
        if left is not None and left.submitting and left.on_cluster.is_empty():
            cluster_undo.forget_here(home)     # stopped before anything reached the cluster
        raise


def _record_queued_here(staged: Path, journal: cluster_undo.Journal, done: OnCluster, job_id: str) -> None:
    """Before the release: run.json naming the held job and task.json (where rank 0's log
    is, for a console that follows the run from its start) copied into the record here,
    whose journal says which job's release is asked."""
    home = journal.home
    shutil.copyfile(RunDir(staged).run_file, RunDir(home).run_file)
    if RunDir(staged).task_file.is_file():
        shutil.copyfile(RunDir(staged).task_file, RunDir(home).task_file)
    journal.releasing(done, job_id)


def _record_left(staged: Path, home: Path, left: OnCluster, said: str) -> None:
    """The record here of a submission that left `left` on the cluster: what `cancel` removes."""
    with contextlib.suppress(OSError, GlaunchError):
        cluster_undo.Journal(home).keep(left)
        with registry.updating(staged) as record:
            record.state = State.FAILED.value
            record.reason = None
            record.detail = f"its submission's link dropped: {said}"
        shutil.copyfile(RunDir(staged).run_file, RunDir(home).run_file)


def left_of(run_dir: Path) -> cluster_undo.Left | None:
    """What a submission or a resume whose link dropped left on the cluster, None for other
    runs; a submission's journal as it stands (`settled_left` reads one whose process
    stopped)."""
    if not (Path(run_dir) / cluster_undo.LEFT_FILE).is_file():
        return None
    return cluster_undo.read_left(Path(run_dir), registry.read(run_dir).run_id, where_of(run_dir).run_dir)


def settled_left(run_dir: Path) -> cluster_undo.Left | None:
    """`left_of`, with the journal of a submission whose glaunch process stopped (killed, its
    machine gone) settled: when the release it asked for was made (its job is no longer
    held), the submission was whole and nothing is left (None); else its record says it
    stopped, naming what it left on the cluster (`glaunch cancel` removes it). A
    submission still under way is left as it stands."""
    left = left_of(run_dir)
    if left is None or not left.submitting or cluster_undo.under_way(Path(run_dir)):
        return left
    where = where_of(run_dir)
    if left.releasing is not None:
        with connect(where.login) as conn:
            live, reason = squeue_job(on_login.slurm_client(conn), left.releasing)
        if not (live == "PENDING" and reason == "JobHeldUser"):
            (Path(run_dir) / cluster_undo.LEFT_FILE).unlink(missing_ok=True)
            return None
    run_id = registry.read(run_dir).run_id
    said = (f"nothing reached {where.login.host}" if left.on_cluster.is_empty()
            else left.on_cluster.said(run_id, where.login.host))
    aside = left.on_cluster.set_aside
    if not left.forget and aside is not None:
        atomic_write_text(RunDir(run_dir).run_file, aside.record)      # the record before the resume
    cluster_undo.Journal(Path(run_dir), forget=left.forget).keep(left.on_cluster)
    with registry.updating(run_dir) as record:
        if left.forget:
            record.state = State.FAILED.value
            record.reason = None
        what = "submitting" if left.forget else "resuming"
        record.detail = f"the glaunch process {what} it stopped before the job was released: {said}"
    return dataclasses.replace(left, submitting=False, releasing=None)


def clean_left(run_dir: Path, left: cluster_undo.Left) -> str:
    """`cancel` of a run whose submission or resume lost its link: what it left on the
    cluster undone (held jobs cancelled, a resume's files put back, a submission's
    directory removed); the record here gone too when the run was never queued."""
    where = where_of(run_dir)
    run_id = registry.read(run_dir).run_id
    with connect(where.login) as conn:
        still = cluster_undo.undo(conn, on_login.slurm_client(conn), left.on_cluster)
    if still is not None:
        cluster_undo.Journal(Path(run_dir), forget=left.forget).keep(still)
        raise SchedulerError(f"run {run_id}: {still.said(run_id, where.login.host)}")
    if left.forget:
        cluster_undo.forget_here(Path(run_dir))
    else:
        (Path(run_dir) / cluster_undo.LEFT_FILE).unlink(missing_ok=True)
    what = "submission" if left.forget else "resume"
    return f"run {run_id}: removed what its interrupted {what} left on {where.login.host}: {_undone(left)}"


def _undone(left: cluster_undo.Left) -> str:
    done = left.on_cluster
    parts = [f"held job {h.job_id}" if h.job_id else "any held job it queued" for h in done.held]
    if done.set_aside is not None:
        parts.append(f"its previous files put back from {posixpath.join(done.set_aside.run_dir, done.set_aside.aside)}")
    if done.placed is not None:
        parts.append(done.placed)
    return " and ".join(parts) or "nothing was left"


# --- resuming -------------------------------------------------------------------------


def copy_here(conn: Connection, where: Where, name: str, run_dir: Path) -> None:
    """The run's file `name` on the cluster copied into its record here."""
    data = on_login.read_bytes(conn, posixpath.join(where.run_dir, name))
    if data is None:
        raise SchedulerError(f"{where.run_dir!r} on {conn.where()} holds no {name}: the run's directory there was "
                             "moved or changed")
    atomic_write_text(Path(run_dir) / name, data.decode("utf-8", errors="replace"))


class ClusterFiles:
    """isdir and isfile of paths on the cluster (one call each)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def isdir(self, path: str) -> bool:
        return self.conn.run(["test", "-d", path]).returncode == 0

    def isfile(self, path: str) -> bool:
        return self.conn.run(["test", "-f", path]).returncode == 0


def job_queued(conn: Connection, job_id: str) -> bool:
    """Whether Slurm still lists the job (pending, running or ending)."""
    live, _ = squeue_job(on_login.slurm_client(conn), job_id)
    return live is not None


def queue_resume(prepared: PreparedResume, conn: Connection, aside: str, moved: Sequence[str], before: str, *,
                 check: bool) -> str:
    """The resumed run's files in place on the cluster (the files `moved` set aside in
    `aside` in the same call; lib/ afresh, as installed here), its job queued held, run.json
    and the task put in place, released; the job's id. run.json here is the one to send
    (SUBMITTING). On failure before the release the job is cancelled and the previous files
    and run.json (`before`) are put back on both sides; what the cluster could not be asked
    to undo is named in the error and kept in the record here for `glaunch cancel`."""
    plan, here = prepared.plan, Path(prepared.run_dir)
    names = sorted({*moved, *prepared.files, LIB_DIR})
    client = on_login.slurm_client(conn, cwd=plan.run_dir)
    template = posixpath.relpath(str(task_template(plan.log_dir)), plan.run_dir)
    set_aside = SetAside(plan.run_dir, aside, tuple(names), False, before, (template,))
    with cluster_undo.submitting(here):
        journal = cluster_undo.Journal(here, forget=False)
        done = OnCluster(journal=journal)
        try:
            done.put_aside(set_aside)
            on_login.set_aside(conn, plan.run_dir, aside, names, _resume_files(prepared))
            done.put_aside(dataclasses.replace(set_aside, whole=True))
            job_id = _check_queue_release(prepared, conn, client, here, check, done,
                                          before_release=lambda job_id: journal.releasing(done, job_id))
        except BaseException as exc:
            atomic_write_text(RunDir(here).run_file, before)
            cluster_undo.undo_after(exc, conn, client, done, prepared.record.run_id,
                                    keep=lambda left, said: _keep_left_of_resume(here, left, said),
                                    clean=lambda: (here / cluster_undo.LEFT_FILE).unlink(missing_ok=True))
        (here / cluster_undo.LEFT_FILE).unlink()
    return job_id


def _keep_left_of_resume(here: Path, left: OnCluster, said: str) -> None:
    """The run's record here (as it was before the resume) says what its resume left."""
    cluster_undo.Journal(here, forget=False).keep(left)
    with registry.updating(here) as record:
        record.detail = f"its resume's link dropped: {said}"


def _resume_files(prepared: PreparedResume) -> bytes:
    """What a resume puts in the run's directory on the cluster, as one tar stream: the
    rendered files, run.json (here's, SUBMITTING), the submitit task, lib/ as installed here."""
    plan, here = prepared.plan, Path(prepared.run_dir)
    with tempfile.TemporaryDirectory(dir=records_dir()) as staging:
        template = task_template(Path(staging) / "logs")
        template.parent.mkdir()
        dump_task(plan, template)
        members = {**{name: (text.encode(), name in bundle.EXECUTABLE) for name, text in prepared.files.items()},
                   "run.json": (RunDir(here).run_file.read_bytes(), False),
                   posixpath.relpath(str(task_template(plan.log_dir)), plan.run_dir): (template.read_bytes(), False),
                   **{f"{LIB_DIR}/{name}": (source.read_bytes(), False) for source, name in carried.carried_files()},
                   **{f"{LIB_DIR}/{name}": (content, False) for name, content in carried.carried_metadata()}}
    return _tar(members)


def prepare_resume(run_dir: Path, overrides: tuple[str, ...], dry_run: bool, where: Where, conn: Connection,
                   road: ResumeRoad) -> PreparedResume:
    """`prepare_resume` of a run submitted over SSH, over `conn` (the connection `road`, the
    road it is launched by, holds): its record and resolved.yaml read from the cluster (the
    local copies refreshed), resolved with the cluster account's HOME and USER, its
    directories checked there."""
    _refuse_while_left(run_dir)
    record = registry.read(run_dir) if dry_run else refreshed_over(conn, run_dir, where)
    refuse_unless_ended(record, run_dir)
    copy_here(conn, where, RESOLVED_FILE, run_dir)
    recorded = RecordedConfig.read(run_dir)
    exp, site = recorded.load(overrides)
    recorded.check_site_kept(exp, site)
    environ = cluster_environ(conn, os.environ, submitting=True)
    ctx = dataclasses.replace(recorded.context(exp, site), environ=environ)
    plan = on_cluster(recorded.conventions(resolve(exp, site, ctx)))
    recorded.check_kept(plan, exp, files=ClusterFiles(conn))
    scheduler = schedulers.get(plan.scheduler)
    scheduler.check(plan)
    return PreparedResume(run_dir, record, overrides, plan, scheduler.render(plan), scheduler, road=road)


def _refuse_while_left(run_dir: Path) -> None:
    """ConfigError for a run whose last submission or resume lost its link and left
    something on the cluster: `glaunch cancel` undoes it first."""
    left = settled_left(run_dir)
    if left is not None:
        run_id = registry.read(run_dir).run_id
        if left.submitting:
            raise ConfigError(f"run {run_id}: a glaunch process on this machine is submitting it", file=WHERE,
                              key="RUN")
        raise ConfigError(f"run {run_id}: {left.on_cluster.said(run_id, where_of(run_dir).login.host)}; resume it "
                          "once that is done", file=WHERE, key="RUN")


def launch_resume(prepared: PreparedResume, conn: Connection, *, check: bool) -> Run:
    """On the cluster, in one call: the previous files to resumes/N/, the new ones and
    run.json (SUBMITTING, with its resume entry) in place; then the job queued held, its
    record and task put in place, and released (queue_resume)."""
    plan, here = prepared.plan, prepared.run_dir
    try:
        before, record = _resumed_record(prepared, conn)
    except BaseException:
        conn.close()
        raise
    aside = os.path.relpath(RunDir(plan.run_dir).previous_files(len(record.extra["resumes"])), plan.run_dir)
    try:
        job_id = queue_resume(prepared, conn, aside, MOVED_ASIDE, before, check=check)
    finally:
        conn.close()
    atomic_write_text(here / RESOLVED_FILE, prepared.files[RESOLVED_FILE])
    return Run(record.run_id, here, plan.site_name, False, tuple(prepared.files), State.PENDING.value, job_id,
               warnings=prepared.warnings, cluster_host=conn.login.host, cluster_dir=plan.run_dir)


def _resumed_record(prepared: PreparedResume, conn: Connection) -> tuple[str, RunRecord]:
    """run.json here read again from the cluster (its text, as the cluster has it), checked
    to have ended with its job gone from the queue, and given its resume entry (SUBMITTING)."""
    where = where_of(prepared.run_dir)
    refreshed_over(conn, prepared.run_dir, where)
    before = RunDir(prepared.run_dir).run_file.read_text(encoding="utf-8")
    there = dataclasses.replace(prepared, run_dir=Path(prepared.plan.run_dir))
    with registry.updating(prepared.run_dir) as record:
        refuse_unless_ended(record, prepared.run_dir)
        if record.job_id and job_queued(conn, record.job_id):
            raise ConfigError(f"run {record.run_id}: its job {record.job_id} is still in the queue (its ranks may "
                              "be saving a checkpoint); resume it once that has ended", file=WHERE, key="RUN")
        previous = record.extra.get("resumes")
        number = (len(previous) if isinstance(previous, list) else 0) + 1
        record_resume(record, there, number, RunDir(prepared.plan.run_dir).previous_files(number))
    return before, record


def _tar(members: Mapping[str, tuple[bytes, bool]]) -> bytes:
    """A tar stream of `members` (name -> bytes, executable), owners left out."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (data, executable) in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o755 if executable else 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


# --- following --------------------------------------------------------------------------


def refreshed(run_dir: Path) -> RunRecord:
    """The run's record read from the cluster, with Slurm's view folded in; for a submission
    whose link dropped or whose process stopped, the record here, which says what it left
    there, and for one under way, the record here as it stands."""
    if settled_left(run_dir) is not None:
        return registry.read(run_dir)
    where = where_of(run_dir)
    with connect(where.login) as conn:
        return refreshed_over(conn, run_dir, where)


def refreshed_over(conn: Connection, run_dir: Path, where: Where, *, all_logs: bool = False,
                   worker_rank: int | None = None) -> RunRecord:
    mirror_run(conn, run_dir, where, registry.read(run_dir), all_logs=all_logs, worker_rank=worker_rank)
    record = _folded_over(conn, run_dir, registry.read(run_dir))
    _mirror_failing_log(conn, run_dir, where, record)
    return record


def _folded_over(conn: Connection, run_dir: Path, record: RunRecord) -> RunRecord:
    """The mirrored record with what squeue and sacct say of its job folded in (as
    status's refresh does on the login node)."""
    if record.job_id and not (record.state in ENDS and settled(record)):
        client = on_login.slurm_client(conn)
        live = reason = None
        if not has_ended(record):
            live, reason = squeue_job(client, record.job_id)
        record = fold_job(run_dir, live, reason, sacct_records(client, record.job_id))
    return record


FAILED_STATES = frozenset({State.FAILED.value, State.OUT_OF_MEMORY.value, State.NODE_FAIL.value})


def _mirror_failing_log(conn: Connection, run_dir: Path, where: Where, record: RunRecord) -> None:
    """A failed run's first failing task's error log (which its end names, and whose last
    lines it shows) copied here too, where only rank 0's output is copied as it runs."""
    if record.state not in FAILED_STATES or not record.starts:
        return
    task, _, _ = first_failure(RunDir(run_dir), record)
    if task is None:
        return
    log = RunDir(run_dir).task_log(record.starts[-1].job_id, task, "err")
    name = posixpath.join(LOG_DIR, log.name)
    wanted = {name: log.stat().st_size if log.is_file() else 0}
    for got, offset, data in on_login.files_since(conn, where.run_dir, wanted, MIRROR_LIMIT):
        if got == name:
            _take_tail(log, offset, data)


# What status, the console of --wait and list read in a run's directory besides run.json and
# rank 0's log: copied whole into its record here at each refresh (every rank's heartbeat:
# status names the ranks fallen silent).
MIRRORED = (RESULT_FILE, RESUME_FILE, CRASH_FILE, HANG_FILE, RESOLVED_FILE, TASK_FILE, f"{HEARTBEAT_DIR}/rank-*.json",
            f"{CHECKPOINT_DIR}/latest", PEER_RECOVERY_FILE, PEER_NOT_STARTED_FILE)
# The most of one file a refresh copies: records are far smaller; a log that grew by more
# comes over in the next refreshes.
MIRROR_LIMIT = 4 << 20


def mirror_run(conn: Connection, run_dir: Path, where: Where, asked: RunRecord, *, all_logs: bool = False,
               worker_rank: int | None = None) -> None:
    """In one call: run.json of the run on the cluster, checked to be `asked`'s, then the
    files of MIRRORED and what rank 0's log of each of its jobs gained (`all_logs`: every
    task log's), into its record here, so that everything that reads a run's directory
    reads it as on the cluster."""
    here = RunDir(run_dir)
    wanted = {RUN_FILE: 0, **{pattern: 0 for pattern in MIRRORED}}
    task = read_placement(run_dir).task(0)
    logs = [here.task_log(job_id, task) for job_id
            in dict.fromkeys([*(s.job_id for s in asked.starts), *([asked.job_id] if asked.job_id else [])])]
    if all_logs:
        logs += [p for p in here.log_dir.glob("*_log.*") if TASK_LOG.fullmatch(p.name)] if here.log_dir.is_dir() else []
        wanted.update({f"{LOG_DIR}/*_log.out": 0, f"{LOG_DIR}/*_log.err": 0})
    if worker_rank is not None:
        wanted.update(_worker_logs_of(here, worker_rank))
    for log in logs:
        wanted[posixpath.join(LOG_DIR, log.name)] = log.stat().st_size if log.is_file() else 0
    got = {name: (offset, data) for name, offset, data
           in on_login.files_since(conn, where.run_dir, wanted, MIRROR_LIMIT)}
    if RUN_FILE not in got:
        raise SchedulerError(f"{where.run_dir!r} on {conn.where()} holds no run.json: the run's directory "
                             "there was moved or removed")
    atomic_write_text(here.run_file, checked_record(got.pop(RUN_FILE)[1], asked.run_id, where.run_dir, conn.where()))
    for name, (offset, data) in got.items():
        if _is_in(name, LOG_DIR, TASK_LOG) or _is_worker_log(name):
            _take_tail(here.path / name, offset, data)
        elif name in wanted or _is_in(name, HEARTBEAT_DIR, HEARTBEAT):
            _replace(here.path / name, data)
    _drop_gone(here.path, got)


def _drop_gone(run_dir: Path, got: Mapping[str, object]) -> None:
    """The copies here of MIRRORED files the run's directory on the cluster no longer holds
    (a resume set its result, crash and heartbeats aside there): gone here too."""
    present = {posixpath.normpath(name) for name in got}
    for pattern in MIRRORED:
        for copy in run_dir.glob(pattern):
            if copy.relative_to(run_dir).as_posix() not in present and (copy.is_file() or copy.is_symlink()):
                copy.unlink(missing_ok=True)


def _worker_logs_of(here: RunDir, rank: int) -> dict[str, int]:
    """What `logs --rank` of a torchrun run asks for besides the task logs: that rank's
    worker's own logs (launcher.rundir.layout.WORKER_LOG), each from where its copy here
    ends, and a glob for those not copied yet; none where the run is not a torchrun one
    (as far as its task.json here says)."""
    placement = read_placement(here.path)
    if not placement.per_node:
        return {}
    node, local = placement.task(rank), rank % placement.ranks_per_node
    wanted = {f"{LOG_DIR}/{WORKER_LOG_DIR}/*_{node}/*/attempt_*/{local}/std*.log": 0}
    wanted.update({worker.path.relative_to(here.path).as_posix(): worker.path.stat().st_size
                   for worker in here.worker_logs() if placement.rank(worker.node, worker.local_rank) == rank})
    return wanted


def _is_worker_log(name: str) -> bool:
    """Whether `name` (as the cluster spelt it) is a worker's own log under logs/workers/, in
    torchrun's layout and nowhere else (no `..`, no empty part)."""
    parts = name.split("/")
    return (len(parts) > 2 and parts[:2] == [LOG_DIR, WORKER_LOG_DIR] and all(p not in ("", ".", "..") for p in parts)
            and WORKER_LOG.fullmatch("/".join(parts[2:])) is not None)


def _is_in(name: str, folder: str, pattern: Any) -> bool:
    """Whether `name` (as the cluster spelt it) is a file of `folder` that `pattern` names."""
    parent, _, base = name.partition("/")
    return parent == folder and pattern.fullmatch(base) is not None


def _replace(path: Path, data: bytes) -> None:
    """`path` replaced whole with `data` (a copy: it is fetched again at the next refresh)."""
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_name(f".{path.name}.mirror-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _take_tail(path: Path, offset: int, data: bytes) -> None:
    """What a log gained past `offset` on the cluster, appended to its copy here when that
    ends there; all of it, from 0, when the log was cut shorter there."""
    have = path.stat().st_size if path.is_file() else 0
    path.parent.mkdir(parents=True, exist_ok=True)
    if offset == have:
        with open(path, "ab") as f:
            f.write(data)
    elif offset == 0:
        with open(path, "wb") as f:
            f.write(data)


def checked_record(data: bytes, run_id: str, cluster_dir: str, host: str) -> str:
    """run.json as read from `cluster_dir` on `host`, once it is checked to be the record of
    run `run_id` kept in that directory: nothing is copied here or acted on otherwise (a
    directory there replaced or renamed would name another run's job). RunError naming
    both runs, or what is wrong with the record."""
    text = data.decode("utf-8", errors="replace")
    source = f"{host}:{posixpath.join(cluster_dir, 'run.json')}"
    try:
        there = RunRecord.from_dict(parse_json_object(text))
    except ValueError as exc:
        raise RunError(f"damaged run record on the cluster: {exc}; nothing was done", file=source) from None
    if there.run_id != run_id or posixpath.normpath(str(there.run_dir)) != posixpath.normpath(cluster_dir):
        raise RunError(f"holds the record of run {there.run_id} (directory {there.run_dir}), not of run {run_id} "
                       f"({cluster_dir}): the run's directory there was replaced; nothing was done", file=source)
    return text


def cancel(run_dir: Path) -> str:
    left = settled_left(run_dir)
    if left is not None:
        if left.submitting:
            raise ConfigError(f"run {registry.read(run_dir).run_id}: a glaunch process on this machine is submitting "
                              "it: cancel it once that submission has ended", file=WHERE, key="RUN")
        return clean_left(run_dir, left)
    where = where_of(run_dir)
    with connect(where.login) as conn:
        # Three round trips: run.json there (checked to be this run's), squeue's word on the
        # job it names (an edited record would end another run's job), and the cancel.
        # squeue and sacct's fold only for a job that squeue no longer lists.
        mirror_run(conn, run_dir, where, registry.read(run_dir))
        record = registry.read(run_dir)
        if not record.job_id or is_terminal(record.state):
            return f"run {record.run_id}: nothing to cancel ({record.state})"
        job_id = record.job_id
        client = on_login.slurm_client(conn)
        origin = job_origin(client, job_id)
        if origin is None:
            record = _folded_over(conn, run_dir, record)
            if is_terminal(record.state):
                return f"run {record.run_id}: nothing to cancel ({record.state})"
        refuse_foreign_origin(origin, job_id, record.run_id, where.run_dir)
        record_there = posixpath.join(where.run_dir, RUN_FILE)
        now = _cancel_marked(conn, [(where.run_dir, job_id)], [job_id], read_back=record_there)
        # A job ending at its time limit may have resubmitted the run meanwhile: its
        # successor, named in run.json there now, is cancelled too (as on the cluster,
        # where the mark and the resubmission take run.json's lock in turn).
        try:
            again = RunRecord.from_dict(parse_json_object(checked_record(now, record.run_id, where.run_dir,
                                                                         conn.where())))
        except (GlaunchError, ValueError):
            again = record          # not read back: the job asked is the one cancelled
        if again.job_id and again.job_id != job_id and not is_terminal(again.state):
            try:
                refuse_foreign_job(client, again.job_id, record.run_id, where.run_dir)
            except SchedulerError as exc:
                raise SchedulerError(f"run {record.run_id}: cancelled job {job_id} on {where.login.host}; its "
                                     f"successor {again.job_id} was not: {exc.message}") from None
            _cancel_marked(conn, [(where.run_dir, again.job_id)], [again.job_id])
            job_id = f"{job_id} and its successor {again.job_id}"
    return f"run {record.run_id}: cancelled job {job_id} on {where.login.host}"


def _cancel_marked(conn: Connection, marks: Sequence[tuple[str, str]], jobs: Sequence[str],
                   read_back: str = "") -> bytes:
    """The jobs' runs marked as cancelled where they live, then the jobs cancelled, in one
    round trip (launcher.schedulers.ssh.on_login.cancel_marked); `read_back` as it is then."""
    done = on_login.cancel_marked(conn, marks, jobs, read_back)
    if done.returncode != 0:
        raise SchedulerError(f"scancel {' '.join(jobs)} on {conn.where()} failed: "
                             f"{without_tool_prefix('scancel', said(done.stderr))}")
    return done.stdout


def logs(run_dir: Path, *, rank: int | None, follow: bool, echo: Callable[[str], None], poll_s: float) -> None:
    """The run's task logs, copied from the cluster as they grow, shown as for a run here;
    its record there checked to be this run's first (a directory there replaced would hold
    another run's logs)."""
    where = where_of(run_dir)
    reader = None
    with connect(where.login) as conn:
        while True:
            if follow:
                state = refreshed_over(conn, run_dir, where, all_logs=True, worker_rank=rank).state
                follow = not (is_terminal(state) or state == State.UNKNOWN)
            else:
                mirror_run(conn, run_dir, where, registry.read(run_dir), all_logs=True, worker_rank=rank)
            # Made once the first copy brought task.json: which logs are a rank's own.
            reader = reader or RankLogs(run_dir, rank, echo)
            reader.poll()
            if not follow:
                reader.flush()
                return
            time.sleep(poll_s)


def mirror_logs(conn: Connection, folder: str, log_dir: Path) -> None:
    """The task logs of `folder` on the cluster into `log_dir`, in one call: only what each
    one gained since the last copy travels (all of it when it was cut shorter there), and
    is appended here, so a reader following them sees them grow."""
    log_dir.mkdir(exist_ok=True)
    have = {p.name: p.stat().st_size for p in log_dir.iterdir() if TASK_LOG.match(p.name) and p.is_file()}
    for name, offset, data in on_login.log_tails(conn, folder, have):
        if TASK_LOG.match(name):
            _take_tail(log_dir / name, offset, data)


# --- following a sweep --------------------------------------------------------------------------


# What a sweep's table reads in each element's directory besides run.json: its result and
# rank 0's step.
SWEEP_MIRRORED = (RESULT_FILE, posixpath.join(HEARTBEAT_DIR, HEARTBEAT_FILE.format(rank=0)))


def sweep_element_records(sweep_dir: Path) -> dict[str, RunRecord | GlaunchError]:
    """Every element's record (and SWEEP_MIRRORED) read from the cluster in one call, Slurm's
    view of those in flight folded in with one squeue and one sacct there."""
    where = where_of(sweep_dir)
    sweep = sweeps.read(sweep_dir)
    with connect(where.login) as conn:
        names = {}
        for element in sweep.elements:
            there = posixpath.relpath(where_of(Path(element.run_dir)).run_dir, where.run_dir)
            for name in (RUN_FILE, *SWEEP_MIRRORED):
                names[posixpath.join(there, name)] = (element, name)
        _mirror_records(on_login.pack_files(conn, where.run_dir, list(names)), names, sweep, conn.where())
        client = on_login.slurm_client(conn)
        return sweeps.element_records(sweep_dir, lambda runs: _refresh_many(client, runs))


def _mirror_records(stream: bytes, names: Mapping[str, tuple[sweeps.SweepElement, str]], sweep: sweeps.SweepRecord,
                    host: str) -> None:
    """The files of a tar stream into the elements' folders here (`names`: the name in the
    stream -> the element and its file), each run.json checked to be its element's
    (`checked_record`) before any file is copied."""
    members = _members(stream, f"the records of sweep {sweep.sweep_id}", host)
    found = [(names[name], data) for name, data in members.items() if name in names]
    for (element, name), data in found:
        if name == RUN_FILE:
            there = where_of(Path(element.run_dir)).run_dir
            atomic_write_text(RunDir(element.run_dir).run_file, checked_record(data, element.run_id, there, host))
    for (element, name), data in found:
        if name != RUN_FILE:
            _replace(Path(element.run_dir) / name, data)
    came = {(element.run_id, name) for (element, name), _ in found}
    for element, name in names.values():
        if name != RUN_FILE and (element.run_id, RUN_FILE) in came and (element.run_id, name) not in came:
            (Path(element.run_dir) / name).unlink(missing_ok=True)     # gone there (set aside by a resume)


def _members(stream: bytes, what: str, host: str) -> dict[str, bytes]:
    """The regular files of a tar stream read from `host`, by normalised name."""
    out: dict[str, bytes] = {}
    if not stream:
        return out
    try:
        with tarfile.open(fileobj=io.BytesIO(stream), mode="r:") as tar:
            for member in tar:
                data = tar.extractfile(member) if member.isreg() else None
                if data is not None:
                    out[posixpath.normpath(member.name)] = data.read()
    except tarfile.TarError as exc:
        raise SchedulerError(f"{what} came back from {host} damaged: {exc}") from None
    return out


def refresh_copies(run_dirs: Sequence[Path]) -> dict[str, str]:
    """run.json of each run of `run_dirs` kept on a cluster reached over SSH (of a sweep:
    each element's) copied here from there, checked to be that run's, Slurm's view folded
    in: three calls per login (the records, one squeue, one sacct). A login that cannot be
    reached, or a record there that is not its run's, leaves the copy here as it was: a
    listing shows what was last recorded, and is told so: the runs of `run_dirs` (as given)
    whose login did not answer, each with why."""
    unanswered: dict[str, str] = {}
    by_login: dict[Login, list[tuple[Path, Where]]] = {}
    given: dict[Login, set[str]] = {}
    for run_dir in run_dirs:
        for local in _records_of(Path(run_dir)):
            try:
                where = where_of(local)
            except RunError:
                continue
            by_login.setdefault(where.login, []).append((local, where))
            given.setdefault(where.login, set()).add(str(run_dir))
    for login, runs in by_login.items():
        try:
            with connect(login) as conn:
                names = {posixpath.join(w.run_dir, RUN_FILE).lstrip("/"): (local, w) for local, w in runs}
                copied = _copy_checked(on_login.pack_files(conn, "/", list(names)), names, conn.where())
                _refresh_many(on_login.slurm_client(conn), [(local, registry.read(local)) for local in copied])
        except GlaunchError as exc:
            unanswered.update(dict.fromkeys(given[login], f"{login.host}: {exc.message}"))
    return unanswered


def _records_of(run_dir: Path) -> list[Path]:
    """The local records of a run kept over SSH (a sweep: its elements'); none for another run,
    nor for one whose record here is its own (a submission under way, or that left something
    on the cluster: left.json)."""
    if not (run_dir / REMOTE_FILE).is_file() or (run_dir / cluster_undo.LEFT_FILE).is_file():
        return []
    if not (run_dir / sweeps.SWEEP_FILE).is_file():
        return [run_dir]
    try:
        return [Path(e.run_dir) for e in sweeps.read(run_dir).elements]
    except GlaunchError:
        return []


def _copy_checked(stream: bytes, names: Mapping[str, tuple[Path, Where]], host: str) -> list[Path]:
    """The records of a tar stream (by their name there) copied over those here that they
    are checked to be (`checked_record`); the folders here they were copied into."""
    copied = []
    for name, data in _members(stream, "the runs' records", host).items():
        if name not in names:
            continue
        local, where = names[name]
        try:
            text = checked_record(data, registry.read(local).run_id, where.run_dir, host)
        except RunError:
            continue
        atomic_write_text(RunDir(local).run_file, text)
        copied.append(local)
    return copied


def _refresh_many(client: Client, runs: list[tuple[Path, RunRecord]]) -> list[RunRecord]:
    """Slurm's view (asked through `client`, the login node's) folded into the records that
    it may still add to (as `refreshed_over`)."""
    from launcher.schedulers.slurm.scheduler import SlurmScheduler

    def asks(record: RunRecord) -> bool:
        return bool(record.job_id) and not (record.state in ENDS and settled(record))

    asked = [(d, r) for d, r in runs if asks(r)]
    fresh = iter(SlurmScheduler(client).refresh_many(asked) if asked else [])
    return [next(fresh) if asks(r) else r for _, r in runs]


def cancel_sweep(sweep_dir: Path) -> str:
    """scancel the sweep's arrays on the cluster, and its elements' jobs outside them (an
    element resubmitted at its time limit), each element marked as cancelled first where it
    lives (its job controller then ends it as cancelled, not requeued)."""
    where = where_of(sweep_dir)
    sweep = sweeps.read(sweep_dir)
    arrays = [a.job_id for a in sweep.arrays if a.job_id]
    with connect(where.login) as conn:      # one connection: the records' refresh shares it
        records = sweep_element_records(sweep_dir)
        live = [(where_of(Path(e.run_dir)).run_dir, str(r.job_id)) for e in sweep.elements
                if isinstance(r := records.get(e.run_id), RunRecord) and r.job_id and not is_terminal(r.state)]
        loose = [job_id for _, job_id in live if array_job_id(job_id) not in arrays]
        if not arrays and not loose:
            return f"sweep {sweep.sweep_id}: nothing to cancel"
        _cancel_marked(conn, live, [*arrays, *loose])
    return f"sweep {sweep.sweep_id}: cancelled job(s) {', '.join([*arrays, *loose])} on {where.login.host}"


def mirror_sweep_logs(sweep_dir: Path) -> None:
    """Every element's task logs copied from the cluster (one call per element)."""
    where = where_of(sweep_dir)
    with connect(where.login) as conn:
        for element in sweeps.read(sweep_dir).elements:
            there = where_of(Path(element.run_dir)).run_dir
            mirror_logs(conn, posixpath.join(there, "logs"), RunDir(element.run_dir).log_dir)
