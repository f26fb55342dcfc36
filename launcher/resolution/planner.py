"""The planner: every strategy's per-GPU memory (launcher.resolution.memory) on one
allocation, which fit, the recommendation and why, the fewest nodes that would fit, and
the table `glaunch plan` prints. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from launcher.resolution.goodput_projection import Projection
from launcher.resolution.memory import (
    COMM_VOLUME,
    GB,
    NODE_SEARCH_CAP,
    OFFLOAD,
    SETTINGS,
    STRATEGIES,
    PlanInput,
    activation_bytes,
    byte_counts,
    estimate_bytes,
    host_bytes,
    largest_layer,
    pcie_bytes,
    zero_paper_bytes,
)


@dataclass(frozen=True)
class StrategyRow:
    name: str
    model_states_gb: float        # the ZeRO paper's persistent states
    estimate_gb: float            # what decides fit: DeepSpeed's estimator arithmetic, FSDP2's for fsdp
    activations_gb: float
    total_gb: float
    gpu_fits: bool
    comm_volume: float
    pcie_gb: float
    host_gb: float | None
    host_fits: bool | None        # None: not an offload strategy, or host memory unknown

    @property
    def deepspeed_gb(self) -> float | None:
        """DeepSpeed's estimate; None for fsdp, which DeepSpeed does not estimate."""
        return None if self.name == "fsdp" else self.estimate_gb

    @property
    def fits(self) -> bool:
        """Usable: it fits the GPU and, for offload, the host memory where that is known."""
        return self.gpu_fits and self.host_fits is not False

    def to_json(self) -> dict[str, Any]:
        ds = self.deepspeed_gb
        return {"name": self.name, "model_states_gb": _r(self.model_states_gb),
                "estimate_gb": _r(self.estimate_gb), "deepspeed_gb": None if ds is None else _r(ds),
                "activations_gb": _r(self.activations_gb),
                "total_gb": _r(self.total_gb), "fits": self.fits, "gpu_fits": self.gpu_fits,
                "comm_volume": self.comm_volume,
                "pcie_gb": _r(self.pcie_gb), "host_gb": None if self.host_gb is None else _r(self.host_gb),
                "host_fits": self.host_fits}


def _r(value: float) -> float:
    return round(value, 6)


def evaluate(inp: PlanInput, nodes: int | None = None) -> list[StrategyRow]:
    """Every strategy's row on `nodes` nodes (default: the requested ones)."""
    nodes = inp.nodes if nodes is None else nodes
    n = nodes * inp.gpus_per_node
    psi = float(inp.params)
    b = byte_counts(inp.precision, inp.optimizer)
    largest, _ = largest_layer(inp)
    act = activation_bytes(inp) / GB
    rows = []
    for name in STRATEGIES:
        estimate = estimate_bytes(name, psi, n, largest, b) / GB
        total = estimate + act + inp.overhead_gb
        host = host_bytes(name, psi, nodes)
        host_gb = None if host is None else host / GB
        host_fits = None
        if host_gb is not None and inp.host_mem_gb is not None:
            host_fits = host_gb <= inp.host_mem_gb * (1 - inp.headroom)
        rows.append(StrategyRow(name, zero_paper_bytes(name, psi, n, b) / GB, estimate, act, total,
                                total <= inp.usable_gb, COMM_VOLUME[name], pcie_bytes(name, psi, n, b) / GB,
                                host_gb, host_fits))
    return rows


def _first_fitting(rows: Sequence[StrategyRow]) -> StrategyRow | None:
    return next((r for r in rows if r.fits), None)


def find_min_nodes(inp: PlanInput) -> int | None:
    """The fewest nodes above the requested ones at which some strategy fits, up to the
    partition's max_nodes (else NODE_SEARCH_CAP); None when none does. Per-GPU and per-node
    host memory only shrink with more nodes, so a bisection finds it in a few steps
    whatever max_nodes says."""
    low, high = inp.nodes, inp.max_nodes or NODE_SEARCH_CAP
    if high <= low or not _first_fitting(evaluate(inp, high)):
        return None
    while high - low > 1:           # low does not fit, high does
        mid = (low + high) // 2
        if _first_fitting(evaluate(inp, mid)):
            high = mid
        else:
            low = mid
    return high


@dataclass(frozen=True)
class PlanResult:
    input: PlanInput
    rows: tuple[StrategyRow, ...]
    recommended: str | None
    reason: str
    min_nodes: int | None
    largest_layer_params: int
    largest_layer_source: str
    notes: tuple[str, ...] = field(default=())
    goodput: Projection | None = None     # ETTR projected at this size (and a named one)

    @property
    def world_size(self) -> int:
        return self.input.world_size

    def row(self, name: str) -> StrategyRow:
        return next(r for r in self.rows if r.name == name)

    def to_json(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "gpu_mem_gb": float(self.input.gpu_mem_gb),
                "strategies": [r.to_json() for r in self.rows], "recommended": self.recommended,
                "reason": self.reason, "min_nodes": self.min_nodes,
                "goodput": {"projection": self.goodput.to_json()} if self.goodput is not None else None}


