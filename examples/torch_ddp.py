"""Plain torch DDP with glaunch: resume, periodic atomic checkpoints, graceful stop, result.json.

A tiny MLP regression on synthetic data. Each rank's batch at step ``s`` is a pure
function of (seed, s, rank), so resuming needs no data-loader state; model,
optimizer and every rank's RNG states come back from the checkpoint, so an
interrupted-and-resumed run ends with bitwise the same parameters as an
uninterrupted one (compare ``param_sha256`` in result.json).

Where there are GPUs each rank trains on ``cuda:LOCAL_RANK`` over NCCL in the configured
precision (GLAUNCH_PRECISION: bf16 autocast, fp16 autocast with a GradScaler, fp32);
elsewhere on the CPU over gloo in fp32 (:mod:`launcher.runtime.device` decides).

    python examples/torch_ddp.py --steps 50                 # stand-alone, one process
    torchrun --standalone --nproc-per-node 2 examples/torch_ddp.py --steps 50
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
from launcher.runtime.device import observed, placement

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

SEED = 1234
DIM, HIDDEN, BATCH = 16, 32, 32


def make_model(hidden: int = HIDDEN, layers: int = 0) -> nn.Module:
    """DIM -> hidden -> 1, with `layers` more hidden x hidden layers between (a larger model
    for memory measurements; the default is the tiny MLP)."""
    torch.manual_seed(SEED)                  # identical initial weights on every rank
    inner = [m for _ in range(layers) for m in (nn.Linear(hidden, hidden), nn.Tanh())]
    return nn.Sequential(nn.Linear(DIM, hidden), nn.Tanh(), *inner, nn.Linear(hidden, 1))


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
    p.add_argument("--hidden", type=int, default=HIDDEN, help="width of the hidden layers")
    p.add_argument("--layers", type=int, default=0, help="hidden x hidden layers besides the first and last")
    rt.apply_hparams(p)                      # the experiment's hparams (hparams.lr -> --lr)
    args = p.parse_args(argv)

    torch.set_num_threads(1)                 # same float reductions whatever the launch path
    ctx = rt.init_distributed()              # NCCL on cuda:LOCAL_RANK, gloo on CPU
    where = placement(ctx)
    rt.install_stop_handler()

    model = make_model(args.hidden, args.layers).to(where.device)
    # find_unused_parameters keeps DDP's gradient buckets as first laid out (no rebuild after
    # step one), so with more than two ranks the gradient sums add up in the same order before
    # and after a resume: the resumed run stays bitwise identical.
    # Timed: how long this rank waits for its peers in the gradient all-reduces is not its
    # own work (the watchdog names a rank slow from its own work).
    ddp = rt.time_peer_waits(DDP(model, find_unused_parameters=True, **where.ddp_options()))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scaler = where.grad_scaler()             # loss scaling for fp16 only; else a pass-through
    loss_fn = nn.MSELoss()

    start, resumed_from = 0, None
    # The newest complete checkpoint, its files checksummed as they load (read once); one
    # that does not match is refused and the next older one loaded.
    # (In a process started in place of a lost rank, recovery.peer, None: its state comes from a live peer.)
    state = rt.resume_torch_state(model, opt, ctx=ctx)
    if state is not None:
        start = resumed_from = state["step"]
        if "grad_scaler" in state["extra"]:
            scaler.load_state_dict(state["extra"]["grad_scaler"])
        if ctx.is_main:
            print(f"resumed from {state['checkpoint'].path} (step {start})", flush=True)

    def save(step: int):
        extra = {"grad_scaler": scaler.state_dict()} if scaler.is_enabled() else None
        return rt.save_torch_state(step, model, opt, extra=extra, ctx=ctx)

    # recovery.peer: a rank whose step raises gets a live peer's state and the step is redone;
    # otherwise a plain loop.
    recovery = rt.peer_recovery(ddp, opt, extra={"grad_scaler": scaler} if scaler.is_enabled() else None, ctx=ctx)
    loss = out = torch.tensor(float("nan"))
    ran_steps = 0
    for step in recovery.steps(start + 1, args.steps):
        with recovery.step(step):
            ran_steps += 1
            x, y = (t.to(where.device) for t in batch(step, ctx.rank))
            opt.zero_grad(set_to_none=True)
            with where.autocast():
                out = ddp(x)
                loss = loss_fn(out, y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            if ctx.is_main and (step % args.log_every == 0 or step == args.steps):
                print(f"step {step}/{args.steps} loss {loss.item():.4f}", flush=True)
            if args.seconds_per_step:
                time.sleep(args.seconds_per_step)

            saved = save(step) if ctx.checkpoint_due(step) else None
            if rt.should_stop(step=step, total=args.steps) and step < args.steps:
                saved = saved or save(step)
                rt.write_stop(step, saved, ctx=ctx)
                if ctx.is_main:
                    print(f"glaunch: stopping at step {step}, checkpoint saved", flush=True)
                    print(f"glaunch: stop requested by {rt.stop_signal()}", flush=True)
                rt.shutdown_distributed()
                return 0

    # The last step's loss, averaged over the ranks whose process ran it: a process started in
    # place of a lost rank after the last step (recovery.peer) ran none, nor did a resume at the end.
    ran = ran_steps > 0
    final = loss.detach().clone().reshape(1) if ran else torch.zeros(1, dtype=loss.dtype, device=where.device)
    counted = torch.tensor([1.0 if ran else 0.0], dtype=final.dtype, device=final.device)
    if ctx.world_size > 1:
        dist.all_reduce(final)
        dist.all_reduce(counted)
    steps_done = max(start, args.steps)
    final_loss = (final / counted).item() if start < args.steps and counted.item() > 0 else None
    res = rt.write_result(steps_done, model=model, final_loss=final_loss,
                          resumed_from=resumed_from, ctx=ctx,
                          extra={"placement": dict(observed(model, out), precision=where.precision)})
    if ctx.is_main:
        print(f"done: step {steps_done} param_sha256 {res['param_sha256']}", flush=True)
    rt.shutdown_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
