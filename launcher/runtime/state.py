"""Plain-torch adapter: save/load model, optimizer, RNG and data position through the atomic scheme.

Files in a checkpoint written by :func:`save_torch_state`::

    model.pt              rank 0: model + optimizer (+ scheduler) state dicts, step, extra
                          (or model-rank-RRRRR.pt on every rank with ``per_rank_model=True``)
    rank-RRRRR.pt         every rank: its RNG states (python, numpy, torch, cuda) + rank_state

Everything is plain types and tensors, so it loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import random
import sys

from .checkpoint import Checkpoint, CheckpointError, stage_checkpoint
from .context import RankContext, context, log

MODEL_FILE = "model.pt"


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
    """This rank's RNG states from `ckpt`, when it was written by as many ranks."""
    import torch

    f = ckpt.path / rng_file(rank)
    if f.exists() and ckpt.world_size == world_size:
        set_rng_state(torch.load(f, map_location="cpu", weights_only=True))
        return True
    log(f"no RNG state for rank {rank} of {world_size} in {ckpt.path.name} (written by {ckpt.world_size} "
        "ranks): resume is not bitwise reproducible")
    return False


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
        state["numpy"] = [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]
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


def save_torch_state(step: int, model, optimizer=None, *, scheduler=None, extra: dict | None = None,
                     rank_state: dict | None = None, per_rank_model: bool = False,
                     ctx: RankContext | None = None, framework: str = "torch") -> Checkpoint:
    """Collective: checkpoint ``step`` atomically; returns the committed :class:`Checkpoint`.

    ``extra`` (rank 0's) is stored with the model and in the manifest; ``rank_state`` is
    this rank's own (e.g. its data position). With DDP the replicas are identical, so
    rank 0 alone writes the model; ``per_rank_model=True`` makes every rank write its
    own copy (for models whose state differs per rank).
    """
    import torch

    ctx = ctx or context()
    with stage_checkpoint(step, framework=framework, ctx=ctx, extra=extra) as st:
        if per_rank_model or ctx.is_main:
            blob = {"step": step, "model": unwrap(model).state_dict(), "extra": extra or {}}
            if optimizer is not None:
                blob["optimizer"] = optimizer.state_dict()
            if scheduler is not None:
                blob["scheduler"] = scheduler.state_dict()
            torch.save(blob, st.file(model_rank_file(ctx.rank) if per_rank_model else MODEL_FILE))
        torch.save({"step": step, "rank": ctx.rank, "world_size": ctx.world_size,
                    "rng": rng_state(), "rank_state": rank_state or {}}, st.file(rank_file(ctx.rank)))
    return st.committed


def load_torch_state(ckpt: Checkpoint, model, optimizer=None, *, scheduler=None, strict: bool = True,
                     restore_rng: bool = True, ctx: RankContext | None = None) -> dict:
    """Load what :func:`save_torch_state` wrote; returns ``{"step", "extra", "rank_state", "rng_restored"}``.

    RNG states are restored only when this rank's file exists (same world size); otherwise
    a warning says that the run continues but is no longer bitwise reproducible.
    """
    import torch

    ctx = ctx or context()
    per_rank = ckpt.path / model_rank_file(ctx.rank)
    path = per_rank if per_rank.exists() else ckpt.path / MODEL_FILE
    if not path.exists():
        raise CheckpointError(f"{ckpt.path} has neither {MODEL_FILE} nor {per_rank.name}")
    blob = torch.load(path, map_location="cpu", weights_only=True)
    unwrap(model).load_state_dict(blob["model"], strict=strict)
    if optimizer is not None:
        if "optimizer" not in blob:
            raise CheckpointError(f"{path} holds no optimizer state")
        optimizer.load_state_dict(blob["optimizer"])
    if scheduler is not None and "scheduler" in blob:
        scheduler.load_state_dict(blob["scheduler"])
    rank_state: dict = {}
    restored = False
    rf = ckpt.path / rank_file(ctx.rank)
    if rf.exists() and ckpt.world_size == ctx.world_size:
        r = torch.load(rf, map_location="cpu", weights_only=True)
        rank_state = r.get("rank_state") or {}
        if restore_rng:
            set_rng_state(r["rng"])
            restored = True
    else:
        log(f"{ckpt.path.name} was written by {ckpt.world_size} ranks, this run has "
            f"{ctx.world_size}: RNG states not restored, resume is not bitwise reproducible")
    return {"step": int(blob.get("step", ckpt.step)), "extra": blob.get("extra") or {},
            "rank_state": rank_state, "rng_restored": restored}
