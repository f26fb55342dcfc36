"""DeepSpeed ZeRO-3 with CPU optimizer offload, with glaunch (the loop is examples/deepspeed_zero2.py).

Parameters are partitioned across ranks (``deepspeed.zero.Init``); each rank writes its
own ``zero_pp_rank_R_*`` model and optimizer shards, all committed atomically together.
result.json's param_sha256 is computed from the gathered full parameters, so it is
comparable across launch paths.

Optimizer: as in examples/deepspeed_zero2.py (torch AdamW on CPU; DeepSpeed's
DeepSpeedCPUAdam, the usual choice under CPU offload, is a C++ op JIT-built with ninja on
first use, about two minutes here, cached under ~/.cache/torch_extensions afterwards;
with CUDA it is used where a C++ compiler can build it). Devices, backend and precision
as in examples/deepspeed_zero2.py.

    python examples/deepspeed_zero3.py --steps 20
    torchrun --standalone --nproc-per-node 2 examples/deepspeed_zero3.py --steps 20
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deepspeed_zero2 import main  # same loop; only the config differs

DEFAULT_CONFIG = {
    "train_micro_batch_size_per_gpu": 32,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu"},
        "stage3_param_persistence_threshold": 0,   # partition even the tiny layers of this toy
    },
    "steps_per_print": 10**9,
    "wall_clock_breakdown": False,
}

if __name__ == "__main__":
    sys.exit(main(default_config=DEFAULT_CONFIG))
