"""Lightning adapter: cluster environment, device, strategies, and a checkpoint/stop Callback.

    from launcher.runtime.lightning import (GlaunchCallback, cluster_environment, trainer_accelerator,
                                            trainer_precision, trainer_strategy, trainer_topology)

    cb = GlaunchCallback()
    trainer = L.Trainer(accelerator=trainer_accelerator(), strategy=trainer_strategy(),
                        **trainer_topology(), precision=trainer_precision(),
                        plugins=[cluster_environment()], callbacks=[cb], enable_checkpointing=False)
    trainer.fit(model, data, ckpt_path=cb.resume_path())
    if cb.stopped_at is not None:       # a stop was requested; checkpoint committed
        sys.exit(0)

Strategies: :func:`trainer_strategy` (DDP), :func:`trainer_fsdp_strategy` (FSDP, sharded
checkpoints; on the CPU over gloo too) and :func:`trainer_deepspeed` (DeepSpeed from
glaunch's ds_config.json; CUDA only, as Lightning has it).

The callback saves ``trainer.save_checkpoint`` into the staging dir as ``lightning.ckpt``
plus one ``rng-rank-RRRRR.pt`` per rank, and commits through
:func:`launcher.runtime.stage_checkpoint`. ``lightning.ckpt`` is a file written by global
rank 0 (DDP), or a directory every rank writes its share of (FSDP's sharded state dict,
DeepSpeed): each rank lists the files it wrote in its done marker, with checksums taken
while :class:`GlaunchFSDPStrategy` wrote them, or read back once (DeepSpeed's files, seen
through its checkpoint engine). Files no rank claims (DeepSpeed's ``latest`` and scripts,
a plain ``FSDPStrategy``'s shards) are checksummed by rank 0 at commit. Every
``GLAUNCH_CHECKPOINT_EVERY`` optimizer steps, and on a stop request, which it checks after
every training batch with the collective :func:`launcher.runtime.should_stop` and turns
into ``trainer.should_stop``.

Lightning's own signal handling is kept out: its SLURM auto-requeue is off
(``SLURMEnvironment(auto_requeue=False)``) and, because ``Trainer.fit`` installs a SIGTERM
handler that kills the ranks and raises ``SIGTERMException`` at the next batch, the
callback puts the glaunch handler back in ``on_train_start``.
"""

from __future__ import annotations

import contextlib
import os
import types
from pathlib import Path

from launcher.rundir.rankcontext import RankContext, context, log
from launcher.runtime import heartbeats
from launcher.runtime.checkpoint.save import stage_checkpoint
from launcher.runtime.checkpoint.directory import Checkpoint
from launcher.runtime.checkpoint.selection import resume_checkpoint
from launcher.runtime.checkpoint.checksums import ChecksumWriter
from launcher.runtime.distributed import all_reduce_max
from launcher.runtime.deepspeed import _Recorder
from launcher.runtime.deepspeed import placement as deepspeed_placement
from launcher.runtime.device import placement
from launcher.runtime.peerwaits import BucketTail, ddp_hook, waits
from launcher.runtime.result import param_sha256
from launcher.runtime.torchstate import restore_rng, save_rng
from launcher.runtime.stop import install_stop_handler, should_stop, stop_signal

CKPT_FILE = "lightning.ckpt"      # a file (DDP) or a directory (sharded strategies)


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
    CPU, GLAUNCH_DIST_BACKEND if set); ``ddp_options`` go to DistributedDataParallel. Unless
    they name a communication hook of their own, the gradient all-reduces are timed, so that
    what this rank waits for its peers in them is not counted as its own work
    (launcher.runtime.peerwaits: the slow-node report)."""
    from lightning.pytorch.strategies import DDPStrategy

    if "ddp_comm_hook" not in ddp_options:
        ddp_options.update(ddp_comm_state=BucketTail(None, waits()), ddp_comm_hook=ddp_hook)
    return DDPStrategy(process_group_backend=placement(ctx).backend, **ddp_options)


def trainer_fsdp_strategy(ctx: RankContext | None = None, **fsdp_options):
    """:class:`GlaunchFSDPStrategy` on the runtime's process-group backend, sharded checkpoints
    (``state_dict_type="sharded"`` unless given); ``fsdp_options`` go to Lightning's FSDPStrategy."""
    fsdp_options.setdefault("state_dict_type", "sharded")
    return GlaunchFSDPStrategy(process_group_backend=placement(ctx).backend, **fsdp_options)


