"""Per-GPU memory of each data-parallel strategy: the arithmetic the planner
(launcher.resolution.planner) compares to choose one.

Pure arithmetic on a `PlanInput`, without torch (a size counted from `model.factory`
comes in counted: launcher.resolution.strategy.inspect_factory). GB are 10^9 bytes. Ψ is
the parameter count, N the data-parallel degree (nodes x GPUs per node), L the parameter
count of the largest layer.

Model states, ZeRO paper (`model_states_gb`)
--------------------------------------------
Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", section 3.1 and Figure 1: 2Ψ + 2Ψ + KΨ bytes for mixed-precision Adam. With the
experiment's precision and optimizer, bytes per parameter are

    P  weights     2 (fp16/bf16), 4 (fp32)
    G  gradients   2 (fp16/bf16), 4 (fp32)
    K  what the optimizer holds: the fp32 master weights under mixed precision (4) plus
       Adam/AdamW's momentum and variance (8) or SGD's momentum (4). Mixed-precision
       Adam K = 12; fp32 Adam K = 8 (4Ψ + 4Ψ + 8Ψ); SGD K = 8 mixed, 4 in fp32.

    ddp            (P + G + K)Ψ
    zero1          (P + G)Ψ + KΨ/N                 optimizer states partitioned (P_os)
    zero2          PΨ + (G + K)Ψ/N                 and gradients (P_os+g)
    zero3, fsdp    (P + G + K)Ψ/N                  and parameters (P_os+g+p)
    zero2_offload  PΨ + GΨ/N                       K lives in host memory (ZeRO-Offload)
    zero3_offload  GΨ/N                            K and the parameter shards live on the host

Persistent states only, as in the paper: the layer ZeRO-3 gathers while computing is not
counted here.

Model states, DeepSpeed's estimators (`deepspeed_gb`, and `estimate_gb`: what decides fit)
-----------------------------------------------------------------------------------------
The arithmetic of `estimate_zero2_model_states_mem_needs`
(deepspeed/runtime/zero/stage_1_and_2.py) and `estimate_zero3_model_states_mem_needs`
(deepspeed/runtime/zero/stage3.py), GPU side, with their fixed byte counts: 2 bytes of
16-bit weights, 18 sharded bytes (16-bit and fp32 gradients, fp32 weights, Adam's two
states) and 4 bytes for the largest layer's 16-bit weights and gradients. They assume
mixed-precision Adam and are reproduced as DeepSpeed computes them whatever the
experiment's precision and optimizer; the paper column follows those.

    zero2          2Ψ + 18Ψ/N                      estimate_zero2(cpu_offload=False)
    zero2_offload  2Ψ                              estimate_zero2(cpu_offload=True)
    zero3          4L + 18Ψ/N                      estimate_zero3(cpu_offload=False)
    zero3_offload  4L                              estimate_zero3(cpu_offload=True,
                                                                  cpu_offload_params=True)
DeepSpeed has no estimator for ddp and zero1; they follow from the same byte counts:

    ddp            20Ψ                             the ZeRO-2 formula with nothing sharded
                                                   (N = 1); torch DDP with AMP holds the same:
                                                   fp32 weights and gradients, DDP's bucket
                                                   copy of the gradients, Adam's 8 bytes
    zero1          4Ψ + 16Ψ/N                      16-bit gradients stay whole, the rest of
                                                   the 18 sharded bytes is partitioned

PyTorch FSDP2 (`fully_shard`, full sharding: the `fsdp` row's `estimate_gb`)
---------------------------------------------------------------------------
ZeRO-3's accounting with the experiment's precision and optimizer: weights, gradients
and optimizer states are sharded over the N ranks, and one layer at a time is gathered
whole to compute, its weights and, in the backward pass, its gradients before they are
reduce-scattered:

    fsdp           (P + G + K)Ψ/N + (P + G)L       bf16 Adam: 16Ψ/N + 4L; fp32 Adam: 16Ψ/N + 8L

Under mixed precision FSDP2 keeps the sharded weights and gradients in fp32 and
gathers 16-bit copies (MixedPrecisionPolicy): 4 + 4 + 8 bytes per sharded parameter,
the same 16 as P + G + K. The next layer's prefetched weights and the gradients' fp32
copy for the reduce-scatter are transient and left to the site's headroom. DeepSpeed
has no estimate of FSDP: the row's `deepspeed_gb` is null.

L is `model.largest_layer_params`; else the largest module counted from `model.factory`
(its own parameters, as DeepSpeed's model_to_params counts); else 4h² + 4h, the MLP
up-projection of a transformer block, with h = model.hidden_size, or h from
Ψ ≈ 12·layers·h², or without layers from the aspect ratio h ≈ 128·layers of GPT-3 and
LLaMA: h = (128Ψ/12)^(1/3). An embedding with a large vocabulary can be bigger than that
matrix: give model.largest_layer_params then.

Host memory of the offload strategies (`host_gb`, per node)
-----------------------------------------------------------
DeepSpeed's ZeRO-3 estimator with zero_init: 16Ψ/nodes for an offloaded optimizer (fp32
gradients, weights, Adam states), 18Ψ/nodes with the 16-bit parameters offloaded too.
ZeRO-2 offload keeps the same optimizer partitions on the host, so it is counted with
the same 16; DeepSpeed's ZeRO-2 host estimate grows with the total GPU count instead,
because it assumes every rank loads the full fp32 model on the host. The 1.5
additional_buffer_factor is not applied: the site's headroom plays that part. An offload
strategy is only recommended when this fits in the node's memory (resources.mem_gb, else
the partition's mem_gb) less the headroom; when neither is known only the GPU is checked.
In the output `fits` means usable: the GPU check (`gpu_fits`) and, for offload, the host
check (`host_fits`, null when not checked) both pass.

Activations (`activations_gb`)
------------------------------
Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", section 4.1: one transformer layer without recomputation, tensor or sequence
parallelism stores s·b·h·(34 + 5·a·s/h) bytes with 16-bit activations (s sequence
length, b micro batch, h hidden size, a heads). Of those, sbh twice and as²b once are
1-byte dropout masks; with fp32 activations the rest doubles: s·b·h·(66 + 9·a·s/h).
Times model.layers; embeddings and the output logits are not counted. Without all of
layers, hidden_size, heads and seq_len the activations count as 0, and the plan says so.

Fitting
-------
total = estimate_gb + activations_gb + overhead_gb (estimate_gb: DeepSpeed's arithmetic
above, FSDP2's for fsdp; site plan.overhead_gb: CUDA context, NCCL buffers,
fragmentation); a strategy fits when total <= gpu_mem_gb·(1 - headroom). The
recommendation is the first that fits in the order of STRATEGIES (see there).

Communication per step relative to DDP (ZeRO paper, section 7): DDP's all-reduce moves
2Ψ, as do ZeRO-1 and ZeRO-2 (reduce-scatter and all-gather); ZeRO-3 moves 3Ψ, 1.5x,
since parameters are all-gathered in forward and again in backward; so does FSDP2 with
its default reshard_after_forward. Offload adds PCIe traffic per GPU and step: ZeRO-2
offload sends its gradient partition to the host and takes the updated weights back,
(G + P)Ψ/N; ZeRO-3 offload also fetches the parameter shards for the backward pass,
(G + 2P)Ψ/N.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

GB = 1e9
# The table's rows and `auto`'s preference, in this order: least communication first, then
# least host traffic. ZeRO-1 and ZeRO-2 move DDP's 2Ψ per step and come before fsdp's 3Ψ;
# fsdp comes before zero3, which moves as much and holds more (18 sharded bytes against
# 16): it is PyTorch's own, needs no DeepSpeed installed and checkpoints through
# torch.distributed.checkpoint. DeepSpeed is chosen over fsdp only where it moves less or
# where offload is needed.
STRATEGIES = ("ddp", "zero1", "zero2", "fsdp", "zero3", "zero2_offload", "zero3_offload")
PRECISIONS = ("fp32", "fp16", "bf16")
OPTIMIZERS = ("adam", "adamw", "sgd")
NODE_SEARCH_CAP = 4096          # for min_nodes when the partition gives no max_nodes
GPT_ASPECT = 128                # hidden size / layers of GPT-3 175B, LLaMA 7B and 13B

COMM_VOLUME = {"ddp": 1.0, "zero1": 1.0, "zero2": 1.0, "fsdp": 1.5, "zero3": 1.5, "zero2_offload": 1.0,
               "zero3_offload": 1.5}
SETTINGS: dict[str, dict[str, Any]] = {
    "ddp": {"name": "ddp"},
    "fsdp": {"name": "fsdp"},
    "zero1": {"name": "deepspeed", "zero_stage": 1, "offload_optimizer": "none", "offload_params": "none"},
    "zero2": {"name": "deepspeed", "zero_stage": 2, "offload_optimizer": "none", "offload_params": "none"},
    "zero3": {"name": "deepspeed", "zero_stage": 3, "offload_optimizer": "none", "offload_params": "none"},
    "zero2_offload": {"name": "deepspeed", "zero_stage": 2, "offload_optimizer": "cpu", "offload_params": "none"},
    "zero3_offload": {"name": "deepspeed", "zero_stage": 3, "offload_optimizer": "cpu", "offload_params": "cpu"},
}
OFFLOAD = ("zero2_offload", "zero3_offload")


class PlanInputError(ValueError):
    """A PlanInput value the planner cannot use; `field` names the PlanInput field."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


