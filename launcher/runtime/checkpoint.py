"""Atomic, verified, sharded checkpoints (framework-agnostic; stdlib only, ``crc32c`` if installed).

Layout of ``<checkpoint_dir>``::

    step-00000100/            a complete checkpoint: shards + manifest.json (+ per-rank markers)
    step-00000200/
    latest                    text: the name of the newest committed dir ("step-00000200")
    .staging-step-00000300/   being written; never selected for resume

Writing (every rank, same step, collectively)::

    with stage_checkpoint(step, framework="torch") as st:
        with st.open(f"rank-{st.rank:05d}.pt") as f:   # checksummed while written, fsynced
            torch.save(my_shard, f)
        st.add(other_path)           # or claim a file written some other way (hashed at the marker)
    st.committed                     # Checkpoint(step, path, manifest)

1. rank 0 empties ``.staging-step-N``; barrier.
2. each rank writes its files into the staging dir, fsyncs them and writes
   ``.done-rank-RRRRR.json``: its files with size and checksum, the checksum taken
   while the bytes were written (``st.open``, the DCP writer) or, for files a framework
   wrote itself, read back once by the rank that wrote them. A rank that fails
   writes ``.failed-rank-RRRRR.json`` instead.
3. all_reduce of the ranks' failure flags (a rank that raised makes every rank raise
   :class:`CheckpointError`, nothing is committed).
4. rank 0 waits for all ``world_size`` markers, checks that every claimed file exists
   with the size its rank wrote (stat, no re-reading), checksums any unclaimed file
   (written by a framework behind our back, e.g. DeepSpeed's zero_to_fp32.py), writes
   ``manifest.json``, fsyncs, renames the staging dir to ``step-N``, replaces ``latest``
   atomically (temp file + os.replace), and prunes: checkpoints newer than N (an
   abandoned timeline after a fallback), damaged ones, complete ones beyond ``keep``,
   stale staging dirs.
5. rank 0 broadcasts the outcome; every rank returns only once the commit is
   visible (or raises :class:`CheckpointError` on all ranks).

A background save (:mod:`launcher.runtime.background`) runs steps 2 and 4 in a thread
and agrees through the marker files alone (no collective off the main thread); steps 3
and 5 happen at the next :func:`launcher.runtime.wait_checkpoints`.

A rank killed at any point before step 4's rename leaves only a staging dir: the
previous ``step-*`` stays the newest complete one. :func:`latest_complete` never
trusts ``latest`` alone: it returns the newest ``step-*`` whose manifest verifies
(all shards present, sizes and checksums match), warning on stderr when ``latest``
disagrees; :func:`resume_checkpoint` spreads that re-check over the ranks.
``checkpoint_dir`` must be visible to all ranks (a shared filesystem).

Checksums: CRC32C (the ``crc32c`` package, hardware-accelerated, ~10 GB/s per core)
when it is installed, else SHA-256 (~1.5 GB/s); the manifest names the algorithm per
shard, so either verifies wherever it is available.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import json
import os
import re
import shutil
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..runs.files import atomic_write_text, fsync_dir
from ..runs.layout import RunDir
from .context import RankContext, all_reduce_max, broadcast_object, context, is_distributed, log

MANIFEST = "manifest.json"
LATEST = "latest"
STEP_PREFIX = "step-"
STAGING_PREFIX = ".staging-step-"
TRASH_PREFIX = ".trash-"
MARKER_PREFIX = ".done-rank-"
FAILED_PREFIX = ".failed-rank-"
PAD = 8
FORMAT = 2
CHECKSUMS = ("crc32c", "sha256")     # manifest keys a shard's checksum may be under

_STEP_RE = re.compile(r"^step-(\d+)$")
_STAGING_RE = re.compile(r"^\.staging-step-(\d+)$")
_MARKER_RE = re.compile(r"^\.(done|failed)-rank-(\d+)\.json$")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or committed (raised on every rank)."""


@dataclass(frozen=True)
class Checkpoint:
    """A complete, verified checkpoint directory."""

    step: int
    path: Path
    manifest: dict = field(repr=False, compare=False)

    @property
    def framework(self) -> str | None:
        return self.manifest.get("framework")

    @property
    def world_size(self) -> int:
        return int(self.manifest.get("world_size", 0))

    @property
    def extra(self) -> dict:
        return self.manifest.get("extra") or {}

    @property
    def layout(self) -> dict:
        """How the adapter that wrote it laid its files out (e.g. ``{"state": "dcp", ...}``)."""
        return self.manifest.get("layout") or {}


