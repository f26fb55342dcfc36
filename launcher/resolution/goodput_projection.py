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

The interval that minimises the waste is τ* = sqrt(2 δ M) (Young); R does not move it at
first order, so it is the same for every road. The model holds while τ, δ and R are small
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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

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
HOUR = 3600.0


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

    @property
    def in_allocation_s(self) -> float:
        """What a restart inside the allocation costs."""
        return self.restart_s if self.restart_s is not None else self.startup_s + self.load_s

    @property
    def interval_s(self) -> float | None:
        """The configured checkpoint interval in seconds (None: none configured)."""
        return self.every_steps * self.step_s if self.every_steps else None

    def to_json(self) -> dict[str, Any]:
        return {"save_s": self.save_s, "startup_s": self.startup_s, "load_s": self.load_s,
                "queue_wait_s": self.queue_wait_s, "step_s": self.step_s, "every_steps": self.every_steps,
                "interval_s": _r(self.interval_s), "in_allocation_s": _r(self.in_allocation_s),
                "in_allocation_measured": self.restart_s is not None, "defaults": list(self.defaults)}


def costs_with_defaults(measured: dict[str, float | None], every_steps: int | None) -> Costs:
    """Costs from what was measured (None or absent: not measured), the rest DEFAULT_COSTS;
    a measured in-allocation restart (``restart_s``) where there was one."""
    values = {key: measured.get(key) for key in DEFAULT_COSTS}
    defaults = tuple(key for key, value in values.items() if value is None)
    filled = {key: DEFAULT_COSTS[key] if value is None else float(value) for key, value in values.items()}
    restart = measured.get("restart_s")
    return Costs(every_steps=every_steps, defaults=defaults, restart_s=None if restart is None else float(restart),
                 **filled)


# --- the model ------------------------------------------------------------------------------


def job_mtbf_s(failures_per_node_hour: float, nodes: int) -> float:
    """The job's mean time between failures: every node can end it."""
    return HOUR / (failures_per_node_hour * nodes)


def young_daly_interval_s(save_s: float, mtbf_s: float) -> float:
    """τ* = sqrt(2 δ M)."""
    return math.sqrt(2 * save_s * mtbf_s)


def waste(save_s: float, interval_s: float, restart_s: float, mtbf_s: float) -> float:
    """The expected share of wall time lost: δ/τ + (τ/2 + R)/M."""
    return save_s / interval_s + (interval_s / 2 + restart_s) / mtbf_s


def ettr(save_s: float, interval_s: float, restart_s: float, mtbf_s: float) -> float:
    return max(0.0, 1.0 - waste(save_s, interval_s, restart_s, mtbf_s))


def requeue_share(spares: int, failures_per_allocation: float) -> float:
    """The share of failures that find no spare left: E[max(F - K, 0)] / E[F] for F
    Poisson with mean `failures_per_allocation` (a new allocation brings K again)."""
    mean = failures_per_allocation
    if mean <= 0:
        return 0.0
    covered = 0.0             # E[min(F, K)] = sum over j < K of P(F > j)
    cdf = 0.0
    for j in range(spares):
        cdf += math.exp(j * math.log(mean) - mean - math.lgamma(j + 1))
        covered += max(0.0, 1.0 - cdf)
    return max(0.0, 1.0 - covered / mean)


@dataclass(frozen=True)
class Road:
    """One recovery road at one size."""

    name: str
    restart_s: float
    ettr_configured: float | None       # at the configured interval (None: none configured)
    ettr_optimal: float                 # at the Young-Daly interval
    spare_nodes: int = 0
    requeue_share: float | None = None  # spares: the share of failures that still requeue

    def to_json(self) -> dict[str, Any]:
        return {"road": self.name, "restart_s": _r(self.restart_s), "ettr_configured": _r(self.ettr_configured),
                "ettr_optimal": _r(self.ettr_optimal), "spare_nodes": self.spare_nodes,
                "requeue_share": _r(self.requeue_share)}


@dataclass(frozen=True)
class SizeProjection:
    nodes: int
    gpus_per_node: int
    mtbf_s: float
    optimal_interval_s: float
    roads: tuple[Road, ...]
    step_s: float

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def road(self, name: str) -> Road:
        return next(r for r in self.roads if r.name == name)

    def to_json(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
                "mtbf_s": _r(self.mtbf_s), "optimal_interval_s": _r(self.optimal_interval_s),
                "optimal_every_steps": max(1, round(self.optimal_interval_s / self.step_s)),
                "roads": [r.to_json() for r in self.roads]}


