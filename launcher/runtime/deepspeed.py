"""DeepSpeed adapter: CPU-aware import and init, and engine checkpoints through the atomic scheme.

    from launcher.runtime import deepspeed as gds

    ds = gds.import_deepspeed()          # sets DS_ACCELERATOR=cpu first when there is no CUDA
    ctx = gds.init_distributed()         # deepspeed.init_distributed, gloo on CPU
    engine, *_ = ds.initialize(model=model, model_parameters=model.parameters(),
                               config=gds.ds_config(DEFAULT))
    ck = rt.resume_checkpoint(ctx)
    if ck: client = gds.load_engine(engine, ck)
    ...
    gds.save_engine(engine, step, client_state={...})

``save_engine`` calls ``engine.save_checkpoint(<staging>, tag="deepspeed",
save_latest=False)`` inside :func:`launcher.runtime.stage_checkpoint`: every file a rank
writes through DeepSpeed's checkpoint engine is claimed by that rank (hashed into its
done marker); what DeepSpeed copies on its own (zero_to_fp32.py) is hashed at commit.
DeepSpeed's ``latest`` file (written by rank 0 before the other ranks' shards are known
to be complete) is never written nor read: loading names the tag explicitly. Each
rank also stores its RNG states (``rng-rank-RRRRR.pt``).
"""

from __future__ import annotations

import json
import os

from .checkpoint import Checkpoint, stage_checkpoint
from .context import RankContext, context, export_rendezvous_env, log_joined, shutdown_distributed
from .state import restore_rng, save_rng

TAG = "deepspeed"


def import_deepspeed():
    """``import deepspeed``, with ``DS_ACCELERATOR=cpu`` set first when CUDA is unavailable."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    return deepspeed


def init_distributed(ctx: RankContext | None = None, backend: str | None = None) -> RankContext:
    """``deepspeed.init_distributed`` from the glaunch environment (stand-alone too); gloo on CPU."""
    import torch

    ds = import_deepspeed()
    ctx = export_rendezvous_env(ctx)
    backend = backend or os.environ.get("GLAUNCH_DIST_BACKEND") or (
        "nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available():
        torch.cuda.set_device(ctx.local_rank)
    ds.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
    log_joined(ctx, backend)
    return ctx


def ds_config(default: dict, ctx: RankContext | None = None) -> dict:
    """The DeepSpeed config: GLAUNCH_DS_CONFIG (the launcher's ds_config.json) if set, else ``default``."""
    ctx = ctx or context()
    if ctx.ds_config is None:
        return dict(default)
    with open(ctx.ds_config, encoding="utf-8") as f:
        return json.load(f)


class _Recorder:
    """Wraps ``engine.checkpoint_engine.save`` to learn which files this rank wrote."""

    def __init__(self, engine) -> None:
        self.ce = getattr(engine, "checkpoint_engine", None)
        self.paths: list[str] = []

    def __enter__(self):
        if self.ce is not None and hasattr(self.ce, "save"):
            orig = self.ce.save

            def save(state_dict, path, *a, **kw):
                out = orig(state_dict, path, *a, **kw)
                self.paths.append(str(path))
                return out

            self.ce.save = save
        return self

    def __exit__(self, *exc) -> None:
        if self.ce is not None and "save" in vars(self.ce):
            del self.ce.save


def save_engine(engine, step: int, *, client_state: dict | None = None,
                ctx: RankContext | None = None, keep: int | None = None) -> Checkpoint:
    """Collective: ``engine.save_checkpoint`` into a staging dir, then the atomic commit."""

    ctx = ctx or context()
    with stage_checkpoint(step, framework="deepspeed", ctx=ctx, keep=keep,
                          extra={"tag": TAG, "zero_stage": engine.zero_optimization_stage()}) as st:
        with _Recorder(engine) as rec:
            engine.save_checkpoint(str(st.path), tag=TAG, client_state=dict(client_state or {}, step=step),
                                   save_latest=False)
        for p in rec.paths:
            st.add(p)
        save_rng(st, ctx.rank)
    return st.committed


def load_engine(engine, ckpt: Checkpoint, *, ctx: RankContext | None = None, **kwargs) -> dict:
    """``engine.load_checkpoint(ckpt.path, tag=...)`` plus this rank's RNG; returns the client state."""

    ctx = ctx or context()
    tag = ckpt.extra.get("tag", TAG)
    load_path, client_state = engine.load_checkpoint(str(ckpt.path), tag=tag, **kwargs)
    if load_path is None:
        raise RuntimeError(f"DeepSpeed could not load {ckpt.path / tag}")
    restore_rng(ckpt, ctx.rank, ctx.world_size)
    return client_state or {}


def shutdown(engine=None) -> None:
    """``engine.destroy()``, a barrier, ``destroy_process_group``: the clean way out on every rank.

    Without it, a ZeRO-3 rank that exits while its peer is still at work sometimes
    aborts in C++ ("terminate called without an active exception", exit -6), which a
    launcher would take for a crash.
    """
    if engine is not None and hasattr(engine, "destroy"):
        engine.destroy()
    shutdown_distributed()