def step_dir_name(step: int) -> str:
    """``step-00000042``: zero-padded so that names sort like steps."""
    return f"{STEP_PREFIX}{int(step):0{PAD}d}"


def staging_dir_name(step: int) -> str:
    return f"{STAGING_PREFIX}{int(step):0{PAD}d}"


# ------------------------------------------------------------------ checksums

try:
    import crc32c as _crc32c
except ImportError:   # the train extra installs it; without it shards are SHA-256'd
    _crc32c = None  # type: ignore[assignment]


def checksum_algorithm() -> str:
    """The checksum new shards get: ``"crc32c"`` when the package is installed, else ``"sha256"``."""
    return "crc32c" if _crc32c is not None else "sha256"


class Checksum:
    """A running checksum with hashlib's ``update``/``hexdigest`` (releases the GIL on large buffers)."""

    def __init__(self, algorithm: str | None = None) -> None:
        self.algorithm = algorithm or checksum_algorithm()
        if self.algorithm == "crc32c":
            if _crc32c is None:
                raise CheckpointError("crc32c checksums need the 'crc32c' package (pip install crc32c)")
            self._crc = 0
            self._hash = None
        elif self.algorithm == "sha256":
            self._hash = hashlib.sha256()
        else:
            raise ValueError(f"unknown checksum {self.algorithm!r}")

    def update(self, data) -> None:
        if self._hash is not None:
            self._hash.update(data)
        else:
            self._crc = _crc32c.crc32c(data, self._crc)

    def hexdigest(self) -> str:
        return self._hash.hexdigest() if self._hash is not None else f"{self._crc:08x}"


def checksum_file(path: str | os.PathLike, algorithm: str | None = None, chunk: int = 1 << 22) -> str:
    """The checksum of a file's bytes, read in chunks."""
    c = Checksum(algorithm)
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            c.update(view[:n])
    return c.hexdigest()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    return checksum_file(path, "sha256", chunk)


def shard_checksum(entry: dict) -> tuple[str, str] | None:
    """``(algorithm, hex digest)`` of a manifest or marker file entry, or None if it has none."""
    for algo in CHECKSUMS:
        value = entry.get(algo)
        if isinstance(value, str):
            return algo, value
    return None


class ChecksumWriter:
    """A write-only binary file that checksums every byte as it is written.

    What ``torch.save`` and DCP's file writer need (write, tell, flush, fileno); on
    :meth:`close` the data is fsynced (unless ``sync=False``: the caller fsyncs through
    ``fileno()``), ``size`` / ``digest`` are final, and the file's pages leave the page
    cache: a checkpoint is not read back by the job that wrote it, and keeping it
    cached would only evict what training reads and make the next save reclaim memory.
    """

    def __init__(self, path: str | os.PathLike, algorithm: str | None = None, *, sync: bool = True) -> None:
        self.path = Path(path)
        self.checksum = Checksum(algorithm)
        self.size = 0
        self.digest: str | None = None
        self.sync = sync
        self._f = open(self.path, "wb")   # noqa: SIM115 - closed in close()

    @property
    def algorithm(self) -> str:
        return self.checksum.algorithm

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.checksum.update(view)
        n = self._f.write(view)
        self.size += n
        return n

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self._f.flush()

    def fileno(self) -> int:
        self._f.flush()   # callers fsync through it: nothing may stay in the user-space buffer
        return self._f.fileno()

    @property
    def closed(self) -> bool:
        return self._f.closed

    def close(self) -> None:
        if self._f.closed:
            return
        try:
            self._f.flush()
            if self.sync:
                os.fsync(self._f.fileno())
            _drop_cached(self._f.fileno())
        finally:
            self._f.close()
        self.digest = self.checksum.hexdigest()

    def __enter__(self) -> ChecksumWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------ file helpers

def _drop_cached(fd: int) -> None:
    """Evict a written file's clean pages from the page cache (dirty ones are only scheduled)."""
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


def fsync_file(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink())


def _rel(root: Path, p: str | os.PathLike) -> str:
    p = Path(p)
    if not p.is_absolute():
        p = root / p
    rel = os.path.relpath(os.path.abspath(p), os.path.abspath(root))
    if rel.startswith("..") or os.path.isabs(rel):
        raise CheckpointError(f"{p} is not inside the staging dir {root}")
    return Path(rel).as_posix()


