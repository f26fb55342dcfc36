"""The strategy a job runs with, and the configs meeting the planner.

`resolve_strategy` checks the strategy keys for the named strategy, or lets the planner
choose (`strategy.name: auto`); `plan_for` is `glaunch plan` (the planner's inputs from the
experiment and the site, the model size from `model.params` or counted from
`model.factory`). Errors name the config key they come from; `plan_for`, and `resolve` for
the rest, give it its file and line."""

from __future__ import annotations

import importlib
import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from launcher.config import schema, slurmtime
from launcher.config.load import LoadedExperiment
from launcher.config.sourcemap import ConfigKeyError, locating
from launcher.config.sites import LoadedSite
from launcher.errors import ConfigError
from launcher.resolution import goodput_projection, memory, planner


@dataclass(frozen=True, eq=False)
class StrategySettings:
    """The strategy's keys, checked, as the job runs them."""

    name: str                 # ddp | fsdp | deepspeed
    zero_stage: int
    offload_optimizer: str
    offload_params: str
    nvme_path: str | None


def resolve_strategy(exp: schema.Experiment, site: schema.Site, part: schema.Partition | None, nodes: int,
                     ranks_per_node: int, exp_dir: str) -> tuple[StrategySettings, Mapping[str, Any] | None]:
    """The strategy's settings, checked, and what `auto` recorded about its choice (else None).
    `exp_dir`: the experiment file's folder, where `auto` looks for model.factory's module.

    `zero_stage` is DeepSpeed's key (a stage, 0..3: checked for every strategy, a typo is a
    typo) and is otherwise ignored by ddp and fsdp, as `nvme_path` is
    without NVMe offload: the typed config cannot tell a written stage from its default, and
    `strategy.name=fsdp` as an override or a sweep value must work on an experiment written
    for DeepSpeed (a dot-list override can change a key, not remove it). Offload is refused
    for both: DDP has none, and FSDP2's CPU offload (CPUOffloadPolicy) is not something
    glaunch sets or plans."""
    s = exp.strategy
    if not 0 <= s.zero_stage <= 3:       # whatever the strategy: a sweep or override may switch it to deepspeed
        raise ConfigKeyError("strategy.zero_stage", f"{s.zero_stage} is not a ZeRO stage (0..3)")
    choice = None
    if s.name == "auto":
        settings, choice = choose_strategy(exp, site, part, nodes, ranks_per_node, exp_dir)
        s = schema.Strategy(name=settings["name"], zero_stage=settings.get("zero_stage", 0),
                            offload_optimizer=settings.get("offload_optimizer", "none"),
                            offload_params=settings.get("offload_params", "none"), nvme_path=s.nvme_path)
    if s.name == "deepspeed":
        if s.offload_optimizer != "none" and s.zero_stage == 0:
            raise ConfigKeyError("strategy.offload_optimizer", "optimizer offload needs ZeRO stage 1, 2 or 3")
        if s.offload_params != "none" and s.zero_stage != 3:
            raise ConfigKeyError("strategy.offload_params", "parameter offload needs ZeRO stage 3")
        if "nvme" in (s.offload_optimizer, s.offload_params) and not s.nvme_path:
            raise ConfigKeyError("strategy.nvme_path", "NVMe offload needs strategy.nvme_path")
    elif s.offload_optimizer != "none" or s.offload_params != "none":
        key = "strategy.offload_optimizer" if s.offload_optimizer != "none" else "strategy.offload_params"
        if s.name == "fsdp":
            raise ConfigKeyError(key, "glaunch neither sets nor plans offload for fsdp: FSDP2's CPU offload is the "
                                 "script's choice (launcher.runtime.fsdp.shard(model, "
                                 "offload_policy=CPUOffloadPolicy())); for offload that glaunch configures and "
                                 "plans, use strategy.name: deepspeed")
        raise ConfigKeyError(key, "offload needs strategy.name: deepspeed")
    return StrategySettings(s.name, s.zero_stage, s.offload_optimizer, s.offload_params, s.nvme_path), choice


# PlanInput field -> the experiment key it comes from
_EXPERIMENT_KEYS = {
    "params": "model.params", "layers": "model.layers", "hidden_size": "model.hidden_size",
    "heads": "model.heads", "seq_len": "model.seq_len", "largest_layer_params": "model.largest_layer_params",
    "optimizer": "model.optimizer", "precision": "precision", "micro_batch": "batch.micro_size",
    "activation_checkpointing": "model.activation_checkpointing", "flash_attention": "model.flash_attention",
    "nodes": "resources.nodes", "gpus_per_node": "resources.gpus_per_node", "host_mem_gb": "resources.mem_gb",
}


# PlanInput field -> the site profile's key it comes from (a partition's under partitions.NAME)
_SITE_KEYS = {"overhead_gb": "plan.overhead_gb", "headroom": "plan.headroom"}
_PARTITION_KEYS = {"gpu_mem_gb": "gpu_mem_gb", "max_nodes": "max_nodes", "host_mem_gb": "mem_gb"}


