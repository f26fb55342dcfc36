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
``GLAUNCH_HPARAMS``          the run's hparams.json: the experiment's ``hparams:``
``GLAUNCH_RESTART``          0 on the first start, +1 per requeue
``GLAUNCH_RUN_ID`` ``GLAUNCH_JOB_ID`` ``GLAUNCH_LAUNCHER`` (srun | torchrun)
``GLAUNCH_STOP_SIGNALS``     signals that request a graceful stop (default ``USR2,TERM``)

With none of it set a script runs as one stand-alone process (rank 0 of 1).

The training loop, in full::

    from launcher import runtime as rt

    ctx = rt.init_distributed()            # gloo on CPU, nccl with CUDA
    rt.install_stop_handler()              # USR2/TERM only set a flag
    start, resumed = 0, None
    got = rt.resume_torch_state(model, opt)   # newest *verified* checkpoint, same on all ranks
    if got:
        start = resumed = got["step"]
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
``install_stop_handler()``  handle GLAUNCH_STOP_SIGNALS (replaces earlier handlers, e.g. submitit's);
                            also tells the watchdog this rank reports its steps (its first-step bound arms)
``should_stop()``           collective all_reduce(MAX) of the stop flags: same answer on all ranks
``stop_signal()`` / ``received_signal()``  which signal asked for the stop (agreed / this rank's)
``request_stop()`` / ``reset_stop()``      set / clear the flag from code
``stage_checkpoint(step)``  collective context manager: write shards into staging, commit atomically
``latest_complete(dir)``    newest checkpoint whose manifest verifies (never trusts ``latest`` alone)
``resume_checkpoint()``     the same on every rank; sizes and checksums re-checked, split over the ranks
``verify_checkpoint(path)`` ``(manifest, None)`` or ``(None, reason)``
``resume_torch_state``      resume_checkpoint + load_torch_state, the model and optimizer files read
                            once (checksummed as they load; a damaged checkpoint is refused whole
                            and the next older complete one loaded)
``save_torch_state`` / ``load_torch_state``  model + optimizer (+ scheduler) with
                            torch.distributed.checkpoint, every rank writing its share (DDP
                            replicas spread, FSDP2 shards by owner), checksummed as written;
                            per-rank RNG and data position; loads reshard to any world size
``save_torch_state(..., blocking=False)``  returns a ``PendingCheckpoint`` once the state is in
                            host memory; writing and commit go on in a thread; at most one in flight
``wait_checkpoints()``      collective: the save in flight committed (its ``Checkpoint``) or raised
                            on every rank; the next save and a stop call it
``time_peer_waits(model)``  time this rank's waits for its peers in a DDP model's gradient
                            all-reduces (a communication hook) or FSDP2's collectives, so its busy
                            time, which names slow nodes, is its own work (``fsdp.shard`` does it)
``peer_recovery(model, opt)``  the step loop under ``recovery.peer``: a rank whose step raises
                            gets a live peer's state, no checkpoint read (``launcher.runtime.peer``)
``param_sha256(model)``     SHA-256 of all parameters (name order, float32 bytes; gathers ZeRO-3)
``write_result(...)``       rank 0 writes ``<run_dir>/result.json`` atomically
``write_stop(step, ck)``    rank 0 writes ``<run_dir>/stop.json`` (step, signal, checkpoint)
``read_hparams()``          the experiment's ``hparams:`` ({} in a run by hand)
``apply_hparams(parser)``   make them the defaults of the argparse options of the same name
                            (``hparams.lr`` -> ``--lr``), so a sweep over them reaches the script

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

from launcher.rundir.rankcontext import RankContext, RuntimeConfigError, context
from launcher.runtime.checkpoint.background import PendingCheckpoint, wait_checkpoints
from launcher.runtime.checkpoint.directory import (
    Checkpoint,
    CheckpointError,
    list_checkpoints,
    read_latest,
    step_dir_name,
)
from launcher.runtime.checkpoint.selection import latest_complete, resume_checkpoint
from launcher.runtime.checkpoint.save import stage_checkpoint
from launcher.runtime.checkpoint.staging import Staging
from launcher.runtime.checkpoint.verify import verify_checkpoint
from launcher.runtime.device import Placement, placement
from launcher.runtime.heartbeats import heartbeat, note_checkpoint
from launcher.runtime.hparams import apply_hparams, read_hparams
from launcher.runtime.peer import peer_recovery
from launcher.runtime.peerwaits import time_peer_waits
from launcher.runtime.processgroup import init_distributed, shutdown_distributed
from launcher.runtime.distributed import barrier, export_rendezvous_env
from launcher.runtime.result import param_sha256, write_result, write_stop
from launcher.runtime.torchstate import (
    load_torch_state,
    resume_torch_state,
    rng_state,
    save_torch_state,
    set_rng_state,
    unwrap,
)
from launcher.runtime.stop import (
    install_stop_handler,
    received_signal,
    request_stop,
    reset_stop,
    should_stop,
    stop_requested,
    stop_signal,
    uninstall_stop_handler,
)
from launcher.runtime.trackers import tensorboard_dir, tensorboard_writer, tracker_env, wandb_init

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "PendingCheckpoint",
    "Placement",
    "RankContext",
    "RuntimeConfigError",
    "Staging",
    "apply_hparams",
    "barrier",
    "context",
    "export_rendezvous_env",
    "heartbeat",
    "init_distributed",
    "install_stop_handler",
    "latest_complete",
    "list_checkpoints",
    "load_torch_state",
    "note_checkpoint",
    "param_sha256",
    "peer_recovery",
    "placement",
    "read_hparams",
    "read_latest",
    "received_signal",
    "request_stop",
    "reset_stop",
    "resume_checkpoint",
    "resume_torch_state",
    "rng_state",
    "save_torch_state",
    "set_rng_state",
    "should_stop",
    "shutdown_distributed",
    "stage_checkpoint",
    "step_dir_name",
    "stop_requested",
    "stop_signal",
    "tensorboard_dir",
    "tensorboard_writer",
    "time_peer_waits",
    "tracker_env",
    "uninstall_stop_handler",
    "unwrap",
    "verify_checkpoint",
    "wait_checkpoints",
    "wandb_init",
    "write_result",
    "write_stop",
]
