"""DeepSpeed adapter: CPU-aware import and init, and engine checkpoints through the atomic scheme.

    from launcher.runtime import deepspeed as gds

    ds = gds.import_deepspeed()          # sets DS_ACCELERATOR=cpu first when there is no CUDA
    ctx = gds.init_distributed()         # deepspeed.init_distributed: NCCL on cuda:LOCAL_RANK, gloo on CPU
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

ZeRO partitions the optimizer state by data-parallel rank, so a checkpoint loads as it is
only at the world size that wrote it. At another one (``glaunch resume`` on other
resources) ``load_engine`` converts it with DeepSpeed's universal checkpoint
(``deepspeed.checkpoint.ds_to_universal``, on rank 0's CPU) into
``<checkpoint_dir>/universal/step-N``, staged and committed like any checkpoint, verifies
that copy's checksums, and loads it with DeepSpeed's ``load_universal`` path. A restart
before the next save finds the verified copy and converts nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os

from launcher.rundir import envnames
from launcher.rundir.files import load_json_object
from launcher.rundir.rankcontext import RankContext, RuntimeConfigError, context, log
from launcher.runtime import heartbeats
from launcher.runtime.checkpoint.save import stage_checkpoint
from launcher.runtime.checkpoint.directory import Checkpoint, CheckpointError, step_dir_name
from launcher.runtime.checkpoint.verify import verify_checkpoint
from launcher.runtime.distributed import broadcast_object, export_rendezvous_env, log_joined
from launcher.runtime.device import Placement
from launcher.runtime.device import placement as device_placement
from launcher.runtime.processgroup import shutdown_distributed
from launcher.runtime.torchstate import restore_rng, save_rng

TAG = "deepspeed"
UNIVERSAL_DIR = "universal"          # under the checkpoint dir: converted copies, one per source step
UNIVERSAL_FRAMEWORK = "deepspeed-universal"


def import_deepspeed():
    """``import deepspeed``, with ``DS_ACCELERATOR=cpu`` set first when CUDA is unavailable.

    Only then: on a GPU node DeepSpeed detects CUDA itself. A DS_ACCELERATOR=cpu that the
    environment already carries there is obeyed (see :func:`placement`).
    """
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    return deepspeed


def on_cuda() -> bool:
    """Whether DeepSpeed trains on CUDA here: its accelerator, not only torch, decides."""
    import_deepspeed()
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().device_name() == "cuda"


def placement(ctx: RankContext | None = None, backend: str | None = None) -> Placement:
    """This rank's device, backend and precision (:func:`launcher.runtime.device.placement`),
    on the accelerator DeepSpeed chose."""
    import torch

    cuda = on_cuda()
    if not cuda and torch.cuda.is_available():
        log(f"DS_ACCELERATOR={os.environ.get('DS_ACCELERATOR')}: DeepSpeed trains on the CPU over gloo "
            f"although {torch.cuda.device_count()} GPU(s) are visible; leave DS_ACCELERATOR unset "
            "on GPU nodes")
    return device_placement(ctx, cuda=cuda, backend=backend)


def init_distributed(ctx: RankContext | None = None, backend: str | None = None) -> RankContext:
    """``deepspeed.init_distributed`` from the glaunch environment (stand-alone too):
    NCCL on this rank's GPU with CUDA, gloo on CPU."""
    ds = import_deepspeed()
    ctx = export_rendezvous_env(ctx)
    where = placement(ctx, backend)
    where.activate()
    ds.init_distributed(dist_backend=where.backend, auto_mpi_discovery=False)
    log_joined(ctx, where.backend, where.device, where.describe_precision())
    return ctx


