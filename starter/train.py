"""A starter training script for glaunch: a small model on synthetic data with plain torch
DDP. It checkpoints every `checkpoint.every_steps`, stops cleanly when the job is warned
(time limit, preemption) and resumes from its newest complete checkpoint when requeued.

    glaunch submit exp.yaml                     # 2 ranks on this machine
    python train.py --steps 20                  # one process, no glaunch run
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from launcher import runtime as rt
from launcher.runtime.device import placement


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's data at `step`, from (step, rank) alone: a resume needs no loader state."""
    g = torch.Generator().manual_seed(step * 1_000 + rank)
    x = torch.randn(32, 16, generator=g)
    return x, torch.tanh(x.sum(dim=1, keepdim=True) / 4)


def main() -> int:
    parser = argparse.ArgumentParser(description="glaunch starter: a small model on synthetic data")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=1e-2)
    rt.apply_hparams(parser)                 # the experiment's hparams: hparams.lr -> --lr
    args = parser.parse_args()

    ctx = rt.init_distributed()              # NCCL on cuda:LOCAL_RANK, gloo on the CPU
    rt.install_stop_handler()                # the job's warning signal only sets a flag
    where = placement(ctx)
    torch.manual_seed(0)                     # the same initial weights on every rank
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1)).to(where.device)
    ddp = DDP(model, **where.ddp_options())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

    start, resumed_from = 0, None
    got = rt.resume_torch_state(model, opt, ctx=ctx)   # the newest complete checkpoint, the same on every rank
    if got is not None:
        start = resumed_from = got["step"]

    loss = None
    for step in range(start + 1, args.steps + 1):
        x, y = (t.to(where.device) for t in batch(step, ctx.rank))
        opt.zero_grad(set_to_none=True)
        with where.autocast():
            loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        if ctx.is_main and step % 20 == 0:
            print(f"step {step}/{args.steps} loss {loss.item():.4f}", flush=True)
        saved = rt.save_torch_state(step, model, opt, ctx=ctx) if ctx.checkpoint_due(step) else None
        if rt.should_stop(step=step, total=args.steps) and step < args.steps:
            rt.write_stop(step, saved or rt.save_torch_state(step, model, opt, ctx=ctx), ctx=ctx)
            rt.shutdown_distributed()
            return 0                         # glaunch requeues the job, which resumes here

    rt.write_result(max(start, args.steps), model=model, final_loss=None if loss is None else loss.item(),
                    resumed_from=resumed_from, ctx=ctx)
    rt.shutdown_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
