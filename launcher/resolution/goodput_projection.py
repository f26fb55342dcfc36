"""Goodput projected to a size: the expected effective training time ratio (ETTR) of a
run of N nodes x G GPUs, for each way of recovering from a failure, and the checkpoint
interval that would waste least. Pure: numbers in, numbers out (launcher.runner.goodput
reports what did happen to a run; this says what to expect).

The model (first order, as Young's; J. W. Young, "A first order approximation to the
optimum checkpoint interval", CACM 17(9), 1974; J. T. Daly, "A higher order estimate of
the optimum checkpoint interval for restart dumps", FGCS 22(3), 2006). Failures come
without warning, independently on each node, at λ per node-hour, so the job fails every
M = 1 / (λ x nodes) hours on average (its MTBF). Per unit of wall time it wastes

    waste = δ/τ + (τ/2 + R) / M            ETTR = max(0, 1 - waste)

- δ/τ: the save stall δ paid once per checkpoint interval τ;
- τ/2: on average half an interval of work is lost at each failure;
- R: what one failure costs before training goes on, by recovery road:
  - ``requeue``: queue wait + start-up + resume load (a new job);
  - ``in_allocation``: a new job step in the same allocation: as the run measured it
    (``restart_s``), else start-up + resume load;
  - ``spares``: K spare nodes held idle in the allocation take a failed node's place
    while they last (in-allocation cost), then the job requeues. Failures within one
    allocation of length T are Poisson with mean T/M; the share that finds no spare left
    is E[max(F - K, 0)] / E[F], and R is the mix of the two costs. The spares' idle
    node-hours are paid too: ETTR x N / (N + K).
  - ``peer`` (``recovery.peer``, launcher.runtime.peer): a share p of the failures are a
    rank's step raising while its process and device live on; a live peer's state
    restores it in the same processes, so such a failure costs P, the failure to the end
    of the next step (the step in flight redone, no checkpoint read, nothing of the
    interval lost), instead of τ/2 + R. The rest restart in the allocation:

        waste = δ/τ + ((1 - p)(τ/2 + R_in_allocation) + p P) / M

    which is the in-allocation road at an MTBF of M / (1 - p) plus p P / M; its interval
    is τ*_peer = sqrt(2 δ M / (1 - p)) (fewer failures reach a checkpoint: save less often).

The interval that minimises the waste is τ* = sqrt(2 δ M) (Young); R does not move it at
first order, so it is the same for every road but the peer road's. The model holds while τ, δ and R are small
against M; ETTR far below 1 means the size is past where it is accurate (and past where
a run makes good progress: the numbers then mostly say so).

The default failure rate comes from published figures for 8-GPU nodes:
- Meta's research clusters (A. Kokolis et al., "Revisiting Reliability in Large-Scale
  Machine Learning Research Clusters", arXiv:2410.21680, HPCA 2025): a mean time to job
  interruption of about 8 h on 1,024 GPUs (128 nodes): λ = 1 / (8 x 128) ≈ 9.8e-4 per
  node-hour; and under 2 h on 16,384 GPUs (2,048 nodes): λ above 1 / (2 x 2,048) ≈ 2.4e-4;
- Llama 3 (A. Dubey et al., "The Llama 3 Herd of Models", arXiv:2407.21783, 2024):
  419 unexpected interruptions in 54 days on 16,384 GPUs: λ = 419 / (54 x 24 x 2,048)
  ≈ 1.6e-4 per node-hour (a job MTBF of 3.1 h at that size).
The default is the first and highest: it is what jobs of a research cluster saw, and a
projection should not promise more than the record. A site sets its own with
``goodput.failures_per_node_hour``.

The peer road's default share p = 0.15 (DEFAULT_PEER_SHARE; ``project(peer_share=...)``
sets another): of Llama 3's 419 unexpected interruptions 78% were confirmed or suspected
hardware (GPU faults 30.1%, their HBM3 17.2%): a failed GPU or node takes the rank's
process or device with it, which the peer road does not recover (that rank restarts).
The other 22% (software, network, NCCL timeouts) bound what it can take; a fault that
recurs when the step is redone is not recovered either, hence a share below the bound.
Its cost P, until a run measures it (``peer_s``, the ledger's failure -> next step): 30 s
(DEFAULT_PEER_S), a rough figure for forming the group again and sending a large model's
state over the network, said to be a default wherever it is shown.

Measured costs may be anything a record held (0 s saves of an asynchronous checkpoint, steps
faster than the clock, a damaged value): where the model would divide by 0 or leave the
finite numbers, a size's ``not_computable`` names the figure and says why, and the figure
is None; nothing here raises on its inputs' values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

GPUS_PER_NODE_CITED = 8
KOKOLIS_1024_GPUS_MTTI_H = 8.0
KOKOLIS_16384_GPUS_MTTI_H_AT_MOST = 2.0
LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS = 419, 54, 16_384

RATE_KOKOLIS_1024 = 1 / (KOKOLIS_1024_GPUS_MTTI_H * 1024 / GPUS_PER_NODE_CITED)
RATE_LLAMA3 = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 24 * LLAMA3_GPUS / GPUS_PER_NODE_CITED)
DEFAULT_FAILURES_PER_NODE_HOUR = RATE_KOKOLIS_1024
DEFAULT_RATE_SOURCE = ("default: about 8 h between interruptions of 1,024-GPU jobs on Meta's research "
                       "clusters (Kokolis et al. 2024)")

# Costs a run has not measured yet: rough figures for a multi-node job on a shared
# filesystem, said to be defaults wherever they are shown.
DEFAULT_COSTS = {
    "save_s": 30.0,           # the training loop's stall per checkpoint
    "startup_s": 180.0,       # a start's set-up, imports and rendezvous, to its first step
    "load_s": 60.0,           # finding, verifying and loading the newest checkpoint
    "queue_wait_s": 600.0,    # a requeued job waiting for its nodes again
    "step_s": 1.0,            # one training step (converts checkpoint.every_steps to seconds)
}
ROADS = ("requeue", "in_allocation", "spares")
PEER_ROAD = "peer"                # projected besides ROADS when asked for (project's peer_share) or measured
DEFAULT_PEER_SHARE = 0.15         # the share of failures a live peer recovers (the module's docstring)
DEFAULT_PEER_S = 30.0             # a peer recovery: the failure -> the end of the next step
HOUR = 3600.0

# The most GPUs a projection is asked for (`glaunch plan --at-gpus`): about five times the
# largest training clusters built so far (100,000 to 200,000 GPUs). At the default rate a
# job that size fails every half minute, well past where the first-order model holds, so a
# larger count says nothing more and only costs time.
MAX_PROJECTED_GPUS = 1_000_000
# The most failures per allocation the spares road is computed for: choosing the number of
# spares sums the Poisson distribution of an allocation's failures one term per spare
# weighed, so past this the work grows with the job's size while the answer does not
# change (a job failing every few seconds through its allocation: every road's ETTR is 0).
MAX_FAILURES_PER_ALLOCATION = 10_000


@dataclass(frozen=True)
class Costs:
    """What a failure and a checkpoint cost, in seconds; ``defaults`` names the ones that
    were not measured."""

    save_s: float
    startup_s: float
    load_s: float
    queue_wait_s: float
    step_s: float
    every_steps: int | None = None
    defaults: tuple[str, ...] = ()
    # A restart inside the allocation as the run measured it (the failed step's end to the
    # new step's first step: its teardown, the job's decision, the new step's start-up and
    # load); None: not measured, start-up + resume load stand for it.
    restart_s: float | None = None
    # A peer recovery as the run measured it (the failure to the end of the next step, the
    # ledger's median); None: not measured, DEFAULT_PEER_S stands for it.
    peer_s: float | None = None

    @property
    def peer_recovery_s(self) -> float:
        """What a peer recovery costs."""
        return self.peer_s if self.peer_s is not None else DEFAULT_PEER_S

    @property
    def in_allocation_s(self) -> float:
        """What a restart inside the allocation costs."""
        return self.restart_s if self.restart_s is not None else self.startup_s + self.load_s

    @property
    def interval_s(self) -> float | None:
        """The configured checkpoint interval in seconds (None: none configured)."""
        if not self.every_steps:
            return None
        try:
            return self.every_steps * self.step_s
        except OverflowError:          # a count of steps past what a float holds
            return math.inf

    @property
    def requeue_s(self) -> float:
        """What a requeue costs: a new job's queue wait, start-up and resume load."""
        return self.startup_s + self.load_s + self.queue_wait_s

    def to_json(self) -> dict[str, Any]:
        seconds = {key: _finite_or_none(getattr(self, key)) for key in DEFAULT_COSTS}
        return {**seconds, "every_steps": self.every_steps,
                "interval_s": _r(self.interval_s), "in_allocation_s": _r(self.in_allocation_s),
                "in_allocation_measured": self.restart_s is not None,
                "peer_s": _r(self.peer_recovery_s), "peer_measured": self.peer_s is not None,
                "defaults": list(self.defaults)}


