"""The run registry: run.json in each run directory, read and updated under a lock, and
an index of run directories (runs.jsonl in the state directory) so `glaunch status RUN`
finds a run by its id from anywhere.

Both may be damaged or edited by hand: a record that does not read back is a RunError
naming the file and the field; a bad line of the index is skipped and reported."""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from launcher.errors import ConfigError, GlaunchError, RunError
from launcher.rundir.envnames import STATE_DIR
from launcher.rundir.files import (
    read_record,
    exclusive_lock,
    atomic_write_text,
    directory_problem,
    open_regular,
    read_text,
)
from launcher.rundir.layout import RunDir
from launcher.rundir.records import CANCEL_REQUESTED, RunRecord, StartRecord, State, is_job_id

INDEX_FILE = "runs.jsonl"
# One line of the index is ~200 bytes; a longer one is not glaunch's.
MAX_INDEX_LINE = 64 * 1024


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).astimezone().isoformat(timespec="seconds")


def new_run_id(name: str) -> str:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    # os.urandom, not the secrets module: that one imports hmac and hashlib for each command.
    return f"{name}-{stamp}-{os.urandom(2).hex()}"


# --- the state directory -------------------------------------------------------------------


def state_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """$GLAUNCH_STATE_DIR, else $XDG_STATE_HOME/glaunch (when absolute, as the XDG spec
    asks), else ~/.local/state/glaunch from $HOME or, without it, the user's passwd entry.
    Never a shared default such as /tmp, where another user could create it first."""
    if environ.get(STATE_DIR):
        return Path(environ[STATE_DIR])
    xdg = environ.get("XDG_STATE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg) / "glaunch"
    home: str | None = environ.get("HOME", "")
    if not os.path.isabs(home or ""):
        home = _passwd_home()
    if not home:
        raise ConfigError("glaunch's state directory: HOME is not an absolute path and this user's passwd entry "
                          f"gives no home directory; set {STATE_DIR} (or HOME) to a directory of yours",
                          file="environment", key=STATE_DIR)
    return Path(home) / ".local" / "state" / "glaunch"


def _passwd_home() -> str | None:
    import pwd

    try:
        home = pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:               # a uid with no passwd entry (a container run as an arbitrary uid)
        return None
    return home if os.path.isabs(home) else None


def state_dir_error(problem: str, environ: Mapping[str, str] = os.environ) -> ConfigError:
    """The state directory is unusable: blamed on the variable that chose it."""
    directory = state_dir(environ)
    for key in (STATE_DIR, "XDG_STATE_HOME", "HOME"):
        value = environ.get(key, "")
        if value and (key == STATE_DIR or os.path.isabs(value)):
            return ConfigError(f"glaunch's state directory {directory}: {problem}", file="environment", key=key)
    return ConfigError(f"glaunch's state directory {directory}: {problem} (set {STATE_DIR})",
                       file="environment", key=STATE_DIR)


def check_state_dir(environ: Mapping[str, str] = os.environ) -> None:
    """ConfigError unless the state directory can be created and the index appended to.
    Looks only: creates nothing."""
    directory = state_dir(environ)
    problem = directory_problem(directory)
    if problem is None and directory.is_dir():
        index = directory / INDEX_FILE
        if os.path.lexists(index) and not index.is_file():
            problem = f"{index} is not a regular file"
        elif index.exists() and not os.access(index, os.W_OK):
            problem = f"{index} is not writable"
    if problem:
        raise state_dir_error(problem, environ)


def state_file(name: str, environ: Mapping[str, str] = os.environ) -> int:
    """A descriptor (read/write, created if missing) of a file in the state directory;
    ConfigError blaming the variable that chose the directory when it cannot be opened."""
    directory = state_dir(environ)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        return open_regular(directory / name, os.O_RDWR | os.O_CREAT | os.O_APPEND)
    except OSError as exc:
        raise state_dir_error(exc.strerror or str(exc), environ) from None


def _index_path(environ: Mapping[str, str] = os.environ) -> Path:
    return state_dir(environ) / INDEX_FILE


# --- the index -----------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexReport:
    """The usable entries of the index, and what was wrong with the others."""

    entries: list[dict[str, str]]
    bad_lines: list[str]          # "LINE_NUMBER: what is wrong"
    path: Path


def register(run_id: str, run_dir: str) -> None:
    line = json.dumps({"run_id": run_id, "run_dir": run_dir}) + "\n"
    fd = state_file(INDEX_FILE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, line.encode())
    except OSError as exc:
        raise state_dir_error(f"cannot add to {INDEX_FILE}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def unregister(run_id: str, run_dir: str) -> None:
    """Take back what `register` added (a launch that failed and removed its run directory)."""
    path = _index_path()
    try:
        fd = open_regular(path, os.O_RDWR)
    except OSError:
        return
    with os.fdopen(fd, "r+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        lines = f.read().splitlines(keepends=True)
        kept = [line for line in lines if _entry_of(line) != {"run_id": run_id, "run_dir": run_dir}]
        if len(kept) != len(lines):
            f.seek(0)
            f.truncate()
            f.write(b"".join(kept))


def _entry_of(line: bytes) -> dict[str, Any] | None:
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return entry if isinstance(entry, dict) else None


def _check_entry(line: bytes) -> tuple[dict[str, str] | None, str | None]:
    """(entry, None) for a usable index line, (None, what is wrong) otherwise."""
    if len(line) > MAX_INDEX_LINE:
        return None, f"longer than {MAX_INDEX_LINE} bytes"
    try:
        entry = json.loads(line)
    except RecursionError:
        return None, "not JSON: nested too deeply"
    except ValueError:
        return None, "not JSON"
    if not isinstance(entry, dict):
        return None, "not a JSON object"
    run_id, run_dir = entry.get("run_id"), entry.get("run_dir")
    if not isinstance(run_dir, str) or not run_dir or "\0" in run_dir:
        return None, "no run_dir path"
    if not isinstance(run_id, str) or not run_id:
        return None, "no run_id"
    return {"run_id": run_id, "run_dir": run_dir}, None


def read_index() -> IndexReport:
    """Every line of the index, checked. ConfigError when the index is there but cannot be
    read at all (not a regular file, unreadable)."""
    path = _index_path()
    entries: list[dict[str, str]] = []
    bad: list[str] = []
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return IndexReport(entries, bad, path)
    except NotADirectoryError:
        raise state_dir_error("not a directory") from None
    except OSError as exc:
        raise state_dir_error(f"cannot read {INDEX_FILE}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        number = 0
        while True:
            line = f.readline(MAX_INDEX_LINE + 1)
            if not line:
                break
            number += 1
            if len(line) > MAX_INDEX_LINE and not line.endswith(b"\n"):
                while (rest := f.readline(MAX_INDEX_LINE)) and not rest.endswith(b"\n"):
                    pass
            if not line.strip():
                continue
            entry, problem = _check_entry(line)
            if entry is None:
                bad.append(f"{number}: {problem}")
            else:
                entries.append(entry)
    return IndexReport(entries, bad, path)


def indexed_runs() -> list[dict[str, str]]:
    """The usable entries of the index, oldest first."""
    return read_index().entries


def find_run(ref: str) -> Path:
    """A run id or a run directory -> the run directory. ConfigError (bad input, exit 2)
    when it names no run: exit 1 says a run failed."""
    try:
        candidate = Path(ref).expanduser()
        if _has_record(candidate):
            return candidate.resolve()
    except RuntimeError as exc:         # ~user unknown, a symlink loop
        raise ConfigError(f"no run {ref!r}: {exc}", file="command line", key="RUN") from None
    other_runs: RunError | None = None
    for entry in reversed(indexed_runs()):
        if entry["run_id"] == ref and _has_record(Path(entry["run_dir"])):
            other_runs = _another_run(Path(entry["run_dir"]), ref)
            if other_runs is None:
                return Path(entry["run_dir"])
    local = Path("runs") / ref
    if _has_record(local):
        return local.resolve()
    if other_runs is not None:
        raise other_runs
    raise ConfigError(f"no run {ref!r}: not a run directory and not a known run id (`glaunch list` shows runs)",
                      file="command line", key="RUN")


def _another_run(run_dir: Path, run_id: str) -> RunError | None:
    """The error to raise when run.json in `run_dir`, which the index lists as run `run_id`,
    is another run's record (the directory reused, the record copied or linked from another
    run): no command acts on one run for another. None when it is run `run_id`'s, or cannot
    be read (the command reading it says what is wrong)."""
    try:
        recorded = read(run_dir).run_id
    except GlaunchError:
        return None
    if recorded == run_id:
        return None
    return RunError(f"damaged run record: the record of run {recorded}, not of run {run_id} as the run index "
                    "says (a run directory reused, or a record copied or linked from another run)",
                    file=str(RunDir(run_dir).run_file), key="run_id")


def _has_record(run_dir: Path) -> bool:
    try:
        return os.path.lexists(RunDir(run_dir).run_file)
    except (OSError, ValueError):
        return False


# --- run.json ------------------------------------------------------------------------------


def read(run_dir: str | os.PathLike[str]) -> RunRecord:
    """run.json; RunError naming the file and what is wrong when it cannot be read back."""
    return read_record(RunDir(run_dir).run_file, RunRecord.from_dict, "run record")


def write(run_dir: str | os.PathLike[str], record: RunRecord) -> None:
    path = RunDir(run_dir).run_file
    try:
        atomic_write_text(path, json.dumps(record.to_dict(), indent=2) + "\n")
    except OSError as exc:
        raise RunError(f"cannot write the run record: {exc.strerror or exc}", file=str(path)) from None


@contextlib.contextmanager
def updating(run_dir: str | os.PathLike[str]) -> Iterator[RunRecord]:
    """Read-modify-write run.json under a lock (the job and the CLI both update it)."""
    with exclusive_lock(RunDir(run_dir).lock_file, "run record"):
        record = read(run_dir)
        yield record
        write(run_dir, record)


# The most job ids a run's cancel file is read for (a cancel appends one or two).
MAX_CANCELS = 4096


def request_cancel(run_dir: str | os.PathLike[str], job_id: str) -> None:
    """Say in the run's cancel file that `glaunch cancel` asked job `job_id` to end (the
    job controller then ends its start as cancelled). Called under run.json's lock where it
    can be taken (`updating`), so a job resubmitting the run sees the mark or is seen."""
    if not is_job_id(job_id):
        raise RunError(f"{job_id!r} is not a job id", file=str(RunDir(run_dir).cancel_file))
    fd = open_regular(RunDir(run_dir).cancel_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(f"{job_id}\n")


def cancel_asked(run_dir: str | os.PathLike[str], record: RunRecord, job_id: str | None) -> bool:
    """Whether `glaunch cancel` asked job `job_id` of the run to end: named in its cancel
    file, or (a record written before the file) run.json's mark."""
    if job_id is None:
        return False
    if record.extra.get(CANCEL_REQUESTED) == job_id:
        return True
    try:
        lines = read_text(RunDir(run_dir).cancel_file, limit=MAX_CANCELS * 32).splitlines()
    except (OSError, ValueError):
        return False
    return job_id in {line.strip() for line in lines}


def new_start(job_id: str, restart: int, **values: Any) -> StartRecord:
    start = StartRecord(job_id=str(job_id), restart=restart, submitted=now(), state=State.PENDING.value)
    start.update(**values)
    return start