def ds_config(default: dict, ctx: RankContext | None = None) -> dict:
    """The DeepSpeed config: GLAUNCH_DS_CONFIG (the launcher's ds_config.json) if set, else ``default``.

    An enabled ``bf16`` or ``fp16`` section that this device cannot train in (see
    :func:`launcher.runtime.device.placement`: the CPU trains in fp32, and DeepSpeed has no
    fp16 there, "Type fp16 is not supported on your device"; a GPU without bf16 arithmetic
    trains in fp32) is turned off, and the log says so: the same ds_config.json trains in
    bf16 on a GPU node and in fp32 on the CPU.
    """
    ctx = ctx or context()
    if ctx.ds_config is None:
        config = json.loads(json.dumps(default))
    else:
        try:
            config = load_json_object(ctx.ds_config)
        except (OSError, ValueError) as exc:
            why = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
            raise RuntimeConfigError(f"{envnames.DS_CONFIG}={str(ctx.ds_config)!r}: {why}") from None
    for name in ("fp16", "bf16"):
        section = config.get(name)
        if not (isinstance(section, dict) and section.get("enabled")):
            continue
        where = placement(dataclasses.replace(ctx, precision=name))
        if where.precision != name:
            if ctx.is_main:
                log(f"the DeepSpeed config enables {name}; training in {where.describe_precision()}")
            config[name] = dict(section, enabled=False)
    return config


def fast_adam_available(config: dict) -> bool:
    """Whether DeepSpeed's own Adam for ``config`` is prebuilt or can be JIT-built here.

    On CUDA that Adam is FusedAdam (a CUDA kernel: needs nvcc), or DeepSpeedCPUAdam (C++:
    needs a compiler) when the optimizer is offloaded; both also need ninja. Off CUDA the
    answer is always False: ``"torch_adam": true`` (torch.optim.AdamW) keeps CPU runs free
    of a JIT build and their numerics as they are.
    """
    import shutil

    from torch.utils import cpp_extension

    if not on_cuda():
        return False
    offload = ((config.get("zero_optimization") or {}).get("offload_optimizer") or {}).get("device")
    offloaded = offload not in (None, "none")
    from deepspeed.git_version_info import installed_ops

    if installed_ops.get("cpu_adam" if offloaded else "fused_adam"):
        return True
    if not cpp_extension.is_ninja_available():
        return False
    if offloaded:
        return bool(shutil.which(os.environ.get("CXX") or "c++"))
    return cpp_extension.CUDA_HOME is not None


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
    """Collective: ``engine.save_checkpoint`` into a staging dir, then the atomic commit
    (the heartbeat says ``saving`` until it is committed)."""

    ctx = ctx or context()
    with (heartbeats.saving(step),
          stage_checkpoint(step, framework="deepspeed", ctx=ctx, keep=keep,
                           extra={"tag": TAG, "zero_stage": engine.zero_optimization_stage()}) as st):
        with _Recorder(engine) as rec:
            engine.save_checkpoint(str(st.path), tag=TAG, client_state=dict(client_state or {}, step=step),
                                   save_latest=False)
        for p in rec.paths:
            st.add(p)
        save_rng(st, ctx.rank)
    return st.committed


def load_engine(engine, ckpt: Checkpoint, *, ctx: RankContext | None = None, **kwargs) -> dict:
    """Collective: ``engine.load_checkpoint(ckpt.path, tag=...)`` plus this rank's RNG;
    returns the client state. A ZeRO checkpoint written at another world size is loaded
    through its universal copy (made here the first time, see the module docstring)."""

    ctx = ctx or context()
    tag = ckpt.extra.get("tag", TAG)
    if needs_universal(ckpt, ctx):
        universal = universal_copy(ckpt, ctx)
        if ctx.is_main:
            log(f"{ckpt.path.name} was saved by ZeRO-{ckpt.extra.get('zero_stage')} at world size "
                f"{ckpt.world_size}: loading its universal copy {universal.path} at world size {ctx.world_size}")
        load_path, client_state = _load_universal(engine, universal, tag, **kwargs)
    else:
        load_path, client_state = engine.load_checkpoint(str(ckpt.path), tag=tag, **kwargs)
    if load_path is None:
        raise RuntimeError(f"DeepSpeed could not load {ckpt.path / tag}")
    restore_rng(ckpt, ctx.rank, ctx.world_size)
    return client_state or {}


def needs_universal(ckpt: Checkpoint, ctx: RankContext) -> bool:
    """Whether `ckpt` holds ZeRO-partitioned optimizer state for another data-parallel size
    (glaunch runs no tensor or pipeline parallelism: the data-parallel size is the world size)."""
    stage = ckpt.extra.get("zero_stage")
    return (ckpt.framework == "deepspeed" and isinstance(stage, int) and stage >= 1
            and ckpt.world_size not in (0, ctx.world_size))


