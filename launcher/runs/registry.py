"""The run registry: run.json in each run directory, read and updated under a lock, and
an index of run directories so `glaunch status RUN` finds a run by its id from anywhere."""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import secrets
from pathlib import Path
from typing import Iterator, Mapping

from ..errors import RunError
from .files import atomic_write_text
from .layout import RunDir, RunRecord, StartRecord, State


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).astimezone().isoformat(timespec="seconds")


def new_run_id(name: str) -> str:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{name}-{stamp}-{secrets.token_hex(2)}"


def state_dir(environ: Mapping[str, str] = os.environ) -> Path:
    if environ.get("GLAUNCH_STATE_DIR"):
        return Path(environ["GLAUNCH_STATE_DIR"])
    base = environ.get("XDG_STATE_HOME") or os.path.join(environ.get("HOME", "/tmp"), ".local", "state")
    return Path(base) / "glaunch"


def _index_path(environ: Mapping[str, str] = os.environ) -> Path:
    return state_dir(environ) / "runs.jsonl"


def register(run_id: str, run_dir: str) -> None:
    path = _index_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps({"run_id": run_id, "run_dir": run_dir}) + "\n")


def indexed_runs() -> list[dict[str, str]]:
    path = _index_path()
    if not path.exists():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and "run_dir" in entry:
            entries.append(entry)
    return entries


def find_run(ref: str) -> Path:
    """A run id or a run directory -> the run directory."""
    candidate = Path(ref).expanduser()
    if RunDir(candidate).run_file.is_file():
        return candidate.resolve()
    for entry in reversed(indexed_runs()):
        if entry.get("run_id") == ref and RunDir(entry["run_dir"]).run_file.is_file():
            return Path(entry["run_dir"])
    local = Path("runs") / ref
    if RunDir(local).run_file.is_file():
        return local.resolve()
    raise RunError(f"no run {ref!r}: not a run directory and not a known run id (`glaunch list` shows runs)")


def read(run_dir: str | os.PathLike) -> RunRecord:
    path = RunDir(run_dir).run_file
    try:
        return RunRecord.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError) as exc:
        raise RunError(f"cannot read {path}: {exc}") from None


def write(run_dir: str | os.PathLike, record: RunRecord) -> None:
    atomic_write_text(RunDir(run_dir).run_file, json.dumps(record.to_dict(), indent=2) + "\n")


@contextlib.contextmanager
def updating(run_dir: str | os.PathLike) -> Iterator[RunRecord]:
    """Read-modify-write run.json under a lock (the job and the CLI both update it)."""
    with open(RunDir(run_dir).lock_file, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = read(run_dir)
        yield record
        write(run_dir, record)


def new_start(job_id: str, restart: int, **values) -> StartRecord:
    start = StartRecord(job_id=str(job_id), restart=restart, submitted=now(), state=State.PENDING.value)
    start.update(**values)
    return start