def make_plan(inp: PlanInput) -> PlanResult:
    rows = tuple(evaluate(inp))
    largest, source = largest_layer(inp)
    chosen = _first_fitting(rows)
    min_nodes = None if chosen else find_min_nodes(inp)
    reason = _reason(inp, rows, chosen, min_nodes)
    notes = []
    if not inp.shape_given:
        missing = [k for k in ("layers", "hidden_size", "heads", "seq_len") if getattr(inp, k) is None]
        notes.append("activations not counted (0 GB): model." + ", model.".join(missing) + " not given")
    else:
        notes.append(f"activations: {inp.layers} layers x s·b·h·(34 + 5·a·s/h) bytes, Korthikanti et al. 2022"
                     + (" (fp32: 66 + 9·a·s/h)" if inp.precision == "fp32" else "")
                     + f", micro batch {inp.micro_batch}, no recomputation")
    if inp.precision == "fp32" or inp.optimizer == "sgd":
        notes.append(f"the estimate column keeps DeepSpeed's mixed-precision Adam byte counts (fsdp's counts "
                     f"{inp.precision} {inp.optimizer}); the ZeRO paper column counts {inp.precision} {inp.optimizer}")
    if inp.host_mem_gb is None:
        notes.append("host memory not checked for offload: no resources.mem_gb or partition mem_gb")
    return PlanResult(inp, rows, chosen.name if chosen else None, reason, min_nodes, largest, source,
                      tuple(notes))


def _reason(inp: PlanInput, rows: Sequence[StrategyRow], chosen: StrategyRow | None,
            min_nodes: int | None) -> str:
    usable = f"{inp.usable_gb:.1f} GB usable per GPU ({inp.gpu_mem_gb:g} GB less {inp.headroom:.0%} headroom)"
    if chosen is not None:
        skipped = rows[:rows.index(chosen)]
        text = f"{chosen.name} is the first of {', '.join(STRATEGIES)} that fits: {chosen.total_gb:.1f} GB of {usable}"
        if skipped:
            text += "; " + ", ".join(_shortfall(r) for r in skipped)
        if chosen.comm_volume != 1.0:
            text += f"; {chosen.comm_volume:g}x DDP's communication volume"
        if chosen.name in OFFLOAD:
            text += f"; offload adds {chosen.pcie_gb:.1f} GB of PCIe traffic per GPU per step"
            if chosen.host_gb is not None:
                text += f" and needs {chosen.host_gb:.0f} GB of host memory per node"
        return text
    text = f"nothing fits on {inp.nodes} node(s) x {inp.gpus_per_node} GPUs"
    host_limited = [r for r in rows if r.gpu_fits and r.host_fits is False]
    if host_limited:
        host_usable = (inp.host_mem_gb or 0.0) * (1 - inp.headroom)
        text += ": " + ", ".join(f"{r.name} fits the GPU but needs {r.host_gb:.0f} GB" for r in host_limited) \
            + f" of host memory per node, of {host_usable:.0f} GB usable"
    gpu_short = [r for r in rows if not r.gpu_fits]
    if gpu_short:
        best = min(gpu_short, key=lambda r: r.total_gb)
        text += (f"; the least of the others, {best.name}," if host_limited else f": the least, {best.name},") \
            + f" needs {best.total_gb:.1f} GB of {usable}"
    if min_nodes is not None:
        text += f"; it fits from {min_nodes} node(s)"
    else:
        text += f"; no node count up to {inp.max_nodes or NODE_SEARCH_CAP} fits (the largest layer, " \
                "activations and overhead do not shrink with more nodes)"
    return text


def _shortfall(r: StrategyRow) -> str:
    if r.gpu_fits:
        return f"{r.name} fits the GPU but needs {r.host_gb:.0f} GB of host memory per node"
    return f"{r.name} needs {r.total_gb:.1f} GB"


def strategy_settings(name: str) -> dict[str, Any]:
    """The strategy keys a planner name resolves to."""
    if name not in SETTINGS:
        raise ValueError(f"unknown strategy {name!r}; one of {', '.join(STRATEGIES)}")
    return dict(SETTINGS[name])


def format_plan_table(result: PlanResult) -> str:
    inp = result.input
    head = [
        f"model: {inp.params:,} params ({inp.params / 1e9:.3g}B), {inp.precision}, {inp.optimizer}; "
        f"{inp.nodes} node(s) x {inp.gpus_per_node} GPUs = {inp.world_size} ranks",
        f"GPU: {inp.gpu_mem_gb:g} GB, {inp.usable_gb:.1f} GB usable ({inp.headroom:.0%} headroom), "
        f"overhead {inp.overhead_gb:g} GB" + (f"; host: {inp.host_mem_gb:g} GB per node"
                                              if inp.host_mem_gb is not None else ""),
        f"largest layer: {result.largest_layer_params:,} params ({result.largest_layer_source})",
        *result.notes,
        "",
        "per GPU, GB    ZeRO paper   estimate  activations    total  fits  comm   offload (PCIe/step, host/node)",
    ]
    lines = []
    for r in result.rows:
        offload = ""
        if r.name in OFFLOAD:
            offload = f"{r.pcie_gb:.1f} GB, {r.host_gb:.0f} GB"
            if r.host_fits is not None:
                offload += f" of {(inp.host_mem_gb or 0.0) * (1 - inp.headroom):.0f}" + ("" if r.host_fits else " NO")
        lines.append(f"{r.name:14s} {r.model_states_gb:10.2f} {r.estimate_gb:10.2f} {r.activations_gb:12.2f} "
                     f"{r.total_gb:8.2f}  {'yes' if r.fits else 'no':4s}  {r.comm_volume:.1f}x  {offload}".rstrip())
    tail = ["estimate: DeepSpeed's estimators (ddp, zero*); fsdp: FSDP2's sharded states + the largest layer "
            "gathered whole",
            "comm: per-step volume relative to DDP's 2Ψ all-reduce (ZeRO paper); offload adds the PCIe traffic shown",
            "", f"recommended: {result.recommended or 'none'}", f"reason: {result.reason}"]
    if result.min_nodes is not None:
        tail.append(f"minimum nodes: {result.min_nodes} (resources.nodes)")
    return "\n".join(head + lines + tail)