def costs_with_defaults(measured: Mapping[str, Any], every_steps: int | None) -> Costs:
    """Costs from what was measured (None, absent or not a finite number of 0 or more: not
    measured), the rest DEFAULT_COSTS; a measured in-allocation restart (``restart_s``)
    and peer recovery (``peer_s``) where there were."""
    values = {key: _seconds_or_none(measured.get(key)) for key in DEFAULT_COSTS}
    defaults = tuple(key for key, value in values.items() if value is None)
    filled = {key: DEFAULT_COSTS[key] if value is None else value for key, value in values.items()}
    return Costs(every_steps=every_steps, defaults=defaults, restart_s=_seconds_or_none(measured.get("restart_s")),
                 peer_s=_seconds_or_none(measured.get("peer_s")), **filled)


def _seconds_or_none(value: Any) -> float | None:
    """`value` as seconds when it is a finite number of 0 or more, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        return None
    return seconds if 0 <= seconds < math.inf else None


def _positive(value: float | None) -> bool:
    """A finite number above 0: what the model may divide by."""
    return value is not None and 0 < value < math.inf


# --- the model ------------------------------------------------------------------------------


def job_mtbf_s(failures_per_node_hour: float, nodes: int) -> float:
    """The job's mean time between failures: every node can end it. Infinite for a rate of
    0 (and past the floats for a rate too small to divide by); NaN for no rate at all."""
    try:
        per_hour = failures_per_node_hour * nodes
    except OverflowError:            # a node count past what a float holds
        return 0.0
    if per_hour > 0:
        return HOUR / per_hour
    return math.inf if per_hour == 0 else math.nan


def young_daly_interval_s(save_s: float, mtbf_s: float) -> float:
    """τ* = sqrt(2 δ M) (infinite when the product is past the floats)."""
    return math.sqrt(2 * save_s * mtbf_s)


def waste(save_s: float, interval_s: float, restart_s: float, mtbf_s: float) -> float | None:
    """The expected share of wall time lost: δ/τ + (τ/2 + R)/M. None where τ or M is not a
    finite time above 0: the model divides by both."""
    if not (_positive(interval_s) and _positive(mtbf_s)):
        return None
    lost = save_s / interval_s + (interval_s / 2 + restart_s) / mtbf_s
    return None if math.isnan(lost) else lost


def ettr(save_s: float, interval_s: float, restart_s: float, mtbf_s: float) -> float | None:
    lost = waste(save_s, interval_s, restart_s, mtbf_s)
    return None if lost is None else max(0.0, 1.0 - lost)


def peer_waste(save_s: float, interval_s: float, restart_s: float, peer_s: float, share: float,
               mtbf_s: float) -> float | None:
    """δ/τ + ((1 - p)(τ/2 + R) + p P)/M: the waste with a share p of the failures recovered
    by a peer at P each (None where `waste` is)."""
    lost = waste(save_s, interval_s, restart_s, mtbf_s / (1 - share))
    if lost is None:
        return None
    lost += share * peer_s / mtbf_s
    return None if math.isnan(lost) else lost


def peer_ettr(save_s: float, interval_s: float, restart_s: float, peer_s: float, share: float,
              mtbf_s: float) -> float | None:
    lost = peer_waste(save_s, interval_s, restart_s, peer_s, share, mtbf_s)
    return None if lost is None else max(0.0, 1.0 - lost)


def peer_share_of(value: float) -> float:
    """`value` as the peer road's share of failures: a number from 0 to below 1 (all of
    them would need no checkpoint at all: not a first-order model's case); ValueError else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"the share of failures recovered by a peer must be from 0 to below 1, got {value!r}")
    return float(value)


