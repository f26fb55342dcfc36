"""Atomic, verified, sharded checkpoints (framework-agnostic; stdlib only).

Layout of ``<checkpoint_dir>``::

    step-00000100/            a complete checkpoint: shards + manifest.json (+ per-rank markers)
    step-00000200/
    latest                    text: the name of the newest committed dir ("step-00000200")
    .staging-step-00000300/   being written; never selected for resume

Writing (every rank, same step, collectively)::

    with stage_checkpoint(step, framework="torch") as st:
        path = st.path / f"rank-{st.rank:05d}.pt"
        torch.save(my_shard, path)
        st.add(path)                 # claim the files this rank wrote
    st.committed                     # Checkpoint(step, path, manifest)

1. rank 0 empties ``.staging-step-N``; barrier.
2. each rank writes its files into the staging dir, fsyncs them and writes
   ``.done-rank-RRRRR.json`` (its files with size and sha256), fsynced.
3. all_reduce of the ranks' failure flags (a barrier; a rank that raised makes
   every rank raise :class:`CheckpointError`, nothing is committed).
4. rank 0 waits for all ``world_size`` markers, re-checks every claimed file
   (size + sha256 by default), hashes any unclaimed file (written by a framework
   behind our back, e.g. DeepSpeed's zero_to_fp32.py), writes ``manifest.json``,
   fsyncs, renames the staging dir to ``step-N``, replaces ``latest`` atomically
   (temp file + os.replace), and prunes: checkpoints newer than N (an abandoned
   timeline after a fallback), damaged ones, complete ones beyond ``keep``, stale
   staging dirs.
5. rank 0 broadcasts the outcome; every rank returns only once the commit is
   visible (or raises :class:`CheckpointError` on all ranks).

A rank killed at any point before step 4's rename leaves only a staging dir: the
previous ``step-*`` stays the newest complete one. :func:`latest_complete` never
trusts ``latest`` alone: it returns the newest ``step-*`` whose manifest verifies
(all shards present, sizes and hashes match), warning on stderr when ``latest``
disagrees. ``checkpoint_dir`` must be visible to all ranks (a shared filesystem).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
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
PAD = 8
FORMAT = 1

_STEP_RE = re.compile(r"^step-(\d+)$")
_STAGING_RE = re.compile(r"^\.staging-step-(\d+)$")


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


def step_dir_name(step: int) -> str:
    """``step-00000042``: zero-padded so that names sort like steps."""
    return f"{STEP_PREFIX}{int(step):0{PAD}d}"


def staging_dir_name(step: int) -> str:
    return f"{STAGING_PREFIX}{int(step):0{PAD}d}"


# ------------------------------------------------------------------ file helpers

def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


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


def _remove_tree(path: Path) -> None:
    """Rename out of the way first, so a crash mid-delete leaves a .trash- dir, not a half step-."""
    if not path.exists():
        return
    trash = path.with_name(f"{TRASH_PREFIX}{path.name.lstrip('.')}-{time.time_ns()}")
    try:
        os.rename(path, trash)
    except OSError:
        trash = path
    shutil.rmtree(trash, ignore_errors=True)


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


def verify_checkpoint(path: str | os.PathLike, *, verify: str = "hash") -> tuple[dict | None, str | None]:
    """Check a checkpoint dir against its manifest: ``(manifest, None)`` if complete, else ``(None, why)``.

    ``verify="hash"`` re-hashes every shard (default); ``"size"`` only checks presence and sizes.
    """
    if verify not in ("hash", "size"):
        raise ValueError(f"verify must be 'hash' or 'size', not {verify!r}")
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
            rel, size, digest = shard["path"], int(shard["size"]), shard["sha256"]
        except (KeyError, TypeError, ValueError):
            return None, "malformed shard entry"
        if not _safe_rel(rel):
            return None, f"unsafe shard path {rel!r}"
        f = path / rel
        try:
            actual = f.stat().st_size
        except OSError:
            return None, f"shard {rel} is missing"
        if actual != size:
            return None, f"shard {rel} has {actual} bytes, manifest says {size}"
        if verify == "hash" and sha256_file(f) != digest:
            return None, f"shard {rel} sha256 mismatch"
    return manifest, None


def latest_complete(checkpoint_dir: str | os.PathLike, *, verify: str = "hash",
                    quiet: bool = False) -> Checkpoint | None:
    """The newest ``step-*`` checkpoint whose manifest verifies, or None.

    Does not trust ``latest``: a damaged or missing target is skipped with a warning on
    stderr and the newest complete one is returned instead. Never returns a staging dir.
    """
    d = Path(checkpoint_dir)
    pointer = read_latest(d)
    found: Checkpoint | None = None
    for step, path in reversed(list_checkpoints(d)):
        manifest, why = verify_checkpoint(path, verify=verify)
        if manifest is not None:
            found = Checkpoint(step=step, path=path, manifest=manifest)
            break
        if not quiet:
            log(f"checkpoint {path} is not complete ({why}); ignoring it")
    if not quiet and pointer is not None and (found is None or pointer != found.path.name):
        log(f"warning: {d / LATEST} names {pointer!r}, but the newest complete checkpoint is "
            f"{found.path.name if found else 'none'}; using that")
    return found


def resume_checkpoint(ctx: RankContext | None = None, *, verify: str = "hash") -> Checkpoint | None:
    """:func:`latest_complete` of the run's checkpoint dir, decided once by rank 0 and
    broadcast, so all ranks resume from the same one (call on every rank, after
    torch.distributed is initialised when world_size > 1)."""
    ctx = ctx or context()
    if ctx.world_size > 1 and is_distributed():
        found = latest_complete(ctx.checkpoint_dir, verify=verify) if ctx.is_main else None
        found = broadcast_object(found)
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


def _marker_name(rank: int) -> str:
    return f"{MARKER_PREFIX}{rank:05d}.json"


def _write_marker(st: Staging) -> None:
    entries = []
    for rel in st.files:
        f = st.path / rel
        if not f.is_file():
            raise CheckpointError(f"rank {st.rank} claimed {rel} but it was not written")
        fsync_file(f)
        entries.append({"path": rel, "size": f.stat().st_size, "sha256": sha256_file(f)})
    for parent in sorted({(st.path / rel).parent for rel in st.files}, reverse=True):
        fsync_dir(parent)
    marker = {"rank": st.rank, "step": st.step, "world_size": st.world_size,
              "host": socket.gethostname(), "pid": os.getpid(), "files": entries}
    atomic_write_text(st.path / _marker_name(st.rank), json.dumps(marker, indent=1))


def _read_markers(staging: Path, step: int, world: int, timeout_s: float) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    markers = []
    for r in range(world):
        p = staging / _marker_name(r)
        while True:
            try:
                m = json.loads(p.read_text(encoding="utf-8"))
                break
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise CheckpointError(f"rank {r} wrote no done marker in {staging}") from None
                time.sleep(0.2)  # shared filesystems may show new files late
            except ValueError as e:
                raise CheckpointError(f"rank {r}'s done marker is unreadable: {e}") from None
        if m.get("rank") != r or m.get("step") != step:
            raise CheckpointError(f"done marker {p.name} is for rank {m.get('rank')} step {m.get('step')}")
        markers.append(m)
    return markers


def _commit(ctx: RankContext, d: Path, staging: Path, step: int, framework: str, keep: int,
            extra: dict | None, verify: str, marker_timeout_s: float) -> Path:
    markers = _read_markers(staging, step, ctx.world_size, marker_timeout_s)
    shards: dict[str, dict] = {}
    for m in markers:
        for e in m["files"]:
            rel = e["path"]
            if rel in shards:
                raise CheckpointError(f"{rel} claimed by ranks {shards[rel]['rank']} and {m['rank']}")
            f = staging / rel
            try:
                size = f.stat().st_size
            except OSError:
                raise CheckpointError(f"rank {m['rank']}'s shard {rel} is not visible to rank 0") from None
            if size != e["size"]:
                raise CheckpointError(f"shard {rel}: {size} bytes, rank {m['rank']} wrote {e['size']}")
            if verify == "hash" and sha256_file(f) != e["sha256"]:
                raise CheckpointError(f"shard {rel}: sha256 differs from what rank {m['rank']} wrote")
            shards[rel] = {"path": rel, "size": e["size"], "sha256": e["sha256"], "rank": m["rank"]}
    for f in _files_under(staging):
        rel = f.relative_to(staging).as_posix()
        if rel in shards or rel == MANIFEST or f.name.startswith(MARKER_PREFIX) or ".tmp-" in f.name:
            continue
        fsync_file(f)   # written by a framework on some rank, finished before the barrier
        shards[rel] = {"path": rel, "size": f.stat().st_size, "sha256": sha256_file(f), "rank": None}
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
    atomic_write_text(staging / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    fsync_dir(staging)
    final = d / step_dir_name(step)
    if final.exists():   # the same step saved again (e.g. a stop right after resuming)
        old = d / f"{TRASH_PREFIX}{final.name}-{time.time_ns()}"
        os.rename(final, old)
    os.rename(staging, final)
    fsync_dir(d)
    atomic_write_text(d / LATEST, final.name)
    _prune(d, step, keep)
    return final


def _prune(d: Path, step: int, keep: int) -> None:
    kept = 0
    for s, path in reversed(list_checkpoints(d)):
        if s > step:
            log(f"removing {path.name}: newer than the checkpoint just committed (abandoned)")
            _remove_tree(path)
            continue
        manifest, _ = verify_checkpoint(path, verify="size")
        if manifest is not None and kept < keep:
            kept += 1
            continue
        _remove_tree(path)
    for e in os.scandir(d):
        if _STAGING_RE.match(e.name) or e.name.startswith(TRASH_PREFIX):
            shutil.rmtree(d / e.name, ignore_errors=True)
    fsync_dir(d)


@contextlib.contextmanager
def stage_checkpoint(step: int, *, framework: str = "torch", ctx: RankContext | None = None,
                     checkpoint_dir: str | os.PathLike | None = None, keep: int | None = None,
                     extra: dict | None = None, verify: str = "hash", marker_timeout_s: float = 120.0):
    """Collective context manager: write this rank's shards into ``st.path``, commit on exit.

    Every rank must enter it for the same ``step``. Claim your files with ``st.add(path)``
    or ``st.file(name)``; files nobody claims are hashed by rank 0 at commit. ``extra`` (a
    JSON-able dict, rank 0's value wins) goes into the manifest. After the block
    ``st.committed`` is the new :class:`Checkpoint` on every rank. ``keep`` defaults to
    GLAUNCH_CHECKPOINT_KEEP; ``verify`` is how rank 0 re-checks the shards ("hash"/"size").
    """
    ctx = ctx or context()
    d = Path(checkpoint_dir) if checkpoint_dir is not None else ctx.checkpoint_dir
    keep = ctx.checkpoint_keep if keep is None else keep
    staging = d / staging_dir_name(step)
    if ctx.world_size > 1 and not is_distributed():
        raise CheckpointError("stage_checkpoint needs torch.distributed initialised when WORLD_SIZE > 1")
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
    st = Staging(path=staging, step=step, rank=ctx.rank, world_size=ctx.world_size)
    try:
        yield st
        _write_marker(st)
    except Exception as e:  # noqa: BLE001 - every rank must learn about it
        err = e
    if all_reduce_max([1 if err else 0])[0]:
        if err is not None:
            raise CheckpointError(f"step {step}: rank {ctx.rank} failed writing its shards: {err}") from err
        raise CheckpointError(f"step {step}: another rank failed writing its shards; nothing committed")
    outcome: tuple[str, str] | None = None
    if ctx.is_main:
        try:
            final = _commit(ctx, d, staging, step, framework, keep, extra, verify, marker_timeout_s)
            outcome = ("ok", str(final))
        except Exception as e:  # noqa: BLE001
            outcome = ("error", f"{type(e).__name__}: {e}")
    outcome = broadcast_object(outcome) if ctx.world_size > 1 else outcome
    if outcome is None or outcome[0] != "ok":
        raise CheckpointError(f"step {step}: commit failed: {outcome[1] if outcome else 'no answer'}")
    final = Path(outcome[1])
    manifest = json.loads((final / MANIFEST).read_text(encoding="utf-8"))
    st.committed = Checkpoint(step=step, path=final, manifest=manifest)
