"""PyTorch FSDP2 with glaunch: sharded parameters and optimizer state, background checkpoints, resume.

The MLP of ``torch_ddp.py``, with every layer sharded over the ranks by ``fully_shard``
(FSDP2). Each rank's batch at step ``s`` is a pure function of (seed, s, rank).
Checkpoints are written in the background (``blocking=False``): each rank writes its own
shards with torch.distributed.checkpoint while training goes on. An interrupted and
resumed run ends with bitwise the same parameters as an uninterrupted one at the same
world size (compare ``param_sha256`` in result.json); at another world size the
checkpoint is resharded on load.

    python examples/fsdp.py --steps 50                 # stand-alone, one process
    torchrun --standalone --nproc-per-node 2 examples/fsdp.py --steps 50
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

try:
    from launcher import runtime as rt
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from launcher import runtime as rt

import torch
import torch.distributed as dist
from torch import nn

from launcher.runtime import fsdp as gfsdp
from launcher.runtime.device import observed, placement

SEED = 1234
DIM, HIDDEN, BATCH = 16, 32, 32


def make_model() -> nn.Module:
    torch.manual_seed(SEED)                  # identical initial weights on every rank
    return nn.Sequential(nn.Linear(DIM, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, 1))


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of ``rank`` at ``step``: derived from (SEED, step, rank) only."""
    key = hashlib.sha256(f"{SEED}/{step}/{rank}".encode()).digest()
    g = torch.Generator().manual_seed(int.from_bytes(key[:8], "little") & (2**63 - 1))
    w = torch.Generator().manual_seed(SEED)
    w_true = torch.randn(DIM, 1, generator=w)
    x = torch.randn(BATCH, DIM, generator=g)
    y = torch.sin(x @ w_true) + 0.05 * torch.randn(BATCH, 1, generator=g)
    return x, y


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--seconds-per-step", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--log-every", type=int, default=10)
    rt.apply_hparams(p)                      # the experiment's hparams (hparams.lr -> --lr)
    args = p.parse_args(argv)

    torch.set_num_threads(1)                 # same float reductions whatever the launch path
    ctx = rt.init_distributed()              # NCCL on cuda:LOCAL_RANK, gloo on CPU
    where = placement(ctx)                   # FSDP2 moves the shards to the mesh's device
    rt.install_stop_handler()

    model = gfsdp.shard(make_model(), ctx)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()

    start, resumed_from = 0, None
    state = rt.resume_torch_state(model, opt, ctx=ctx)   # read once, checksummed as it loads
    if state is not None:
        start = resumed_from = state["step"]
        if ctx.is_main:
            print(f"resumed from {state['checkpoint'].path} (step {start})", flush=True)

    loss = out = torch.tensor(float("nan"))
    for step in range(start + 1, args.steps + 1):
        x, y = (t.to(where.device) for t in batch(step, ctx.rank))
        opt.zero_grad(set_to_none=True)
        out = model(x)                       # in the configured precision on GPUs (FSDP2's policy)
        loss = loss_fn(out.float(), y)
        loss.backward()
        opt.step()
        if ctx.is_main and (step % args.log_every == 0 or step == args.steps):
            print(f"step {step}/{args.steps} loss {loss.item():.4f}", flush=True)
        if args.seconds_per_step:
            time.sleep(args.seconds_per_step)

        if ctx.checkpoint_due(step):
            rt.save_torch_state(step, model, opt, ctx=ctx, blocking=False)   # returns once copied
        if rt.should_stop(step=step, total=args.steps) and step < args.steps:
            saved = rt.wait_checkpoints(ctx)          # the save in flight, committed (or raised)
            if saved is None or saved.step != step:
                saved = rt.save_torch_state(step, model, opt, ctx=ctx)
            rt.write_stop(step, saved, ctx=ctx)
            if ctx.is_main:
                print(f"glaunch: stopping at step {step}, checkpoint saved", flush=True)
                print(f"glaunch: stop requested by {rt.stop_signal()}", flush=True)
            rt.shutdown_distributed()
            return 0

    rt.wait_checkpoints(ctx)
    final = loss.detach().clone().reshape(1)
    if ctx.world_size > 1:
        dist.all_reduce(final)
        final /= ctx.world_size
    steps_done = max(start, args.steps)
    param_hash = rt.param_sha256(gfsdp.full_parameters(model))   # collective: gathers the shards
    res = rt.write_result(steps_done, param_hash=param_hash, final_loss=None if start >= args.steps else final.item(),
                          resumed_from=resumed_from, ctx=ctx,
                          extra={"placement": dict(observed(model, out), precision=where.precision)})
    if ctx.is_main:
        print(f"done: step {steps_done} param_sha256 {res['param_sha256']}", flush=True)
    rt.shutdown_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
