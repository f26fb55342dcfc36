"""Joining and leaving the torch.distributed process group.

Above both the rank's placement (:mod:`launcher.runtime.device`: which device, which
backend) and the background checkpoint save (:mod:`launcher.runtime.checkpoint.background`),
which must be over before the group goes. No torch import at module level.
"""

from __future__ import annotations

import datetime
import sys
from typing import Any

from launcher.rundir.rankcontext import RankContext
from launcher.runtime.checkpoint.background import wait_checkpoints
from launcher.runtime.device import placement
from launcher.runtime.peer import group_backend, peer_finished, peer_store
from launcher.runtime.distributed import export_rendezvous_env, log_joined


def init_distributed(ctx: RankContext | None = None, backend: str | None = None,
                     timeout_s: float | None = None) -> RankContext:
    """Initialise torch.distributed (env:// rendezvous) unless already done; returns the context.

    Also works stand-alone (world of one on a free local port), so the same script
    runs by hand. Device and backend come from :func:`launcher.runtime.device.placement`:
    with CUDA the current device is set to this rank's GPU first and the backend is NCCL.
    """
    import torch.distributed as dist

    ctx = export_rendezvous_env(ctx)
    if dist.is_initialized():
        return ctx
    where = placement(ctx, backend=backend)
    # Only when given: torch before 2.2 takes no None for the default.
    kwargs: dict[str, Any] = {}
    if timeout_s is not None:
        kwargs["timeout"] = datetime.timedelta(seconds=timeout_s)
    where.activate()
    # Under recovery.peer, gloo's group is one whose connections a recovery forms again, met
    # through a store that outlives every rank's process.
    backend = group_backend(where.backend)
    store = peer_store(ctx, backend, kwargs.get("timeout"))
    if store is not None:
        kwargs["store"] = store
    else:
        kwargs["init_method"] = "env://"
    dist.init_process_group(backend=backend, rank=ctx.rank, world_size=ctx.world_size, **kwargs)
    log_joined(ctx, where.backend, where.device, where.describe_precision())
    return ctx


def shutdown_distributed() -> None:
    """Barrier, then destroy the default process group (if any). Call on every rank before exiting.

    The barrier matters: a rank that tears down gloo while a peer is still busy can die
    with "terminate called without an active exception" (seen with DeepSpeed ZeRO-3 on CPU).
    """
    if "torch" not in sys.modules:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        wait_checkpoints()
        if dist.get_world_size() > 1:
            dist.barrier()
        peer_finished()
        dist.destroy_process_group()
        if "launcher.runtime.peergroup" in sys.modules:
            # Under peer recovery, a generation's gloo group left in a reference cycle (the
            # frames of the failure that ended it) would otherwise go at the interpreter's
            # finalization, its threads torn down there ("terminate called without an active
            # exception", the process's status then -6 after a run that completed).
            import gc

            gc.collect()
