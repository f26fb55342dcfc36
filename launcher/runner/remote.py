"""Remote submission: a Slurm site whose profile has `login:`, used from a machine where
Slurm's commands do not answer (no `sbatch` on PATH; GLAUNCH_DIRECT=1 keeps the direct
road). The run is rendered here as on the cluster, with the cluster's paths, written to a
local staging folder, sent in one transfer to its directory under runs_root on the
cluster, and queued there with the same job.sbatch bytes; all over one SSH connection per
command. The run's record here is a folder of glaunch's state directory holding
remote.json (the login and the run's directory on the cluster) and the last run.json read
from there: status, cancel and logs ask the cluster through it.

Queueing: sbatch --hold, then run.json with the job's id and the submitit task are put in
place, then `scontrol release`: the job never starts before its record is whole. Any
failure before the release cancels the job and removes what was sent: nothing is left on
either side.
"""

from __future__ import annotations

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
from typing import Any, Callable, Mapping, Sequence

from launcher.config.login import Login
from launcher.errors import ConfigError, GlaunchError, RunError, SchedulerError
from launcher.rundir import registry
from launcher.rundir.files import atomic_write_text
from launcher.rundir.layout import REMOTE_FILE, TASK_LOG, RunDir
from launcher.rundir.lifecycle import ENDS
from launcher.rundir.records import RunRecord, State, is_terminal
from launcher.runner import bundle, sweeps
from launcher.runner.logs import RankLogs
from launcher.runner.results import Run
from launcher.schedulers.slurm.client import using
from launcher.schedulers.slurm.queries import find_submitted, sacct_records, squeue_job
from launcher.schedulers.slurm.records import fold_job, has_ended, record_queued, settled
from launcher.schedulers.slurm.submit import dump_task, preflight, submission_marker, submitted_pickle, task_template
from launcher.schedulers.ssh import remote as on_login
from launcher.schedulers.ssh.connection import Connection
from launcher.schedulers.ssh.transfer import send_tree

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


def check_upstreams(upstreams: Sequence[Any], login: Login) -> None:
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


def cluster_environ(conn: Connection, environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with HOME, USER and LOGNAME of the cluster account: what ~, $HOME and $USER
    in runs_root and checkpoint.dir stand for, as the cluster's shell would expand them."""
    home, user = on_login.home_and_user(conn)
    return {**environ, "HOME": home, "USER": user, "LOGNAME": user}


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


def on_cluster(plan: Any) -> Any:
    """The plan as the cluster runs it: from its code snapshot (the only copy of the code
    there), in the snapshot's counterpart of the working directory (else the run
    directory). ConfigError for a run without a snapshot."""
    if plan.code is None:
        raise ConfigError("a run submitted over SSH runs from its code snapshot on the cluster: leave "
                          "code.snapshot on", file=plan.experiment_file, key="code.snapshot")
    return dataclasses.replace(plan, workdir=plan.code.import_path or plan.run_dir)


def python_warning(loaded_site: Any, plan: Any) -> str | None:
    """Over SSH the nodes run this machine's interpreter path unless the profile names one
    (`python:`) or a container: said, as the cluster may have no such file."""
    if loaded_site.config.python or plan.container is not None:
        return None
    return (f"the nodes run {plan.python[0]} (this machine's interpreter, which must exist on the cluster): "
            f"set python: in {loaded_site.path} to the cluster's")


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
        data = json.loads(path.read_text(encoding="utf-8"))
        login = Login(**data["login"])
        run = data["run_dir"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RunError(f"cannot read where the run lives: {exc}", file=str(path)) from None
    if login.problems() or not isinstance(run, str) or not run.startswith("/"):
        raise RunError("names no usable login or cluster directory", file=str(path))
    return Where(login, run)


# --- submitting -------------------------------------------------------------------------


def relocated(plan: Any, local_run_dir: Path) -> Any:
    """The plan with its run directory (logs, checkpoints, code snapshot) at `local_run_dir`:
    where the bundle rendered for the cluster is written before it is sent."""
    return relocated_under(plan, plan.run_dir, str(local_run_dir))


def relocated_under(plan: Any, old: str, new: str) -> Any:
    """The plan with each of its directories under `old` (the cluster's) under `new`."""

    def moved(path: str) -> str:
        return new + path[len(old):] if path == old or path.startswith(old + "/") else path

    code = plan.code and dataclasses.replace(plan.code, dest=moved(plan.code.dest))
    return dataclasses.replace(plan, run_dir=moved(plan.run_dir), log_dir=moved(plan.log_dir),
                               checkpoint_dir=moved(plan.checkpoint_dir), code=code)


def launch(prepared: Any, *, check: bool) -> Run:
    """Write, send and queue the prepared run over its connection (closed at the end)."""
    plan, conn = prepared.plan, prepared.remote
    try:
        if bundle.checkpoint_outside(plan):
            raise prepared.checkpoint_from.error("a run submitted over SSH keeps its checkpoints in its run "
                                                 "directory on the cluster: leave checkpoint.dir out")
        records_dir().mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=records_dir()))
        try:
            job_id = _stage_send_queue(prepared, conn, staging / plan.run_id, check)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        conn.close()
    return Run(plan.run_id, records_dir() / plan.run_id, plan.site_name, False, tuple(prepared.files),
               State.PENDING.value, job_id=job_id, warnings=prepared.warnings)


