"""Lightning FSDP with glaunch: sharded parameters, optimizer state and checkpoints, on GPUs or the CPU.

The model, data and loop of lightning_ddp.py under Lightning's FSDPStrategy
(:class:`launcher.runtime.lightning.GlaunchFSDPStrategy`): every rank holds a shard of the
parameters and of AdamW's state, and writes its shard of each checkpoint (a sharded
``lightning.ckpt/`` directory that GlaunchCallback commits through glaunch's protocol). On
GPUs over NCCL where torch sees CUDA, else on the CPU over gloo. ``param_sha256`` in
result.json is taken over the gathered, whole parameters.

    torchrun --standalone --nproc-per-node 2 examples/lightning_fsdp.py --steps 50
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

try:
    from lightning_ddp import train
except ImportError:  # imported from elsewhere than its folder
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from lightning_ddp import train

from launcher.runtime.lightning import trainer_fsdp_strategy

# Lightning's FSDP is FSDP1, whose sharded state dict (ShardedTensor) and process-group helpers
# torch warns about on every save as deprecated.
warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed\.")
warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.distributed\.fsdp\._shard_utils")


def main(argv: list[str] | None = None) -> int:
    return train(argv, lambda ctx: {"strategy": trainer_fsdp_strategy(ctx)}, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
