"""Where this rank trains: its device, the process-group backend and the precision.

One decision for the plain torch loop and the Lightning and DeepSpeed adapters alike:

- CUDA visible: this rank's GPU is ``cuda:LOCAL_RANK`` (``cuda:0`` when the process sees
  exactly one GPU, as with per-task GPU binding), the backend is NCCL, and a plain torch
  loop runs in the configured precision (GLAUNCH_PRECISION): bf16 autocast, fp16 autocast
  with a GradScaler, or fp32.
- Otherwise: the CPU over gloo, in fp32. A plain torch loop ignores bf16/fp16 on the CPU
  (CPU autocast would change its numerics, and its results are compared bitwise across
  launch paths and resumes); the framework adapters keep the CPU precision their
  frameworks support (Lightning's bf16-mixed, DeepSpeed's bf16).

GLAUNCH_DIST_BACKEND overrides the backend. Importing this module does not import torch.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass

from launcher.rundir import envnames
from launcher.runtime.rankcontext import RankContext, RuntimeConfigError, context

PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class Placement:
    """What :func:`placement` decided for this rank."""

    device: str         # "cuda:N" or "cpu"
    backend: str        # torch.distributed backend: "nccl", "gloo", or GLAUNCH_DIST_BACKEND
    precision: str      # what a plain torch loop computes in: fp32 | bf16 | fp16
    requested: str      # GLAUNCH_PRECISION as configured

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

    def describe(self) -> str:
        words = f"{self.device}, {self.backend}, {self.precision}"
        if self.precision != self.requested:
            words += f" ({self.requested} requested; the CPU runs fp32)"
        return words


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
        return Placement("cpu", backend, "fp32", requested)
    index = gpu_index(ctx.local_rank, torch.cuda.device_count())
    return Placement(f"cuda:{index}", backend, requested, requested)


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
