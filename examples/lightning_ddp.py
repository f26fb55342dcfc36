"""Lightning DDP with glaunch: the Trainer checkpoints and stops through GlaunchCallback.

Same tiny MLP regression as examples/torch_ddp.py. The batch of step ``s`` on rank ``r``
(micro-batch ``m`` with gradient accumulation) is derived from (seed, s, r, m) inside
``training_step`` (the dataloader only paces the loop), so a mid-epoch resume needs no
data-loader state. lightning_fsdp.py and lightning_deepspeed.py train the same model with
:func:`train` and another strategy. Accelerator, devices, nodes, strategy and precision
come from the runtime: GPUs (one per rank, NCCL, the configured precision) where torch
sees CUDA, else the CPU over gloo; devices and nodes from the launcher's environment
(LOCAL_WORLD_SIZE, WORLD_SIZE / LOCAL_WORLD_SIZE). The cluster environment plugin matches
the launch mode with Lightning's SLURM requeue off.

    python examples/lightning_ddp.py --steps 50
    torchrun --standalone --nproc-per-node 2 examples/lightning_ddp.py --steps 50
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
from launcher.runtime.device import observed
from launcher.runtime.lightning import (
    GlaunchCallback,
    cluster_environment,
    trainer_accelerator,
    trainer_precision,
    trainer_strategy,
    trainer_topology,
    whole_param_sha256,
)

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

SEED = 1234
DIM, HIDDEN, BATCH = 16, 32, 32


def batch(step: int, rank: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    key = hashlib.sha256(f"{SEED}/{step}/{rank}/{micro}".encode()).digest()
    g = torch.Generator().manual_seed(int.from_bytes(key[:8], "little") & (2**63 - 1))
    w_true = torch.randn(DIM, 1, generator=torch.Generator().manual_seed(SEED))
    x = torch.randn(BATCH, DIM, generator=g)
    y = torch.sin(x @ w_true) + 0.05 * torch.randn(BATCH, 1, generator=g)
    return x, y


class Ticks(Dataset):
    """Only paces the loop: one item per step; the data itself comes from batch()."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class Regressor(L.LightningModule):
    def __init__(self, lr: float, steps: int, seconds_per_step: float, log_every: int) -> None:
        super().__init__()
        torch.manual_seed(SEED)
        self.net = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))
        self.lr, self.steps, self.sps, self.log_every = lr, steps, seconds_per_step, log_every
        self.last_loss = self.last_out = None

    def training_step(self, _ticks, batch_idx):
        step = self.global_step + 1                      # the step this update completes
        micro = batch_idx % self.trainer.accumulate_grad_batches   # Lightning's own accumulation count
        x, y = (t.to(self.device) for t in batch(step, self.global_rank, micro))
        out = self.net(x)
        loss = nn.functional.mse_loss(out, y)
        self.last_loss, self.last_out = loss.detach(), out.detach()
        if self.global_rank == 0 and micro == 0 and (step % self.log_every == 0 or step == self.steps):
            print(f"step {step}/{self.steps} loss {loss.item():.4f}", flush=True)
        if self.sps:
            time.sleep(self.sps)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def main(argv: list[str] | None = None) -> int:
    # Fixed gradient buckets (see torch_ddp.py): bitwise-identical resumes past two ranks.
    return train(argv, lambda ctx: {"strategy": trainer_strategy(ctx, find_unused_parameters=True)})


def train(argv: list[str] | None, strategy, description: str = __doc__) -> int:
    """Fit the regressor with the Trainer keywords ``strategy(ctx)`` returns (``strategy``, and
    ``accumulate_grad_batches`` where the strategy decides it); write result.json, or stop.json
    on a stop request."""
    p = argparse.ArgumentParser(description=description.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--seconds-per-step", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--log-every", type=int, default=10)
    rt.apply_hparams(p)                      # the experiment's hparams (hparams.lr -> --lr)
    args = p.parse_args(argv)

    torch.set_num_threads(1)
    ctx = rt.context()
    rt.install_stop_handler()            # before fit: a signal during start-up is not lost
    L.seed_everything(SEED, workers=True, verbose=False)
    cb = GlaunchCallback(ctx)
    ckpt_path = cb.resume_path()
    if ctx.is_main and ckpt_path:
        print(f"resumed from {ckpt_path} (step {cb.resumed_from})", flush=True)

    model = Regressor(args.lr, args.steps, args.seconds_per_step, args.log_every)
    options = strategy(ctx)
    trainer = L.Trainer(
        accelerator=trainer_accelerator(ctx),
        **options,
        **trainer_topology(ctx),
        precision=trainer_precision(ctx),
        plugins=[cluster_environment(ctx)],
        callbacks=[cb],
        max_steps=args.steps,
        max_epochs=-1,
        deterministic=True,
        logger=False,
        enable_checkpointing=False,      # GlaunchCallback does it, atomically
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(ctx.run_dir),
    )
    # An epoch of whole optimizer steps: Lightning also steps on an epoch's last batch.
    ticks = max(args.steps, 1) * options.get("accumulate_grad_batches", 1) * ctx.world_size
    loader = DataLoader(Ticks(ticks), batch_size=1, shuffle=False)
    trainer.fit(model, loader, ckpt_path=ckpt_path)

    if cb.stopped_at is not None:
        rt.write_stop(cb.stopped_at, cb.last_saved, ctx=ctx)
        if ctx.is_main:
            print(f"glaunch: stopping at step {cb.stopped_at}, checkpoint saved", flush=True)
            print(f"glaunch: stop requested by {cb.stop_signal}", flush=True)
        rt.shutdown_distributed()
        return 0

    loss = model.last_loss
    if loss is not None and trainer.world_size > 1:
        loss = trainer.strategy.reduce(loss.clone(), reduce_op="mean")
    res = rt.write_result(trainer.global_step, param_hash=whole_param_sha256(trainer, model),
                          final_loss=None if loss is None else loss.item(),
                          resumed_from=cb.resumed_from, ctx=ctx,
                          extra={"placement": dict(observed(model, model.last_out),
                                                   precision=str(trainer.precision))})
    if ctx.is_main:
        print(f"done: step {trainer.global_step} param_sha256 {res['param_sha256']}", flush=True)
    rt.shutdown_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
