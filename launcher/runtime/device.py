"""Where this rank trains: its device, the process-group backend and the precision.

One decision for the plain torch loop and the Lightning and DeepSpeed adapters alike:

- CUDA visible: this rank's GPU is ``cuda:LOCAL_RANK`` (``cuda:0`` when the process sees
  exactly one GPU, as with per-task GPU binding), the backend is NCCL, and the run trains
  in the configured precision (GLAUNCH_PRECISION): bf16 autocast, fp16 autocast with a
  GradScaler, or fp32. bf16 needs a GPU that computes in it (NVIDIA compute capability 8.0
  and later, AMD's): on an older one the run trains in fp32 (emulated bf16 is slower than
  fp32 there).
- Otherwise: the CPU over gloo, in fp32, whatever was configured: the same experiment
  (``precision: bf16``) trains in bf16 on a GPU node and in fp32 on a laptop, unedited. CPU
  autocast would change the numerics, which are compared bitwise across launch paths and
  resumes; DeepSpeed has no fp16 on the CPU at all.

One decision for every framework: a plain loop autocasts in :attr:`Placement.precision`,
the Lightning adapter turns it into the Trainer's ``precision``, the DeepSpeed adapter turns
the ds_config.json sections it cannot use off, and FSDP2's policy follows it. Each rank says
in its log what it trains in, and why when that is not what was configured.

GLAUNCH_DIST_BACKEND overrides the backend. Importing this module does not import torch.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass

from launcher.rundir import envnames
from launcher.rundir.rankcontext import RankContext, RuntimeConfigError, context

PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class Placement:
    """What :func:`placement` decided for this rank."""

    device: str         # "cuda:N" or "cpu"
    backend: str        # torch.distributed backend: "nccl", "gloo", or GLAUNCH_DIST_BACKEND
    precision: str      # what this rank trains in: fp32 | bf16 | fp16
    requested: str      # GLAUNCH_PRECISION as configured
    why: str = ""       # why `precision` is not `requested`, e.g. "the CPU trains in fp32"

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def index(self) -> int | None:
        """The CUDA device index, None on the CPU."""
        return int(self.device.split(":", 1)[1]) if self.cuda else None

    def activate(self) -> None:
        """Make this rank's GPU the current CUDA device (before NCCL or any CUDA allocation)."""
        if self.cuda:
            import torch

            torch.cuda.set_device(self.index)

    def autocast_dtype(self):
        """The torch dtype autocast computes in, None for fp32."""
        import torch

        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)

    def autocast(self):
        """``torch.autocast`` on this rank's GPU in the configured precision; a no-op context in fp32."""
        dtype = self.autocast_dtype()
        if dtype is None:
            return contextlib.nullcontext()
        import torch

        return torch.autocast(device_type="cuda", dtype=dtype)

    def grad_scaler(self):
        """A GradScaler, enabled for fp16 only (bf16 and fp32 need no loss scaling).

        Disabled, ``scale``/``step``/``update`` pass straight through to the loss and the
        optimizer, so the same loop serves every precision.
        """
        import torch

        enabled = self.precision == "fp16"
        if hasattr(torch.amp, "GradScaler"):
            return torch.amp.GradScaler("cuda", enabled=enabled)
        return torch.cuda.amp.GradScaler(enabled=enabled)   # torch before 2.3, as some sites load

    def ddp_options(self) -> dict:
        """DistributedDataParallel's device arguments: this GPU on CUDA, none on the CPU."""
        if self.cuda:
            return {"device_ids": [self.index], "output_device": self.index}
        return {}

    def describe_precision(self) -> str:
        """``bf16``, or ``fp32 (bf16 configured; the CPU trains in fp32)``."""
        if self.precision == self.requested:
            return self.precision
        return f"{self.precision} ({self.requested} configured; {self.why})"


def placement(ctx: RankContext | None = None, *, cuda: bool | None = None,
              backend: str | None = None) -> Placement:
    """Decide this rank's device, backend and precision (see the module docstring).

    ``cuda``: whether to train on CUDA; by default whether torch sees a GPU (the DeepSpeed
    adapter passes DeepSpeed's own accelerator choice). ``backend`` overrides the backend.
    """
    ctx = ctx or context()
    requested = ctx.precision
    if requested not in PRECISIONS:
        raise RuntimeConfigError(f"{envnames.PRECISION}={requested!r}: expected one of {', '.join(PRECISIONS)}")
    import torch

    if cuda is None:
        cuda = torch.cuda.is_available()
    backend = backend or os.environ.get(envnames.DIST_BACKEND) or ("nccl" if cuda else "gloo")
    if not cuda:
        return Placement("cpu", backend, "fp32", requested, "the CPU trains in fp32")
    index = gpu_index(ctx.local_rank, torch.cuda.device_count())
    if requested == "bf16" and not bf16_capable(index):
        name = torch.cuda.get_device_name(index)
        return Placement(f"cuda:{index}", backend, "fp32", requested, f"{name} has no bf16 arithmetic")
    return Placement(f"cuda:{index}", backend, requested, requested)


def bf16_capable(index: int) -> bool:
    """Whether GPU `index` computes in bf16 natively: NVIDIA from compute capability 8.0
    (A100, H100, L40; not V100 or T4, where torch would emulate it), AMD Instinct (ROCm)."""
    import torch

    if getattr(torch.version, "hip", None):
        return True
    return tuple(torch.cuda.get_device_capability(index)) >= (8, 0)


def gpu_index(local_rank: int, visible: int) -> int:
    """This rank's CUDA device: LOCAL_RANK among the node's GPUs, or the one GPU it sees."""
    if local_rank < visible:
        return local_rank
    if visible == 1:
        return 0
    devices = f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}"
    if visible == 0:
        raise RuntimeConfigError(f"training on CUDA was asked for (DS_ACCELERATOR="
                                 f"{os.environ.get('DS_ACCELERATOR', '<unset>')}), but this process sees "
                                 f"no GPU ({devices})")
    raise RuntimeConfigError(f"LOCAL_RANK={local_rank}, but this process sees {visible} GPUs ({devices}): "
                             "more ranks on this node than GPUs")


def observed(module, output=None) -> dict:
    """What a rank really trained with, for result.json: the parameters' device and dtype,
    the dtype of a forward ``output`` (autocast shows there), and the process group's backend."""
    record: dict = {}
    param = next(iter(module.parameters()), None)
    if param is not None:
        record["device"] = str(param.device)
        record["param_dtype"] = str(param.dtype).removeprefix("torch.")
    if output is not None:
        record["compute_dtype"] = str(output.dtype).removeprefix("torch.")
    record["backend"] = None
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            record["backend"] = str(dist.get_backend())
    return record