def universal_copy(ckpt: Checkpoint, ctx: RankContext) -> Checkpoint:
    """Collective: the verified universal copy of `ckpt` (``<checkpoint_dir>/universal/step-N``):
    the one already there when it verifies and was made from this very checkpoint, else a
    new one, converted by rank 0 inside the staging/commit protocol."""
    directory = ckpt.path.parent / UNIVERSAL_DIR
    source = {"source": ckpt.path.name, "source_created": ckpt.manifest.get("created"),
              "source_world_size": ckpt.world_size}
    found = _verified(directory / step_dir_name(ckpt.step), source, ctx)
    if found is not None:
        return found
    tag = ckpt.extra.get("tag", TAG)
    # A save to the watchdog: the other ranks wait while rank 0 converts, before any first step.
    with (heartbeats.saving(),
          stage_checkpoint(ckpt.step, framework=UNIVERSAL_FRAMEWORK, ctx=ctx, checkpoint_dir=directory, keep=1,
                           extra=dict(source, tag=tag, zero_stage=ckpt.extra.get("zero_stage"))) as st):
        if ctx.is_main:
            convert_to_universal(ckpt.path / tag, st.path / tag)
            st.add(*(p for p in (st.path / tag).rglob("*") if p.is_file()))
    found = _verified(st.committed.path, source, ctx)
    if found is None:
        raise CheckpointError(f"the universal copy of {ckpt.path} does not verify after its commit")
    return found


def _verified(path, source: dict, ctx: RankContext) -> Checkpoint | None:
    """Rank 0 re-reads every file of the copy at `path` against its manifest (checksums)
    and checks that it was made from `source`; the same answer on every rank."""
    manifest = None
    if ctx.is_main and path.is_dir():
        manifest, why = verify_checkpoint(path, verify="hash")
        if manifest is None:
            log(f"universal copy {path}: {why}; converting again")
        elif any((manifest.get("extra") or {}).get(k) != v for k, v in source.items()):
            manifest = None      # made from an earlier checkpoint of the same step
    manifest = broadcast_object(manifest)
    return None if manifest is None else Checkpoint(step=int(manifest["step"]), path=path, manifest=manifest)


def convert_to_universal(source, output) -> None:
    """DeepSpeed's ds_to_universal on this process's CPU: the ZeRO checkpoint folder
    `source` (one tag's) -> the universal checkpoint folder `output`."""
    import argparse
    import contextlib
    import io

    from deepspeed.checkpoint import ds_to_universal

    args = argparse.Namespace(input_folder=str(source), output_folder=str(output), num_extract_workers=1,
                              num_merge_workers=1, keep_temp_folder=False, strict=True,
                              inject_missing_state=True)
    chatter = io.StringIO()          # its progress lines and bars; kept for an error
    try:
        with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
            ds_to_universal.main(args)
    except Exception as exc:
        raise CheckpointError(f"converting {source} to DeepSpeed's universal checkpoint failed: "
                              f"{type(exc).__name__}: {exc}\n{chatter.getvalue()[-2000:]}") from exc


def _load_universal(engine, universal: Checkpoint, tag: str, **kwargs):
    """``engine.load_checkpoint`` with DeepSpeed's ``checkpoint.load_universal`` switched on
    for this one load (the engine reads the setting when it loads)."""
    config = engine._config
    before = config.load_universal_checkpoint
    config.load_universal_checkpoint = True
    try:
        return engine.load_checkpoint(str(universal.path), tag=tag, **kwargs)
    finally:
        config.load_universal_checkpoint = before


def shutdown(engine=None) -> None:
    """``engine.destroy()``, a barrier, ``destroy_process_group``: the clean way out on every rank.

    Without it, a ZeRO-3 rank that exits while its peer is still at work sometimes
    aborts in C++ ("terminate called without an active exception", exit -6), which a
    launcher would take for a crash.
    """
    if engine is not None and hasattr(engine, "destroy"):
        engine.destroy()
    shutdown_distributed()
