"""What a submission over SSH did on the cluster, and its one undo.

A run's, a sweep's and a resume's submission each fill an `OnCluster` as they go: the
directory they placed there, the files a resume set aside, each sbatch asked (its answer
may be lost with the link) and the job it queued held. After a failure, `undo` takes it
back in reverse: the held jobs cancelled (a job whose answer was lost looked up by its
marker or script first), a resume's previous files and run.json put back, the placed
directory removed. What it could not undo (the link dropped) comes back as an `OnCluster`
of what is left: the exit-3 message names it (`said`), the record here keeps it
(left.json, `write_left`/`read_left`, checked against the run's own directory on the
cluster before use), and `glaunch cancel` runs the same undo once the cluster answers.
A run's submission journals its OnCluster there as it goes (`Journal`, under the lock of
`submitting`), so that what a process stopped midway left is named too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import posixpath
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, NoReturn

from launcher.errors import SchedulerError
from launcher.rundir import registry
from launcher.rundir.files import atomic_write_text, exclusive_lock, load_bounded_object, lock_held
from launcher.schedulers.slurm.array import array_job_id
from launcher.schedulers.slurm.client import Client
from launcher.schedulers.slurm.queries import find_submitted
from launcher.schedulers.slurm.submit import cancel_held, submission_marker
from launcher.schedulers.ssh import on_login
from launcher.schedulers.ssh.connection import Connection

# The record here of a submission that left something on the cluster, or of one under way.
LEFT_FILE = "left.json"
# Locked by the process submitting the run of a record here, while it does.
SUBMITTING_LOCK = ".submitting.lock"


@dataclass(frozen=True)
class Held:
    """A job asked of sbatch, held: `job_id` once its answer came (None: the answer was
    lost, and the job, if queued, is found by `marker` or `script`); `array`: a sweep's
    array, whose squeue id names a task."""

    script: str
    marker: str
    job_id: str | None = None
    array: bool = False


@dataclass(frozen=True)
class SetAside:
    """A resume's previous files (`names`) moved into `aside` (relative to `run_dir`);
    `whole`: the move completed; `record`: run.json as it was before; `added`: files the
    resume put there beside them (its submitit task, until the release takes it)."""

    run_dir: str
    aside: str
    names: tuple[str, ...]
    whole: bool
    record: str
    added: tuple[str, ...] = ()


@dataclass
class OnCluster:
    """What a submission has done on the cluster (or, from `undo`, what is left of it).
    `journal`, when given, is told of each change before the cluster is asked to make it
    (the record here keeps it: launcher.runner.remote)."""

    placed: str | None = None
    set_aside: SetAside | None = None
    held: list[Held] = field(default_factory=list)
    journal: Callable[[OnCluster], None] | None = field(default=None, repr=False, compare=False)

    def place(self, folder: str) -> None:
        """`folder` is about to be sent to the cluster."""
        self.placed = folder
        self._journal()

    def put_aside(self, aside: SetAside) -> None:
        """A resume's previous files are about to be set aside (`aside.whole`: they were)."""
        self.set_aside = aside
        self._journal()

    def asked(self, script: str, marker: str, *, array: bool = False) -> int:
        """sbatch is about to be asked for a held job: its place in `held`."""
        self.held.append(Held(script, marker, array=array))
        self._journal()
        return len(self.held) - 1

    def answered(self, index: int, job_id: str) -> None:
        self.held[index] = dataclasses.replace(self.held[index], job_id=job_id)
        self._journal()

    def _journal(self) -> None:
        if self.journal is not None:
            self.journal(self)

    def as_dict(self) -> dict[str, Any]:
        return {"placed": self.placed, "set_aside": dataclasses.asdict(self.set_aside) if self.set_aside else None,
                "held": [dataclasses.asdict(h) for h in self.held]}

    def is_empty(self) -> bool:
        return self.placed is None and self.set_aside is None and not self.held

    def said(self, name: str, host: str) -> str:
        """The exit-3 message's part: what is left on `host`, and the command that removes it."""
        parts = []
        jobs = [h.job_id for h in self.held if h.job_id]
        if jobs:
            parts.append(f"held job{'s' if len(jobs) > 1 else ''} {', '.join(jobs)}")
        if any(h.job_id is None for h in self.held):
            parts.append("a held job it may have queued")
        if self.set_aside is not None:
            parts.append(f"the previous files of {self.set_aside.run_dir} set aside in "
                         f"{posixpath.join(self.set_aside.run_dir, self.set_aside.aside)}")
        if self.placed is not None:
            parts.append(f"the directory {self.placed}")
        undoes = "undoes them" if self.set_aside is not None and self.placed is None else "removes them"
        return f"left on {host}: {' and '.join(parts)} (glaunch cancel {name} {undoes} once {host} answers)"

    def to_json(self) -> str:
        return json.dumps(self.as_dict())