def _site_key(field: str, part_name: str | None) -> str:
    if field in _PARTITION_KEYS:
        return f"partitions.{part_name}.{_PARTITION_KEYS[field]}"
    return _SITE_KEYS.get(field, field)


def _model_size(model: schema.Model, exp_dir: str) -> tuple[int, int | None, str | None]:
    """(params, largest layer or None, where the largest layer came from); model.factory's
    module is looked for in `exp_dir`, then in the working directory."""
    if model.params is not None:
        if not math.isfinite(model.params) or model.params < 1:
            raise ConfigKeyError("model.params", f"must be a finite number, 1 or more, got {model.params!r}")
        return int(model.params), model.largest_layer_params, None
    if model.factory:
        try:
            params, largest = inspect_factory(model.factory, [exp_dir, os.getcwd()])
        except ValueError as exc:
            raise ConfigKeyError("model.factory", str(exc)) from None
        if model.largest_layer_params is not None:
            return params, model.largest_layer_params, None
        return params, largest, f"counted from model.factory {model.factory}"
    raise ConfigKeyError("model.params", "the planner needs model.params or model.factory")


def plan_input(exp: schema.Experiment, site: schema.Site, part: schema.Partition | None, part_name: str | None,
               nodes: int, gpus_per_node: int, exp_dir: str) -> memory.PlanInput:
    if part is None:
        raise _no_partition(exp, site, part_name)
    if part.gpu_mem_gb is None:
        # The profile's value is missing: the error points at the partition's entry there.
        raise ConfigKeyError(f"partitions.{part_name}.gpu_mem_gb", f"site {site.name!r} gives no gpu_mem_gb for "
                             f"partition {part_name!r}; the planner needs it (GPU memory in GB)", site=True)
    m = exp.model
    params, largest, largest_source = _model_size(m, exp_dir)
    host_mem = exp.resources.mem_gb if exp.resources.mem_gb is not None else part.mem_gb
    try:
        return memory.PlanInput(
            params=params, nodes=nodes, gpus_per_node=gpus_per_node, gpu_mem_gb=part.gpu_mem_gb,
            precision=exp.precision, optimizer=m.optimizer, micro_batch=exp.batch.micro_size, layers=m.layers,
            hidden_size=m.hidden_size, heads=m.heads, seq_len=m.seq_len, largest_layer_params=largest,
            overhead_gb=site.plan.overhead_gb, headroom=site.plan.headroom, max_nodes=part.max_nodes,
            host_mem_gb=host_mem, largest_layer_source=largest_source,
            activation_checkpointing=m.activation_checkpointing, flash_attention=m.flash_attention)
    except memory.PlanInputError as exc:
        key = _EXPERIMENT_KEYS.get(exc.field)
        if key is not None and not (exc.field == "host_mem_gb" and exp.resources.mem_gb is None):
            raise ConfigKeyError(key, exc.message) from None
        raise ConfigKeyError(_site_key(exc.field, part_name), exc.message, site=True) from None


def choose_strategy(exp: schema.Experiment, site: schema.Site, part: schema.Partition | None, nodes: int,
                    ranks_per_node: int, exp_dir: str) -> tuple[dict[str, Any], Mapping[str, Any]]:
    """The strategy settings `auto` resolves to, and what to record about the choice."""
    result = planner.make_plan(plan_input(exp, site, part, _partition_name(exp, site), nodes, ranks_per_node,
                                          exp_dir))
    if result.recommended is None:
        more = (f"; it fits from {result.min_nodes} node(s) (resources.nodes={result.min_nodes})"
                if result.min_nodes else "")
        raise ConfigKeyError("strategy.name", f"auto: no strategy fits on {nodes} node(s){more}\n"
                             + planner.format_plan_table(result))
    row = result.recommended_row or result.row(result.recommended)
    choice = {"chosen": result.recommended, "reason": result.reason, "per_gpu_gb": round(row.total_gb, 2),
              "usable_gb": round(result.input.usable_gb, 2), "activation_checkpointing": result.recomputation}
    return planner.strategy_settings(result.recommended), choice


def _partition_name(exp: schema.Experiment, site: schema.Site) -> str | None:
    return exp.resources.partition or site.default_partition or next(iter(site.partitions), None)


def _no_partition(exp: schema.Experiment, site: schema.Site, name: str | None) -> ConfigKeyError:
    """No partition `name` to plan for, blamed where the name was written: the experiment's
    resources.partition, else the profile's default_partition, else its (empty) partitions."""
    message = f"site {site.name!r} has no partition {name!r} to plan for"
    if exp.resources.partition:
        return ConfigKeyError("resources.partition", message)
    return ConfigKeyError("default_partition" if site.default_partition else "partitions", message, site=True)