def trainer_deepspeed(config: dict, ctx: RankContext | None = None, **strategy_options) -> dict:
    """Trainer keywords for Lightning's ``DeepSpeedStrategy`` configured by ``config``, the
    DeepSpeed config (:func:`launcher.runtime.deepspeed.ds_config`: glaunch's ds_config.json).

    ``{"strategy": DeepSpeedStrategy(config=...), "accumulate_grad_batches": N}``: Lightning
    refuses ``gradient_accumulation_steps`` in the config and sets it from the Trainer's
    ``accumulate_grad_batches``, so it moves there (DeepSpeed still checks it against
    ``train_batch_size``). The LightningModule's own optimizer is used where the config has
    none, which ZeRO accepts with ``zero_allow_untested_optimizer`` (Lightning's default too).
    Lightning trains DeepSpeed on CUDA GPUs only: off CUDA ``Trainer.fit`` raises in the
    strategy's ``setup_environment``.
    """
    from lightning.pytorch.strategies import DeepSpeedStrategy

    config = dict(config)
    accumulate = int(config.pop("gradient_accumulation_steps", 1))
    if "optimizer" not in config:
        config.setdefault("zero_allow_untested_optimizer", True)
    strategy = DeepSpeedStrategy(config=config, process_group_backend=deepspeed_placement(ctx).backend,
                                 **strategy_options)
    return {"strategy": strategy, "accumulate_grad_batches": accumulate}


def trainer_topology(ctx: RankContext | None = None) -> dict:
    """``{"devices": LOCAL_WORLD_SIZE, "num_nodes": WORLD_SIZE // LOCAL_WORLD_SIZE}`` for the Trainer.

    With the "gpu" accelerator Lightning then gives local rank N the GPU ``cuda:N``, the
    device :func:`launcher.runtime.device.placement` names.
    """
    ctx = ctx or context()
    return {"devices": ctx.local_world_size, "num_nodes": ctx.num_nodes}


_PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}


def trainer_precision(ctx: RankContext | None = None) -> str:
    """The precision this rank trains in (:func:`launcher.runtime.device.placement`) as a
    Trainer ``precision``: bf16 -> bf16-mixed, fp16 -> 16-mixed (with Lightning's
    GradScaler), fp32 -> 32-true. The CPU trains in 32-true whatever was configured, so
    ``precision: bf16`` gives bf16-mixed on GPU nodes and 32-true on a laptop; rank 0's log
    says which."""
    ctx = ctx or context()
    where = placement(ctx)
    if ctx.is_main:
        log(f"Trainer precision {_PRECISION[where.precision]}: {where.describe_precision()}")
    return _PRECISION[where.precision]


def _fsdp_base():
    from lightning.pytorch.strategies import FSDPStrategy

    return FSDPStrategy


