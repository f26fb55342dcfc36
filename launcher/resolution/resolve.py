"""Resolve: site profile + experiment -> one frozen JobPlan, with every cross-check.

Pure: the caller passes in everything from the outside world (cwd, the submitting
interpreter, the environment used to expand `$VAR` in paths, the run id).
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Mapping

from ..config import schema
from ..config.load import LoadedExperiment, LoadedSite, Provenance
from ..errors import ConfigError
from . import deepspeed_config, slurmtime
from .jobplan import Container, JobPlan, SubmitContext

def resolve(exp_loaded: LoadedExperiment, site_loaded: LoadedSite, ctx: SubmitContext) -> JobPlan:
    exp, site = exp_loaded.config, site_loaded.config
    eprov, sprov = exp_loaded.provenance, site_loaded.provenance
    res = exp.resources

    partition_name, part = _partition(exp, site, eprov, sprov)
    gpus = _gpus_per_node(res, part, partition_name, site, eprov)
    nodes = _positive(res.nodes, "resources.nodes", eprov)
    if part is not None and part.max_nodes is not None and nodes > part.max_nodes:
        raise eprov.error("resources.nodes", f"{nodes} nodes requested, partition {partition_name!r} of site "
                          f"{site.name!r} allows at most {part.max_nodes} (partitions.{partition_name}.max_nodes)")
    time_seconds = _time(res.time, "resources.time", eprov)
    if part is not None and part.max_time is not None:
        limit = _time(part.max_time, f"partitions.{partition_name}.max_time", sprov)
        if time_seconds > limit:
            raise eprov.error("resources.time", f"{slurmtime.format(time_seconds)} requested, partition "
                              f"{partition_name!r} of site {site.name!r} allows at most "
                              f"{slurmtime.format(limit)} (partitions.{partition_name}.max_time)")

    ranks_per_node = max(gpus, 1)
    tasks_per_node = ranks_per_node if exp.launcher == "srun" else 1
    world_size = nodes * ranks_per_node
    cpus_per_task = _cpus_per_task(res, part, partition_name, ranks_per_node, tasks_per_node, eprov)
    mem_gb = res.mem_gb
    if mem_gb is not None:
        if mem_gb <= 0:
            raise eprov.error("resources.mem_gb", "must be more than 0")
        if part is not None and part.mem_gb is not None and mem_gb > part.mem_gb:
            raise eprov.error("resources.mem_gb", f"{mem_gb:g} GB per node requested, partition "
                              f"{partition_name!r} has {part.mem_gb:g} GB (partitions.{partition_name}.mem_gb)")

    lead = exp.requeue.signal_lead_s
    if lead < 0 or lead > 65535:
        raise eprov.error("requeue.signal_lead_s", "must be between 0 and 65535 seconds (Slurm's --signal limit)")
    if lead >= time_seconds:
        raise eprov.error("requeue.signal_lead_s", f"{lead} s warning is not shorter than the time limit "
                          f"{slurmtime.format(time_seconds)}: the job would be warned before it starts")
    if exp.requeue.max < 0:
        raise eprov.error("requeue.max", "must be 0 or more")
    if exp.checkpoint.every_steps < 1:
        raise eprov.error("checkpoint.every_steps", "must be 1 or more")
    if exp.checkpoint.keep < 1:
        raise eprov.error("checkpoint.keep", "must be 1 or more")

    strategy, choice = _strategy(exp, site, part, nodes, ranks_per_node, eprov)
    micro = _positive(exp.batch.micro_size, "batch.micro_size", eprov)
    global_batch = exp.batch.global_size if exp.batch.global_size is not None else micro * world_size
    _positive(global_batch, "batch.global_size", eprov)
    if global_batch % (micro * world_size):
        raise eprov.error("batch.global_size", f"{global_batch} is not divisible by micro_size {micro} x world "
                          f"size {world_size} (= {micro * world_size}); accumulation must be a whole number")
    accumulation = global_batch // (micro * world_size)
    ds_config = None
    if strategy.name == "deepspeed":
        ds_config = deepspeed_config.build(
            world_size=world_size, global_batch=global_batch, micro_batch=micro, accumulation=accumulation,
            zero_stage=strategy.zero_stage, offload_optimizer=strategy.offload_optimizer,
            offload_params=strategy.offload_params, nvme_path=strategy.nvme_path,
            precision=exp.precision, extra=exp.deepspeed, file=eprov.of("deepspeed").file)
    elif exp.deepspeed:
        raise eprov.error("deepspeed", "DeepSpeed keys given but strategy.name is 'ddp'")

    cwd = ctx.cwd
    runs_root = _path(ctx.runs_dir, "--runs-dir", None, ctx, cwd) if ctx.runs_dir else (
        _path(site.runs_root, "runs_root", sprov, ctx, cwd) if site.runs_root else os.path.join(cwd, "runs"))
    run_dir = os.path.join(runs_root, ctx.run_id)
    checkpoint_dir = (_path(exp.checkpoint.dir, "checkpoint.dir", eprov, ctx, cwd)
                      if exp.checkpoint.dir else os.path.join(run_dir, "checkpoints"))
    exp_dir = os.path.dirname(os.path.abspath(os.path.join(cwd, str(exp_loaded.path))))
    script = None
    if exp.entrypoint.script:
        script = _path(exp.entrypoint.script, "entrypoint.script", eprov, ctx, exp_dir)

    env = dict(site.env)
    env.update(exp.env)
    reserved = sorted(k for k in env if k.startswith("GLAUNCH_"))
    if reserved:
        key = reserved[0]
        prov = eprov if key in exp.env else sprov
        raise prov.error(f"env.{key}", "GLAUNCH_* variables are set by glaunch itself")

    container = None
    if site.container is not None:
        mounts = list(site.container.mounts)
        for path in (cwd, runs_root, checkpoint_dir):
            if not any(m.split(":")[0] == path for m in mounts):
                mounts.append(path)
        container = Container(site.container.runtime, site.container.image, tuple(mounts))
    if site.python:
        python = _python_words(site.python, sprov)
    elif container is not None:
        python = ("python3",)
    else:
        python = (ctx.python,)
    if container is not None and container.runtime == "apptainer":
        binds = [word for mount in container.mounts for word in ("--bind", mount)]
        python = ("apptainer", "exec", "--nv", *binds, container.image, *python)

    return JobPlan(
        run_id=ctx.run_id, name=exp.name, site_name=site.name, site_file=str(site_loaded.path),
        scheduler=site.scheduler, experiment_file=str(exp_loaded.path),
        workdir=cwd, run_dir=run_dir, log_dir=os.path.join(run_dir, "logs"), checkpoint_dir=checkpoint_dir,
        partition=partition_name, account=site.account,
        qos=(part.qos if part is not None and part.qos else site.qos),
        constraint=part.constraint if part is not None else None,
        nodes=nodes, gpus_per_node=gpus, gpu_directive=site.gpu_directive, tasks_per_node=tasks_per_node,
        cpus_per_task=cpus_per_task, mem_gb=mem_gb, time_seconds=time_seconds,
        preemptible=bool(part is not None and part.preemptible),
        extra_sbatch=tuple(sorted(site.sbatch.items())),
        launcher=exp.launcher, ranks_per_node=ranks_per_node, world_size=world_size,
        entry_script=script, entry_module=exp.entrypoint.module,
        entry_args=tuple(str(a) for a in exp.entrypoint.args),
        python=python, container=container, modules=tuple(site.modules), setup=tuple(site.setup),
        env=tuple(env.items()), derive_master_port="MASTER_PORT" not in env,
        strategy=strategy.name, zero_stage=strategy.zero_stage if strategy.name == "deepspeed" else None,
        precision=exp.precision, global_batch=global_batch, micro_batch=micro, accumulation=accumulation,
        ds_config=ds_config, strategy_choice=choice,
        checkpoint_every=exp.checkpoint.every_steps, checkpoint_keep=exp.checkpoint.keep,
        requeue_max=exp.requeue.max, signal_lead_s=lead, crash_retries=site.crash_retries,
        experiment=_as_dict(exp), site=_as_dict(site),
    )


# --- pieces -----------------------------------------------------------------------


def _positive(value: int, key: str, prov: Provenance) -> int:
    if value < 1:
        raise prov.error(key, f"must be 1 or more, got {value}")
    return value


def _time(value: str, key: str, prov: Provenance) -> int:
    try:
        return slurmtime.parse(value)
    except ValueError as exc:
        raise prov.error(key, str(exc)) from None


def _partition(exp: schema.Experiment, site: schema.Site, eprov: Provenance, sprov: Provenance):
    name = exp.resources.partition or site.default_partition
    if name is None:
        if len(site.partitions) == 1:
            name = next(iter(site.partitions))
        elif site.partitions:
            raise eprov.error("resources.partition", f"site {site.name!r} has no default_partition; choose one "
                              f"of: {', '.join(site.partitions)}")
        else:
            return None, None
    if site.partitions and name not in site.partitions:
        key = "resources.partition" if exp.resources.partition else "default_partition"
        prov = eprov if exp.resources.partition else sprov
        raise prov.error(key, f"partition {name!r} is not defined by site {site.name!r} "
                         f"(partitions: {', '.join(site.partitions)})")
    return name, site.partitions.get(name)


def _gpus_per_node(res: schema.Resources, part, partition_name, site: schema.Site, prov: Provenance) -> int:
    available = part.gpus_per_node if part is not None else None
    if res.gpus_per_node is None:
        if available is None:
            raise prov.error("resources.gpus_per_node", f"site {site.name!r} describes no partition "
                             "to take the GPU count from; set resources.gpus_per_node")
        return available
    if res.gpus_per_node < 0:
        raise prov.error("resources.gpus_per_node", "must be 0 or more")
    if available is not None and res.gpus_per_node > available:
        raise prov.error("resources.gpus_per_node", f"{res.gpus_per_node} GPUs per node requested, partition "
                         f"{partition_name!r} of site {site.name!r} has {available} per node "
                         f"(partitions.{partition_name}.gpus_per_node)")
    return res.gpus_per_node


def _cpus_per_task(res: schema.Resources, part, partition_name, ranks_per_node: int, tasks_per_node: int,
                   prov: Provenance) -> int | None:
    """CPUs per Slurm task. `resources.cpus_per_task` is per rank; torchrun's one task per
    node gets the CPUs of all the node's ranks."""
    cpus_per_node = part.cpus_per_node if part is not None else None
    if res.cpus_per_task is not None:
        per_rank = _positive(res.cpus_per_task, "resources.cpus_per_task", prov)
        if cpus_per_node is not None and per_rank * ranks_per_node > cpus_per_node:
            raise prov.error("resources.cpus_per_task", f"{per_rank} CPUs x {ranks_per_node} ranks per node = "
                             f"{per_rank * ranks_per_node}, partition {partition_name!r} has {cpus_per_node} "
                             f"(partitions.{partition_name}.cpus_per_node)")
    elif cpus_per_node is not None:
        per_rank = max(cpus_per_node // ranks_per_node, 1)
    else:
        return None
    return per_rank * (ranks_per_node // tasks_per_node)


@dataclass(frozen=True)
class _Strategy:
    name: str
    zero_stage: int
    offload_optimizer: str
    offload_params: str
    nvme_path: str | None


def _strategy(exp: schema.Experiment, site: schema.Site, part, nodes: int, ranks_per_node: int,
              prov: Provenance) -> tuple[_Strategy, Mapping[str, Any] | None]:
    s = exp.strategy
    choice = None
    if s.name == "auto":
        from .strategy import choose_strategy  # keeps the planner off the non-auto path
        settings, choice = choose_strategy(exp, site, part, nodes, ranks_per_node, prov)
        s = schema.Strategy(name=settings["name"], zero_stage=settings.get("zero_stage", 0),
                            offload_optimizer=settings.get("offload_optimizer", "none"),
                            offload_params=settings.get("offload_params", "none"), nvme_path=s.nvme_path)
    if s.name == "deepspeed":
        if not 0 <= s.zero_stage <= 3:
            raise prov.error("strategy.zero_stage", f"{s.zero_stage} is not a ZeRO stage (0..3)")
        if s.offload_optimizer != "none" and s.zero_stage == 0:
            raise prov.error("strategy.offload_optimizer", "optimizer offload needs ZeRO stage 1, 2 or 3")
        if s.offload_params != "none" and s.zero_stage != 3:
            raise prov.error("strategy.offload_params", "parameter offload needs ZeRO stage 3")
        if "nvme" in (s.offload_optimizer, s.offload_params) and not s.nvme_path:
            raise prov.error("strategy.nvme_path", "NVMe offload needs strategy.nvme_path")
    elif s.offload_optimizer != "none" or s.offload_params != "none":
        key = "strategy.offload_optimizer" if s.offload_optimizer != "none" else "strategy.offload_params"
        raise prov.error(key, "offload needs strategy.name: deepspeed")
    return _Strategy(s.name, s.zero_stage, s.offload_optimizer, s.offload_params, s.nvme_path), choice


def _path(value: str, key: str, prov: Provenance | None, ctx: SubmitContext, base: str) -> str:
    """Expand ~ and $VAR with the submitting environment, make absolute. A variable that
    is not set is an error rather than a path with a hole in it."""
    text = str(value)
    if text.startswith("~"):
        home = ctx.environ.get("HOME")
        if home is None:
            return _path_error(key, prov, "uses ~ but HOME is not set")
        text = home + text[1:]
    missing = [m.group(1) or m.group(2) for m in re.finditer(r"\$(?:\{([A-Za-z_]\w*)\}|([A-Za-z_]\w*))", text)
               if (m.group(1) or m.group(2)) not in ctx.environ]
    if missing:
        return _path_error(key, prov, f"${missing[0]} is not set in the environment")
    text = re.sub(r"\$(?:\{([A-Za-z_]\w*)\}|([A-Za-z_]\w*))",
                  lambda m: ctx.environ[m.group(1) or m.group(2)], text)
    if "\0" in text:
        return _path_error(key, prov, "a path cannot contain a NUL character")
    path = text if PurePath(text).is_absolute() else os.path.join(base, text)
    return os.path.normpath(path)


def _path_error(key: str, prov: Provenance | None, message: str):
    if prov is None:
        raise ConfigError(message, file="command line", key=key)
    raise prov.error(key, message)


def _python_words(command: str, prov: Provenance) -> tuple[str, ...]:
    """The site's `python:` command, split into words as a shell would."""
    try:
        words = tuple(shlex.split(command))
    except ValueError as exc:
        raise prov.error("python", f"{command!r} is not a command line: {exc}") from None
    if not words:
        raise prov.error("python", "must name an interpreter")
    return words


def _as_dict(obj: Any) -> Any:
    from dataclasses import asdict, is_dataclass
    return asdict(obj) if is_dataclass(obj) else obj


__all__ = ["JobPlan", "SubmitContext", "resolve"]
