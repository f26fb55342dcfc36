"""Plain-torch adapter: model, optimizer, scheduler, RNG and data position through the atomic scheme.

Files in a checkpoint written by :func:`save_torch_state`::

    state/                a torch.distributed.checkpoint (DCP) directory: model + optimizer
      __R_0.distcp          (+ scheduler) state; every rank writes its share, replicated DDP
      .metadata             tensors spread over the ranks, FSDP2 shards by their owner
    rank-RRRRR.pt         every rank: its RNG states (python, numpy, torch, cuda) + rank_state

Model and optimizer state go through ``torch.distributed.checkpoint.state_dict``
(``get_state_dict`` / ``set_state_dict``: parameter names, not positions), so plain
modules, DDP and FSDP2 (``fully_shard``) models all save and load the same way, and a
checkpoint loads at another world size (DCP reshards). Checkpoints of the earlier
layout (``model.pt`` written by rank 0, or ``model-rank-RRRRR.pt`` with
``per_rank_model=True``) still load.

Everything loads with ``weights_only=True`` except DCP's non-tensor entries (optimizer
hyper-parameters, scheduler state), which DCP itself unpickles.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys

from launcher.rundir.files import open_regular
from launcher.rundir.rankcontext import RankContext, context, log
from launcher.runtime import heartbeats
from launcher.runtime.checkpoint import background
from launcher.runtime.checkpoint.commit import agree, commit, first_failed_rank
from launcher.runtime.checkpoint.save import open_staging, stage_checkpoint
from launcher.runtime.checkpoint.directory import Checkpoint, CheckpointDamaged, CheckpointError, step_dir_name
from launcher.runtime.checkpoint.selection import resume_checkpoint
from launcher.runtime.checkpoint.staging import fsync_file, in_thread, write_failure_marker, write_marker

MODEL_FILE = "model.pt"
STATE_DIR = "state"
# Rank 0 waits this long at commit for the other ranks' done markers (their writes run in parallel).
MARKER_TIMEOUT_S = 1800.0


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def model_rank_file(rank: int) -> str:
    return f"model-rank-{rank:05d}.pt"


def rng_file(rank: int) -> str:
    """A rank's RNG states, for the adapters whose framework writes the rest."""
    return f"rng-rank-{rank:05d}.pt"


def save_rng(staging, rank: int) -> None:
    """This rank's RNG states into the checkpoint being staged."""
    import torch

    torch.save(rng_state(), staging.file(rng_file(rank)))


def restore_rng(ckpt: Checkpoint, rank: int, world_size: int) -> bool:
    """This rank's RNG states from `ckpt`, when it was written by as many ranks (else
    rank 0 says once that the run is no longer bitwise reproducible)."""
    if ckpt.world_size != world_size:
        warn_rng_not_restored(ckpt.world_size, world_size, rank)
        return False
    f = ckpt.path / rng_file(rank)
    if not f.exists():
        log(f"no RNG state for rank {rank} in {ckpt.path.name}: resume is not bitwise reproducible")
        return False
    set_rng_state(load_file(f))
    return True


