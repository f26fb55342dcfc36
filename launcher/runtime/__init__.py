"""glaunch in-job runtime: what a training script imports.

Small and framework-agnostic; thin adapters live in ``launcher.runtime.lightning``,
``launcher.runtime.deepspeed`` and ``launcher.runtime.fsdp``. Importing this package
does not import torch.

Environment (set by the launcher on every rank; all optional)
-------------------------------------------------------------
``RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT``
    torch.distributed env:// rendezvous (torchrun sets its own).
``GLAUNCH_RUN_DIR``          run directory; result.json / stop.json go here (default ``./glaunch-run``)
``GLAUNCH_CHECKPOINT_DIR``   checkpoints (default ``<run dir>/checkpoints``; shared by all ranks)
``GLAUNCH_CHECKPOINT_EVERY`` checkpoint every N steps (default 0: only when stopping)
``GLAUNCH_CHECKPOINT_KEEP``  complete checkpoints kept (default 2)
``GLAUNCH_STRATEGY`` ``GLAUNCH_PRECISION`` ``GLAUNCH_DS_CONFIG``  what the launcher resolved
``GLAUNCH_RESTART``          0 on the first start, +1 per requeue
``GLAUNCH_RUN_ID`` ``GLAUNCH_JOB_ID`` ``GLAUNCH_LAUNCHER`` (srun | torchrun)
``GLAUNCH_STOP_SIGNALS``     signals that request a graceful stop (default ``USR2,TERM``)

With none of it set a script runs as one stand-alone process (rank 0 of 1).

The training loop, in full::

    from launcher import runtime as rt

    ctx = rt.init_distributed()            # gloo on CPU, nccl with CUDA
    rt.install_stop_handler()              # USR2/TERM only set a flag
    start, resumed = 0, None
    ck = rt.resume_checkpoint(ctx)         # newest *verified* checkpoint, same on all ranks
    if ck:
        start = resumed = rt.load_torch_state(ck, model, opt)["step"]
    for step in range(start + 1, steps + 1):
        train_one_step(step)               # data derived from (seed, step, rank)
        if ctx.checkpoint_due(step):       # returns once this rank's share is in host memory
            rt.save_torch_state(step, model, opt, blocking=False)
        if step < steps and rt.should_stop():     # collective, every rank, every step
            ck = rt.wait_checkpoints()             # the save in flight: committed, or raised
            if ck is None or ck.step != step:
                ck = rt.save_torch_state(step, model, opt)   # blocking
            rt.write_stop(step, ck)
            print(f"glaunch: stopping at step {step}, checkpoint saved")
            rt.shutdown_distributed()
            return 0                               # the launcher decides about requeue
    rt.wait_checkpoints()
    rt.write_result(steps, model=model, final_loss=loss, resumed_from=resumed)
    rt.shutdown_distributed()

API
---
``context()``               the :class:`RankContext` (rank, local_rank, world_size, node_rank,
                            run_dir, checkpoint_dir, checkpoint_every, restart, job_id, is_main, ...)
``init_distributed()``      init torch.distributed from it (also stand-alone); returns the context
``shutdown_distributed()``  barrier + destroy_process_group: every rank, before returning
``install_stop_handler()``  handle GLAUNCH_STOP_SIGNALS (replaces earlier handlers, e.g. submitit's)
``should_stop()``           collective all_reduce(MAX) of the stop flags: same answer on all ranks
``stop_signal()`` / ``received_signal()``  which signal asked for the stop (agreed / this rank's)
``request_stop()`` / ``reset_stop()``      set / clear the flag from code
``stage_checkpoint(step)``  collective context manager: write shards into staging, commit atomically
``latest_complete(dir)``    newest checkpoint whose manifest verifies (never trusts ``latest`` alone)
``resume_checkpoint()``     the same on every rank; sizes and checksums re-checked, split over the ranks
``verify_checkpoint(path)`` ``(manifest, None)`` or ``(None, reason)``
``save_torch_state`` / ``load_torch_state``  model + optimizer (+ scheduler) with
                            torch.distributed.checkpoint, every rank writing its share (DDP
                            replicas spread, FSDP2 shards by owner), checksummed as written;
                            per-rank RNG and data position; loads reshard to any world size
``save_torch_state(..., blocking=False)``  returns a ``PendingCheckpoint`` once the state is in
                            host memory; writing and commit go on in a thread; at most one in flight
``wait_checkpoints()``      collective: the save in flight committed (its ``Checkpoint``) or raised
                            on every rank; the next save and a stop call it
``param_sha256(model)``     SHA-256 of all parameters (name order, float32 bytes; gathers ZeRO-3)
``write_result(...)``       rank 0 writes ``<run_dir>/result.json`` atomically
``write_stop(step, ck)``    rank 0 writes ``<run_dir>/stop.json`` (step, signal, checkpoint)

Adapters (import them only where the framework is installed)
-----------------------------------------------------------
``launcher.runtime.lightning``  ``GlaunchCallback`` (atomic checkpoints via
    trainer.save_checkpoint, resume via ``resume_path()``, ``should_stop`` each optimizer
    step -> ``trainer.should_stop``), ``cluster_environment()`` (SLURMEnvironment with
    auto_requeue=False under srun, TorchElasticEnvironment on the rank variables,
    LightningEnvironment stand-alone), ``trainer_topology()``, ``trainer_precision()``.
``launcher.runtime.deepspeed``  ``import_deepspeed()`` (DS_ACCELERATOR=cpu without CUDA),
    ``init_distributed()``, ``ds_config(default)`` (GLAUNCH_DS_CONFIG or the default),
    ``save_engine(engine, step)`` / ``load_engine(engine, ck)`` (engine.save_checkpoint
    into the staging dir with save_latest=False; load names the tag), ``shutdown(engine)``.
``launcher.runtime.fsdp``  ``shard(model)`` (FSDP2 ``fully_shard`` of each layer, then the
    root, on a CPU or CUDA mesh over all ranks), ``full_parameters(model)`` (gathered, for
    ``param_sha256``); checkpoints go through ``save_torch_state`` unchanged.

Examples: ``examples/torch_ddp.py``, ``fsdp.py``, ``lightning_ddp.py``, ``deepspeed_zero2.py``,
``deepspeed_zero3.py``. See ``launcher.runtime.checkpoint`` for the on-disk layout and
the commit protocol.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

# Names -> the module that defines them. Imported when first used, so that a process that
# needs one piece of the runtime (the task, jobend, the renderer's launch words) does not
# load all of it.
_EXPORTS = {
    "PendingCheckpoint": "background",
    "wait_checkpoints": "background",
    "stage_checkpoint": "checkpoint_commit",
    "Checkpoint": "checkpoint_layout",
    "CheckpointError": "checkpoint_layout",
    "list_checkpoints": "checkpoint_layout",
    "read_latest": "checkpoint_layout",
    "step_dir_name": "checkpoint_layout",
    "latest_complete": "checkpoint_resume",
    "resume_checkpoint": "checkpoint_resume",
    "Staging": "checkpoint_staging",
    "verify_checkpoint": "checkpoint_verify",
    "RankContext": "context",
    "RuntimeConfigError": "context",
    "barrier": "context",
    "context": "context",
    "export_rendezvous_env": "context",
    "init_distributed": "context",
    "shutdown_distributed": "context",
    "Placement": "device",
    "placement": "device",
    "heartbeat": "heartbeats",
    "note_checkpoint": "heartbeats",
    "param_sha256": "result",
    "write_result": "result",
    "write_stop": "result",
    "load_torch_state": "state",
    "rng_state": "state",
    "save_torch_state": "state",
    "set_rng_state": "state",
    "unwrap": "state",
    "install_stop_handler": "stop",
    "received_signal": "stop",
    "request_stop": "stop",
    "reset_stop": "stop",
    "should_stop": "stop",
    "stop_requested": "stop",
    "stop_signal": "stop",
    "uninstall_stop_handler": "stop",
    "tensorboard_dir": "trackers",
    "tensorboard_writer": "trackers",
    "tracker_env": "trackers",
    "wandb_init": "trackers",
}
__all__ = sorted(_EXPORTS)



class _Package(types.ModuleType):
    """`context` names both a submodule and its function. The import system binds each
    submodule it loads as an attribute of its package; this package keeps the function
    there, so that `rt.context()` works whichever was imported first, and a process that
    never uses the context does not load it."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "context" and isinstance(value, types.ModuleType):
            value = value.context
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

