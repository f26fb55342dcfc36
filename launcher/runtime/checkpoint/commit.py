"""Committing a checkpoint: rank 0's commit (markers in, manifest written, staging dir
renamed, ``latest`` replaced, old ones pruned) and the agreement of all ranks on its
outcome. The collective save around them is :mod:`launcher.runtime.checkpoint.save`; the
protocol, step by step, is in :mod:`launcher.runtime.checkpoint`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

from launcher.rundir.files import fsync_dir
from launcher.rundir.rankcontext import RankContext, log
from launcher.runtime.checkpoint import checksums
from launcher.runtime.checkpoint.directory import (
    FORMAT,
    LATEST,
    MANIFEST,
    MARKER_RE,
    STAGING_RE,
    TRASH_PREFIX,
    Checkpoint,
    CheckpointError,
    list_checkpoints,
    staging_dir_name,
    step_dir_name,
)
from launcher.runtime.checkpoint.staging import fsync_together, publish_text, read_markers
from launcher.runtime.checkpoint.verify import read_manifest, verify_checkpoint
from launcher.runtime.distributed import all_reduce_max, broadcast_object, is_distributed


def commit(ctx: RankContext, d: Path, staging: Path, step: int, *, framework: str, keep: int,
           extra: dict | None = None, verify: str = "size", marker_timeout_s: float = 120.0,
           on_markers=None, prune_in_background: bool = False, layout: dict | None = None) -> Path:
    """Rank 0: the commit of a staged checkpoint (step 4 of the protocol); returns the final dir.

    ``on_markers(markers)``, if given, runs once all markers are in and returns manifest
    entries (``{"path", "size", algo: digest}``) for files rank 0 writes then (DCP's
    ``.metadata``), not fsynced: the commit makes them durable with the manifest.
    ``verify="hash"`` re-reads every shard instead of trusting the
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
        checksum = checksums.shard_checksum(e)
        if checksum is None:
            raise CheckpointError(f"rank {rank}'s entry for {rel} has no checksum")
        f = staging / rel
        try:
            size = f.stat().st_size
        except OSError:
            raise CheckpointError(f"rank {rank}'s shard {rel} is not visible to rank 0") from None
        if size != e["size"]:
            raise CheckpointError(f"shard {rel}: {size} bytes, rank {rank} wrote {e['size']}")
        if verify == "hash" and checksums.checksum_file(f, checksum[0]) != checksum[1]:
            raise CheckpointError(f"shard {rel}: {checksum[0]} differs from what rank {rank} wrote")
        shards[rel] = {"path": rel, "size": e["size"], checksum[0]: checksum[1], "rank": rank}
    unsynced = [staging / e["path"] for e in late]   # the ranks fsynced theirs before their markers
    for f in _files_under(staging):
        rel = f.relative_to(staging).as_posix()
        if rel in shards or rel == MANIFEST or MARKER_RE.match(f.name) or ".tmp-" in f.name:
            continue
        unsynced.append(f)   # written by a framework on some rank, finished before its marker
        algo = checksums.checksum_algorithm()
        shards[rel] = {"path": rel, "size": f.stat().st_size, algo: checksums.checksum_file(f, algo), "rank": None}
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
    final = d / step_dir_name(step)
    publish_text(staging / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    pointer = _stage_latest(d, final.name)
    # Everything the rename below commits is made durable first, in one go: the manifest,
    # the files written at commit, the shards' directory entries (every rank's files were
    # fsynced by their rank before its marker) and the new ``latest`` (a hint only).
    fsync_together(unsynced + [staging / MANIFEST], _shard_dirs(staging, shards), hints=[pointer] if pointer else [])
    if final.exists():   # the same step saved again (e.g. a stop right after resuming)
        old = d / f"{TRASH_PREFIX}{final.name}-{time.time_ns()}"
        os.rename(final, old)
    os.rename(staging, final)
    _point_latest(d, final.name, pointer)
    fsync_dir(d)   # the commit, and ``latest`` with it
    _prune(d, step, keep, in_background=prune_in_background)
    return final


def _shard_dirs(staging: Path, shards: dict[str, dict]) -> list[Path]:
    """The staging dir and every directory under it that holds a shard: their entries must be durable."""
    dirs = {staging}
    for rel in shards:
        dirs.update(p for p in (staging / rel).parents if p.is_relative_to(staging))
    return sorted(dirs)


def _stage_latest(d: Path, name: str) -> Path | None:
    """``latest``'s new text in a temp file beside it, renamed by :func:`_point_latest` once the
    checkpoint dir has its name; None (and a warning) when it cannot be written."""
    tmp = d / f".{LATEST}.tmp-{socket.gethostname()}-{os.getpid()}"
    try:
        tmp.unlink(missing_ok=True)   # whatever a killed writer left there: a new file, never written into
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(name)
    except OSError as e:
        log(f"warning: {d / LATEST} cannot be written ({e}); resume finds the newest complete checkpoint "
            "without it")
        return None
    return tmp


def _point_latest(d: Path, name: str, staged: Path | None) -> None:
    """Replace ``latest`` with what :func:`_stage_latest` wrote. The rename before it was the commit
    (resume never trusts ``latest``), so a pointer that cannot be written is a warning, not a
    failed save; a directory in its place (not ours) is moved aside first."""
    if staged is None:
        return
    pointer = d / LATEST
    try:
        if pointer.is_dir() and not pointer.is_symlink():
            to_trash(pointer)
        os.replace(staged, pointer)
    except OSError as e:
        log(f"warning: {name} is committed, but {pointer} could not be updated ({e}); "
            "resume finds the newest complete checkpoint without it")
        with contextlib.suppress(OSError):
            staged.unlink()


def _prune(d: Path, step: int, keep: int, *, in_background: bool = False) -> None:
    """Drop checkpoints newer than ``step`` (abandoned), damaged ones, complete ones beyond ``keep``,
    staging and trash dirs. Each goes by a rename to ``.trash-*`` first; with ``in_background``
    the deletion itself happens in a thread (an interrupted one leaves ``.trash-*``, removed here
    next time)."""
    doomed: list[Path] = []
    kept = 0
    abandoned = False
    for s, path in reversed(list_checkpoints(d)):
        if s > step:
            log(f"removing {path.name}: newer than the checkpoint just committed (abandoned)")
            doomed.append(to_trash(path))
            abandoned = True
            continue
        manifest, _ = verify_checkpoint(path, verify="size")
        if manifest is not None and kept < keep:
            kept += 1
            continue
        doomed.append(to_trash(path))
    for e in os.scandir(d):
        if STAGING_RE.match(e.name):
            doomed.append(to_trash(d / e.name))
        elif e.name.startswith(TRASH_PREFIX):
            doomed.append(d / e.name)
        elif e.name.startswith(f".{LATEST}.tmp-"):   # a new ``latest`` a killed commit never renamed
            with contextlib.suppress(OSError):
                os.unlink(d / e.name)
    if abandoned:
        # An abandoned timeline must not come back after a crash as the newest checkpoint;
        # an older one that comes back is only pruned again.
        fsync_dir(d)
    doomed = list(dict.fromkeys(doomed))
    if in_background:
        global _pruning
        _pruning = threading.Thread(target=delete_all, args=(doomed,), name="glaunch-prune", daemon=True)
        _pruning.start()
    else:
        delete_all(doomed)


def to_trash(path: Path) -> Path:
    """``path`` renamed to a ``.trash-*`` name beside it (``path`` itself when it cannot be)."""
    trash = path.with_name(f"{TRASH_PREFIX}{path.name.lstrip('.')}-{time.time_ns()}")
    try:
        os.rename(path, trash)
    except OSError:
        return path
    return trash


# The background prune's thread: while it runs, the ``.trash-*`` dirs are its work, not leftovers.
_pruning: threading.Thread | None = None


def pruning() -> bool:
    """Whether a background prune is still deleting (its ``.trash-*`` dirs are not leftovers)."""
    return _pruning is not None and _pruning.is_alive()


def delete_all(paths: list[Path]) -> None:
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)


def _files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink())


def discard_staging(ctx: RankContext, d: Path, step: int) -> None:
    """Rank 0, once no rank writes into it any more: remove a failed save's staging dir."""
    if ctx.is_main:
        staging = d / staging_dir_name(step)
        if staging.exists():
            delete_all([to_trash(staging)])


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
        discard_staging(ctx, final.parent, step)
        raise CheckpointError(f"step {step}: rank {bad}: {why}; nothing committed")
    manifest, why = read_manifest(final)
    if manifest is None:
        raise CheckpointError(f"step {step}: the committed {final} is not readable here ({why})")
    return Checkpoint(step=step, path=final, manifest=manifest)
