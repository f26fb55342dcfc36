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
(deepspeed/runtime/zero/stage3.py), GPU side. Their fixed byte counts assume
mixed-precision Adam: 2 bytes of 16-bit weights, 18 sharded bytes (16-bit gradients 2,
fp32 gradients 4, fp32 weights 4, Adam's two states 8) and 4 bytes for the largest
layer's 16-bit weights and gradients. The planner counts the same roles with the
experiment's precision and optimizer, so that the estimate that decides fit is in the
precision of the table beside it:

    W   weights as the model computes with them: P
    S   sharded bytes: G + F + O + 4, with F = 4 the fp32 gradient partition under mixed
        precision (0 in fp32: the gradients already are), O the optimizer's states (8
        Adam/AdamW, 4 SGD) and 4 its fp32 copy of the weight partition (the master
        weights; DeepSpeed's optimizer clones the partition to fp32 in fp32 training
        too: single_partition_of_fp32_groups, fp32_partitioned_groups_flat)
    Y   the largest layer's weights and gradients: P + G

Mixed-precision Adam gives W = 2, S = 18, Y = 4: DeepSpeed's own figures, which the
tests compare with its functions. fp32 Adam gives W = 4, S = 16, Y = 8.

    zero2          WΨ + SΨ/N                       estimate_zero2(cpu_offload=False)
    zero2_offload  WΨ                              estimate_zero2(cpu_offload=True)
    zero3          YL + SΨ/N                       estimate_zero3(cpu_offload=False)
    zero3_offload  YL                              estimate_zero3(cpu_offload=True,
                                                                  cpu_offload_params=True)
DeepSpeed has no estimator for ddp and zero1; they follow from the same byte counts:

    ddp            (W + S)Ψ                        the ZeRO-2 formula with nothing sharded
                                                   (N = 1), 20Ψ for mixed-precision Adam;
                                                   torch DDP holds as much: weights and
                                                   gradients (fp32 under AMP), DDP's bucket
                                                   copy of the gradients, Adam's 8 bytes
    zero1          (W + G)Ψ + (S - G)Ψ/N           the gradients in the compute precision
                                                   stay whole, the rest of S is partitioned

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
Models", without tensor or sequence parallelism (s sequence length, b micro batch, h
hidden size, a heads, l layers):

    none        l·s·b·h·(34 + 5·a·s/h)     section 4.1, equation (1): one layer stores
                                           sbh·34 for its inputs, projections, MLP and
                                           norms, and 5·a·s²·b for the attention scores,
                                           their softmax and its dropout mask
    selective   l·s·b·h·34                 section 5: the attention scores are recomputed
                                           in the backward pass instead of stored
    full        2·s·b·h·l + one layer      section 5: only each layer's 16-bit input is
                                           stored; the layer being recomputed holds its
                                           whole working set, sbh·(34 + 5as/h)

FlashAttention (Dao et al. 2022, `model.flash_attention`, the default) computes attention
in tiles and never materialises the a·s² scores: the 5·a·s/h term goes whatever the
recomputation, and the heads are then not needed. Of the 34 and 5as/h, sbh twice and
as²b once are 1-byte dropout masks; with fp32 activations the rest doubles: 66 + 9·a·s/h,
and a full-recomputation layer input is 4·s·b·h. Embeddings and the output logits are
not counted. Without layers, hidden_size and seq_len (and heads, where the scores count)
the activations count as 0, and the plan says so.

Fitting
-------
total = estimate_gb + activations_gb + overhead_gb (estimate_gb: DeepSpeed's arithmetic
above, FSDP2's for fsdp; site plan.overhead_gb: CUDA context, NCCL buffers,
fragmentation); a strategy fits when total <= gpu_mem_gb·(1 - headroom). The
recommendation is the first that fits in the order of STRATEGIES (see there). When none
fits with the experiment's model.activation_checkpointing, the recommendation tries the
settings after it in RECOMPUTATION (selective, then full) before declaring that nothing
fits, and names the setting it assumes: full recomputation runs each forward pass again
(about a third more compute, Korthikanti et al., section 5), selective little. Offload is
recommended only where no strategy without it fits with any of those settings: moving
the optimizer step to the host costs more than recomputing.

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
# model.activation_checkpointing, least recomputation first: `auto` tries them in this order
RECOMPUTATION = ("none", "selective", "full")
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
    activation_checkpointing: str = "none"    # one of RECOMPUTATION
    flash_attention: bool = True

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
        if self.activation_checkpointing not in RECOMPUTATION:
            raise PlanInputError("activation_checkpointing", f"{self.activation_checkpointing!r} is not one of "
                                 f"{', '.join(RECOMPUTATION)}")
        if not isinstance(self.flash_attention, bool):
            raise PlanInputError("flash_attention", f"must be true or false, not {self.flash_attention!r}")
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
    def counts_scores(self) -> bool:
        """Whether the a·s² attention scores are stored: neither FlashAttention nor
        selective recomputation (full recomputation stores them for the layer it recomputes)."""
        return not self.flash_attention and self.activation_checkpointing != "selective"

    @property
    def missing_shape(self) -> tuple[str, ...]:
        """The shape fields the activations need and do not have."""
        needed = ("layers", "hidden_size", "heads", "seq_len") if self.counts_scores else \
            ("layers", "hidden_size", "seq_len")
        return tuple(name for name in needed if getattr(self, name) is None)

    @property
    def shape_given(self) -> bool:
        return not self.missing_shape


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
    """Bytes per parameter of the ZeRO paper's accounting (p, g, k) and DeepSpeed's (w, s, y);
    see the module docstring."""

    p: int    # weights
    g: int    # gradients
    k: int    # fp32 master weights (mixed precision) + optimizer states
    s: int    # DeepSpeed's sharded bytes: gradients, fp32 gradients, fp32 weights, optimizer states

    @property
    def w(self) -> int:
        """DeepSpeed's whole weights: those the model computes with."""
        return self.p

    @property
    def y(self) -> int:
        """DeepSpeed's bytes of the largest layer gathered whole: its weights and gradients."""
        return self.p + self.g