if TYPE_CHECKING:
    from .background import (  # noqa: F401
        PendingCheckpoint,
        wait_checkpoints,
    )
    from .checkpoint_commit import stage_checkpoint  # noqa: F401
    from .checkpoint_layout import (  # noqa: F401
        Checkpoint,
        CheckpointError,
        list_checkpoints,
        read_latest,
        step_dir_name,
    )
    from .checkpoint_resume import latest_complete, resume_checkpoint  # noqa: F401
    from .checkpoint_staging import Staging  # noqa: F401
    from .checkpoint_verify import verify_checkpoint  # noqa: F401
    from .context import (  # noqa: F401
        RankContext,
        RuntimeConfigError,
        barrier,
        context,
        export_rendezvous_env,
        init_distributed,
        shutdown_distributed,
    )
    from .device import (  # noqa: F401
        Placement,
        placement,
    )
    from .heartbeats import (  # noqa: F401
        heartbeat,
        note_checkpoint,
    )
    from .result import (  # noqa: F401
        param_sha256,
        write_result,
        write_stop,
    )
    from .state import (  # noqa: F401
        load_torch_state,
        rng_state,
        save_torch_state,
        set_rng_state,
        unwrap,
    )
    from .stop import (  # noqa: F401
        install_stop_handler,
        received_signal,
        request_stop,
        reset_stop,
        should_stop,
        stop_requested,
        stop_signal,
        uninstall_stop_handler,
    )
    from .trackers import (  # noqa: F401
        tensorboard_dir,
        tensorboard_writer,
        tracker_env,
        wandb_init,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
