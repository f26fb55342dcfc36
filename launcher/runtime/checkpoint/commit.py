"""Committing a checkpoint: rank 0's commit (markers in, manifest written, staging dir
renamed, ``latest`` replaced, old ones pruned) and the agreement of all ranks on its
outcome. The collective save around them is :mod:`launcher.runtime.checkpoint.save`; the
protocol, step by step, is in :mod:`launcher.runtime.checkpoint`.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

from launcher.rundir.files import atomic_write_text, fsync_dir
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
from launcher.runtime.checkpoint.staging import fsync_file, read_markers
from launcher.runtime.checkpoint.verify import read_manifest, verify_checkpoint
from launcher.runtime.distributed import all_reduce_max, broadcast_object, is_distributed


def commit(ctx: RankContext, d: Path, staging: Path, step: int, *, framework: str, keep: int,
           extra: dict | None = None, verify: str = "size", marker_timeout_s: float = 120.0,
           on_markers=None, prune_in_background: bool = False, layout: dict | None = None) -> Path:
    """Rank 0: the commit of a staged checkpoint (step 4 of the protocol); returns the final dir.

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
    for f in _files_under(staging):
        rel = f.relative_to(staging).as_posix()
        if rel in shards or rel == MANIFEST or MARKER_RE.match(f.name) or ".tmp-" in f.name:
            continue
        fsync_file(f)   # written by a framework on some rank, finished before its marker
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
    atomic_write_text(staging / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    fsync_dir(staging)
    final = d / step_dir_name(step)
    if final.exists():   # the same step saved again (e.g. a stop right after resuming)
        old = d / f"{TRASH_PREFIX}{final.name}-{time.time_ns()}"
        os.rename(final, old)
    os.rename(staging, final)
    fsync_dir(d)
    _point_latest(d, final.name)
    _prune(d, step, keep, in_background=prune_in_background)
    return final


def _point_latest(d: Path, name: str) -> None:
    """Replace ``latest``. The rename before it was the commit (resume never trusts ``latest``),
    so a pointer that cannot be written is a warning, not a failed save; a directory in its
    place (not ours) is moved aside first."""
    pointer = d / LATEST
    try:
        if pointer.is_dir() and not pointer.is_symlink():
            to_trash(pointer)
        atomic_write_text(pointer, name)
    except OSError as e:
        log(f"warning: {name} is committed, but {pointer} could not be updated ({e}); "
            "resume finds the newest complete checkpoint without it")


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
            doomed.append(to_trash(path))
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