def requeue_shares(most: int, failures_per_allocation: float) -> list[float]:
    """requeue_share(k, failures_per_allocation) for k = 0 .. most, in one pass over the
    Poisson terms; shorter where more spares change no share (see _share)."""
    mean = failures_per_allocation
    if not mean > 0:
        return [0.0]
    if mean == math.inf:
        return [1.0]
    shares = [1.0]
    covered = 0.0             # E[min(F, K)] = sum over j < K of P(F > j)
    cdf = 0.0
    log_mean = math.log(mean)
    # Past the mean by 10 standard deviations P(F > j) is below 1e-20: no term adds to
    # `covered` any more, and more spares change no share.
    terms = min(most, math.ceil(mean + 10 * math.sqrt(mean)) + 10)
    for j in range(terms):
        cdf += math.exp(j * log_mean - mean - math.lgamma(j + 1))
        covered += max(0.0, 1.0 - cdf)
        shares.append(max(0.0, 1.0 - covered / mean))
    return shares


def requeue_share(spares: int, failures_per_allocation: float) -> float:
    """The share of failures that find no spare left: E[max(F - K, 0)] / E[F] for F
    Poisson with mean `failures_per_allocation` (a new allocation brings K again)."""
    return _share(requeue_shares(spares, failures_per_allocation), spares)