def undo(conn: Connection, client: Client, done: OnCluster) -> OnCluster | None:
    """`done` taken back on the cluster in reverse, each step tried: the held jobs
    cancelled, a resume's files put back, the placed directory removed. What is left, None
    when nothing is. A held job still queued after a failed scancel stays left; its
    directory is not removed under it."""
    left = OnCluster()
    for held in done.held:
        still = _cancel(conn, client, held)
        if still is not None:
            left.held.append(still)
    if done.set_aside is not None:
        try:
            _put_back(conn, done.set_aside)
        except SchedulerError:
            left.set_aside = done.set_aside
    if done.placed is not None and (left.held or not _removed(conn, done.placed)):
        left.placed = done.placed       # never removed under a job still queued from it
    return None if left.is_empty() else left


def undo_after(exc: BaseException, conn: Connection, client: Client, done: OnCluster, name: str,
               keep: Callable[[OnCluster, str], None], clean: Callable[[], None] = lambda: None) -> NoReturn:
    """After `exc` ended the submission of `name`: `done` undone, and `exc` raised again.
    What the cluster could not be asked to undo is kept by `keep(left, said)` (the record
    here) and named in the error (a SchedulerError's message gets `said` appended); when
    nothing is left, `clean()` (the record here of a submission journaled there goes)."""
    left = undo(conn, client, done)
    if left is None:
        clean()
        raise exc
    said = left.said(name, conn.login.host)
    keep(left, said)
    if isinstance(exc, SchedulerError):
        raise SchedulerError(f"{exc.message}; {said}") from None
    raise exc


def _cancel(conn: Connection, client: Client, held: Held) -> Held | None:
    """The held job cancelled (looked up first when its answer was lost): None once it is
    gone or was never queued, else what is left of it."""
    job_id = held.job_id
    if job_id is None:
        try:
            found = find_submitted(client, held.script, held.marker, user=on_login.account(conn).user)
        except SchedulerError:
            return held
        if found is None:
            return None
        job_id = array_job_id(found) if held.array else found
    return None if cancel_held(client, job_id) else dataclasses.replace(held, job_id=job_id)


def _removed(conn: Connection, folder: str) -> bool:
    try:
        on_login.remove_tree(conn, folder)
    except SchedulerError:
        return False
    return True


def _put_back(conn: Connection, aside: SetAside) -> None:
    on_login.put_back(conn, aside.run_dir, aside.aside, aside.names, whole=aside.whole)
    on_login.write_bytes(conn, posixpath.join(aside.run_dir, "run.json"), aside.record.encode())
    if aside.added:
        on_login.run_checked(conn, ["rm", "-f", "--", *(posixpath.join(aside.run_dir, n) for n in aside.added)],
                             f"removing what a resume added to {aside.run_dir!r}")


# --- the record here ----------------------------------------------------------------------


def forget_here(home: Path) -> None:
    """The record here of a submission undone: every run registered under `home` (a run,
    or a sweep and its elements) unregistered, the folder removed."""
    for entry in registry.indexed_runs():
        if entry["run_dir"] == str(home) or str(entry["run_dir"]).startswith(str(home) + "/"):
            registry.unregister(entry["run_id"], entry["run_dir"])
    shutil.rmtree(home, ignore_errors=True)


def write_left(home: Path, left: OnCluster, *, forget: bool, submitting: bool = False,
               releasing: str | None = None) -> None:
    """left.json in the record `home`; `forget`: the record itself goes once it is cleaned
    (a submission that never queued), else it stays (a resume's run). `submitting`: the
    journal of a submission under way (what it has done so far); `releasing`: the held job
    whose release it has asked for."""
    more: dict[str, Any] = {"submitting": {"releasing": releasing}} if submitting else {}
    atomic_write_text(home / LEFT_FILE, json.dumps({**left.as_dict(), "forget": forget, **more}))


@dataclass(frozen=True)
class Journal:
    """What keeps a submission's OnCluster in its record `home` as it goes (left.json,
    `write_left`): told of each change (called with it), then of the release asked for.
    `forget`: the record goes once what is left is cleaned (a run or sweep submitted), else
    it stays (a resumed run's)."""

    home: Path
    forget: bool = True

    def __call__(self, done: OnCluster) -> None:
        write_left(self.home, done, forget=self.forget, submitting=True)

    def releasing(self, done: OnCluster, job_id: str) -> None:
        """The release of the held job `job_id` is about to be asked."""
        write_left(self.home, done, forget=self.forget, submitting=True, releasing=job_id)

    def keep(self, left: OnCluster) -> None:
        """The submission ended leaving `left` on the cluster: what `cancel` removes."""
        write_left(self.home, left, forget=self.forget)