FP32 = 4                        # bytes of an fp32 value


def byte_counts(precision: str, optimizer: str) -> ByteCounts:
    mixed = precision != "fp32"
    word = 2 if mixed else FP32
    states = 4 if optimizer == "sgd" else 8
    fp32_grads = FP32 if mixed else 0
    return ByteCounts(p=word, g=word, k=states + (FP32 if mixed else 0), s=word + fp32_grads + states + FP32)


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


# DeepSpeed's host bytes of an offloaded optimizer: fp32 grads + fp32 weights + Adam states
DS_HOST_OPTIMIZER = 16
DS_PARAM = 2                    # the 16-bit parameters ZeRO-3 offload also keeps on the host


def deepspeed_bytes(name: str, psi: float, n: int, largest: float, b: ByteCounts) -> float:
    """Per-GPU model-state bytes, DeepSpeed's estimator arithmetic in the experiment's precision."""
    return {
        "ddp": (b.w + b.s) * psi,
        "zero1": (b.w + b.g) * psi + (b.s - b.g) * psi / n,
        "zero2": b.w * psi + b.s * psi / n,
        "zero3": b.y * largest + b.s * psi / n,
        "zero2_offload": b.w * psi,
        "zero3_offload": b.y * largest,
    }[name]


def fsdp_bytes(psi: float, n: int, largest: float, b: ByteCounts) -> float:
    """Per-GPU model-state bytes of FSDP2's full sharding: ZeRO-3's sharded states and the
    largest layer's weights and gradients gathered whole, in the experiment's precision."""
    return (b.p + b.g + b.k) * psi / n + (b.p + b.g) * largest


def estimate_bytes(name: str, psi: float, n: int, largest: float, b: ByteCounts) -> float:
    """Per-GPU model-state bytes that decide what fits: FSDP2's for fsdp, DeepSpeed's
    estimator arithmetic for the others."""
    return fsdp_bytes(psi, n, largest, b) if name == "fsdp" else deepspeed_bytes(name, psi, n, largest, b)


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
    """Korthikanti et al. 2022 with the recomputation and attention of `inp`; see the module
    docstring."""
    s, b, h, layers = inp.seq_len, inp.micro_batch, inp.hidden_size, inp.layers
    if inp.missing_shape or s is None or h is None or layers is None:
        return 0.0
    linear, quadratic = (66, 9) if inp.precision == "fp32" else (34, 5)
    per_token = float(linear)
    if inp.counts_scores and inp.heads is not None:      # missing_shape says heads is set then
        per_token += quadratic * inp.heads * s / h
    layer = s * b * h * per_token
    if inp.activation_checkpointing == "full":
        word = FP32 if inp.precision == "fp32" else 2
        return layers * word * s * b * h + layer
    return layers * layer


def activation_formula(inp: PlanInput) -> str:
    """How `activation_bytes` counts, in words, for the plan's text."""
    linear, quadratic = (66, 9) if inp.precision == "fp32" else (34, 5)
    layer = f"s·b·h·({linear} + {quadratic}·a·s/h)" if inp.counts_scores else f"s·b·h·{linear}"
    why = {"none": "no recomputation", "selective": "selective recomputation: attention scores recomputed",
           "full": "full recomputation"}[inp.activation_checkpointing]
    flash = "FlashAttention: scores never stored" if inp.flash_attention else "no FlashAttention"
    if inp.activation_checkpointing == "full":
        word = FP32 if inp.precision == "fp32" else 2
        counted = f"{inp.layers} layer inputs x {word}·s·b·h + one layer's {layer}"
    else:
        counted = f"{inp.layers} layers x {layer}"
    return f"{counted} bytes ({why}; {flash}), micro batch {inp.micro_batch}"


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
