"""PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``) on the glaunch runtime.

    from launcher.runtime import fsdp as gfsdp

    ctx = rt.init_distributed()                  # gloo on CPU, nccl with CUDA
    model = gfsdp.shard(make_model(), ctx)       # each layer with parameters, then the root
    opt = torch.optim.AdamW(model.parameters())  # over the sharded (DTensor) parameters
    ck = rt.resume_checkpoint(ctx)
    if ck: rt.load_torch_state(ck, model, opt)   # resharded when the world size changed
    ...
    rt.save_torch_state(step, model, opt, blocking=False)   # each rank writes its own shards
    rt.write_result(steps, param_hash=rt.param_sha256(gfsdp.full_parameters(model)))

Checkpoints need nothing FSDP-specific: :func:`launcher.runtime.save_torch_state` goes
through ``torch.distributed.checkpoint.state_dict``, which yields the DTensor shards,
and torch.distributed.checkpoint writes each shard from the rank that holds it and
reshards on load.

Under glaunch the job's strategy is ``strategy.name: fsdp`` (``GLAUNCH_STRATEGY=fsdp``), whose
per-GPU memory ``glaunch plan`` estimates; the configured precision reaches ``fully_shard``
as a MixedPrecisionPolicy (:func:`mixed_precision`). CPU offload is the script's own choice:
``shard(model, offload_policy=CPUOffloadPolicy())``.
"""

from __future__ import annotations

from launcher.rundir.rankcontext import RankContext, context
from launcher.runtime.device import placement
from launcher.runtime.peerwaits import time_peer_waits


def device_mesh(ctx: RankContext | None = None):
    """A 1-D mesh over all ranks: CUDA when available (one GPU per rank), else CPU (gloo)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    ctx = ctx or context()
    return init_device_mesh("cuda" if torch.cuda.is_available() else "cpu", (ctx.world_size,))


def mixed_precision(ctx: RankContext | None = None):
    """FSDP2's MixedPrecisionPolicy for the configured precision (GLAUNCH_PRECISION) where
    this rank trains: bf16 or fp16 weights gathered for compute and gradients reduced in
    fp32, while the sharded weights and the optimizer stay fp32 (what the planner counts);
    None in fp32 and on the CPU, which trains in fp32 (:func:`launcher.runtime.device.placement`)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(placement(ctx or context()).precision)
    if dtype is None:
        return None
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def shard(model, ctx: RankContext | None = None, *, mesh=None, layers=None, time_waits: bool = True, **kwargs):
    """``fully_shard`` each of ``layers`` (default: every direct child with parameters), then the root.

    ``kwargs`` go to ``fully_shard`` (``reshard_after_forward``, ``offload_policy``, ...);
    ``mp_policy`` defaults to :func:`mixed_precision`. Returns the model (FSDP2 shards in
    place). Call after :func:`launcher.runtime.init_distributed`. With `time_waits` (the
    default) the all-gathers and reduce-scatters are timed, so that the time this rank
    waits for its peers in them is not counted as its own work
    (launcher.runtime.peerwaits: the slow-node report).
    """
    from torch.distributed.fsdp import fully_shard

    if "mp_policy" not in kwargs:
        policy = mixed_precision(ctx)
        if policy is not None:
            kwargs["mp_policy"] = policy
    mesh = mesh if mesh is not None else device_mesh(ctx)
    if layers is None:
        layers = [m for m in model.children() if any(True for _ in m.parameters())]
    for layer in layers:
        fully_shard(layer, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)
    return time_peer_waits(model) if time_waits else model


class _FullParameters:
    """Looks like a module to :func:`launcher.runtime.param_sha256`: full (gathered) parameters by name."""

    def __init__(self, named: list) -> None:
        self._named = named

    def named_parameters(self):
        return iter(self._named)


def full_parameters(model) -> _FullParameters:
    """Collective: every parameter gathered whole (DTensor -> full tensor), by name.

    Pass it to :func:`launcher.runtime.param_sha256`, so that an FSDP2 run's hash compares
    with the same model's hash at any other world size or strategy.
    """
    from torch.distributed.tensor import DTensor

    named = []
    for name, p in model.named_parameters():
        data = p.detach()
        if isinstance(data, DTensor):
            data = data.full_tensor()
        named.append((name, data))
    return _FullParameters(named)
