"""Committing a checkpoint: the collective :func:`stage_checkpoint`, rank 0's commit
(markers in, manifest written, staging dir renamed, ``latest`` replaced, old ones
pruned) and the agreement of all ranks on its outcome. The protocol, step by step, is
in :mod:`launcher.runtime.checkpoint`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from pathlib import Path

from launcher.rundir.files import atomic_write_text, fsync_dir
from launcher.runtime.checkpoint import checksums
from launcher.runtime import heartbeats
from launcher.runtime.checkpoint.layout import (
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
from launcher.runtime.checkpoint.staging import Staging, fsync_file, read_markers, write_marker
from launcher.runtime.checkpoint.verify import read_manifest, verify_checkpoint
from launcher.runtime.rankcontext import (
    RankContext,
    all_reduce_max,
    broadcast_object,
    context,
    is_distributed,
    log,
)


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
            _to_trash(pointer)
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
            doomed.append(_to_trash(path))
            continue
        manifest, _ = verify_checkpoint(path, verify="size")
        if manifest is not None and kept < keep:
            kept += 1
            continue
        doomed.append(_to_trash(path))
    for e in os.scandir(d):
        if STAGING_RE.match(e.name):
            doomed.append(_to_trash(d / e.name))
        elif e.name.startswith(TRASH_PREFIX):
            doomed.append(d / e.name)
    fsync_dir(d)
    doomed = list(dict.fromkeys(doomed))
    if in_background:
        global _pruning
        _pruning = threading.Thread(target=_delete_all, args=(doomed,), name="glaunch-prune", daemon=True)
        _pruning.start()
    else:
        _delete_all(doomed)


def _to_trash(path: Path) -> Path:
    trash = path.with_name(f"{TRASH_PREFIX}{path.name.lstrip('.')}-{time.time_ns()}")
    try:
        os.rename(path, trash)
    except OSError:
        return path
    return trash


# The background prune's thread: while it runs, the ``.trash-*`` dirs are its work, not leftovers.
_pruning: threading.Thread | None = None


def _delete_all(paths: list[Path]) -> None:
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)


def _files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink())


def open_staging(step: int, ctx: RankContext, d: Path) -> Staging:
    """Collective: rank 0 makes an empty ``.staging-step-N`` in ``d``; every rank gets its :class:`Staging`.

    Rank 0 first removes the staging dirs of earlier attempts (killed, or failed) and what
    an interrupted prune left: only one save is ever in flight, so they are dead, and on a
    full disk they would keep every later save from fitting.
    """
    from launcher.runtime.checkpoint.background import in_flight  # here: background imports this module

    staging = d / staging_dir_name(step)
    if ctx.world_size > 1 and not is_distributed():
        raise CheckpointError("checkpoints need torch.distributed initialised when WORLD_SIZE > 1")
    err: str | None = None
    if ctx.is_main:
        pending = in_flight()
        busy = None if pending is None else staging_dir_name(pending.step)
        try:
            d.mkdir(parents=True, exist_ok=True)
            for e in os.scandir(d):
                if STAGING_RE.match(e.name) and e.name != busy:
                    _delete_all([_to_trash(d / e.name)])
                elif e.name.startswith(TRASH_PREFIX) and not (_pruning and _pruning.is_alive()):
                    _delete_all([d / e.name])           # an interrupted prune's
            staging.mkdir()
            fsync_dir(d)
        except OSError as e:
            err = f"{type(e).__name__}: {e}"
    if first_failed_rank(ctx, err is not None) is not None:
        why = broadcast_object(err) if is_distributed() else err
        raise CheckpointError(f"cannot create {staging}: {why}")
    return Staging(path=staging, step=step, rank=ctx.rank, world_size=ctx.world_size)


def discard_staging(ctx: RankContext, d: Path, step: int) -> None:
    """Rank 0, once no rank writes into it any more: remove a failed save's staging dir."""
    if ctx.is_main:
        staging = d / staging_dir_name(step)
        if staging.exists():
            _delete_all([_to_trash(staging)])


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
    from launcher.runtime.checkpoint.background import wait_checkpoints  # here: background imports this module

    ctx = ctx or context()
    wait_checkpoints(ctx)   # at most one save in flight: its staging dir is not this one's to clean
    # The loop stalls for the whole save: the hang watchdog gives it the save's bound
    # (inside an adapter's own mark, this changes nothing).
    with heartbeats.saving(step):
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
            discard_staging(ctx, d, step)
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
            discard_staging(ctx, d, step)
            raise CheckpointError(f"step {step}: commit failed: {outcome[1] if outcome else 'no answer'}")
        final = Path(outcome[1])
        manifest = json.loads((final / MANIFEST).read_text(encoding="utf-8"))
        st.committed = Checkpoint(step=step, path=final, manifest=manifest)