def _share(shares: Sequence[float], spares: int) -> float:
    """requeue_shares' value for `spares` (past the list's end, its last: no change there)."""
    return shares[min(spares, len(shares) - 1)]


@dataclass(frozen=True)
class Road:
    """One recovery road at one size (a figure None: not computable, its size says why)."""

    name: str
    restart_s: float | None
    ettr_configured: float | None       # at the configured interval (None: none configured)
    ettr_optimal: float | None          # at the Young-Daly interval (the peer road: its own)
    spare_nodes: int = 0
    requeue_share: float | None = None  # spares: the share of failures that still requeue
    peer_share: float | None = None     # peer: the share of failures a peer recovers
    optimal_interval_s: float | None = None   # peer: its own Young-Daly interval

    def to_json(self) -> dict[str, Any]:
        data = {"road": self.name, "restart_s": _r(self.restart_s), "ettr_configured": _r(self.ettr_configured),
                "ettr_optimal": _r(self.ettr_optimal), "spare_nodes": self.spare_nodes,
                "requeue_share": _r(self.requeue_share)}
        if self.name == PEER_ROAD:
            data.update(peer_share=_r(self.peer_share), optimal_interval_s=_r(self.optimal_interval_s))
        return data


@dataclass(frozen=True)
class SizeProjection:
    nodes: int
    gpus_per_node: int
    mtbf_s: float
    optimal_interval_s: float
    roads: tuple[Road, ...]
    step_s: float
    # What could not be computed at this size (NOT_COMPUTABLE's keys) -> why.
    not_computable: Mapping[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def optimal_every_steps(self) -> int | None:
        """The Young-Daly interval in steps (at least one); None when it is not a count."""
        if "optimal_every_steps" in self.not_computable:
            return None
        return max(1, round(self.optimal_interval_s / self.step_s))

    def road(self, name: str) -> Road:
        return next(r for r in self.roads if r.name == name)

    def to_json(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
                "mtbf_s": _r(self.mtbf_s), "optimal_interval_s": _r(self.optimal_interval_s),
                "optimal_every_steps": self.optimal_every_steps,
                "roads": [r.to_json() for r in self.roads], "not_computable": dict(self.not_computable)}


@dataclass(frozen=True)
class Projection:
    failures_per_node_hour: float
    rate_source: str
    costs: Costs
    allocation_s: float
    sizes: tuple[SizeProjection, ...] = field(default=())
    peer_share: float | None = None     # the peer road's share of failures; None: no peer road

    def to_json(self) -> dict[str, Any]:
        model = ("ETTR = 1 - (save/interval + (interval/2 + restart)/MTBF); MTBF = 1/(rate x nodes); "
                 "Young-Daly interval sqrt(2 x save x MTBF); spares: x nodes/(nodes + spares)")
        if self.peer_share is not None:
            model += ("; peer: a share p of the failures costs the peer recovery instead of interval/2 + restart, "
                      "the rest restart in the allocation; its interval sqrt(2 x save x MTBF/(1 - p))")
        return {"failures_per_node_hour": _finite_or_none(self.failures_per_node_hour), "rate_source": self.rate_source,
                "allocation_s": _r(self.allocation_s), "costs": self.costs.to_json(), "model": model,
                "peer_share": self.peer_share, "sizes": [s.to_json() for s in self.sizes]}


# The figures of a size that may not be computable, as `not_computable` names them.
NOT_COMPUTABLE = ("mtbf_s", "optimal_interval_s", "optimal_every_steps", "ettr_configured", "ettr_optimal", "spares")


def not_computable(failures_per_node_hour: float, costs: Costs, nodes: int, mtbf_s: float, optimal_s: float,
                   allocation_s: float) -> dict[str, str]:
    """The figures of a size the model cannot give (NOT_COMPUTABLE's keys) -> why: each
    would divide by 0 or leave the finite numbers."""
    if not _positive(mtbf_s):
        why = (f"the job's MTBF comes out as {_seconds(mtbf_s)} from {failures_per_node_hour:.3g} failures per "
               f"node-hour x {nodes} node(s)")
        return dict.fromkeys(NOT_COMPUTABLE, why)
    found: dict[str, str] = {}
    interval = costs.interval_s
    if interval is not None and not _positive(interval):
        found["ettr_configured"] = (f"the checkpoint interval measured {_seconds(interval)} ({costs.every_steps} "
                                    f"steps of {_seconds(costs.step_s)})")
    if not math.isfinite(optimal_s):
        why = (f"the Young-Daly interval is not a finite time (sqrt(2 x the save stall {_seconds(costs.save_s)} "
               f"x the job's MTBF {_seconds(mtbf_s)}))")
        found.update(dict.fromkeys(("optimal_interval_s", "optimal_every_steps", "ettr_optimal", "spares"), why))
    elif optimal_s <= 0:
        why = f"the Young-Daly interval is 0 s (the save stall measured {_seconds(costs.save_s)})"
        found.update(dict.fromkeys(("ettr_optimal", "spares"), why))
    if "optimal_every_steps" not in found and not (_positive(costs.step_s)
                                                   and math.isfinite(optimal_s / costs.step_s)):
        found["optimal_every_steps"] = (f"the Young-Daly interval {_seconds(optimal_s)} in steps of "
                                        f"{_seconds(costs.step_s)} is not a count of steps")
    expected = allocation_s / mtbf_s
    if "spares" not in found and not expected <= MAX_FAILURES_PER_ALLOCATION:
        found["spares"] = (f"{expected:.3g} failures expected per allocation of {_seconds(allocation_s)}, past "
                           f"the {MAX_FAILURES_PER_ALLOCATION:,} the first-order model is computed for")
    return found


def _road(name: str, costs: Costs, restart_s: float, mtbf_s: float, optimal_s: float | None,
          keep: float = 1.0, spares: int = 0, share: float | None = None) -> Road:
    configured = costs.interval_s
    at_configured = None if configured is None else ettr(costs.save_s, configured, restart_s, mtbf_s)
    at_optimal = None if optimal_s is None else ettr(costs.save_s, optimal_s, restart_s, mtbf_s)
    return Road(name, restart_s, None if at_configured is None else keep * at_configured,
                None if at_optimal is None else keep * at_optimal, spares, share)


def _spares_road(costs: Costs, nodes: int, spares: int, share: float, mtbf_s: float, optimal_s: float) -> Road:
    restart = share * costs.requeue_s + (1 - share) * costs.in_allocation_s
    return _road("spares", costs, restart, mtbf_s, optimal_s, nodes / (nodes + spares), spares, share)


def spares_road(costs: Costs, nodes: int, spares: int, mtbf_s: float, optimal_s: float,
                allocation_s: float) -> Road:
    """In-allocation restarts while `spares` last, requeues after; the spares' idle share paid."""
    share = requeue_share(spares, allocation_s / mtbf_s)
    return _spares_road(costs, nodes, spares, share, mtbf_s, optimal_s)


def best_spares(costs: Costs, nodes: int, mtbf_s: float, optimal_s: float, allocation_s: float) -> Road:
    """The spares road with the number of spares (1 up to `nodes`) that gives the best ETTR:
    each spare saves requeues until its idle node-hours cost more than they save. Past a
    few standard deviations above the failures expected per allocation a spare saves
    nothing more, so that bounds the numbers weighed (and the work, with
    MAX_FAILURES_PER_ALLOCATION)."""
    expected = allocation_s / mtbf_s
    most = max(1, min(nodes, math.ceil(expected + 4 * math.sqrt(expected)) + 1))
    shares = requeue_shares(most, expected)
    roads = [_spares_road(costs, nodes, k, _share(shares, k), mtbf_s, optimal_s) for k in range(1, most + 1)]
    return max(roads, key=lambda r: (r.ettr_optimal or 0.0, -r.spare_nodes))


def peer_road(costs: Costs, share: float, mtbf_s: float, optimal: bool) -> Road:
    """A share `share` of the failures recovered by a peer, the rest restarted in the
    allocation; at the configured interval and (`optimal`: where the size's Young-Daly
    interval is computable) at the road's own, sqrt(2 δ M / (1 - p))."""
    restart = share * costs.peer_recovery_s + (1 - share) * costs.in_allocation_s
    configured = costs.interval_s

    def at(interval: float) -> float | None:
        return peer_ettr(costs.save_s, interval, costs.in_allocation_s, costs.peer_recovery_s, share, mtbf_s)

    interval = young_daly_interval_s(costs.save_s, mtbf_s / (1 - share)) if optimal else None
    return Road(PEER_ROAD, restart, None if configured is None else at(configured),
                None if interval is None else at(interval), peer_share=share, optimal_interval_s=interval)


def _no_spares_road() -> Road:
    """The spares road where it cannot be computed (its size's not_computable says why)."""
    return Road("spares", None, None, None)


def project_size(failures_per_node_hour: float, costs: Costs, nodes: int, gpus_per_node: int,
                 allocation_s: float, spares: int | None = None, peer_share: float | None = None) -> SizeProjection:
    """Every road at one size; `spares` None: the number of spares that is best; the peer
    road too given `peer_share` (peer_share_of)."""
    mtbf = job_mtbf_s(failures_per_node_hour, nodes)
    optimal = young_daly_interval_s(costs.save_s, mtbf) if _positive(mtbf) else math.nan
    why = not_computable(failures_per_node_hour, costs, nodes, mtbf, optimal, allocation_s)
    at_optimal = None if "ettr_optimal" in why else optimal
    if "spares" in why:
        spare_road = _no_spares_road()
    elif spares is None:
        spare_road = best_spares(costs, nodes, mtbf, optimal, allocation_s)
    else:
        spare_road = spares_road(costs, nodes, spares, mtbf, optimal, allocation_s)
    roads: tuple[Road, ...] = (_road("requeue", costs, costs.requeue_s, mtbf, at_optimal),
                               _road("in_allocation", costs, costs.in_allocation_s, mtbf, at_optimal),
                               spare_road)
    if peer_share is not None:
        roads += (peer_road(costs, peer_share_of(peer_share), mtbf, at_optimal is not None),)
    return SizeProjection(nodes, gpus_per_node, mtbf, optimal, roads, costs.step_s, why)


def project(failures_per_node_hour: float | None, costs: Costs, sizes: Sequence[tuple[int, int]],
            allocation_s: float, rate_source: str | None = None, peer_share: float | None = None) -> Projection:
    """Each (nodes, GPUs per node) of `sizes`; no rate: the published default. The peer
    road with `peer_share` (peer_share_of; ValueError for another value), and at
    DEFAULT_PEER_SHARE where the costs hold a measured peer recovery (the run has
    recovery.peer on)."""
    if failures_per_node_hour is None:
        failures_per_node_hour, rate_source = DEFAULT_FAILURES_PER_NODE_HOUR, DEFAULT_RATE_SOURCE
    if peer_share is None and costs.peer_s is not None:
        peer_share = DEFAULT_PEER_SHARE
    share = None if peer_share is None else peer_share_of(peer_share)
    return Projection(failures_per_node_hour, rate_source or "given", costs, allocation_s,
                      tuple(project_size(failures_per_node_hour, costs, n, g, allocation_s, peer_share=share)
                            for n, g in sizes), share)


def nodes_for_gpus(gpus: int, gpus_per_node: int) -> int:
    """Whole nodes of `gpus_per_node` for `gpus` (integer arithmetic: any count is exact)."""
    return max(1, -(-gpus // gpus_per_node))


def _seconds(value: float) -> str:
    return f"{value:.3g} s"


def _finite_or_none(value: float) -> float | None:
    """`value` for JSON, which holds no NaN or infinity (None for those)."""
    return value if math.isfinite(value) else None


def _r(value: float | None) -> float | None:
    """Rounded for JSON; None for no value and for one JSON cannot hold (NaN, infinity)."""
    return None if value is None or not math.isfinite(value) else round(value, 4)