def _stage_send_queue(prepared: Any, conn: Connection, local: Path, check: bool) -> str:
    plan = prepared.plan
    local_plan = relocated(plan, local)
    paths = dict(runs_root=prepared.runs_root_from, checkpoint=prepared.checkpoint_from)
    survey = bundle.check_inputs(local_plan, **paths)
    written = bundle.write_bundle(local_plan, prepared.files, dry_run=False, survey=survey, **paths)
    with registry.updating(written.path) as record:
        record.run_dir = plan.run_dir
        record.extra = moved_paths(record.extra, str(written.path), plan.run_dir)
    dump_task(plan, task_template(local_plan.log_dir))
    user = on_login.home_and_user(conn)[1]
    send_tree(conn, written.path, plan.run_dir, make_parent=True)
    client = on_login.slurm_client(conn, cwd=plan.run_dir)
    job_id = None
    try:
        with using(client):
            warnings = prepared.scheduler.check_cluster(plan) if check else []
            if check:
                preflight(plan, Path(plan.run_dir) / "job.sbatch", {})
            job_id = _sbatch_held(client, plan, user)
            _complete(conn, plan, written.path, job_id, warnings, prepared.scheduler.version())
            record_here(local, plan, job_id, Where(conn.login, plan.run_dir))
            _release(client, job_id)
    except BaseException:
        _undo(conn, client, plan, job_id)
        raise
    return job_id


def moved_paths(value: Any, old: str, new: str) -> Any:
    """`value` (run.json's parts) with each path under `old` named under `new` instead."""
    if isinstance(value, str):
        return new + value[len(old):] if value == old or value.startswith(old + "/") else value
    if isinstance(value, dict):
        return {key: moved_paths(item, old, new) for key, item in value.items()}
    if isinstance(value, list):
        return [moved_paths(item, old, new) for item in value]
    return value


def _sbatch_held(client: Any, plan: Any, user: str) -> str:
    """sbatch the run's job held; its id."""
    marker = submission_marker(plan.run_id) if "comment" not in dict(plan.extra_sbatch) else ""
    return sbatch_held(client, posixpath.join(plan.run_dir, "job.sbatch"), marker, user)


def sbatch_held(client: Any, script: str, marker: str, user: str, *, found_as: Callable[[str], str] = str) -> str:
    """sbatch `script` (a cluster path) held, with `marker` as its --comment when given; its
    job id. A lost answer is looked up by the marker or the script (`found_as`: the id to
    take from the row found: an array's own)."""
    cmd = ["sbatch", "--hold", *([f"--comment={marker}"] if marker else []), script]

    def lookup(deadline: float) -> str | None:
        found = find_submitted(script, marker, deadline=deadline, user=user)
        return found_as(found) if found else None

    output = client.submit(cmd, lookup=lookup)
    words = output.split()
    if len(words) < 4 or not words[-1].isdigit():
        raise SchedulerError(f"sbatch answered without a job id: {output.strip()[:200]}")
    return words[-1]


def _complete(conn: Connection, plan: Any, staged: Path, job_id: str, warnings: list[str],
              version: str | None) -> None:
    """On the cluster: run.json saying the job is queued, and submitit's task for it."""
    record_queued(staged, plan, job_id, warnings, version)
    on_login.write_bytes(conn, posixpath.join(plan.run_dir, "run.json"), RunDir(staged).run_file.read_bytes())
    template = str(task_template(plan.log_dir))
    on_login.run_checked(conn, ["mv", "-f", "--", template, str(submitted_pickle(plan.log_dir, job_id))],
                         "putting the job's task in place")


def record_here(staged: Path, plan: Any, job_id: str, where: Where) -> None:
    """The local record: remote.json and run.json, registered under the run's id."""
    home = records_dir() / plan.run_id
    home.mkdir()
    try:
        atomic_write_text(home / REMOTE_FILE, where.to_json())
        shutil.copyfile(RunDir(staged).run_file, RunDir(home).run_file)
        registry.register(plan.run_id, str(home))
    except BaseException:
        shutil.rmtree(home, ignore_errors=True)
        raise