def plan_for(exp_loaded: LoadedExperiment, site_loaded: LoadedSite,
             at_gpus: int | None = None) -> planner.PlanResult:
    """`glaunch plan`: the planner's table for the experiment on the site, and goodput
    projected at its size and at `at_gpus` GPUs (whole nodes of the same size)."""
    exp, site = exp_loaded.config, site_loaded.config
    if at_gpus is not None and (type(at_gpus) is not int
                                or not 1 <= at_gpus <= goodput_projection.MAX_PROJECTED_GPUS):
        raise ConfigError(f"--at-gpus must be a whole number of GPUs from 1 to "
                          f"{goodput_projection.MAX_PROJECTED_GPUS:,}, got {str(at_gpus)[:40]}")
    with locating(exp_loaded.provenance, site_loaded.provenance):
        name = _partition_name(exp, site)
        part = site.partitions.get(name) if name else None
        if part is None:
            raise _no_partition(exp, site, name)
        gpus = _planned_gpus(exp, site, part, name)
        result = planner.make_plan(plan_input(exp, site, part, name, exp.resources.nodes, gpus, exp_loaded.folder))
        return replace(result, goodput=planned_goodput(exp, site, gpus, at_gpus))


def planned_goodput(exp: schema.Experiment, site: schema.Site, gpus_per_node: int,
                    at_gpus: int | None) -> goodput_projection.Projection:
    """The projection before any run: default costs, the site's failure rate (else the
    published one), the experiment's checkpoint interval and time limit."""
    try:
        allocation = slurmtime.parse(exp.resources.time)
    except ValueError as exc:
        raise ConfigKeyError("resources.time", str(exc)) from None
    sizes = [(exp.resources.nodes, gpus_per_node)]
    if at_gpus is not None:
        sizes.append((goodput_projection.nodes_for_gpus(at_gpus, gpus_per_node), gpus_per_node))
    rate = site.goodput.failures_per_node_hour
    return goodput_projection.project(
        rate, goodput_projection.costs_with_defaults({}, exp.checkpoint.every_steps or None), sizes,
        allocation, None if rate is None else "site goodput.failures_per_node_hour",
        peer_share=goodput_projection.DEFAULT_PEER_SHARE if exp.recovery.peer else None)


def _planned_gpus(exp: schema.Experiment, site: schema.Site, part: schema.Partition, name: str | None) -> int:
    gpus = exp.resources.gpus_per_node
    if gpus is None:
        if part.gpus_per_node < 1:
            raise ConfigKeyError(f"partitions.{name}.gpus_per_node", "the planner needs GPUs per node", site=True)
        return part.gpus_per_node
    if gpus < 1:
        raise ConfigKeyError("resources.gpus_per_node", f"the planner needs 1 GPU per node or more, got {gpus}")
    if gpus > part.gpus_per_node:
        raise ConfigKeyError("resources.gpus_per_node", f"{gpus} GPUs per node requested, partition {name!r} of "
                             f"site {site.name!r} has {part.gpus_per_node} per node "
                             f"(partitions.{name}.gpus_per_node)")
    return gpus


def _factory_model(spec: str, search_path: Sequence[str] = ()) -> Any:
    """Build the model `spec` ("module:function") names on the meta device."""
    module_name, sep, func_name = spec.partition(":")
    if not sep or not module_name or not func_name:
        raise ValueError(f"{spec!r} is not 'module:function'")
    added = [p for p in search_path if p not in sys.path]
    sys.path[:0] = added
    try:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ValueError(f"cannot import {module_name!r}: {exc}") from None
        func = getattr(module, func_name, None)
        if not callable(func):
            raise ValueError(f"module {module_name!r} has no function {func_name!r}")
        try:
            import torch      # only here: counting a factory's parameters is the one use of torch at submit
        except ImportError:
            raise ValueError("counting parameters from model.factory needs torch installed where glaunch "
                             "runs; or give model.params") from None
        try:
            with torch.device("meta"):      # shapes only: no memory, no weights loaded
                model = func()
        except Exception as exc:  # the factory is user code; any failure is bad input
            raise ValueError(f"{spec} failed on the meta device: {type(exc).__name__}: {exc}") from None
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"{spec} returned {type(model).__name__}, not a torch.nn.Module")
        return model
    finally:
        for p in added:
            if p in sys.path:
                sys.path.remove(p)


def inspect_factory(spec: str, search_path: Sequence[str] = ()) -> tuple[int, int]:
    """(parameters, parameters of the largest module) of the model `spec` builds.
    Shared parameters count once; a module's own parameters, not its children's, make a
    layer, as DeepSpeed's model_to_params counts them."""
    model = _factory_model(spec, search_path)
    total = sum(p.numel() for p in model.parameters())
    largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    if total < 1:
        raise ValueError(f"{spec} built a model without parameters")
    return total, largest
