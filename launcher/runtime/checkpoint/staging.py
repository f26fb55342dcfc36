"""A rank's share of a checkpoint being written: the :class:`Staging` handle its writer
gets, and the marker files through which rank 0's commit learns that the share is in
(its files with sizes and checksums) or will not come.

A rank makes its files durable (fsync) before its marker; the directories that hold
them are made durable once, by rank 0's commit, when every marker is in
(:func:`fsync_together`). A done marker is a message to rank 0, not part of the
checkpoint (nothing reads it after the commit), so it is published whole (temp file and
rename) but not fsynced.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from launcher.rundir.files import atomic_write_text, fsync_dir, load_json_object, open_regular
from launcher.runtime.checkpoint import checksums
from launcher.runtime.checkpoint.directory import (
    MARKER_RE,
    Checkpoint,
    CheckpointError,
    failed_marker_name,
    marker_name,
)
from launcher.runtime.checkpoint.checksums import ChecksumWriter


@dataclass
class Staging:
    """Handed to the writer by :func:`stage_checkpoint`."""

    path: Path
    step: int
    rank: int
    world_size: int
    files: list[str] = field(default_factory=list)
    committed: Checkpoint | None = None
    written: dict[str, dict] = field(default_factory=dict)   # rel -> {"size", algo: digest}
    payload: dict | None = None                                # travels in this rank's done marker

    def add(self, *paths: str | os.PathLike) -> None:
        """Claim files (absolute, or relative to the staging dir) as this rank's shards."""
        for p in paths:
            rel = _rel(self.path, p)
            if rel not in self.files:
                self.files.append(rel)

    def file(self, name: str) -> Path:
        """``path / name``, claimed for this rank (parent dirs created)."""
        p = self.path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        self.add(p)
        return p

    def record(self, path: str | os.PathLike, size: int, algorithm: str, digest: str) -> None:
        """Claim a file whose checksum was taken while it was written (not read back)."""
        rel = _rel(self.path, path)
        self.add(rel)
        self.written[rel] = {"size": int(size), algorithm: digest}

    @contextlib.contextmanager
    def open(self, name: str, *, sync: bool = True):
        """A :class:`ChecksumWriter` on ``path / name``, claimed and recorded when closed; fsynced
        then unless ``sync=False`` (the caller fsyncs it before the marker)."""
        p = self.file(name)
        with ChecksumWriter(p, sync=sync) as w:
            try:
                yield w
            except Exception as e:
                w.raise_io_error(e)
                raise
        self.record(p, w.size, w.algorithm, w.checksum.hexdigest())


def _rel(root: Path, p: str | os.PathLike) -> str:
    p = Path(p)
    if not p.is_absolute():
        p = root / p
    rel = os.path.relpath(os.path.abspath(p), os.path.abspath(root))
    if rel.startswith("..") or os.path.isabs(rel):
        raise CheckpointError(f"{p} is not inside the staging dir {root}")
    return Path(rel).as_posix()


def fsync_file(path: str | os.PathLike) -> None:
    fd = open_regular(path)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_together(files: Sequence[Path], dirs: Sequence[Path], hints: Sequence[Path] = ()) -> None:
    """fsync ``files`` (an error raises), ``dirs`` (as :func:`fsync_dir`: some filesystems
    refuse, harmlessly) and ``hints`` (files whose loss costs nothing: errors ignored) at
    once, in threads: a journaling filesystem commits concurrent fsyncs together, where
    one after the other each waits for a commit (and a disk flush) of its own."""
    jobs = [(fsync_file, f) for f in files] + [(fsync_dir, d) for d in dirs] + [(_fsync_hint, h) for h in hints]
    threads = min(len(jobs), FSYNC_THREADS)
    waits = [in_thread(_run_all, jobs[i::threads]) for i in range(threads)]
    errors = []
    for wait in waits:   # every one ends before any error is raised
        try:
            wait()
        except OSError as e:
            errors.append(e)
    if errors:
        raise errors[0]


# At most this many fsyncs in flight at once (a framework may leave many files to the commit).
FSYNC_THREADS = 16


def _run_all(jobs: list) -> None:
    for fn, path in jobs:
        fn(path)


def in_thread(fn, *args) -> Callable[[], None]:
    """Start ``fn(*args)`` in a thread of its own; the function returned waits for it and raises
    its error. A plain thread: a background save that ends after the main thread did may
    still start one, where concurrent.futures refuses new work at interpreter exit."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn(*args)
        except BaseException as e:   # raised in the waiting thread
            errors.append(e)

    thread = threading.Thread(target=run, name="glaunch-fsync", daemon=True)
    thread.start()

    def wait() -> None:
        thread.join()
        if errors:
            raise errors[0]

    return wait


def _fsync_hint(path: Path) -> None:
    with contextlib.suppress(OSError):
        fsync_file(path)


def publish_text(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all for its readers (a new temp file beside it, renamed),
    without making it durable: for what is read while the save runs and not after it."""
    atomic_write_text(path, text, durable=False)


