"""torch.distributed as the training library uses it: the rendezvous environment a
stand-alone run lacks, the line a rank logs as it joins, and the few collectives the
library itself makes once the process group is up (joining and leaving it is
:mod:`launcher.runtime.processgroup`; the rank's environment, read without torch, is
:mod:`launcher.rundir.rankcontext`). No torch import at module level.
"""

from __future__ import annotations

import os
import sys

from launcher.rundir.rankcontext import RankContext, RuntimeConfigError, context, free_port, log, node_name


def export_rendezvous_env(ctx: RankContext | None = None) -> RankContext:
    """Fill in RANK/LOCAL_RANK/WORLD_SIZE/LOCAL_WORLD_SIZE/MASTER_ADDR/MASTER_PORT when missing.

    Only a stand-alone run lacks them; frameworks that insist on env:// (DeepSpeed,
    Lightning) then find a world of one on 127.0.0.1 and a free port. Existing values
    are never overwritten.
    """
    ctx = ctx or context()
    os.environ.setdefault("RANK", str(ctx.rank))
    os.environ.setdefault("LOCAL_RANK", str(ctx.local_rank))
    os.environ.setdefault("WORLD_SIZE", str(ctx.world_size))
    os.environ.setdefault("LOCAL_WORLD_SIZE", str(ctx.local_world_size))
    os.environ.setdefault("GROUP_RANK", str(ctx.node_rank))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if not os.environ.get("MASTER_PORT", "").strip():
        if ctx.world_size > 1:
            raise RuntimeConfigError("MASTER_PORT is not set (or empty) but WORLD_SIZE > 1")
        os.environ["MASTER_PORT"] = str(free_port())
    return context()


def log_joined(ctx: RankContext, backend: str, device: str | None = None, precision: str | None = None) -> None:
    """Where this rank sits, as it joins the process group (the logs show the placement and
    the precision it trains in)."""
    on = f" on {device}" if device else ""
    dtype = f", training in {precision}" if precision else ""
    log(f"joined {backend}: rank {ctx.rank}/{ctx.world_size}, local rank {ctx.local_rank}, "
        f"node {ctx.node_rank} ({node_name()}){on}{dtype}")


def is_distributed() -> bool:
    """True when torch.distributed is initialised with more than one rank (no torch import if unused)."""
    if "torch" not in sys.modules:
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def barrier() -> None:
    """dist.barrier() when distributed, else nothing."""
    if is_distributed():
        import torch.distributed as dist

        dist.barrier()


def broadcast_object(obj, src: int = 0):
    """Broadcast a picklable object from ``src`` to every rank (identity when not distributed)."""
    if not is_distributed():
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_reduce_max(values: list[int]) -> list[int]:
    """Element-wise MAX of small integer vectors across ranks (identity when not distributed)."""
    if not is_distributed():
        return list(values)
    import torch
    import torch.distributed as dist

    device = "cpu"
    if dist.get_backend() == "nccl":
        device = f"cuda:{torch.cuda.current_device()}"
    t = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [int(v) for v in t.tolist()]