def _release(client: Any, job_id: str) -> None:
    proc = client.call("scontrol", "release", job_id)
    if proc.returncode != 0:
        raise SchedulerError(f"scontrol release {job_id} failed: {(proc.stderr or proc.stdout).strip()}")


def _undo(conn: Connection, client: Any, plan: Any, job_id: str | None) -> None:
    """After a failure: cancel the held job, remove the run's directory on the cluster and
    its record here. Best effort: the first failure is the one reported."""
    home = records_dir() / plan.run_id
    if home.is_dir() and (home / REMOTE_FILE).is_file():
        registry.unregister(plan.run_id, str(home))
        shutil.rmtree(home, ignore_errors=True)
    try:
        if job_id is not None:
            client.call("scancel", job_id)
        on_login.remove_tree(conn, plan.run_dir)
    except SchedulerError:
        pass


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
    with using(on_login.slurm_client(conn)):
        live, _ = squeue_job(job_id)
    return live is not None


def queue_resume(prepared: Any, conn: Connection, aside: str, moved: Sequence[str], before: str, *,
                 check: bool) -> str:
    """The resumed run's files in place on the cluster (the files `moved` set aside in
    `aside` in the same call), its job queued held, run.json and the task put in place,
    released; the job's id. run.json here is the one to send (SUBMITTING). On failure
    before the release the job is cancelled and the previous files and run.json
    (`before`) are put back."""
    plan, here = prepared.plan, Path(prepared.run_dir)
    with tempfile.TemporaryDirectory(dir=records_dir()) as staging:
        template = task_template(Path(staging) / "logs")
        template.parent.mkdir()
        dump_task(plan, template)
        members = {**{name: (text.encode(), name in bundle.EXECUTABLE) for name, text in prepared.files.items()},
                   "run.json": (RunDir(here).run_file.read_bytes(), False),
                   posixpath.relpath(str(task_template(plan.log_dir)), plan.run_dir): (template.read_bytes(), False)}
    names = sorted({*moved, *prepared.files})
    whole = False
    client = on_login.slurm_client(conn, cwd=plan.run_dir)
    job_id = None
    try:
        on_login.set_aside(conn, plan.run_dir, aside, names, _tar(members))
        whole = True
        with using(client):
            warnings = prepared.scheduler.check_cluster(plan) if check else []
            if check:
                preflight(plan, Path(plan.run_dir) / "job.sbatch", {})
            job_id = _sbatch_held(client, plan, on_login.account(conn).user)
            _complete(conn, plan, here, job_id, warnings, prepared.scheduler.version())
            _release(client, job_id)
    except BaseException:
        _revert_resume(conn, client, plan, job_id, aside, names, whole, before)
        raise
    return job_id


def _revert_resume(conn: Connection, client: Any, plan: Any, job_id: str | None, aside: str, names: Sequence[str],
                   whole: bool, before: str) -> None:
    """`queue_resume` undone on the cluster, best effort: the job cancelled, the previous
    files and run.json back."""
    try:
        if job_id is not None:
            client.call("scancel", job_id)
        on_login.put_back(conn, plan.run_dir, aside, names, whole=whole)
        on_login.write_bytes(conn, posixpath.join(plan.run_dir, "run.json"), before.encode())
    except SchedulerError:
        pass


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
    """The run's record read from the cluster, with Slurm's view folded in."""
    where = where_of(run_dir)
    with connect(where.login) as conn:
        return refreshed_over(conn, run_dir, where)


def refreshed_over(conn: Connection, run_dir: Path, where: Where) -> RunRecord:
    data = on_login.read_bytes(conn, posixpath.join(where.run_dir, "run.json"))
    if data is None:
        raise SchedulerError(f"{where.run_dir!r} on {conn.where()} holds no run.json: the run's directory "
                             "there was moved or removed")
    atomic_write_text(RunDir(run_dir).run_file, data.decode("utf-8", errors="replace"))
    record = registry.read(run_dir)
    if not record.job_id or (record.state in ENDS and settled(record)):
        return record
    with using(on_login.slurm_client(conn)):
        live = reason = None
        if not has_ended(record):
            live, reason = squeue_job(record.job_id)
        return fold_job(run_dir, live, reason, sacct_records(record.job_id))


def cancel(run_dir: Path) -> str:
    where = where_of(run_dir)
    with connect(where.login) as conn:
        record = refreshed_over(conn, run_dir, where)
        if not record.job_id or is_terminal(record.state):
            return f"run {record.run_id}: nothing to cancel ({record.state})"
        proc = on_login.slurm_client(conn).call("scancel", record.job_id)
        if proc.returncode != 0:
            raise SchedulerError(f"scancel {record.job_id} on {conn.where()} failed: {proc.stderr.strip()}")
    return f"run {record.run_id}: cancelled job {record.job_id} on {where.login.host}"