def write_marker(st: Staging) -> None:
    """Make this rank's files durable and list them, with sizes and checksums, in its done marker.

    Their directory entries are the commit's to make durable (:func:`fsync_together`)."""
    entries = []
    for rel in st.files:
        f = st.path / rel
        if not f.is_file():
            raise CheckpointError(f"rank {st.rank} claimed {rel} but it was not written")
        size = f.stat().st_size
        known = st.written.get(rel)
        if known is not None:
            if known["size"] != size:
                raise CheckpointError(f"rank {st.rank} wrote {known['size']} bytes to {rel}, {size} are there")
            entries.append({"path": rel, **known})
            continue
        fsync_file(f)   # written by a framework: made durable and read back once, here
        algo = checksums.checksum_algorithm()
        entries.append({"path": rel, "size": size, algo: checksums.checksum_file(f, algo)})
    marker = {"rank": st.rank, "step": st.step, "world_size": st.world_size,
              "host": socket.gethostname(), "pid": os.getpid(), "files": entries}
    if st.payload is not None:
        marker["payload"] = st.payload
    publish_text(st.path / marker_name(st.rank), json.dumps(marker, indent=1))


def write_failure_marker(st: Staging, error: BaseException) -> None:
    """Tell rank 0's commit, through the staging dir, that this rank's share will not come."""
    try:
        atomic_write_text(st.path / failed_marker_name(st.rank), json.dumps(
            {"rank": st.rank, "step": st.step, "error": f"{type(error).__name__}: {error}"}))
    except OSError:
        pass   # the staging dir itself is gone: rank 0 times out on the missing marker


# Off the main thread, once the main thread has ended (the script returned, or died of a
# peer's death in a collective), rank 0 waits for missing markers only while the staging
# dir still changes: a rank that is still writing grows its files; a dead one never will.
ORPHAN_STALL_S = 60.0


def _progress(staging: Path) -> tuple:
    """What changes while any rank writes into ``staging``: its files' names and sizes."""
    seen = []
    for root, _dirs, files in os.walk(staging):
        for name in files:
            try:
                seen.append((root, name, os.stat(os.path.join(root, name)).st_size))
            except OSError:
                pass
    return tuple(sorted(seen))


def read_markers(staging: Path, step: int, world: int, timeout_s: float,
                 orphan_stall_s: float = ORPHAN_STALL_S) -> list[dict]:
    """Every rank's done marker, waiting up to ``timeout_s`` for them to appear.

    Raises :class:`CheckpointError` as soon as a rank's failure marker shows up, and, in a
    background save whose process's main thread has ended, once the staging dir has not
    changed for ``orphan_stall_s`` (the missing ranks are gone: nothing would ever commit).
    """
    deadline = time.monotonic() + timeout_s
    markers: dict[int, dict] = {}
    delay = 0.005
    orphan = threading.current_thread() is not threading.main_thread()
    last: tuple | None = None
    changed = time.monotonic()
    while True:
        try:
            names = [e.name for e in os.scandir(staging)]
        except OSError as e:
            raise CheckpointError(f"cannot list {staging}: {e}") from None
        for name in names:
            m = MARKER_RE.match(name)
            if not m:
                continue
            r = int(m.group(2))
            if m.group(1) == "failed":
                try:
                    why = load_json_object(staging / name).get("error")
                except (OSError, ValueError):
                    why = None
                raise CheckpointError(f"rank {r} failed writing its shards: {why or 'no reason given'}")
            if r >= world or r in markers:
                continue
            try:
                marker = load_json_object(staging / name)
            except (OSError, ValueError) as e:
                raise CheckpointError(f"rank {r}'s done marker is unreadable: {e}") from None
            if marker.get("rank") != r or marker.get("step") != step:
                raise CheckpointError(f"done marker {name} is for rank {marker.get('rank')} "
                                      f"step {marker.get('step')}")
            markers[r] = marker
        if len(markers) == world:
            return [markers[r] for r in range(world)]
        missing = [r for r in range(world) if r not in markers]
        who = f"rank {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        if time.monotonic() > deadline:
            raise CheckpointError(f"{who} wrote no done marker in {staging}")
        if orphan and not threading.main_thread().is_alive():
            now = _progress(staging)
            if now != last:
                last, changed = now, time.monotonic()
            elif time.monotonic() - changed > orphan_stall_s:
                raise CheckpointError(f"{who} wrote no done marker in {staging}, which has not changed for "
                                      f"{orphan_stall_s:.0f} s since the main thread ended: nothing committed")
        time.sleep(delay)   # shared filesystems may show new files late
        delay = min(0.2, delay * 2)
