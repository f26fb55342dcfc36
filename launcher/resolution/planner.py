"""The planner: every strategy's per-GPU memory (launcher.resolution.memory) on one
allocation, which fit, the recommendation and why, the fewest nodes that would fit, and
the table `glaunch plan` prints. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from launcher.resolution.goodput_projection import Projection
from launcher.resolution.memory import (
    COMM_VOLUME,
    GB,
    NODE_SEARCH_CAP,
    OFFLOAD,
    RECOMPUTATION,
    SETTINGS,
    STRATEGIES,
    PlanInput,
    activation_bytes,
    activation_formula,
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


def recomputation_to_try(inp: PlanInput) -> tuple[str, ...]:
    """The experiment's activation checkpointing, then the settings after it in
    RECOMPUTATION; only its own when the activations are not counted (the shape is not
    given): recomputation then changes nothing the plan can see."""
    configured = inp.activation_checkpointing
    if not inp.shape_given:
        return (configured,)
    return RECOMPUTATION[RECOMPUTATION.index(configured):]


def _fits_somehow(inp: PlanInput, nodes: int) -> bool:
    return any(_first_fitting(evaluate(replace(inp, activation_checkpointing=setting), nodes))
               for setting in recomputation_to_try(inp))


def find_min_nodes(inp: PlanInput) -> int | None:
    """The fewest nodes above the requested ones at which some strategy fits, with the
    experiment's recomputation or more (see recomputation_to_try), up to the partition's
    max_nodes (else NODE_SEARCH_CAP); None when none does. Per-GPU and per-node host memory
    only shrink with more nodes, so a bisection finds it in a few steps whatever max_nodes
    says."""
    low, high = inp.nodes, inp.max_nodes or NODE_SEARCH_CAP
    if high <= low or not _fits_somehow(inp, high):
        return None
    while high - low > 1:           # low does not fit, high does
        mid = (low + high) // 2
        if _fits_somehow(inp, mid):
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
    # The recomputation the recommendation assumes and, where it is not the experiment's,
    # every strategy's row with it.
    recomputation: str = "none"
    recomputed_rows: tuple[StrategyRow, ...] = field(default=())
    goodput: Projection | None = None     # ETTR projected at this size (and a named one)

    @property
    def world_size(self) -> int:
        return self.input.world_size

    @property
    def recommendation(self) -> str:
        """The strategy, and the recomputation it needs where that is not the experiment's."""
        if self.recommended is None:
            return "none"
        if self.recomputation != self.input.activation_checkpointing:
            return f"{self.recommended} with activation_checkpointing: {self.recomputation}"
        return self.recommended

    def row(self, name: str) -> StrategyRow:
        """The strategy's row with the experiment's own recomputation."""
        return next(r for r in self.rows if r.name == name)

    @property
    def recommended_row(self) -> StrategyRow | None:
        """The recommendation's row, with the recomputation it assumes."""
        return next((r for r in self.recomputed_rows or self.rows if r.name == self.recommended), None)

    def to_json(self) -> dict[str, Any]:
        inp = self.input
        return {"world_size": self.world_size, "gpu_mem_gb": float(inp.gpu_mem_gb),
                "strategies": [r.to_json() for r in self.rows], "recommended": self.recommended,
                "recommended_activation_checkpointing": self.recomputation if self.recommended else None,
                "recomputed_strategies": [r.to_json() for r in self.recomputed_rows] or None,
                "activations": {"activation_checkpointing": inp.activation_checkpointing,
                                "flash_attention": inp.flash_attention, "counted": inp.shape_given,
                                "missing": [f"model.{k}" for k in inp.missing_shape]},
                "reason": self.reason, "min_nodes": self.min_nodes, "notes": list(self.notes),
                "goodput": {"projection": self.goodput.to_json()} if self.goodput is not None else None}


def make_plan(inp: PlanInput) -> PlanResult:
    rows = tuple(evaluate(inp))
    largest, source = largest_layer(inp)
    assumed, assumed_rows, chosen = _choose(inp, rows)
    min_nodes = None if chosen else find_min_nodes(inp)
    if assumed == inp.activation_checkpointing:
        reason = _reason(inp, rows, chosen, min_nodes)
    else:
        reason = _recomputed_reason(inp, rows, assumed, assumed_rows, chosen, min_nodes)
    return PlanResult(inp, rows, chosen.name if chosen else None, reason, min_nodes, largest, source,
                      _notes(inp), assumed if chosen else inp.activation_checkpointing,
                      assumed_rows if chosen and assumed != inp.activation_checkpointing else ())


