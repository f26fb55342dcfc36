"""How the runner reaches a run once it was submitted: the road it goes by, chosen from
its record here (`road_to`), and asked for everything the runner does with it: its record
refreshed, its logs read (copied as they grow), its job or its sweep's cancelled, its
resume prepared and launched. The direct road (launcher.runner.direct) reads and asks
this machine; the SSH road (`OverSSH`) asks the cluster a Slurm profile's `login:` names
(launcher.runner.remote behind it), for a run whose record here holds remote.json. A
submission's road, which also renders and sends it, is launcher.runner.submission_road.
The SSH code is imported only where the SSH road is taken."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence, TypeAlias

from launcher.config.login import Login
from launcher.errors import ConfigError, GlaunchError, RunError, SchedulerError
from launcher.rundir import registry
from launcher.rundir.layout import REMOTE_FILE, RunDir
from launcher.rundir.records import RunRecord
from launcher.runner.direct import DIRECT, Direct, NotRefreshed
from launcher.runner.inputs import items
from launcher.runner.results import Run

if TYPE_CHECKING:
    from launcher.runner.prepared import PreparedResume
    from launcher.schedulers.slurm.client import Client
    from launcher.schedulers.ssh.connection import Connection

Text = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class OverSSH:
    """The SSH road. A run's (`road_to`) names no login: each of its methods reads where the
    run lives from its record here (remote.json). A resume's, or a submission's
    (launcher.runner.submission_road): `login`, the login node it goes through, and `conn`,
    the open connection to it (None for a dry run)."""

    login: Login | None = None
    conn: Connection | None = None

    # --- following a run or sweep ---------------------------------------------------------

    def refreshed(self, run_dir: Path) -> RunRecord:
        """The record read from the cluster, Slurm asked there; NotRefreshed as on the
        direct road when the cluster cannot be asked."""
        from launcher.runner import remote

        try:
            return remote.refreshed(run_dir)
        except SchedulerError as exc:
            raise NotRefreshed(exc, registry.read(run_dir)) from None

    def sweep_records(self, sweep_dir: Path) -> dict[str, RunRecord | GlaunchError]:
        from launcher.runner import remote

        return remote.sweep_element_records(sweep_dir)

    @contextlib.contextmanager
    def held(self, run_dir: Path) -> Iterator[None]:
        """The run's (or sweep's) connection kept open across the polls of the block (one
        connection per command)."""
        from launcher.runner import remote

        with remote.connect(remote.where_of(run_dir).login):
            yield

    def logs(self, run_dir: Path, *, rank: int | None, follow: bool, echo: Text, poll_s: float) -> None:
        from launcher.runner import remote

        remote.logs(run_dir, rank=rank, follow=follow, echo=echo, poll_s=poll_s)

    def mirror_sweep_logs(self, sweep_dir: Path) -> None:
        from launcher.runner import remote

        remote.mirror_sweep_logs(sweep_dir)

    def cancel(self, run_dir: Path) -> str:
        from launcher.runner import remote

        return remote.cancel(run_dir)

    def cancel_sweep(self, sweep_dir: Path) -> str:
        from launcher.runner import remote

        return remote.cancel_sweep(sweep_dir)

    def prepare_resume(self, run_dir: Path, overrides: Sequence[str], dry_run: bool,
                       here: Callable[[Path, Sequence[str], bool], PreparedResume]) -> PreparedResume:
        """Its record and resolved.yaml read from the cluster, resolved with the cluster
        account's HOME and USER, its directories checked there. The connection stays
        open for the launch."""
        from launcher.runner import remote

        overrides = items(overrides, "overrides")
        where = remote.where_of(run_dir)
        conn = remote.connect(where.login)
        try:
            return remote.prepare_resume(run_dir, overrides, dry_run, where, conn, OverSSH(where.login, conn))
        except BaseException:
            conn.close()
            raise

    def launch_resume(self, prepared: PreparedResume, *, check: bool,
                      here: Callable[[PreparedResume], Run]) -> Run:
        from launcher.runner import remote

        if self.conn is None:
            raise ConfigError("a resume is sent over the connection it was prepared with: prepare it again",
                              file="command line", key="RUN")
        return remote.launch_resume(prepared, self.conn, check=check)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


RunRoad: TypeAlias = "Direct | OverSSH"


def road_to(run_dir: Path) -> RunRoad:
    """The road of the run (or sweep) kept in `run_dir`: over SSH when its record here is
    that of a run living on a cluster (it holds remote.json), else the direct one. RunError
    when run.json names the other transport: a record that lost (or gained) its remote.json
    is never followed on the wrong road, where a job id of one cluster is another's job."""
    record = _record_of(run_dir)
    over_ssh = check_road(run_dir, record) if record is not None else (Path(run_dir) / REMOTE_FILE).is_file()
    return OverSSH() if over_ssh else DIRECT


