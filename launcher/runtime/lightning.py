"""Lightning adapter: cluster environment for the launch mode, and a checkpoint/stop Callback.

    from launcher.runtime.lightning import (GlaunchCallback, cluster_environment, trainer_accelerator,
                                            trainer_precision, trainer_strategy, trainer_topology)

    cb = GlaunchCallback()
    trainer = L.Trainer(accelerator=trainer_accelerator(), strategy=trainer_strategy(),
                        **trainer_topology(), precision=trainer_precision(),
                        plugins=[cluster_environment()], callbacks=[cb], enable_checkpointing=False)
    trainer.fit(model, data, ckpt_path=cb.resume_path())
    if cb.stopped_at is not None:       # a stop was requested; checkpoint committed
        sys.exit(0)

The callback saves ``trainer.save_checkpoint`` into the staging dir (``lightning.ckpt``,
written by global rank 0) plus one ``rng-rank-RRRRR.pt`` per rank, and commits through
:func:`launcher.runtime.stage_checkpoint`. Every ``GLAUNCH_CHECKPOINT_EVERY`` optimizer
steps, and on a stop request, which it checks after every training batch with the
collective :func:`launcher.runtime.should_stop` and turns into ``trainer.should_stop``.

Lightning's own signal handling is kept out: its SLURM auto-requeue is off
(``SLURMEnvironment(auto_requeue=False)``) and, because ``Trainer.fit`` installs a SIGTERM
handler that kills the ranks and raises ``SIGTERMException`` at the next batch, the
callback puts the glaunch handler back in ``on_train_start``.
"""

from __future__ import annotations

import os

from .checkpoint import Checkpoint, resume_checkpoint, stage_checkpoint
from .context import RankContext, all_reduce_max, context, log
from .device import placement
from .state import restore_rng, save_rng
from .stop import install_stop_handler, should_stop, stop_signal

CKPT_FILE = "lightning.ckpt"


def cluster_environment(ctx: RankContext | None = None):
    """The Lightning ClusterEnvironment for how glaunch started this rank.

    srun (one task per GPU, SLURM_PROCID set): ``SLURMEnvironment(auto_requeue=False)``
    (glaunch requeues, not Lightning); torchrun, or any launch that exported RANK/
    LOCAL_RANK/GROUP_RANK/LOCAL_WORLD_SIZE: ``TorchElasticEnvironment``; stand-alone:
    ``LightningEnvironment``.
    """
    from lightning.pytorch.plugins.environments import (
        LightningEnvironment,
        SLURMEnvironment,
        TorchElasticEnvironment,
    )

    ctx = ctx or context()
    if ctx.launcher == "srun" and "SLURM_PROCID" in os.environ and "SLURM_NTASKS" in os.environ:
        try:
            return SLURMEnvironment(auto_requeue=False)
        except RuntimeError as e:   # e.g. --ntasks without --ntasks-per-node, which Lightning refuses
            log(f"Lightning's SLURMEnvironment refused this allocation ({e}); "
                "using TorchElasticEnvironment on the glaunch rank variables")
    # TorchElasticEnvironment reads exactly the glaunch/torchrun contract; its own detect()
    # only looks for TORCHELASTIC_RUN_ID, which an srun/in-process launch does not set.
    if TorchElasticEnvironment.detect() or all(
            k in os.environ for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK")):
        return TorchElasticEnvironment()
    return LightningEnvironment()


def trainer_accelerator(ctx: RankContext | None = None) -> str:
    """The Trainer's ``accelerator``: "gpu" where this rank trains on CUDA, else "cpu"
    (the decision of :func:`launcher.runtime.device.placement`)."""
    return "gpu" if placement(ctx).cuda else "cpu"


def trainer_strategy(ctx: RankContext | None = None, **ddp_options):
    """Lightning's ``DDPStrategy`` on the runtime's process-group backend (NCCL on CUDA, gloo on
    CPU, GLAUNCH_DIST_BACKEND if set); ``ddp_options`` go to DistributedDataParallel."""
    from lightning.pytorch.strategies import DDPStrategy

    return DDPStrategy(process_group_backend=placement(ctx).backend, **ddp_options)


def trainer_topology(ctx: RankContext | None = None) -> dict:
    """``{"devices": LOCAL_WORLD_SIZE, "num_nodes": WORLD_SIZE // LOCAL_WORLD_SIZE}`` for the Trainer.

    With the "gpu" accelerator Lightning then gives local rank N the GPU ``cuda:N``, the
    device :func:`launcher.runtime.device.placement` names.
    """
    ctx = ctx or context()
    return {"devices": ctx.local_world_size, "num_nodes": ctx.num_nodes}


_PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}