class GlaunchFSDPStrategy(_fsdp_base()):  # type: ignore[misc]
    """Lightning's ``FSDPStrategy`` (FSDP1) that also trains on the CPU and checksums its shards as it writes them.

    CPU: Lightning allows FSDP only with a GPU accelerator (its accelerator connector checks
    for exactly ``FSDPStrategy``, not subclasses) and hands FSDP ``device_id=None``, for which
    FSDP looks for an accelerator and, on a CPU node, fails. FSDP itself shards and trains
    on the CPU over gloo when told ``device_id=cpu``: on the CPU this strategy wraps the
    module so, and Lightning takes the module as already wrapped.

    Sharded checkpoints: Lightning's layout (a torch.distributed.checkpoint directory plus
    ``meta.pt`` from rank 0), written through :class:`launcher.runtime.checkpoint.dcp.ChecksummingWriter`;
    afterwards :attr:`written` maps each file this rank wrote to ``(size, algorithm, digest)``.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.written: dict[Path, tuple[int, str, str]] = {}

    def _setup_model(self, model):
        from torch.distributed.fsdp import FullyShardedDataParallel

        if self.root_device.type == "cpu" and not any(isinstance(m, FullyShardedDataParallel)
                                                      for m in model.modules()):
            model = FullyShardedDataParallel(
                module=model, cpu_offload=self.cpu_offload, mixed_precision=self.mixed_precision_config,
                sharding_strategy=self.sharding_strategy, device_id=self.root_device, **self.kwargs)
            self.kwargs.pop("auto_wrap_policy", None)   # applied here; Lightning would warn it is ignored
        return super()._setup_model(model)

    def save_checkpoint(self, checkpoint: dict, filepath, storage_options=None) -> None:
        self.written = {}
        if self._state_dict_type != "sharded" or storage_options is not None:
            super().save_checkpoint(checkpoint, filepath, storage_options)
            return
        import torch
        from lightning.fabric.strategies.fsdp import _METADATA_FILENAME
        from torch.distributed.checkpoint import save

        from launcher.runtime.checkpoint.dcp import ChecksummingWriter

        path = Path(self.broadcast(filepath)).absolute()
        if path.is_file():
            path.unlink()
        path.mkdir(parents=True, exist_ok=True)
        state = {"model": checkpoint.pop("state_dict")}
        state.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))})
        writer = ChecksummingWriter(path)
        save(state, storage_writer=writer)
        written: dict = writer.written
        if self.global_rank == 0:
            with ChecksumWriter(path / _METADATA_FILENAME) as f:
                torch.save(checkpoint, f)  # type: ignore[arg-type]  # a binary file object
            written[f.path] = (f.size, f.algorithm, f.digest)
        self.written = written


def whole_param_sha256(trainer, module) -> str:
    """Collective: :func:`launcher.runtime.param_sha256` of the LightningModule's parameters,
    whole on every rank (gathered under FSDP; ZeRO-3's param_sha256 gathers itself), so the
    hash compares across strategies and world sizes."""
    from lightning.pytorch.strategies import FSDPStrategy

    wrapped = trainer.strategy.model if isinstance(trainer.strategy, FSDPStrategy) else None
    if wrapped is None:
        return param_sha256(module)
    from torch.distributed.fsdp import FullyShardedDataParallel

    # Copies: the gathered storage is freed on leaving, which a NumPy view of it would forbid.
    with FullyShardedDataParallel.summon_full_params(wrapped, writeback=False):
        named = [(name, p.detach().clone()) for name, p in module.named_parameters()]
    return param_sha256(types.SimpleNamespace(named_parameters=lambda: iter(named)))


@contextlib.contextmanager
def _writes(strategy):
    """What this rank writes in ``trainer.save_checkpoint``: ``{path: (size, algorithm, digest)}``
    for files checksummed as written, ``{path: None}`` for files to read back once."""
    from lightning.pytorch.strategies import DeepSpeedStrategy

    found: dict = {}
    if isinstance(strategy, DeepSpeedStrategy):
        with _Recorder(strategy.deepspeed_engine) as rec:   # DeepSpeed's files, seen through its engine
            yield found
        found.update(dict.fromkeys(rec.paths))
    else:
        yield found
        found.update(getattr(strategy, "written", None) or {})


def _callback_base():
    from lightning.pytorch.callbacks import Callback

    return Callback


class GlaunchCallback(_callback_base()):  # type: ignore[misc]
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
        # The callback reports every optimizer step (should_stop): the watchdog may watch this rank.
        heartbeats.announce()

    # -- resume
    def resume_path(self) -> str | None:
        """``ckpt_path`` for ``trainer.fit``: lightning.ckpt (a file or a sharded directory) of
        the newest complete checkpoint.

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
        # Act first when the step moves on: the batches before are micro-batches of its accumulation.
        self._checked_step = trainer.global_step
        if self.resumed is not None:
            restore_rng(self.resumed, trainer.global_rank, trainer.world_size)

    # -- save / stop
    def save(self, trainer, step: int) -> Checkpoint:
        """Collective: ``trainer.save_checkpoint`` into a staging dir, then the atomic commit
        (the heartbeat says ``saving`` until it is committed)."""
        with (heartbeats.saving(step),
              stage_checkpoint(step, framework="lightning", ctx=self.ctx, keep=self.keep,
                               extra={"strategy": type(trainer.strategy).__name__}) as st):
            path = st.path / CKPT_FILE
            with _writes(trainer.strategy) as written:
                trainer.save_checkpoint(str(path), weights_only=False)   # collective
            for f, known in written.items():
                if known is None:
                    st.add(f)
                else:
                    st.record(f, *known)
            if not written and trainer.is_global_zero and path.is_file():
                st.add(path)   # one file, written by rank 0
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
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        if not last and should_stop(step=step, total=total):
            if saved is None:
                self.save(trainer, step)
            self.stopped_at = step
            self.stop_signal = stop_signal()
            trainer.should_stop = True
