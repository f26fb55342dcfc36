"""Lightning DeepSpeed (ZeRO stage 2) with glaunch, configured from glaunch's ds_config.json.

The model, data and loop of lightning_ddp.py under Lightning's DeepSpeedStrategy. The
DeepSpeed config is the launcher's ds_config.json (GLAUNCH_DS_CONFIG: ZeRO stage and batch
sizes fitted to the allocation), else DEFAULT_CONFIG when run by hand; its gradient
accumulation becomes the Trainer's ``accumulate_grad_batches``
(:func:`launcher.runtime.lightning.trainer_deepspeed`). Every rank writes its share of
each checkpoint (DeepSpeed's ``lightning.ckpt/`` directory), which GlaunchCallback
commits through glaunch's protocol and resumes.

Lightning trains DeepSpeed on CUDA GPUs only: on a CPU node ``Trainer.fit`` stops with
Lightning's "The DeepSpeed strategy is only supported on CUDA GPUs". The DeepSpeed
examples without Lightning (deepspeed_zero2.py) and lightning_fsdp.py train on the CPU.

    torchrun --standalone --nproc-per-node 2 examples/lightning_deepspeed.py --steps 50
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from lightning_ddp import train
except ImportError:  # imported from elsewhere than its folder
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from lightning_ddp import train

from launcher.runtime.deepspeed import ds_config
from launcher.runtime.lightning import trainer_deepspeed

DEFAULT_CONFIG = {
    "train_micro_batch_size_per_gpu": 8,
    # Buckets sized for this model: DeepSpeed's default (5e8 elements) allocates 2 GB per rank.
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 10**6, "allgather_bucket_size": 10**6},
}


def main(argv: list[str] | None = None) -> int:
    return train(argv, lambda ctx: trainer_deepspeed(ds_config(DEFAULT_CONFIG, ctx), ctx), description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