def trainer_precision(ctx: RankContext | None = None) -> str:
    """GLAUNCH_PRECISION as a Trainer ``precision`` (fp32 -> 32-true, bf16 -> bf16-mixed,
    fp16 -> 16-mixed, with Lightning's GradScaler; Lightning has fp16 AMP on CUDA only, so on
    CPU fp16 falls back to 32-true, while bf16-mixed runs on CPU too)."""
    ctx = ctx or context()
    flag = _PRECISION.get(ctx.precision, "32-true")
    if flag == "16-mixed" and not placement(ctx).cuda:
        log("fp16 mixed precision needs CUDA; using 32-true on CPU")
        return "32-true"
    return flag


def _callback_base():
    from lightning.pytorch.callbacks import Callback

    return Callback


class GlaunchCallback(_callback_base()):
    """Atomic checkpoints every N steps and on stop requests; resume via :meth:`resume_path`."""

    def __init__(self, ctx: RankContext | None = None, every: int | None = None,
                 keep: int | None = None, verify: str = "hash") -> None:
        super().__init__()
        self.ctx = ctx or context()
        self.every = self.ctx.checkpoint_every if every is None else every
        self.keep = keep
        self.verify = verify
        self.resumed: Checkpoint | None = None
        self.stopped_at: int | None = None
        self.stop_signal: str | None = None
        self.last_saved: Checkpoint | None = None
        self._resolved = False
        self._checked_step = -1

    # -- resume
    def resume_path(self) -> str | None:
        """``ckpt_path`` for ``trainer.fit``: lightning.ckpt of the newest complete checkpoint.

        Called before ``fit`` (torch.distributed is not up yet), so every rank looks
        itself; :meth:`setup` then checks that all ranks picked the same step.
        """
        self.resumed = resume_checkpoint(self.ctx, verify=self.verify)
        self._resolved = True
        if self.resumed is None:
            return None
        path = self.resumed.path / CKPT_FILE
        if not path.exists():
            raise FileNotFoundError(f"{self.resumed.path} is not a Lightning checkpoint (no {CKPT_FILE})")
        return str(path)

    @property
    def resumed_from(self) -> int | None:
        return None if self.resumed is None else self.resumed.step

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit" or not self._resolved:
            return
        mine = -1 if self.resumed is None else self.resumed.step
        hi, neg_lo = all_reduce_max([mine, -mine])
        if hi != -neg_lo:
            raise RuntimeError(f"ranks disagree on the checkpoint to resume from (steps {-neg_lo}..{hi}); "
                               "is the checkpoint dir on a filesystem shared by all ranks?")

    def on_train_start(self, trainer, pl_module) -> None:
        install_stop_handler(self.ctx.stop_signals)   # take SIGTERM back from Lightning
        if self.resumed is not None:
            restore_rng(self.resumed, trainer.global_rank, trainer.world_size)

    # -- save / stop
    def save(self, trainer, step: int) -> Checkpoint:

        with stage_checkpoint(step, framework="lightning", ctx=self.ctx, keep=self.keep,
                              verify=self.verify) as st:
            path = st.path / CKPT_FILE
            trainer.save_checkpoint(str(path), weights_only=False)   # collective; rank 0 writes
            if trainer.is_global_zero:
                st.add(path)
            save_rng(st, trainer.global_rank)
        self.last_saved = st.committed
        return st.committed

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self._checked_step:      # gradient accumulation: act on optimizer steps only
            return
        self._checked_step = step
        saved = None
        if self.every > 0 and step > 0 and step % self.every == 0 and \
                (self.last_saved is None or self.last_saved.step != step):
            saved = self.save(trainer, step)
        last = trainer.max_steps is not None and 0 < trainer.max_steps <= step
        if not last and should_stop():
            if saved is None:
                self.save(trainer, step)
            self.stopped_at = step
            self.stop_signal = stop_signal()
            trainer.should_stop = True