@dataclass(frozen=True)
class Projection:
    failures_per_node_hour: float
    rate_source: str
    costs: Costs
    allocation_s: float
    sizes: tuple[SizeProjection, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {"failures_per_node_hour": self.failures_per_node_hour, "rate_source": self.rate_source,
                "allocation_s": self.allocation_s, "costs": self.costs.to_json(),
                "model": "ETTR = 1 - (save/interval + (interval/2 + restart)/MTBF); MTBF = 1/(rate x nodes); "
                         "Young-Daly interval sqrt(2 x save x MTBF); spares: x nodes/(nodes + spares)",
                "sizes": [s.to_json() for s in self.sizes]}


def _road(name: str, costs: Costs, restart_s: float, mtbf_s: float, optimal_s: float,
          keep: float = 1.0, spares: int = 0, share: float | None = None) -> Road:
    configured = costs.interval_s
    return Road(name, restart_s,
                None if configured is None else keep * ettr(costs.save_s, configured, restart_s, mtbf_s),
                keep * ettr(costs.save_s, optimal_s, restart_s, mtbf_s), spares, share)


def spares_road(costs: Costs, nodes: int, spares: int, mtbf_s: float, optimal_s: float,
                allocation_s: float) -> Road:
    """In-allocation restarts while `spares` last, requeues after; the spares' idle share paid."""
    share = requeue_share(spares, allocation_s / mtbf_s)
    requeue = costs.startup_s + costs.load_s + costs.queue_wait_s
    restart = share * requeue + (1 - share) * costs.in_allocation_s
    return _road("spares", costs, restart, mtbf_s, optimal_s, nodes / (nodes + spares), spares, share)


def best_spares(costs: Costs, nodes: int, mtbf_s: float, optimal_s: float, allocation_s: float) -> Road:
    """The spares road with the number of spares (1 up to `nodes`) that gives the best ETTR:
    each spare saves requeues until its idle node-hours cost more than they save."""
    expected = allocation_s / mtbf_s
    most = max(1, min(nodes, math.ceil(expected + 4 * math.sqrt(expected)) + 1))
    roads = [spares_road(costs, nodes, k, mtbf_s, optimal_s, allocation_s) for k in range(1, most + 1)]
    return max(roads, key=lambda r: (r.ettr_optimal, -r.spare_nodes))


def project_size(failures_per_node_hour: float, costs: Costs, nodes: int, gpus_per_node: int,
                 allocation_s: float, spares: int | None = None) -> SizeProjection:
    """Every road at one size; `spares` None: the number of spares that is best."""
    mtbf = job_mtbf_s(failures_per_node_hour, nodes)
    optimal = young_daly_interval_s(costs.save_s, mtbf)
    roads = (_road("requeue", costs, costs.startup_s + costs.load_s + costs.queue_wait_s, mtbf, optimal),
             _road("in_allocation", costs, costs.in_allocation_s, mtbf, optimal),
             best_spares(costs, nodes, mtbf, optimal, allocation_s) if spares is None
             else spares_road(costs, nodes, spares, mtbf, optimal, allocation_s))
    return SizeProjection(nodes, gpus_per_node, mtbf, optimal, roads, costs.step_s)


def project(failures_per_node_hour: float | None, costs: Costs, sizes: Sequence[tuple[int, int]],
            allocation_s: float, rate_source: str | None = None) -> Projection:
    """Each (nodes, GPUs per node) of `sizes`; no rate: the published default."""
    if failures_per_node_hour is None:
        failures_per_node_hour, rate_source = DEFAULT_FAILURES_PER_NODE_HOUR, DEFAULT_RATE_SOURCE
    return Projection(failures_per_node_hour, rate_source or "given", costs, allocation_s,
                      tuple(project_size(failures_per_node_hour, costs, n, g, allocation_s) for n, g in sizes))


def nodes_for_gpus(gpus: int, gpus_per_node: int) -> int:
    return max(1, math.ceil(gpus / gpus_per_node))


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
