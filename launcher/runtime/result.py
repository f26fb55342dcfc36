"""result.json (a finished run) and stop.json (a graceful stop), written atomically by rank 0.
Both also end the start's heartbeats and telemetry on every rank (:mod:`.heartbeats`)."""

from __future__ import annotations

import hashlib
import json
import time

from launcher.rundir.files import atomic_write_text
from launcher.rundir.layout import RunDir
from launcher.rundir.rankcontext import RankContext, context
from launcher.runtime import heartbeats, stopflag
from launcher.runtime.checkpoint.background import wait_checkpoints
from launcher.runtime.torchstate import unwrap
from launcher.runtime.stop import stop_signal


def _is_zero3_param(p) -> bool:
    return hasattr(p, "ds_id") and hasattr(p, "ds_status")


def param_sha256(model) -> str:
    """SHA-256 over all parameters, sorted by name, as contiguous float32 CPU bytes.

    Wrappers (DDP, DeepSpeed engine) are looked through, so names, and hence hashes,
    agree between launch paths. ZeRO-3 partitioned parameters are gathered one at a
    time (``deepspeed.zero.GatheredParameters``): then this is a collective and every
    rank must call it.
    """
    import torch

    module = unwrap(model)
    named = sorted(module.named_parameters(), key=lambda kv: kv[0])
    h = hashlib.sha256()
    for _name, p in named:
        if _is_zero3_param(p):
            import deepspeed

            with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
                data = p.detach().to("cpu", torch.float32).contiguous().clone()
        else:
            if hasattr(p, "full_tensor"):       # a DTensor (FSDP2): the whole parameter, a collective
                p = p.full_tensor()
            data = p.detach().to("cpu", torch.float32).contiguous()
        h.update(data.numpy().tobytes())
    return h.hexdigest()


def write_result(final_step: int, *, model=None, final_loss: float | None = None,
                 param_hash: str | None = None, resumed_from: int | None = None,
                 ctx: RankContext | None = None, extra: dict | None = None) -> dict:
    """Call on every rank at the end of training; rank 0 writes ``<run_dir>/result.json``.

    Keys: final_step, world_size, final_loss, param_sha256 (of ``model`` unless
    ``param_hash`` is given), resumed_from (step or null), restarts (GLAUNCH_RESTART).
    Returns the dict (on every rank).
    """
    ctx = ctx or context()
    wait_checkpoints(ctx)    # a save still in flight is committed (or raised) before the run is done
    if param_hash is None and model is not None:
        param_hash = param_sha256(model)   # collective under ZeRO-3
    result = {
        "final_step": int(final_step),
        "world_size": ctx.world_size,
        "final_loss": None if final_loss is None else float(final_loss),
        "param_sha256": param_hash,
        "resumed_from": resumed_from,
        "restarts": ctx.restart,
    }
    if extra:
        result.update(extra)
    heartbeats.flush("finished", int(final_step))
    heartbeats.write_telemetry("finish")
    if ctx.is_main:
        ctx.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(RunDir(ctx.run_dir).result_file, json.dumps(result, indent=1, sort_keys=True) + "\n")
    return result


def write_stop(step: int, checkpoint=None, *, ctx: RankContext | None = None) -> dict:
    """Rank 0 records a graceful stop in ``<run_dir>/stop.json``: step, signal, checkpoint, restart.

    The launcher reads it to tell a time limit (USR2 from ``--signal``) from a
    preemption (TERM) when the ranks ran in child processes it cannot ask. ``requested``
    and ``decided``: when this rank was asked to stop and when the ranks agreed to (the
    stop's save ran from then until ``time``).
    """
    ctx = ctx or context()
    # stop.json names only a committed checkpoint: a background save in flight finishes first.
    committed = wait_checkpoints(ctx)
    if checkpoint is None or not hasattr(checkpoint, "manifest"):
        checkpoint = committed or checkpoint
    beats = heartbeats.flush("stopped", int(step))
    record = {
        "step": int(step),
        "signal": stop_signal(),
        "checkpoint": None if checkpoint is None else str(getattr(checkpoint, "path", checkpoint)),
        "restart": ctx.restart,
        "time": time.time(),
        "requested": stopflag.requested_at(),
        "decided": beats.stop_decided,
    }
    heartbeats.write_telemetry("stop", stop_requested=stopflag.requested_at())
    if ctx.is_main:
        ctx.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(RunDir(ctx.run_dir).stop_file, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record