def _safe_rel(rel: str) -> bool:
    parts = Path(rel).parts
    return bool(parts) and not Path(rel).is_absolute() and ".." not in parts


# ------------------------------------------------------------------ reading / verifying

def read_latest(checkpoint_dir: str | os.PathLike) -> str | None:
    """The dir name in ``latest`` (not verified), or None."""
    try:
        return (Path(checkpoint_dir) / LATEST).read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def list_checkpoints(checkpoint_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """All ``step-*`` dirs (complete or not), oldest first. Staging and trash dirs are never listed."""
    d = Path(checkpoint_dir)
    out = []
    try:
        entries = list(os.scandir(d))
    except OSError:
        return []
    for e in entries:
        m = _STEP_RE.match(e.name)
        if m and e.is_dir(follow_symlinks=False):
            out.append((int(m.group(1)), d / e.name))
    return sorted(out)


def read_manifest(path: str | os.PathLike) -> tuple[dict | None, str | None]:
    """A checkpoint dir's manifest.json, checked for shape: ``(manifest, None)`` or ``(None, why)``."""
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, "no manifest.json"
    except (OSError, ValueError) as e:
        return None, f"unreadable manifest.json ({e})"
    if not isinstance(manifest, dict) or not isinstance(manifest.get("shards"), list):
        return None, "manifest.json has no shard list"
    m = _STEP_RE.match(path.name)
    if m and int(m.group(1)) != manifest.get("step"):
        return None, f"manifest step {manifest.get('step')} does not match the dir name"
    for shard in manifest["shards"]:
        try:
            rel, _ = shard["path"], int(shard["size"])
        except (KeyError, TypeError, ValueError):
            return None, "malformed shard entry"
        if not isinstance(rel, str) or not _safe_rel(rel) or shard_checksum(shard) is None:
            return None, f"malformed or unsafe shard entry {rel!r}"
    return manifest, None


def verify_share(shards: list[dict], rank: int, world: int) -> list[dict]:
    """The shards ``rank`` of ``world`` re-checksums: largest first, each to the least-loaded rank.

    Deterministic, so every rank computes the same split from the same manifest.
    """
    heap = [(0, r) for r in range(max(1, world))]
    mine = []
    for shard in sorted(shards, key=lambda s: (-int(s["size"]), s["path"])):
        load, r = heapq.heappop(heap)
        heapq.heappush(heap, (load + int(shard["size"]) + 1, r))
        if r == rank:
            mine.append(shard)
    return mine


def check_shards(path: Path, manifest: dict, *, verify: str = "hash",
                 share: tuple[int, int] | None = None) -> str | None:
    """Why ``path`` does not match ``manifest`` (None when it does).

    Every shard's presence and size is checked; with ``verify="hash"`` the checksums of
    all shards, or only of this rank's share when ``share=(rank, world)``, are re-computed.
    """
    if verify not in ("hash", "size"):
        raise ValueError(f"verify must be 'hash' or 'size', not {verify!r}")
    for shard in manifest["shards"]:
        rel, size = shard["path"], int(shard["size"])
        try:
            actual = (path / rel).stat().st_size
        except OSError:
            return f"shard {rel} is missing"
        if actual != size:
            return f"shard {rel} has {actual} bytes, manifest says {size}"
    if verify == "size":
        return None
    todo = manifest["shards"] if share is None else verify_share(manifest["shards"], *share)
    for shard in todo:
        found = shard_checksum(shard)
        if found is None:
            return f"shard {shard['path']} has no checksum"
        algo, digest = found
        if algo == "crc32c" and _crc32c is None:
            log(f"cannot re-check {shard['path']}: its crc32c checksum needs the 'crc32c' package; "
                "checked its size only")
            continue
        if checksum_file(path / shard["path"], algo) != digest:
            return f"shard {shard['path']} {algo} mismatch"
    return None


def verify_checkpoint(path: str | os.PathLike, *, verify: str = "hash") -> tuple[dict | None, str | None]:
    """Check a checkpoint dir against its manifest: ``(manifest, None)`` if complete, else ``(None, why)``.

    ``verify="hash"`` re-checksums every shard (default); ``"size"`` only checks presence and sizes.
    """
    if verify not in ("hash", "size"):
        raise ValueError(f"verify must be 'hash' or 'size', not {verify!r}")
    path = Path(path)
    manifest, why = read_manifest(path)
    if manifest is None:
        return None, why
    why = check_shards(path, manifest, verify=verify)
    return (manifest, None) if why is None else (None, why)


def _warn_latest(d: Path, found: Checkpoint | None) -> None:
    pointer = read_latest(d)
    if pointer is not None and (found is None or pointer != found.path.name):
        log(f"warning: {d / LATEST} names {pointer!r}, but the newest complete checkpoint is "
            f"{found.path.name if found else 'none'}; using that")


def latest_complete(checkpoint_dir: str | os.PathLike, *, verify: str = "hash",
                    quiet: bool = False) -> Checkpoint | None:
    """The newest ``step-*`` checkpoint whose manifest verifies, or None (one process checks all).

    Does not trust ``latest``: a damaged or missing target is skipped with a warning on
    stderr and the newest complete one is returned instead. Never returns a staging dir.
    """
    d = Path(checkpoint_dir)
    found: Checkpoint | None = None
    for step, path in reversed(list_checkpoints(d)):
        manifest, why = verify_checkpoint(path, verify=verify)
        if manifest is not None:
            found = Checkpoint(step=step, path=path, manifest=manifest)
            break
        if not quiet:
            log(f"checkpoint {path} is not complete ({why}); ignoring it")
    if not quiet:
        _warn_latest(d, found)
    return found


def _latest_complete_spread(ctx: RankContext, verify: str) -> Checkpoint | None:
    """:func:`latest_complete` with the checksums split over the ranks (collective).

    Rank 0 lists the candidates and reads each manifest; every rank checks all sizes
    and re-checksums its share of the files (:func:`verify_share`); an all_reduce of
    the ranks' verdicts decides, so all ranks take the same checkpoint.
    """
    d = ctx.checkpoint_dir
    names = broadcast_object([p.name for _, p in reversed(list_checkpoints(d))] if ctx.is_main else None)
    for name in names:
        path = d / name
        manifest, why = read_manifest(path) if ctx.is_main else (None, None)
        manifest, why = broadcast_object((manifest, why))
        mine = None
        unseen = manifest is not None and not path.is_dir()
        if manifest is not None and not unseen:
            try:
                mine = check_shards(path, manifest, verify=verify, share=(ctx.rank, ctx.world_size))
            except OSError as e:
                mine = f"unreadable ({e})"
            if mine is not None:
                log(f"checkpoint {path}: {mine}")
        bad, blind = all_reduce_max([1 if mine is not None or unseen else 0, ctx.rank + 1 if unseen else 0])
        if blind:
            raise CheckpointError(f"rank {blind - 1} cannot see {path}, which rank 0 can: the checkpoint dir "
                                  "must be on a filesystem shared by all ranks")
        if manifest is not None and not bad:
            return Checkpoint(step=int(manifest["step"]), path=path, manifest=manifest)
        if ctx.is_main:
            log(f"checkpoint {path} is not complete ({why or mine or 'a shard failed on another rank'}); "
                "ignoring it")
    return None


def resume_checkpoint(ctx: RankContext | None = None, *, verify: str = "hash") -> Checkpoint | None:
    """The newest complete checkpoint of the run's checkpoint dir, the same on all ranks.

    Call on every rank, after torch.distributed is initialised when world_size > 1: the
    full re-check (sizes, and checksums with ``verify="hash"``) is then spread over the
    ranks. Without torch.distributed each process checks everything itself.
    """
    ctx = ctx or context()
    if ctx.world_size > 1 and is_distributed():
        found = _latest_complete_spread(ctx, verify)
        if ctx.is_main:
            _warn_latest(ctx.checkpoint_dir, found)
    else:
        found = latest_complete(ctx.checkpoint_dir, verify=verify, quiet=not ctx.is_main)
    if ctx.is_main and not ctx.standalone:
        _note_resume(ctx, found)
    return found


def _note_resume(ctx: RankContext, found: Checkpoint | None) -> None:
    """<run_dir>/resume.json: the step this start resumed from, for run.json's record of starts."""
    try:
        ctx.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(RunDir(ctx.run_dir).resume_file, json.dumps(
            {"restart": ctx.restart, "job_id": ctx.job_id, "step": None if found is None else found.step}) + "\n")
    except OSError as exc:
        log(f"could not write {RunDir(ctx.run_dir).resume_file}: {exc}")


# ------------------------------------------------------------------ writing

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
    def open(self, name: str):
        """A :class:`ChecksumWriter` on ``path / name``, claimed and recorded when closed."""
        p = self.file(name)
        with ChecksumWriter(p) as w:
            yield w
        self.record(p, w.size, w.algorithm, w.checksum.hexdigest())


def _marker_name(rank: int) -> str:
    return f"{MARKER_PREFIX}{rank:05d}.json"


def _failed_name(rank: int) -> str:
    return f"{FAILED_PREFIX}{rank:05d}.json"


def write_marker(st: Staging) -> None:
    """Make this rank's files durable and list them, with sizes and checksums, in its done marker."""
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
        algo = checksum_algorithm()
        entries.append({"path": rel, "size": size, algo: checksum_file(f, algo)})
    for parent in sorted({(st.path / rel).parent for rel in st.files}, reverse=True):
        fsync_dir(parent)
    marker = {"rank": st.rank, "step": st.step, "world_size": st.world_size,
              "host": socket.gethostname(), "pid": os.getpid(), "files": entries}
    if st.payload is not None:
        marker["payload"] = st.payload
    atomic_write_text(st.path / _marker_name(st.rank), json.dumps(marker, indent=1))


def write_failure_marker(st: Staging, error: BaseException) -> None:
    """Tell rank 0's commit, through the staging dir, that this rank's share will not come."""
    try:
        atomic_write_text(st.path / _failed_name(st.rank), json.dumps(
            {"rank": st.rank, "step": st.step, "error": f"{type(error).__name__}: {error}"}))
    except OSError:
        pass   # the staging dir itself is gone: rank 0 times out on the missing marker


def read_markers(staging: Path, step: int, world: int, timeout_s: float) -> list[dict]:
    """Every rank's done marker, waiting up to ``timeout_s`` for them to appear.

    Raises :class:`CheckpointError` as soon as a rank's failure marker shows up.
    """
    deadline = time.monotonic() + timeout_s
    markers: dict[int, dict] = {}
    delay = 0.005
    while True:
        try:
            names = [e.name for e in os.scandir(staging)]
        except OSError as e:
            raise CheckpointError(f"cannot list {staging}: {e}") from None
        for name in names:
            m = _MARKER_RE.match(name)
            if not m:
                continue
            r = int(m.group(2))
            if m.group(1) == "failed":
                try:
                    why = json.loads((staging / name).read_text(encoding="utf-8")).get("error")
                except (OSError, ValueError):
                    why = None
                raise CheckpointError(f"rank {r} failed writing its shards: {why or 'no reason given'}")
            if r >= world or r in markers:
                continue
            try:
                marker = json.loads((staging / name).read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise CheckpointError(f"rank {r}'s done marker is unreadable: {e}") from None
            if marker.get("rank") != r or marker.get("step") != step:
                raise CheckpointError(f"done marker {name} is for rank {marker.get('rank')} "
                                      f"step {marker.get('step')}")
            markers[r] = marker
        if len(markers) == world:
            return [markers[r] for r in range(world)]
        if time.monotonic() > deadline:
            missing = [r for r in range(world) if r not in markers]
            raise CheckpointError(f"rank {missing[0]} wrote no done marker in {staging}"
                                  + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        time.sleep(delay)   # shared filesystems may show new files late
        delay = min(0.2, delay * 2)


def commit(ctx: RankContext, d: Path, staging: Path, step: int, *, framework: str, keep: int,
           extra: dict | None = None, verify: str = "size", marker_timeout_s: float = 120.0,
           on_markers=None, prune_in_background: bool = False, layout: dict | None = None) -> Path:
    """Rank 0: the commit of a staged checkpoint (step 4 above); returns the final dir.

    ``on_markers(markers)``, if given, runs once all markers are in and returns manifest
    entries (``{"path", "size", algo: digest}``) for files rank 0 writes then (DCP's
    ``.metadata``). ``verify="hash"`` re-reads every shard instead of trusting the
    markers' checksums. ``prune_in_background`` leaves the deletion of pruned
    checkpoints to a thread (they are renamed away before this returns). ``layout``
    (JSON-able) describes the files for the adapter that reads them back.
    """
    markers = read_markers(staging, step, ctx.world_size, marker_timeout_s)
    late = list(on_markers(markers)) if on_markers is not None else []
    shards: dict[str, dict] = {}
    claims = [(m["rank"], e) for m in markers for e in m["files"]] + [(ctx.rank, e) for e in late]
    for rank, e in claims:
        rel = e["path"]
        if rel in shards:
            raise CheckpointError(f"{rel} claimed by ranks {shards[rel]['rank']} and {rank}")
        checksum = shard_checksum(e)
        if checksum is None:
            raise CheckpointError(f"rank {rank}'s entry for {rel} has no checksum")
        f = staging / rel
        try:
            size = f.stat().st_size
        except OSError:
            raise CheckpointError(f"rank {rank}'s shard {rel} is not visible to rank 0") from None
        if size != e["size"]:
            raise CheckpointError(f"shard {rel}: {size} bytes, rank {rank} wrote {e['size']}")
        if verify == "hash" and checksum_file(f, checksum[0]) != checksum[1]:
            raise CheckpointError(f"shard {rel}: {checksum[0]} differs from what rank {rank} wrote")
        shards[rel] = {"path": rel, "size": e["size"], checksum[0]: checksum[1], "rank": rank}
    for f in _files_under(staging):
        rel = f.relative_to(staging).as_posix()
        if rel in shards or rel == MANIFEST or _MARKER_RE.match(f.name) or ".tmp-" in f.name:
            continue
        fsync_file(f)   # written by a framework on some rank, finished before its marker
        algo = checksum_algorithm()
        shards[rel] = {"path": rel, "size": f.stat().st_size, algo: checksum_file(f, algo), "rank": None}
    now = time.time()
    manifest = {
        "format": FORMAT,
        "step": step,
        "world_size": ctx.world_size,
        "created": now,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "framework": framework,
        "run_id": ctx.run_id,
        "job_id": ctx.job_id,
        "restart": ctx.restart,
        "extra": extra or {},
        "shards": [shards[k] for k in sorted(shards)],
    }
    if layout is not None:
        manifest["layout"] = layout
    atomic_write_text(staging / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    fsync_dir(staging)
    final = d / step_dir_name(step)
    if final.exists():   # the same step saved again (e.g. a stop right after resuming)
        old = d / f"{TRASH_PREFIX}{final.name}-{time.time_ns()}"
        os.rename(final, old)
    os.rename(staging, final)
    fsync_dir(d)
    atomic_write_text(d / LATEST, final.name)
    _prune(d, step, keep, in_background=prune_in_background)
    return final


def _prune(d: Path, step: int, keep: int, *, in_background: bool = False) -> None:
    """Drop checkpoints newer than ``step`` (abandoned), damaged ones, complete ones beyond ``keep``,
    staging and trash dirs. Each goes by a rename to ``.trash-*`` first; with ``in_background``
    the deletion itself happens in a thread (an interrupted one leaves ``.trash-*``, removed here
    next time)."""
    doomed: list[Path] = []
    kept = 0
    for s, path in reversed(list_checkpoints(d)):
        if s > step:
            log(f"removing {path.name}: newer than the checkpoint just committed (abandoned)")
            doomed.append(_to_trash(path))
            continue
        manifest, _ = verify_checkpoint(path, verify="size")
        if manifest is not None and kept < keep:
            kept += 1
            continue
        doomed.append(_to_trash(path))
    for e in os.scandir(d):
        if _STAGING_RE.match(e.name):
            doomed.append(_to_trash(d / e.name))
        elif e.name.startswith(TRASH_PREFIX):
            doomed.append(d / e.name)
    fsync_dir(d)
    doomed = list(dict.fromkeys(doomed))
    if in_background:
        threading.Thread(target=_delete_all, args=(doomed,), name="glaunch-prune", daemon=True).start()
    else:
        _delete_all(doomed)


def _to_trash(path: Path) -> Path:
    trash = path.with_name(f"{TRASH_PREFIX}{path.name.lstrip('.')}-{time.time_ns()}")
    try:
        os.rename(path, trash)
    except OSError:
        return path
    return trash


def _delete_all(paths: list[Path]) -> None:
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)


def open_staging(step: int, ctx: RankContext, d: Path) -> Staging:
    """Collective: rank 0 makes an empty ``.staging-step-N`` in ``d``; every rank gets its :class:`Staging`."""
    staging = d / staging_dir_name(step)
    if ctx.world_size > 1 and not is_distributed():
        raise CheckpointError("checkpoints need torch.distributed initialised when WORLD_SIZE > 1")
    err: BaseException | None = None
    if ctx.is_main:
        try:
            d.mkdir(parents=True, exist_ok=True)
            if staging.exists():
                shutil.rmtree(staging)  # left by an attempt that was killed
            staging.mkdir()
            fsync_dir(d)
        except OSError as e:
            err = e
    if all_reduce_max([1 if err else 0])[0]:
        raise CheckpointError(f"cannot create {staging}: {err or 'failed on rank 0'}")
    return Staging(path=staging, step=step, rank=ctx.rank, world_size=ctx.world_size)


def first_failed_rank(ctx: RankContext, failed: bool) -> int | None:
    """Collective: the lowest rank that reports ``failed``, or None (one all_reduce)."""
    if ctx.world_size == 1 or not is_distributed():
        return ctx.rank if failed else None
    top = all_reduce_max([ctx.world_size - ctx.rank if failed else 0])[0]
    return ctx.world_size - top if top else None


def agree(ctx: RankContext, step: int, final: Path, error: str | None) -> Checkpoint:
    """Collective, after every rank's part of a save (background ones included) is over.

    ``error`` is this rank's failure (rank 0's includes the commit). All ranks raise the
    lowest failing rank's :class:`CheckpointError`, or all return the committed checkpoint.
    """
    bad = first_failed_rank(ctx, error is not None)
    if bad is not None:
        why = broadcast_object(error, src=bad) if ctx.world_size > 1 and is_distributed() else error
        raise CheckpointError(f"step {step}: rank {bad}: {why}; nothing committed")
    manifest, why = read_manifest(final)
    if manifest is None:
        raise CheckpointError(f"step {step}: the committed {final} is not readable here ({why})")
    return Checkpoint(step=step, path=final, manifest=manifest)


@contextlib.contextmanager
def stage_checkpoint(step: int, *, framework: str = "torch", ctx: RankContext | None = None,
                     checkpoint_dir: str | os.PathLike | None = None, keep: int | None = None,
                     extra: dict | None = None, verify: str = "size", marker_timeout_s: float = 120.0,
                     on_markers=None):
    """Collective context manager: write this rank's shards into ``st.path``, commit on exit.

    Every rank must enter it for the same ``step``. Write through ``st.open(name)`` (the
    checksum is taken while writing) or claim files with ``st.add(path)`` / ``st.file(name)``
    (read back once by the writing rank); files nobody claims are checksummed by rank 0
    at commit. ``extra`` (a JSON-able dict, rank 0's value wins) goes into the manifest.
    After the block ``st.committed`` is the new :class:`Checkpoint` on every rank. ``keep``
    defaults to GLAUNCH_CHECKPOINT_KEEP; ``verify="hash"`` makes rank 0 re-read every shard
    at commit (default ``"size"``: markers' checksums and stat sizes). ``on_markers``: see
    :func:`commit`.
    """
    ctx = ctx or context()
    d = Path(checkpoint_dir) if checkpoint_dir is not None else ctx.checkpoint_dir
    keep = ctx.checkpoint_keep if keep is None else keep
    st = open_staging(step, ctx, d)
    err: BaseException | None = None
    try:
        yield st
        write_marker(st)
    except Exception as e:   # every rank must learn about it
        err = e
    if all_reduce_max([1 if err else 0])[0]:
        if err is not None:
            raise CheckpointError(f"step {step}: rank {ctx.rank} failed writing its shards: {err}") from err
        raise CheckpointError(f"step {step}: another rank failed writing its shards; nothing committed")
    outcome: tuple[str, str] | None = None
    if ctx.is_main:
        try:
            final = commit(ctx, d, st.path, step, framework=framework, keep=keep, extra=extra, verify=verify,
                           marker_timeout_s=marker_timeout_s, on_markers=on_markers)
            outcome = ("ok", str(final))
        except Exception as e:
            outcome = ("error", f"{type(e).__name__}: {e}")
    outcome = broadcast_object(outcome) if ctx.world_size > 1 else outcome
    if outcome is None or outcome[0] != "ok":
        raise CheckpointError(f"step {step}: commit failed: {outcome[1] if outcome else 'no answer'}")
    final = Path(outcome[1])
    manifest = json.loads((final / MANIFEST).read_text(encoding="utf-8"))
    st.committed = Checkpoint(step=step, path=final, manifest=manifest)
