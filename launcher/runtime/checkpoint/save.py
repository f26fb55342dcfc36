"""One collective save: :func:`open_staging` (step 1 of the protocol in
:mod:`launcher.runtime.checkpoint`) and :func:`stage_checkpoint`, which runs it from the
staging dir to the agreed commit (steps 1-5).

Above the background save (:mod:`launcher.runtime.checkpoint.background`): a new save
first waits for the one in flight, and leaves its staging dir alone.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from launcher.rundir.files import load_json_object
from launcher.rundir.rankcontext import RankContext, context
from launcher.runtime import heartbeats
from launcher.runtime.checkpoint.background import in_flight, wait_checkpoints
from launcher.runtime.checkpoint.commit import (
    commit,
    delete_all,
    discard_staging,
    first_failed_rank,
    pruning,
    to_trash,
)
from launcher.runtime.checkpoint.directory import (
    MANIFEST,
    STAGING_RE,
    TRASH_PREFIX,
    Checkpoint,
    CheckpointError,
    staging_dir_name,
)
from launcher.runtime.checkpoint.staging import Staging, write_marker
from launcher.runtime.distributed import all_reduce_max, broadcast_object, is_distributed


def open_staging(step: int, ctx: RankContext, d: Path) -> Staging:
    """Collective: rank 0 makes an empty ``.staging-step-N`` in ``d``; every rank gets its :class:`Staging`.

    Rank 0 first removes the staging dirs of earlier attempts (killed, or failed) and what
    an interrupted prune left: only one save is ever in flight, so they are dead, and on a
    full disk they would keep every later save from fitting.
    """
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
                    delete_all([to_trash(d / e.name)])
                elif e.name.startswith(TRASH_PREFIX) and not pruning():
                    delete_all([d / e.name])           # an interrupted prune's
            staging.mkdir()   # durable with the rest at the commit (its rename is what counts)
        except OSError as e:
            err = f"{type(e).__name__}: {e}"
    if first_failed_rank(ctx, err is not None) is not None:
        why = broadcast_object(err) if is_distributed() else err
        raise CheckpointError(f"cannot create {staging}: {why}")
    return Staging(path=staging, step=step, rank=ctx.rank, world_size=ctx.world_size)


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
    :func:`launcher.runtime.checkpoint.commit.commit`.
    """
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
        try:
            manifest = load_json_object(final / MANIFEST)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"step {step}: committed, but {final / MANIFEST} cannot be read back: {e}") from None
        st.committed = Checkpoint(step=step, path=final, manifest=manifest)