def _choose(inp: PlanInput, rows: tuple[StrategyRow, ...]) -> tuple[str, tuple[StrategyRow, ...], StrategyRow | None]:
    """(the recomputation assumed, every strategy's row with it, the recommendation): the first
    strategy without offload that fits, in the order of STRATEGIES, with the experiment's
    recomputation, else with more (recomputation_to_try); offload only where none without it
    fits with any, since its PCIe traffic and host-side optimizer step cost more than
    recomputing a forward pass."""
    tried = []
    for setting in recomputation_to_try(inp):
        with_setting = rows if setting == inp.activation_checkpointing else \
            tuple(evaluate(replace(inp, activation_checkpointing=setting)))
        tried.append((setting, with_setting))
        chosen = next((r for r in with_setting if r.fits and r.name not in OFFLOAD), None)
        if chosen is not None:
            return setting, with_setting, chosen
    for setting, with_setting in tried:
        chosen = _first_fitting(with_setting)
        if chosen is not None:
            return setting, with_setting, chosen
    return tried[-1][0], tried[-1][1], None


def _notes(inp: PlanInput) -> tuple[str, ...]:
    notes = []
    if inp.missing_shape:
        notes.append("activations not counted (0 GB): model." + ", model.".join(inp.missing_shape) + " not given"
                     f" (activation_checkpointing: {inp.activation_checkpointing}, flash_attention: "
                     f"{str(inp.flash_attention).lower()}; no other recomputation tried)")
    else:
        notes.append(f"activations: {activation_formula(inp)}, Korthikanti et al. 2022")
    if inp.host_mem_gb is None:
        notes.append("host memory not checked for offload: no resources.mem_gb or partition mem_gb")
    return tuple(notes)


def _recomputed_reason(inp: PlanInput, rows: Sequence[StrategyRow], assumed: str,
                       assumed_rows: Sequence[StrategyRow], chosen: StrategyRow | None, min_nodes: int | None) -> str:
    """The reason where nothing fits with the experiment's recomputation: what the most that
    was tried gives."""
    least = min((r for r in rows if r.name not in OFFLOAD), key=lambda r: r.total_gb)
    what = "only offload fits" if _first_fitting(rows) else "nothing fits"
    text = (f"{what} with activation_checkpointing: {inp.activation_checkpointing} (the least without offload, "
            f"{least.name}, needs {least.total_gb:.1f} GB); with activation_checkpointing: {assumed}, ")
    text += _reason(replace(inp, activation_checkpointing=assumed), assumed_rows, chosen, min_nodes)
    if chosen is not None:
        text += (f"; set model.activation_checkpointing: {assumed} and checkpoint the activations in the "
                 "training script")
    return text


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
        *_table_lines(result.rows, inp),
    ]
    if result.recomputed_rows:
        assumed = replace(inp, activation_checkpointing=result.recomputation)
        head += ["", f"with activation_checkpointing: {result.recomputation}, activations: "
                 f"{activation_formula(assumed)}", "", *_table_lines(result.recomputed_rows, inp)]
    tail = ["estimate: DeepSpeed's estimators' byte counts in the experiment's precision and optimizer "
            "(ddp, zero*); fsdp: FSDP2's sharded states + the largest layer gathered whole",
            "comm: per-step volume relative to DDP's 2Ψ all-reduce (ZeRO paper); offload adds the PCIe traffic shown",
            "", f"recommended: {result.recommendation}", f"reason: {result.reason}"]
    if result.min_nodes is not None:
        tail.append(f"minimum nodes: {result.min_nodes} (resources.nodes)")
    return "\n".join(head + tail)


def _table_lines(rows: Sequence[StrategyRow], inp: PlanInput) -> list[str]:
    lines = ["per GPU, GB    ZeRO paper   estimate  activations    total  fits  comm   offload (PCIe/step, host/node)"]
    for r in rows:
        offload = ""
        if r.name in OFFLOAD:
            offload = f"{r.pcie_gb:.1f} GB, {r.host_gb:.0f} GB"
            if r.host_fits is not None:
                offload += f" of {(inp.host_mem_gb or 0.0) * (1 - inp.headroom):.0f}" + ("" if r.host_fits else " NO")
        lines.append(f"{r.name:14s} {r.model_states_gb:10.2f} {r.estimate_gb:10.2f} {r.activations_gb:12.2f} "
                     f"{r.total_gb:8.2f}  {'yes' if r.fits else 'no':4s}  {r.comm_volume:.1f}x  {offload}".rstrip())
    return lines
