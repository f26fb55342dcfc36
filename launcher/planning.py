"""Glue between the configs and the pure memory model in launcher/plan.py:
`glaunch plan` and `strategy.name: auto`."""

from __future__ import annotations

from typing import Any, Mapping

from . import schema
from .errors import ConfigError, GlaunchError
from .load import LoadedExperiment, LoadedSite, Provenance


def _planner():
    import importlib.util

    if importlib.util.find_spec(f"{__package__}.plan") is None:
        raise GlaunchError("the strategy planner (launcher/plan.py) is not part of this build yet: "
                           "choose strategy.name ddp or deepspeed")
    from . import plan as planner
    return planner


def _params(model: schema.Model, prov: Provenance) -> int:
    planner = _planner()

    if model.params is not None:
        if model.params <= 0:
            raise prov.error("model.params", "must be more than 0")
        return int(model.params)
    if model.factory:
        try:
            return planner.count_params_from_factory(model.factory)
        except (ValueError, ImportError, AttributeError) as exc:
            raise prov.error("model.factory", str(exc)) from None
    raise prov.error("model.params", "the planner needs model.params or model.factory")


def plan_input(exp: schema.Experiment, site: schema.Site, part, nodes: int, gpus_per_node: int,
               prov: Provenance):
    planner = _planner()

    if part is None or part.gpu_mem_gb is None:
        raise prov.error("resources.partition", f"site {site.name!r} gives no gpu_mem_gb for this partition; "
                         "the planner needs it (partitions.NAME.gpu_mem_gb)")
    m = exp.model
    return planner.PlanInput(
        params=_params(m, prov), nodes=nodes, gpus_per_node=gpus_per_node, gpu_mem_gb=part.gpu_mem_gb,
        precision=exp.precision, optimizer=m.optimizer, micro_batch=exp.batch.micro_size, layers=m.layers,
        hidden_size=m.hidden_size, heads=m.heads, seq_len=m.seq_len, largest_layer_params=m.largest_layer_params,
        overhead_gb=site.plan.overhead_gb, headroom=site.plan.headroom, max_nodes=part.max_nodes)


def choose_strategy(exp: schema.Experiment, site: schema.Site, part, nodes: int, ranks_per_node: int,
                    prov: Provenance) -> tuple[dict[str, Any], Mapping[str, Any]]:
    planner = _planner()

    result = planner.make_plan(plan_input(exp, site, part, nodes, ranks_per_node, prov))
    if result.recommended is None:
        more = f"; it fits from {result.min_nodes} node(s) (resources.nodes)" if result.min_nodes else ""
        raise prov.error("strategy.name", f"auto: no strategy fits on {nodes} node(s){more}\n"
                         + planner.format_plan_table(result))
    settings = planner.strategy_settings(result.recommended)
    return settings, {"chosen": result.recommended, "reason": result.reason}


def plan_for(exp_loaded: LoadedExperiment, site_loaded: LoadedSite):
    planner = _planner()

    exp, site, prov = exp_loaded.config, site_loaded.config, exp_loaded.provenance
    name = exp.resources.partition or site.default_partition or next(iter(site.partitions), None)
    part = site.partitions.get(name) if name else None
    if part is None:
        raise prov.error("resources.partition", f"site {site.name!r} has no partition {name!r} to plan for")
    gpus = exp.resources.gpus_per_node if exp.resources.gpus_per_node is not None else part.gpus_per_node
    if gpus < 1:
        raise ConfigError("the planner needs GPUs per node", file=site_loaded.path.as_posix(),
                          key=f"partitions.{name}.gpus_per_node")
    try:
        return planner.make_plan(plan_input(exp, site, part, exp.resources.nodes, gpus, prov))
    except ValueError as exc:
        raise prov.error("model", str(exc)) from None