@dataclass(frozen=True)
class PlanInput:
    params: int
    nodes: int
    gpus_per_node: int
    gpu_mem_gb: float
    precision: str = "bf16"
    optimizer: str = "adam"
    micro_batch: int = 1
    layers: int | None = None
    hidden_size: int | None = None
    heads: int | None = None
    seq_len: int | None = None
    largest_layer_params: int | None = None
    overhead_gb: float = 2.0
    headroom: float = 0.10
    max_nodes: int | None = None
    host_mem_gb: float | None = None     # per node; None: host memory is not checked
    largest_layer_source: str | None = None   # where largest_layer_params came from, for the table

    def __post_init__(self) -> None:
        for name in ("params", "nodes", "gpus_per_node", "micro_batch"):
            _positive_int(self, name)
        for name in ("layers", "hidden_size", "heads", "seq_len", "largest_layer_params", "max_nodes"):
            if getattr(self, name) is not None:
                _positive_int(self, name)
        for name in ("gpu_mem_gb", "host_mem_gb"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise PlanInputError(name, f"must be a finite number more than 0, got {value!r}")
        if self.precision not in PRECISIONS:
            raise PlanInputError("precision", f"{self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if self.optimizer not in OPTIMIZERS:
            raise PlanInputError("optimizer", f"{self.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
        if not 0 <= self.headroom < 1:
            raise PlanInputError("headroom", "must be a fraction in [0, 1)")
        if not (self.overhead_gb >= 0 and math.isfinite(self.overhead_gb)):
            raise PlanInputError("overhead_gb", f"must be a finite number, 0 or more, got {self.overhead_gb!r}")
        if self.largest_layer_params is not None and self.largest_layer_params > self.params:
            raise PlanInputError("largest_layer_params", f"{self.largest_layer_params} is more than the "
                                 f"model's {self.params} parameters")

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def usable_gb(self) -> float:
        return self.gpu_mem_gb * (1 - self.headroom)

    @property
    def shape_given(self) -> bool:
        return None not in (self.layers, self.hidden_size, self.heads, self.seq_len)


def _positive_int(inp: PlanInput, name: str) -> None:
    """Whole and positive; a whole float such as 7.5e9 becomes an int."""
    value = getattr(inp, name)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
        object.__setattr__(inp, name, value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanInputError(name, f"must be a whole number of 1 or more, not {value!r}")


@dataclass(frozen=True)
class ByteCounts:
    """Bytes per parameter of the ZeRO paper's accounting; see the module docstring."""

    p: int    # weights
    g: int    # gradients
    k: int    # fp32 master weights (mixed precision) + optimizer states


def byte_counts(precision: str, optimizer: str) -> ByteCounts:
    mixed = precision != "fp32"
    word = 2 if mixed else 4
    return ByteCounts(p=word, g=word, k=(4 if optimizer == "sgd" else 8) + (4 if mixed else 0))


def zero_paper_bytes(name: str, psi: float, n: int, b: ByteCounts) -> float:
    """Per-GPU model-state bytes, the ZeRO paper's accounting."""
    return {
        "ddp": (b.p + b.g + b.k) * psi,
        "zero1": (b.p + b.g) * psi + b.k * psi / n,
        "zero2": b.p * psi + (b.g + b.k) * psi / n,
        "zero3": (b.p + b.g + b.k) * psi / n,
        "fsdp": (b.p + b.g + b.k) * psi / n,
        "zero2_offload": b.p * psi + b.g * psi / n,
        "zero3_offload": b.g * psi / n,
    }[name]


# DeepSpeed's estimators: 16-bit weights, sharded bytes, largest layer's weights + grads;
# the 16-bit gradients' part of the sharded bytes stays whole under ZeRO-1.
DS_PARAM, DS_SHARD, DS_LAYER, DS_GRAD16 = 2, 18, 4, 2
DS_HOST_OPTIMIZER = 16          # fp32 grads + fp32 weights + Adam states, on the host


def deepspeed_bytes(name: str, psi: float, n: int, largest: float) -> float:
    """Per-GPU model-state bytes, DeepSpeed's estimator arithmetic."""
    return {
        "ddp": (DS_PARAM + DS_SHARD) * psi,
        "zero1": (DS_PARAM + DS_GRAD16) * psi + (DS_SHARD - DS_GRAD16) * psi / n,
        "zero2": DS_PARAM * psi + DS_SHARD * psi / n,
        "zero3": DS_LAYER * largest + DS_SHARD * psi / n,
        "zero2_offload": DS_PARAM * psi,
        "zero3_offload": DS_LAYER * largest,
    }[name]


def fsdp_bytes(psi: float, n: int, largest: float, b: ByteCounts) -> float:
    """Per-GPU model-state bytes of FSDP2's full sharding: ZeRO-3's sharded states and the
    largest layer's weights and gradients gathered whole, in the experiment's precision."""
    return (b.p + b.g + b.k) * psi / n + (b.p + b.g) * largest


def estimate_bytes(name: str, psi: float, n: int, largest: float, b: ByteCounts) -> float:
    """Per-GPU model-state bytes that decide what fits: FSDP2's for fsdp, DeepSpeed's
    estimator arithmetic for the others."""
    return fsdp_bytes(psi, n, largest, b) if name == "fsdp" else deepspeed_bytes(name, psi, n, largest)


def host_bytes(name: str, psi: float, nodes: int) -> float | None:
    """Host bytes per node an offload strategy needs; None for the others."""
    if name == "zero2_offload":
        return DS_HOST_OPTIMIZER * psi / nodes
    if name == "zero3_offload":
        return (DS_HOST_OPTIMIZER + DS_PARAM) * psi / nodes
    return None


def pcie_bytes(name: str, psi: float, n: int, b: ByteCounts) -> float:
    """GPU<->host bytes per GPU per step."""
    if name == "zero2_offload":
        return (b.g + b.p) * psi / n
    if name == "zero3_offload":
        return (b.g + 2 * b.p) * psi / n
    return 0.0


def activation_bytes(inp: PlanInput) -> float:
    """Korthikanti et al. 2022, per layer s·b·h·(34 + 5as/h) bytes (16-bit), times layers."""
    if not inp.shape_given:
        return 0.0
    s, b, h, a, layers = inp.seq_len, inp.micro_batch, inp.hidden_size, inp.heads, inp.layers
    if s is None or h is None or a is None or layers is None:     # shape_given says they are all set
        return 0.0
    linear, quadratic = (66, 9) if inp.precision == "fp32" else (34, 5)
    return layers * s * b * h * (linear + quadratic * a * s / h)


def largest_layer(inp: PlanInput) -> tuple[int, str]:
    """L and where it came from; see the module docstring."""
    if inp.largest_layer_params is not None:
        return inp.largest_layer_params, inp.largest_layer_source or "model.largest_layer_params"
    h: float
    if inp.hidden_size is not None:
        h, how = inp.hidden_size, "4h²+4h from model.hidden_size"
    elif inp.layers is not None:
        h, how = math.sqrt(inp.params / (12 * inp.layers)), "4h²+4h, h from params = 12·layers·h²"
    else:
        h, how = (GPT_ASPECT * inp.params / 12) ** (1 / 3), "4h²+4h, h from params assuming h = 128·layers"
    return min(int(4 * h * h + 4 * h), inp.params), f"estimated: {how}"