def logs(run_dir: Path, *, rank: int | None, follow: bool, echo: Callable[[str], None], poll_s: float) -> None:
    """The run's task logs, copied from the cluster as they grow, shown as for a run here."""
    where = where_of(run_dir)
    reader = RankLogs(run_dir, rank, echo)
    with connect(where.login) as conn:
        while True:
            mirror_logs(conn, posixpath.join(where.run_dir, "logs"), RunDir(run_dir).log_dir)
            reader.poll()
            if not follow:
                reader.flush()
                return
            state = refreshed_over(conn, run_dir, where).state
            if is_terminal(state) or state == State.UNKNOWN:
                follow = False
            time.sleep(poll_s)


def mirror_logs(conn: Connection, folder: str, log_dir: Path) -> None:
    """The task logs of `folder` on the cluster into `log_dir`, in one call: only what each
    one gained since the last copy travels (all of it when it was cut shorter there), and
    is appended here, so a reader following them sees them grow."""
    log_dir.mkdir(exist_ok=True)
    have = {p.name: p.stat().st_size for p in log_dir.iterdir() if TASK_LOG.match(p.name) and p.is_file()}
    for name, offset, data in on_login.log_tails(conn, folder, have):
        if not TASK_LOG.match(name):
            continue
        if offset == have.get(name, 0):
            with open(log_dir / name, "ab") as f:
                f.write(data)
        elif offset == 0:
            with open(log_dir / name, "wb") as f:
                f.write(data)


# --- following a sweep --------------------------------------------------------------------------


def sweep_element_records(sweep_dir: Path) -> dict[str, RunRecord | GlaunchError]:
    """Every element's record read from the cluster in one call, Slurm's view of those in
    flight folded in with one squeue and one sacct there."""
    where = where_of(sweep_dir)
    sweep = sweeps.read(sweep_dir)
    with connect(where.login) as conn:
        names = {e.run_id: posixpath.join(posixpath.relpath(where_of(Path(e.run_dir)).run_dir,
                                                            where.run_dir), "run.json")
                 for e in sweep.elements}
        _mirror_records(on_login.pack_files(conn, where.run_dir, list(names.values())), names, sweep)
        with using(on_login.slurm_client(conn)):
            return sweeps.element_records(sweep_dir, _refresh_many)


def _mirror_records(stream: bytes, names: dict[str, str], sweep: Any) -> None:
    """The run.json files of a tar stream into the elements' folders here."""
    wanted = {name: Path(e.run_dir) for e in sweep.elements if (name := names.get(e.run_id))}
    if not stream:
        return
    with tarfile.open(fileobj=io.BytesIO(stream), mode="r:") as tar:
        for member in tar:
            target = wanted.get(posixpath.normpath(member.name))
            data = tar.extractfile(member) if member.isreg() and target is not None else None
            if data is not None and target is not None:
                atomic_write_text(RunDir(target).run_file, data.read().decode("utf-8", errors="replace"))


def _refresh_many(runs: list[tuple[Path, RunRecord]]) -> list[RunRecord]:
    """Slurm's view folded into the records that it may still add to (as `refreshed_over`)."""
    from launcher import schedulers

    def asks(record: RunRecord) -> bool:
        return bool(record.job_id) and not (record.state in ENDS and settled(record))

    asked = [(d, r) for d, r in runs if asks(r)]
    fresh = iter(schedulers.get("slurm").refresh_many(asked) if asked else [])
    return [next(fresh) if asks(r) else r for _, r in runs]


def cancel_sweep(sweep_dir: Path) -> str:
    """scancel the sweep's arrays on the cluster."""
    where = where_of(sweep_dir)
    sweep = sweeps.read(sweep_dir)
    arrays = [a.job_id for a in sweep.arrays if a.job_id]
    if not arrays:
        return f"sweep {sweep.sweep_id}: nothing to cancel"
    with connect(where.login) as conn:
        proc = on_login.slurm_client(conn).call("scancel", *arrays)
        if proc.returncode != 0:
            raise SchedulerError(f"scancel {' '.join(arrays)} on {conn.where()} failed: {proc.stderr.strip()}")
    return f"sweep {sweep.sweep_id}: cancelled array job(s) {', '.join(arrays)} on {where.login.host}"


def mirror_sweep_logs(sweep_dir: Path) -> None:
    """Every element's task logs copied from the cluster (one call per element)."""
    where = where_of(sweep_dir)
    with connect(where.login) as conn:
        for element in sweeps.read(sweep_dir).elements:
            there = where_of(Path(element.run_dir)).run_dir
            mirror_logs(conn, posixpath.join(there, "logs"), RunDir(element.run_dir).log_dir)