def submitting(home: Path) -> contextlib.AbstractContextManager[None]:
    """Held by the process that submits the run of the record `home`, for as long as it
    does (`under_way`). The system lets go of it when that process ends, however it ends."""
    return exclusive_lock(home / SUBMITTING_LOCK, "record of the run being submitted")


def under_way(home: Path) -> bool:
    """Whether a live process still submits the run of the record `home` (`submitting`)."""
    return lock_held(home / SUBMITTING_LOCK)


@dataclass(frozen=True)
class Left:
    """left.json read back: what is left on the cluster, and whether the record here goes
    once it is cleaned. `submitting`: the journal of a submission not finished (its process
    may still run: `under_way`), `releasing` the held job whose release it asked for."""

    on_cluster: OnCluster
    forget: bool
    submitting: bool = False
    releasing: str | None = None


def read_left(home: Path, run_id: str, cluster_dir: str) -> Left | None:
    """left.json of the record `home`, None when it has none. Only what belongs to the run
    `run_id` living in `cluster_dir` is taken: a path elsewhere, a job id not of Slurm's
    shape or a name reaching out of the run's directory is dropped."""
    try:
        data = load_bounded_object(home / LEFT_FILE)
    except OSError:
        return None
    except ValueError:
        # Damaged: nothing in it is trusted to name what to remove; the run's marked job is
        # cancelled, and its directory and record stay.
        return Left(OnCluster(held=[_marked(run_id, cluster_dir, None)]), False)
    if "forget" not in data:
        return Left(_earlier_form(data, run_id, cluster_dir), True)
    placed = cluster_dir if data.get("placed") == cluster_dir else None
    held = [h for h in (_held(item, cluster_dir) for item in _list(data.get("held"))) if h is not None]
    aside = _set_aside(data.get("set_aside"), cluster_dir)
    journal = data.get("submitting")
    releasing = journal.get("releasing") if isinstance(journal, dict) else None
    return Left(OnCluster(placed, aside, held), data.get("forget") is not False, isinstance(journal, dict),
                releasing if _is_job_id(releasing) and any(h.job_id == releasing for h in held) else None)


def _earlier_form(data: Mapping[str, Any], run_id: str, cluster_dir: str) -> OnCluster:
    """left.json as a run's submission wrote it before sweeps and resumes kept one too:
    job_id, run_dir, maybe_queued."""
    job_id = data.get("job_id")
    placed = cluster_dir if data.get("run_dir") == cluster_dir else None
    return OnCluster(placed, None, [_marked(run_id, cluster_dir, job_id if _is_job_id(job_id) else None)])


def _marked(run_id: str, cluster_dir: str, job_id: str | None) -> Held:
    """The held job of run `run_id`: its job script in `cluster_dir`, its marker."""
    return Held(posixpath.join(cluster_dir, "job.sbatch"), submission_marker(run_id), job_id)


def _is_job_id(value: Any) -> bool:
    return isinstance(value, str) and value.isdigit()


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _within(path: Any, folder: str) -> bool:
    return isinstance(path, str) and posixpath.normpath(path) == path and path.startswith(folder + "/")


def _held(item: Any, cluster_dir: str) -> Held | None:
    if not isinstance(item, dict) or not _within(item.get("script"), cluster_dir):
        return None
    marker, job_id = item.get("marker"), item.get("job_id")
    if not isinstance(marker, str) or (job_id is not None and not _is_job_id(job_id)):
        return None
    return Held(item["script"], marker, job_id, item.get("array") is True)


def _set_aside(item: Any, cluster_dir: str) -> SetAside | None:
    if not isinstance(item, dict) or item.get("run_dir") != cluster_dir:
        return None
    aside, names, record = item.get("aside"), _list(item.get("names")), item.get("record")
    added = _list(item.get("added"))
    if not (isinstance(aside, str) and _relative(aside) and all(_relative(n) for n in [*names, *added])
            and isinstance(record, str)):
        return None
    return SetAside(cluster_dir, aside, tuple(names), item.get("whole") is True, record, tuple(added))


def _relative(name: Any) -> bool:
    return (isinstance(name, str) and bool(name) and not name.startswith("/")
            and ".." not in name.split("/") and posixpath.normpath(name) == name)