def check_road(run_dir: Path, record: RunRecord) -> bool:
    """Whether the record here is that of a run reached over SSH (it holds remote.json);
    RunError (naming run.json's transport) when `record`, run.json of `run_dir`, names the
    other transport (`transport_mismatch`)."""
    over_ssh = (Path(run_dir) / REMOTE_FILE).is_file()
    problem = transport_mismatch(record.transport, over_ssh, elsewhere=_lives_elsewhere(run_dir, record))
    if problem is not None:
        raise RunError(f"{problem}; the record here is not followed", file=str(RunDir(run_dir).run_file),
                       key="transport")
    return over_ssh


def _record_of(run_dir: Path) -> RunRecord | None:
    """run.json, None where there is none (a sweep's folder) or it cannot be read (the
    command that reads it says so)."""
    if not RunDir(run_dir).run_file.is_file():
        return None
    try:
        return registry.read(run_dir)
    except GlaunchError:
        return None


def _lives_elsewhere(run_dir: Path, record: RunRecord) -> bool:
    """Whether run.json names another directory than the one holding it (a copy here of a
    record kept on a cluster)."""
    try:
        return record.run_dir is None or Path(record.run_dir).resolve() != Path(run_dir).resolve()
    except (OSError, RuntimeError, ValueError):
        return True


def transport_mismatch(recorded: str | None, over_ssh: bool, *, elsewhere: bool) -> str | None:
    """Pure: why run.json's transport (`recorded`; None in a record older than it) and the
    record's remote.json (`over_ssh`: present) disagree, or None. A run whose record is its
    own directory (not `elsewhere`) was submitted where Slurm answers, whatever an older
    glaunch recorded (`ssh://` for any profile with a login)."""
    if recorded is None:
        return None
    if recorded.startswith("ssh://") and not over_ssh and elsewhere:
        return f"the run was submitted over SSH ({recorded}), but its record here has no {REMOTE_FILE}"
    if not recorded.startswith("ssh://") and over_ssh:
        return f"the run's commands ran here (transport {recorded}), but its record here holds {REMOTE_FILE}"
    return None


def _followed_over_ssh(run_dir: Path) -> bool:
    """Whether the run's road is SSH; False for a record whose road cannot be chosen (its
    own row says why: launcher.runner.recent)."""
    try:
        return isinstance(road_to(run_dir), OverSSH)
    except GlaunchError:
        return False


def refresh_copies(run_dirs: Sequence[Path]) -> tuple[bool, dict[str, str]]:
    """The records here of the runs of `run_dirs` kept on a cluster reached over SSH (their
    job writes run.json there, not here) copied from there, Slurm's view folded in; whether
    there were any, and those (of `run_dirs`, as given) whose login did not answer, each
    with why (their records here stay as last recorded)."""
    kept = [run_dir for run_dir in run_dirs if _followed_over_ssh(run_dir)]
    if not kept:
        return False, {}
    from launcher.runner import remote

    return True, remote.refresh_copies(kept)


@contextlib.contextmanager
def slurm_answering(login: Login | None, *, always: bool = False) -> Iterator[tuple[Client, str | None]]:
    """The client that runs Slurm's commands within the block: on `login` over one SSH
    connection when the SSH road is taken (`always`: whenever there is a login), else this
    machine's. Yields it with the login as a message names it, or None for this machine."""
    from launcher.schedulers.slurm.client import CLIENT

    if login is None:
        yield CLIENT, None
        return
    from launcher.runner import remote

    if not (always or remote.goes_remote(login, "slurm")):
        yield CLIENT, None
        return
    from launcher.schedulers.ssh import on_login

    with remote.connect(login) as conn:
        yield on_login.slurm_client(conn), login.shown
