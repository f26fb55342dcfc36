"""Which checkpoint to resume from: the newest one whose manifest verifies, never ``latest``
on its word alone; with torch.distributed, the same on every rank and the re-check
spread over the ranks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from pathlib import Path

from launcher.errors import GlaunchError
from launcher.rundir import claims
from launcher.rundir.files import atomic_write_text
from launcher.rundir.layout import RunDir
from launcher.rundir.rankcontext import RankContext, context, log
from launcher.runtime.checkpoint.directory import (
    LATEST,
    Checkpoint,
    CheckpointError,
    latest_pointer,
    list_checkpoints,
)
from launcher.runtime.checkpoint.verify import check_shards, load_checked, read_manifest, verify_checkpoint
from launcher.runtime.distributed import all_reduce_max, broadcast_object, is_distributed


def _warn_latest(d: Path, found: Checkpoint | None) -> None:
    pointer, why = latest_pointer(d)
    if why is not None:
        log(f"warning: {d / LATEST} {why}; using the newest complete checkpoint, "
            f"{found.path.name if found else 'none'}")
    if pointer is not None and (found is None or pointer != found.path.name):
        log(f"warning: {d / LATEST} names {pointer!r}, but the newest complete checkpoint is "
            f"{found.path.name if found else 'none'}; using that")


def _found(step: int, path: Path, manifest: dict, verify: str) -> Checkpoint:
    pending = tuple(load_checked(manifest)) if verify == "load" else ()
    return Checkpoint(step=step, path=path, manifest=manifest, pending=pending)


def latest_complete(checkpoint_dir: str | os.PathLike, *, verify: str = "hash",
                    quiet: bool = False, refused: Collection[str] = ()) -> Checkpoint | None:
    """The newest ``step-*`` checkpoint whose manifest verifies, or None (one process checks all).

    Does not trust ``latest``: a damaged or missing target is skipped with a warning on
    stderr and the newest complete one is returned instead. Never returns a staging dir,
    nor one named in ``refused`` (dirs a load found damaged).
    """
    d = Path(checkpoint_dir)
    found: Checkpoint | None = None
    for step, path in reversed(list_checkpoints(d)):
        if path.name in refused:
            continue
        manifest, why = verify_checkpoint(path, verify=verify)
        if manifest is not None:
            found = _found(step, path, manifest, verify)
            break
        if not quiet:
            log(f"checkpoint {path} is not complete ({why}); ignoring it")
    if not quiet:
        _warn_latest(d, found)
    return found


def _latest_complete_spread(ctx: RankContext, verify: str, refused: Collection[str]) -> Checkpoint | None:
    """:func:`latest_complete` with the checksums split over the ranks (collective).

    Rank 0 lists the candidates and reads each manifest; every rank checks all sizes
    and re-checksums its share of the files (:func:`verify_share`); an all_reduce of
    the ranks' verdicts decides, so all ranks take the same checkpoint.
    """
    d = ctx.checkpoint_dir
    names = broadcast_object([p.name for _, p in reversed(list_checkpoints(d)) if p.name not in refused]
                             if ctx.is_main else None)
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
            return _found(int(manifest["step"]), path, manifest, verify)
        if ctx.is_main:
            log(f"checkpoint {path} is not complete ({why or mine or 'a shard failed on another rank'}); "
                "ignoring it")
    return None


def resume_checkpoint(ctx: RankContext | None = None, *, verify: str = "hash",
                      refused: Collection[str] = ()) -> Checkpoint | None:
    """The newest complete checkpoint of the run's checkpoint dir, the same on all ranks.

    Call on every rank, after torch.distributed is initialised when world_size > 1: the
    full re-check (sizes, and checksums with ``verify="hash"``) is then spread over the
    ranks. Without torch.distributed each process checks everything itself.
    ``verify="load"`` leaves the checksums of the DCP data files to the load
    (``Checkpoint.pending``; :func:`launcher.runtime.resume_torch_state`), which falls back
    to the next older checkpoint, passing its dir in ``refused``, when one does not match.
    """
    ctx = ctx or context()
    refuse_anothers(ctx)
    if ctx.world_size > 1 and is_distributed():
        found = _latest_complete_spread(ctx, verify, refused)
        if ctx.is_main:
            _warn_latest(ctx.checkpoint_dir, found)
    else:
        found = latest_complete(ctx.checkpoint_dir, verify=verify, quiet=not ctx.is_main, refused=refused)
    if ctx.is_main and not ctx.standalone:
        _note_resume(ctx, found)
    return found


def refuse_anothers(ctx: RankContext) -> None:
    """CheckpointError when the checkpoint directory's claim names another run: a run never
    loads another's state (a copied run directory, a job started by hand). Stand-alone
    scripts and directories without a claim are not checked."""
    if ctx.standalone or not ctx.run_id:
        return
    try:
        owner = claims.owner_of(ctx.checkpoint_dir)
    except GlaunchError as exc:
        raise CheckpointError(str(exc)) from None
    if owner is not None and owner.run_id != ctx.run_id:
        raise CheckpointError(f"{ctx.checkpoint_dir} holds the checkpoints of run {owner.run_id} "
                              f"({owner.run_dir}), not of this run ({ctx.run_id}): nothing is loaded from it")


def _note_resume(ctx: RankContext, found: Checkpoint | None) -> None:
    """<run_dir>/resume.json: the step this start resumed from, for run.json's record of starts."""
    try:
        ctx.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(RunDir(ctx.run_dir).resume_file, json.dumps(
            {"restart": ctx.restart, "job_id": ctx.job_id, "step": None if found is None else found.step}) + "\n")
    except OSError as exc:
        log(f"could not write {RunDir(ctx.run_dir).resume_file}: {exc}")