def load_file(path) -> dict:
    """torch.load of a checkpoint file, opened as a regular file only (a FIFO in its place
    would block the rank): CheckpointError naming it otherwise."""
    import torch

    try:
        fd = open_regular(path)
    except OSError as exc:
        raise CheckpointError(f"{path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        return torch.load(f, map_location="cpu", weights_only=True)


def warn_rng_not_restored(saved_world_size: int, world_size: int, rank: int) -> None:
    """The one warning (rank 0's) of a resume at another world size: each rank's RNG stream
    belongs to a rank of the saved run, so none is restored."""
    if rank == 0:
        log(f"resumed at world size {world_size} from a checkpoint saved at world size {saved_world_size}: "
            "per-rank RNG streams are not restored; the run is no longer bitwise reproducible")


def unwrap(model):
    """The user's module inside DDP / DeepSpeed engine / torch.compile wrappers."""
    for _ in range(8):
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None or inner is model:
            return model
        model = inner
    return model


def rng_state() -> dict:
    """This process's RNG states as plain python types and tensors."""
    import torch

    py = random.getstate()
    state = {"python": [py[0], list(py[1]), py[2]], "torch": torch.get_rng_state()}
    if "numpy" in sys.modules:
        import numpy as np

        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [name, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` returned."""
    import torch

    if "python" in state:
        v, internal, gauss = state["python"]
        random.setstate((v, tuple(internal), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _app_state(model, optimizer=None, scheduler=None) -> dict:
    """``{"model": ..., "optimizer": ..., "scheduler": ...}`` keyed by parameter names (DCP's state_dict API)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is not None:
        msd, osd = get_state_dict(model, optimizer)
        state = {"model": msd, "optimizer": osd}
    else:
        state = {"model": get_model_state_dict(model)}
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    return state


def _stepped(optimizer) -> bool:
    """Whether the optimizer has state yet. Before its first step DCP's state_dict API would
    create some with a zero-gradient step, changing what the next real step does."""
    optimizers = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
    return all(bool(o.state) for o in optimizers)


def _rank_blob(step: int, ctx: RankContext, rank_state: dict | None) -> dict:
    return {"step": step, "rank": ctx.rank, "world_size": ctx.world_size,
            "rng": rng_state(), "rank_state": rank_state or {}}


_host_buffers = None


def _buffers():
    global _host_buffers
    if _host_buffers is None:
        from launcher.runtime.checkpoint.dcp import HostBuffers

        _host_buffers = HostBuffers()
    return _host_buffers


def save_torch_state(step: int, model, optimizer=None, *, scheduler=None, extra: dict | None = None,
                     rank_state: dict | None = None, per_rank_model: bool = False,
                     ctx: RankContext | None = None, framework: str = "torch", blocking: bool = True):
    """Collective: checkpoint ``step`` atomically.

    Every rank writes its share of the model and optimizer state with
    torch.distributed.checkpoint (replicated state is spread over the ranks) and its
    own ``rank-RRRRR.pt`` (RNG states, ``rank_state`` such as its data position),
    checksummed as written; rank 0 commits once every rank's done marker is in.
    ``extra`` (rank 0's) is stored in the manifest (:attr:`Checkpoint.extra`).

    ``blocking=True`` returns the committed :class:`Checkpoint`. ``blocking=False``
    returns a :class:`~launcher.runtime.checkpoint.background.PendingCheckpoint` as soon as this
    rank's share is copied to host memory; writing and commit go on in a thread, and
    :func:`~launcher.runtime.checkpoint.background.wait_checkpoints` (collective) returns the
    committed checkpoint or raises the failure on every rank. A save in flight is
    waited for first, here, so at most one is ever in flight, and a failed one is
    raised by the next call.

    ``per_rank_model=True`` writes each rank's whole state dict with ``torch.save``
    instead (for models whose state differs per rank and is not sharded DTensors).

    The heartbeat says ``saving`` while the loop waits for the save: the whole of a
    blocking one, the plan and the copy to host memory of a background one (its
    writing goes on while the loop steps).
    """
    ctx = ctx or context()
    background.wait_checkpoints(ctx)
    with heartbeats.saving(step if blocking or per_rank_model else None):
        if per_rank_model:
            return _save_per_rank(step, model, optimizer, scheduler=scheduler, extra=extra, rank_state=rank_state,
                                  ctx=ctx, framework=framework)
        return _save_dcp(step, model, optimizer, scheduler=scheduler, extra=extra, rank_state=rank_state,
                         ctx=ctx, framework=framework, blocking=blocking)


def _save_dcp(step, model, optimizer, *, scheduler, extra, rank_state, ctx, framework, blocking):
    from launcher.runtime.checkpoint import dcp

    d = ctx.checkpoint_dir
    st = open_staging(step, ctx, d)
    writer = dcp.ChecksummingWriter(st.path / STATE_DIR, thread_count=dcp.io_threads(ctx))
    planner = dcp.StagingPlanner()
    state: dict = {}
    state_error: BaseException | None = None
    optimizer_saved = optimizer is not None and _stepped(optimizer)
    try:
        state = _app_state(model, optimizer if optimizer_saved else None, scheduler)
    except Exception as e:   # reported on every rank by plan_save
        state_error = e
    layout = {"state": "dcp", "dir": STATE_DIR,
              "optimizer": "saved" if optimizer_saved else "unstepped" if optimizer is not None else "none"}
    plan, metadata = dcp.plan_save(state, writer, planner, ctx, local_error=state_error)
    blob = _rank_blob(step, ctx, rank_state)
    final = d / step_dir_name(step)
    stage_error: BaseException | None = None
    if not blocking:
        try:
            planner.stage(plan, _buffers())
        except Exception as e:   # becomes this rank's failure marker
            stage_error = e
    del state

    def write_part() -> str | None:
        """This rank's files and done marker (no collective: may run in a thread)."""
        try:
            if stage_error is not None:
                raise stage_error
            results = _write_rank_file_and(st, blob, lambda: dcp.write_share(plan, planner, writer,
                                                                              skip_zip_crc32=blocking))
            for path, (size, algo, digest) in writer.written.items():
                st.record(path, size, algo, digest)
            st.payload = {"dcp": dcp.encode_results(results)}
            write_marker(st)
        except Exception as e:   # rank 0 stops waiting on the failure marker
            write_failure_marker(st, e)
            return f"{type(e).__name__}: {e}"
        return None

    def commit_part() -> str | None:
        """Rank 0: DCP's .metadata from the markers' write results, then the commit (no collective)."""
        def write_metadata(markers: list[dict]) -> list[dict]:
            path, (size, algo, digest) = dcp.write_metadata(
                writer, metadata, [dcp.decode_results(m["payload"]["dcp"]) for m in markers])
            return [{"path": path.relative_to(st.path).as_posix(), "size": size, algo: digest}]

        try:
            commit(ctx, d, st.path, step, framework=framework, keep=ctx.checkpoint_keep, extra=extra,
                   marker_timeout_s=MARKER_TIMEOUT_S, on_markers=write_metadata, prune_in_background=True,
                   layout=layout)
        except Exception as e:   # every rank learns it in agree()
            return f"commit failed: {type(e).__name__}: {e}"
        return None

    if not blocking:
        def work() -> str | None:
            error = write_part()
            return commit_part() if error is None and ctx.is_main else error

        return background.start(step, final, work)
    error = write_part()
    # Blocking: a collective before the commit, so rank 0 finds every marker at once, no polling.
    if first_failed_rank(ctx, error is not None) is None and ctx.is_main:
        error = commit_part()
    return agree(ctx, step, final, error)


def _write_rank_file_and(st, blob: dict, write_data):
    """This rank's ``rank-RRRRR.pt`` (``blob``), then ``write_data()``; returns what that returned.

    The small file is fsynced in a thread while the data is written, so that the end of the
    save, which the other ranks wait for, waits for the data's fsync alone."""
    with st.open(rank_file(st.rank), sync=False) as f:
        _torch_save(blob, f)
    synced = in_thread(fsync_file, st.path / rank_file(st.rank))
    try:
        written = write_data()
    except BaseException:
        with contextlib.suppress(OSError):   # the data's error is the one to report
            synced()
        raise
    synced()
    return written


def _torch_save(obj, f) -> None:
    import torch

    torch.save(obj, f)


def _save_per_rank(step, model, optimizer, *, scheduler, extra, rank_state, ctx, framework) -> Checkpoint:
    with stage_checkpoint(step, framework=framework, ctx=ctx, extra=extra) as st:
        blob = {"step": step, "model": unwrap(model).state_dict(), "extra": extra or {}}
        if optimizer is not None:
            blob["optimizer"] = optimizer.state_dict()
        if scheduler is not None:
            blob["scheduler"] = scheduler.state_dict()
        with st.open(model_rank_file(ctx.rank)) as f:
            _torch_save(blob, f)
        with st.open(rank_file(ctx.rank)) as f:
            _torch_save(_rank_blob(step, ctx, rank_state), f)
    return st.committed


def load_torch_state(ckpt: Checkpoint, model, optimizer=None, *, scheduler=None, strict: bool = True,
                     restore_rng: bool = True, ctx: RankContext | None = None) -> dict:
    """Load what :func:`save_torch_state` wrote; returns ``{"step", "extra", "rank_state", "rng_restored"}``.

    Collective for DCP checkpoints (every rank loads its share; another world size, or
    DDP <-> FSDP2, is resharded). The checksums ``ckpt.pending`` leaves to the load are
    taken while it reads: :class:`CheckpointDamaged` on every rank, with the model and
    optimizer untouched, when a file does not match. An optimizer without state gets it from
    the checkpoint alone: no step is run to create what the load overwrites. RNG states and
    ``rank_state`` are restored only when the checkpoint was written by as many ranks;
    otherwise a warning says that the run continues but is no longer bitwise reproducible.
    """
    ctx = ctx or context()
    state_dir = ckpt.path / STATE_DIR
    if not (state_dir / ".metadata").exists():
        step, extra = _load_files(ckpt, model, optimizer, scheduler=scheduler, strict=strict, ctx=ctx)
    else:
        _load_dcp(ckpt, model, optimizer, scheduler=scheduler, strict=strict, ctx=ctx)
        step, extra = ckpt.step, ckpt.extra
    rank_state: dict = {}
    restored = False
    rf = ckpt.path / rank_file(ctx.rank)
    if ckpt.world_size != ctx.world_size:
        warn_rng_not_restored(ckpt.world_size, ctx.world_size, ctx.rank)
    elif rf.exists():
        r = load_file(rf)
        rank_state = r.get("rank_state") or {}
        if restore_rng:
            set_rng_state(r["rng"])
            restored = True
    else:
        log(f"no {rf.name} in {ckpt.path.name}: RNG states not restored, resume is not bitwise reproducible")
    return {"step": step, "extra": extra, "rank_state": rank_state, "rng_restored": restored}


def _load_dcp(ckpt: Checkpoint, model, optimizer, *, scheduler, strict: bool, ctx: RankContext) -> None:
    """Model, optimizer (and scheduler) state from the checkpoint's DCP directory, in place.

    An optimizer without state gets its entries allocated, uninitialised, from the
    checkpoint's metadata (DCP would run a step to create them); the load fills them or,
    where it reads one whole, puts what it read in its place; a failed load takes them away.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    from launcher.runtime.checkpoint import dcp
    from launcher.runtime.checkpoint.optimizer_state import allocate_from_metadata

    state_dir = ckpt.path / STATE_DIR
    metadata = dcp.read_metadata(state_dir)
    saved = dcp.saved_keys(metadata)
    if optimizer is not None and "optimizer" not in saved:
        if ckpt.layout.get("optimizer") != "unstepped":
            raise CheckpointError(f"{ckpt.path} holds no optimizer state")
        optimizer = None   # saved before the optimizer's first step: it stays as constructed
    optimizers = [] if optimizer is None else list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
    allocated = allocate_from_metadata(model, optimizers, metadata)
    placeholders = [t for o in allocated for entries in o.state.values() for t in entries.values()
                    if t is not None]
    try:
        state = _app_state(model, optimizer, scheduler if "scheduler" in saved else None)
        prefix = f"{STATE_DIR}/"
        reader = dcp.VerifyingReader(state_dir, {s["path"][len(prefix):]: s for s in ckpt.pending
                                                 if s["path"].startswith(prefix)}, ctx) if ckpt.pending else None
        dcp.load(state, state_dir, ctx, allow_partial=not strict, reader=reader, replaceable=placeholders)
        set_state_dict(model, optimizers, model_state_dict=state["model"],
                       optim_state_dict=state.get("optimizer", {}), options=StateDictOptions(strict=strict))
    except BaseException:
        for o in allocated:   # uninitialised entries must not outlive a failed load
            o.state.clear()
        raise
    if "scheduler" in state:
        scheduler.load_state_dict(state["scheduler"])


def resume_torch_state(model, optimizer=None, *, scheduler=None, strict: bool = True,
                       restore_rng: bool = True, ctx: RankContext | None = None) -> dict | None:
    """:func:`resume_checkpoint` + :func:`load_torch_state` of the newest complete checkpoint,
    reading its model and optimizer files once: their checksums are taken while they load
    (``verify="load"``), not in a pass of their own before. A checkpoint whose files do
    not match is refused before anything of it reaches the model, and the next older
    complete one is loaded instead. Collective, on every rank.

    None when there is no complete checkpoint, else :func:`load_torch_state`'s dict with
    ``"checkpoint"``, the :class:`Checkpoint` loaded. None, reading nothing, in a process
    started in place of a lost rank (``ctx.peer_join``, recovery.peer): its peers are in a
    recovery, not here, and the state it needs comes from one of them.
    """
    ctx = ctx or context()
    if ctx.peer_join is not None:
        log("this process replaces a lost rank: its state comes from a live peer, no checkpoint is read")
        return None
    refused: list[str] = []
    while True:
        ckpt = resume_checkpoint(ctx, verify="load", refused=refused)
        if ckpt is None:
            return None
        try:
            loaded = load_torch_state(ckpt, model, optimizer, scheduler=scheduler, strict=strict,
                                      restore_rng=restore_rng, ctx=ctx)
        except CheckpointDamaged as e:
            if ctx.is_main:
                log(f"checkpoint {e}; ignoring it")
            refused.append(ckpt.path.name)
            continue
        return {**loaded, "checkpoint": ckpt}


def _load_files(ckpt: Checkpoint, model, optimizer, *, scheduler, strict: bool, ctx: RankContext):
    """The ``torch.save`` layouts: ``model-rank-RRRRR.pt`` (per_rank_model) or rank 0's ``model.pt``."""
    per_rank = ckpt.path / model_rank_file(ctx.rank)
    path = per_rank if per_rank.exists() else ckpt.path / MODEL_FILE
    if not path.exists():
        raise CheckpointError(f"{ckpt.path} has neither {STATE_DIR}/ nor {MODEL_FILE} nor {per_rank.name}")
    blob = load_file(path)
    unwrap(model).load_state_dict(blob["model"], strict=strict)
    if optimizer is not None:
        if "optimizer" not in blob:
            raise CheckpointError(f"{path} holds no optimizer state")
        optimizer.load_state_dict(blob["optimizer"])
    if scheduler is not None and "scheduler" in blob:
        scheduler.load_state_dict(blob["scheduler"])
    return int(blob.get("step", ckpt.step)), blob.get("extra") or {}
