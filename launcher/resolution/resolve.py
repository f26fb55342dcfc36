"""Resolve: site profile + experiment -> one frozen JobPlan, with every cross-check.

Pure: the caller passes in everything from the outside world (cwd, the submitting
interpreter, the environment used to expand `$VAR` in paths, the run id). `resolve`
reads as the steps of a plan: the allocation, the restart settings, the strategy, the
batch, the directories, the code, the environment, the container and the interpreter.
Each step raises a ConfigKeyError naming the key at fault; `resolve` gives it the file
and line that set the key.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

from launcher import shell
from launcher.config import schema, slurmtime
from launcher.config.load import LoadedExperiment
from launcher.config.login import login_of
from launcher.config.sourcemap import ConfigKeyError, locating
from launcher.config.schema import partition_name_problem
from launcher.config.sitechecks import python_words
from launcher.config.sites import LoadedSite
from launcher.resolution import deepspeed_config, paths
from launcher.resolution.jobplan import (
    Allocation, CodeRoot, CodeSnapshot, Container, JobPlan, Launch, Recovery, SubmitContext, Training, Transport,
)
from launcher.resolution.strategy import StrategySettings, resolve_strategy
from launcher.rundir.layout import CODE_DIR
from launcher.rundir import envnames
from launcher.rundir.taskspec import MAX_WORLD_SIZE, STALL_AUTO_INITIAL_S

# Counts beyond what the job's consumers hold: the job's task spec takes up to
# MAX_WORLD_SIZE ranks (far past any training job; the watchdog goes over each); Slurm keeps
# CPUs per task in 16 bits and memory in MB in 64, their top values meaning "unset"/"unlimited".
MAX_CPUS_PER_TASK = 2 ** 16 - 3
MAX_MEM_MB = 2 ** 62
MAX_BATCH = 2 ** 63 - 1


def resolve(exp_loaded: LoadedExperiment, site_loaded: LoadedSite, ctx: SubmitContext) -> JobPlan:
    """The run's plan; a ConfigError names the key at fault where it was set."""
    with locating(exp_loaded.provenance, site_loaded.provenance):
        return _plan(exp_loaded, site_loaded, ctx)


def _plan(exp_loaded: LoadedExperiment, site_loaded: LoadedSite, ctx: SubmitContext) -> JobPlan:
    exp, site = exp_loaded.config, site_loaded.config
    _check_experiment_text(exp)
    alloc = _allocation(exp, site)
    _check_requeue(exp, alloc.time_seconds)
    stall_auto = _check_watchdog_and_checkpoints(exp)
    strategy, choice = resolve_strategy(exp, site, alloc.part, alloc.nodes, alloc.ranks_per_node, exp_loaded.folder)
    global_batch, micro, accumulation = _batch(exp, alloc.world_size)
    ds_config = _deepspeed_config(exp, strategy, alloc.world_size, global_batch, micro, accumulation)
    dirs = _directories(exp, site, ctx)
    script = _entry_script(exp_loaded, ctx)
    code = _code(exp, site, ctx, script, dirs.run_dir, skip=(dirs.runs_root, dirs.checkpoint_dir))
    hparams = _hparams(exp)
    env = _environment(exp, site)
    container = _container(site, ctx.cwd, dirs)
    python = node_python(site, container, ctx.python, home=ctx.environ.get("HOME"))
    part = alloc.part
    return JobPlan(
        run_id=ctx.run_id, name=exp.name, site_name=site.name, site_file=str(site_loaded.path),
        # Where it was submitted from, whole: a resume over SSH runs from the code tree's
        # root, where a path relative to the submitting folder names another file.
        scheduler=site.scheduler, experiment_file=os.path.join(ctx.cwd, exp_loaded.path),
        workdir=ctx.cwd, run_dir=dirs.run_dir, log_dir=os.path.join(dirs.run_dir, "logs"),
        checkpoint_dir=dirs.checkpoint_dir, checkpoint_take_over=exp.checkpoint.take_over,
        profile_files=site_loaded.files,
        allocation=Allocation(
            partition=alloc.partition, account=site.account,
            qos=(part.qos if part is not None and part.qos else site.qos),
            constraint=part.constraint if part is not None else None,
            segment=part.segment if part is not None else None,
            nodes=alloc.nodes, spare_nodes=alloc.spare_nodes, gpus_per_node=alloc.gpus_per_node,
            gpu_directive=site.gpu_directive,
            tasks_per_node=alloc.tasks_per_node, cpus_per_task=alloc.cpus_per_task, mem_gb=alloc.mem_gb,
            time_seconds=alloc.time_seconds, extra_sbatch=tuple(sorted(site.sbatch.items())),
            dependency=ctx.dependency),
        launch=Launch(
            launcher=exp.launcher, ranks_per_node=alloc.ranks_per_node, world_size=alloc.world_size,
            entry_script=code.copy_of(code_entry(ctx, script)) if code and script else script,
            entry_module=exp.entrypoint.module,
            entry_args=tuple(str(a) for a in exp.entrypoint.args),
            entry_resume_args=tuple(str(a) for a in exp.entrypoint.resume_args),
            progress_pattern=exp.entrypoint.progress.pattern if exp.entrypoint.progress else None,
            progress_total=exp.entrypoint.progress.total if exp.entrypoint.progress else None,
            python=python, container=container, modules=tuple(site.modules), setup=tuple(site.setup),
            env=tuple(env.items()), derive_master_port="MASTER_PORT" not in env),
        training=Training(
            strategy=strategy.name, zero_stage=strategy.zero_stage if strategy.name == "deepspeed" else None,
            precision=exp.precision, global_batch=global_batch, micro_batch=micro, accumulation=accumulation,
            ds_config=ds_config, strategy_choice=choice,
            checkpoint_every=exp.checkpoint.every_steps, checkpoint_keep=exp.checkpoint.keep),
        recovery=Recovery(
            requeue_max=exp.requeue.max, signal_lead_s=exp.requeue.signal_lead_s, crash_retries=site.crash_retries,
            exclude_bad_nodes=exp.requeue.exclude_bad_nodes,
            # A sweep's element is a task of a job array: a new job would be outside the array.
            requeue_mode="requeue" if ctx.sweep_id is not None else exp.requeue.mode,
            watchdog_stall_s=STALL_AUTO_INITIAL_S if stall_auto else float(exp.watchdog.stall_s),
            watchdog_stall_auto=stall_auto, watchdog_auto_floor_s=float(exp.watchdog.auto_floor_s),
            watchdog_first_step_s=exp.watchdog.first_step_s, watchdog_slow_node=exp.watchdog.slow_node,
            peer=_recovery_peer(exp, strategy.name)),
        transport=transport_of(site),
        experiment=_as_dict(exp), site=_as_dict(site), code=code, hparams=hparams, sweep_id=ctx.sweep_id,
    )


def _recovery_peer(exp: schema.Experiment, strategy: str) -> bool:
    """recovery.peer, for data-parallel runs only: a sharded state has no whole copy on a peer."""
    if exp.recovery.peer and strategy != "ddp":
        raise ConfigKeyError("recovery.peer", f"needs strategy.name: ddp (a data-parallel run), not {strategy!r}")
    return exp.recovery.peer


def transport_of(site: schema.Site) -> Transport:
    """How the Slurm commands of `site`'s runs reach its cluster: the login node its
    `login:` names, or none. The submission's road is chosen from it before resolution
    (the road gives the environment a plan's paths are expanded with)."""
    return Transport(login=login_of(site.login))


# --- the allocation ---------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Allocation:
    """What the job asks of the scheduler, checked against its partition."""

    partition: str | None
    part: schema.Partition | None
    nodes: int
    spare_nodes: int
    gpus_per_node: int
    ranks_per_node: int
    tasks_per_node: int
    world_size: int
    cpus_per_task: int | None
    mem_gb: float | None
    time_seconds: int


def _allocation(exp: schema.Experiment, site: schema.Site) -> _Allocation:
    res = exp.resources
    name, part = _partition(exp, site)
    gpus = _gpus_per_node(res, part, name, site)
    nodes = _nodes(res, part, name, site)
    spare = _spare_nodes(res, nodes, part, name, site)
    _check_segment(nodes + spare, part, name)
    time_seconds = _time_limit(res, part, name, site)
    ranks_per_node = max(gpus, 1)
    tasks_per_node = ranks_per_node if exp.launcher == "srun" else 1
    world_size = nodes * ranks_per_node
    if world_size > MAX_WORLD_SIZE:
        raise ConfigKeyError("resources.nodes", f"{nodes} nodes x {ranks_per_node} ranks = {world_size} ranks, "
                             f"more than glaunch runs in one job ({MAX_WORLD_SIZE})")
    return _Allocation(
        partition=name, part=part, nodes=nodes, spare_nodes=spare, gpus_per_node=gpus, ranks_per_node=ranks_per_node,
        tasks_per_node=tasks_per_node, world_size=world_size,
        cpus_per_task=_cpus_per_task(res, part, name, ranks_per_node, tasks_per_node),
        mem_gb=_mem_gb(res, part, name), time_seconds=time_seconds)


def _partition(exp: schema.Experiment, site: schema.Site) -> tuple[str | None, schema.Partition | None]:
    if exp.resources.partition:
        # Named where no site lists it, it still becomes the job's --partition.
        problem = partition_name_problem(exp.resources.partition)
        if problem:
            raise ConfigKeyError("resources.partition", problem)
    name = exp.resources.partition or site.default_partition
    if name is None:
        if len(site.partitions) == 1:
            name = next(iter(site.partitions))
        elif site.partitions:
            raise ConfigKeyError("resources.partition", f"site {site.name!r} has no default_partition; choose "
                                 f"one of: {', '.join(site.partitions)}")
        else:
            return None, None
    if site.partitions and name not in site.partitions:
        chosen = bool(exp.resources.partition)
        raise ConfigKeyError("resources.partition" if chosen else "default_partition",
                             f"partition {name!r} is not defined by site {site.name!r} "
                             f"(partitions: {', '.join(site.partitions)})", site=not chosen)
    return name, site.partitions.get(name)


def _gpus_per_node(res: schema.Resources, part: schema.Partition | None, partition: str | None,
                   site: schema.Site) -> int:
    available = part.gpus_per_node if part is not None else None
    if res.gpus_per_node is None:
        if available is None:
            raise ConfigKeyError("resources.gpus_per_node", f"site {site.name!r} describes no partition "
                                 "to take the GPU count from; set resources.gpus_per_node")
        return available
    if res.gpus_per_node < 0:
        raise ConfigKeyError("resources.gpus_per_node", "must be 0 or more")
    if available is not None and res.gpus_per_node > available:
        raise ConfigKeyError("resources.gpus_per_node", f"{res.gpus_per_node} GPUs per node requested, partition "
                             f"{partition!r} of site {site.name!r} has {available} per node "
                             f"(partitions.{partition}.gpus_per_node)")
    return res.gpus_per_node


def _nodes(res: schema.Resources, part: schema.Partition | None, partition: str | None, site: schema.Site) -> int:
    nodes = _positive(res.nodes, "resources.nodes")
    if part is not None and part.max_nodes is not None and nodes > part.max_nodes:
        raise ConfigKeyError("resources.nodes", f"{nodes} nodes requested, partition {partition!r} of site "
                             f"{site.name!r} allows at most {part.max_nodes} (partitions.{partition}.max_nodes)")
    return nodes


def _spare_nodes(res: schema.Resources, nodes: int, part: schema.Partition | None, partition: str | None,
                 site: schema.Site) -> int:
    """Nodes the job holds besides `nodes`, idle until one replaces a node a crash or a
    hang pointed at (a restart inside the allocation instead of a requeue)."""
    if res.spare_nodes < 0:
        raise ConfigKeyError("resources.spare_nodes", f"must be 0 or more, got {res.spare_nodes}")
    total = nodes + res.spare_nodes
    if part is not None and part.max_nodes is not None and total > part.max_nodes:
        raise ConfigKeyError("resources.spare_nodes", f"{nodes} + {res.spare_nodes} spare nodes requested, partition "
                             f"{partition!r} of site {site.name!r} allows at most {part.max_nodes} "
                             f"(partitions.{partition}.max_nodes)")
    return res.spare_nodes


def _check_segment(allocated: int, part: schema.Partition | None, partition: str | None) -> None:
    """Slurm splits a job asking --segment=N into segments of N nodes: its node count (with
    the spares) must be a multiple of N, or sbatch refuses it."""
    if part is None or part.segment is None or allocated % part.segment == 0:
        return
    raise ConfigKeyError("resources.nodes", f"{allocated} node(s) (resources.nodes with resources.spare_nodes) are "
                         f"not a multiple of partitions.{partition}.segment {part.segment}: Slurm places a job's "
                         "nodes in whole segments")


def _time_limit(res: schema.Resources, part: schema.Partition | None, partition: str | None,
                site: schema.Site) -> int:
    seconds = _time(res.time, "resources.time")
    if part is not None and part.max_time is not None:
        limit = _time(part.max_time, f"partitions.{partition}.max_time", site=True)
        if seconds > limit:
            raise ConfigKeyError("resources.time", f"{slurmtime.format(seconds)} requested, partition "
                                 f"{partition!r} of site {site.name!r} allows at most "
                                 f"{slurmtime.format(limit)} (partitions.{partition}.max_time)")
    return seconds


def _cpus_per_task(res: schema.Resources, part: schema.Partition | None, partition: str | None,
                   ranks_per_node: int, tasks_per_node: int) -> int | None:
    """CPUs per Slurm task. `resources.cpus_per_task` is per rank; torchrun's one task per
    node gets the CPUs of all the node's ranks."""
    cpus_per_node = part.cpus_per_node if part is not None else None
    if res.cpus_per_task is not None:
        per_rank = _positive(res.cpus_per_task, "resources.cpus_per_task")
        if cpus_per_node is not None and per_rank * ranks_per_node > cpus_per_node:
            raise ConfigKeyError("resources.cpus_per_task", f"{per_rank} CPUs x {ranks_per_node} ranks per node = "
                                 f"{per_rank * ranks_per_node}, partition {partition!r} has {cpus_per_node} "
                                 f"(partitions.{partition}.cpus_per_node)")
    elif cpus_per_node is not None:
        per_rank = max(cpus_per_node // ranks_per_node, 1)
    else:
        return None
    cpus = per_rank * (ranks_per_node // tasks_per_node)
    if cpus > MAX_CPUS_PER_TASK:
        raise ConfigKeyError("resources.cpus_per_task", f"{cpus} CPUs per task, more than Slurm can request "
                             f"({MAX_CPUS_PER_TASK})")
    return cpus


def _mem_gb(res: schema.Resources, part: schema.Partition | None, partition: str | None) -> float | None:
    mem_gb = res.mem_gb
    if mem_gb is None:
        return None
    if not math.isfinite(mem_gb) or mem_gb <= 0:
        raise ConfigKeyError("resources.mem_gb", f"must be a finite number more than 0, got {mem_gb!r}")
    if mem_gb * 1024 > MAX_MEM_MB:
        raise ConfigKeyError("resources.mem_gb", f"{mem_gb:g} GB is more than Slurm can request ({MAX_MEM_MB} MB)")
    if mem_gb * 1024 < 1:
        raise ConfigKeyError("resources.mem_gb", f"{mem_gb:g} GB is less than 1 MiB, the smallest request "
                             "Slurm takes (--mem=0 would mean all of the node's memory)")
    if part is not None and part.mem_gb is not None and mem_gb > part.mem_gb:
        raise ConfigKeyError("resources.mem_gb", f"{mem_gb:g} GB per node requested, partition "
                             f"{partition!r} has {part.mem_gb:g} GB (partitions.{partition}.mem_gb)")
    return mem_gb


# --- restarts, the batch and DeepSpeed ----------------------------------------------------


def _check_requeue(exp: schema.Experiment, time_seconds: int) -> None:
    lead = exp.requeue.signal_lead_s
    if lead < 0 or lead > 65535:
        raise ConfigKeyError("requeue.signal_lead_s", "must be between 0 and 65535 seconds (Slurm's --signal "
                             "limit)")
    if lead >= time_seconds:
        raise ConfigKeyError("requeue.signal_lead_s", f"{lead} s warning is not shorter than the time limit "
                             f"{slurmtime.format(time_seconds)}: the job would be warned before it starts")
    if exp.requeue.max < 0:
        raise ConfigKeyError("requeue.max", "must be 0 or more")


def _check_watchdog_and_checkpoints(exp: schema.Experiment) -> bool:
    """Whether watchdog.stall_s is auto (else a number of seconds, checked here)."""
    stall = exp.watchdog.stall_s
    auto = stall == "auto"
    if not auto and (isinstance(stall, bool) or not isinstance(stall, (int, float)) or not 0 <= stall < math.inf):
        shown = repr(stall) if len(repr(stall)) <= 40 else repr(stall)[:37] + "..."
        raise ConfigKeyError("watchdog.stall_s", f"{shown} is not auto, 0 (off) or a number of seconds")
    if exp.watchdog.first_step_s < 0:
        raise ConfigKeyError("watchdog.first_step_s", "must be 0 (off) or more seconds")
    if exp.watchdog.auto_floor_s < 0:
        raise ConfigKeyError("watchdog.auto_floor_s", "must be 0 or more seconds")
    if exp.checkpoint.every_steps < 1:
        raise ConfigKeyError("checkpoint.every_steps", "must be 1 or more")
    if exp.checkpoint.keep < 1:
        raise ConfigKeyError("checkpoint.keep", "must be 1 or more")
    return auto


def _batch(exp: schema.Experiment, world_size: int) -> tuple[int, int, int]:
    """(global batch, micro batch, gradient accumulation steps)."""
    micro = _positive(exp.batch.micro_size, "batch.micro_size")
    global_batch = exp.batch.global_size if exp.batch.global_size is not None else micro * world_size
    _positive(global_batch, "batch.global_size")
    if micro * world_size > MAX_BATCH:
        raise ConfigKeyError("batch.micro_size", f"{micro} x {world_size} ranks = {micro * world_size} samples "
                             f"per step, more than a 64-bit count holds")
    if global_batch % (micro * world_size):
        raise ConfigKeyError("batch.global_size", f"{global_batch} is not divisible by micro_size {micro} x world "
                             f"size {world_size} (= {micro * world_size}); accumulation must be a whole number")
    return global_batch, micro, global_batch // (micro * world_size)


def _deepspeed_config(exp: schema.Experiment, strategy: StrategySettings, world_size: int, global_batch: int,
                      micro: int, accumulation: int) -> dict[str, Any] | None:
    if strategy.name != "deepspeed":
        if exp.deepspeed:
            raise ConfigKeyError("deepspeed", f"DeepSpeed keys given but strategy.name is {strategy.name!r}")
        return None
    return deepspeed_config.build(
        world_size=world_size, global_batch=global_batch, micro_batch=micro, accumulation=accumulation,
        zero_stage=strategy.zero_stage, offload_optimizer=strategy.offload_optimizer,
        offload_params=strategy.offload_params, nvme_path=strategy.nvme_path,
        precision=exp.precision, extra=exp.deepspeed)


# --- directories ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Directories:
    """The run's directories, and what chose each: the name an error about one gives."""

    runs_root: str
    runs_key: str              # --runs-dir, runs_root or the working directory
    run_dir: str
    checkpoint_dir: str
    checkpoint_key: str        # checkpoint.dir, or runs_key for <run dir>/checkpoints


def _directories(exp: schema.Experiment, site: schema.Site, ctx: SubmitContext) -> _Directories:
    paths.check_text(ctx.cwd, paths.WORKDIR)
    runs_key, runs_root = _runs_root(site, ctx)
    bad = sorted(set(runs_root) & set("%\\"))
    if bad:
        raise paths.error(runs_key, f"{runs_root!r} holds {' and '.join(map(repr, bad))}: the run directory is "
                          "part of Slurm's log file patterns (%j, %t), where they would change the names")
    paths.check_writable_place(runs_root, runs_key)
    run_dir = os.path.join(runs_root, ctx.run_id)
    if exp.checkpoint.dir:
        checkpoint_key = "checkpoint.dir"
        checkpoint_dir = paths.expand(exp.checkpoint.dir, checkpoint_key, ctx.environ, ctx.cwd)
        paths.check_writable_place(checkpoint_dir, checkpoint_key)
    else:
        checkpoint_key, checkpoint_dir = runs_key, os.path.join(run_dir, "checkpoints")
    return _Directories(runs_root, runs_key, run_dir, checkpoint_dir, checkpoint_key)


def _runs_root(site: schema.Site, ctx: SubmitContext) -> tuple[str, str]:
    """(what chose it, the directory run directories are made in)."""
    if ctx.runs_dir is not None and not str(ctx.runs_dir).strip():
        raise paths.error("--runs-dir", "is empty: give a directory, or leave the option out for the default")
    if ctx.runs_dir:
        return "--runs-dir", paths.expand(ctx.runs_dir, "--runs-dir", ctx.environ, ctx.cwd)
    if site.runs_root:
        return "runs_root", paths.expand(site.runs_root, "runs_root", ctx.environ, ctx.cwd)
    return paths.WORKDIR, os.path.join(ctx.cwd, "runs")


# --- the environment, the container and the interpreter -------------------------------------


def _environment(exp: schema.Experiment, site: schema.Site) -> dict[str, str]:
    """The site's env, then the experiment's over it."""
    env = dict(site.env)
    env.update(exp.env)
    reserved = sorted(k for k in env if k.startswith(envnames.PREFIX))
    if reserved:
        key = reserved[0]
        raise ConfigKeyError(f"env.{key}", "GLAUNCH_* variables are set by glaunch itself", site=key not in exp.env)
    _check_exec_sizes(env, exp)
    return env


def _container(site: schema.Site, cwd: str, dirs: _Directories) -> Container | None:
    if site.container is None:
        return None
    mounts = list(site.container.mounts)
    # The paths the job reads and writes are mounted too: ',' or ':' in one of them
    # would split it into other mounts (pyxis and apptainer have no escape for them).
    for path, key in ((cwd, paths.WORKDIR), (dirs.runs_root, dirs.runs_key),
                      (dirs.checkpoint_dir, dirs.checkpoint_key)):
        bad = sorted(set(path) & set(",:"))
        if bad:
            raise paths.error(key, f"{path!r} holds {' and '.join(map(repr, bad))}: it is mounted into the "
                              f"container ({site.container.runtime}), where ',' separates mounts and ':' source, "
                              "target and flags")
        if not any(m.split(":")[0] == path for m in mounts):
            mounts.append(path)
    return Container(site.container.runtime, site.container.image, tuple(mounts))


def node_python(site: schema.Site, container: Container | None, submitting: str, *,
                home: str | None = None) -> tuple[str, ...]:
    """The interpreter command on the nodes: the site's `python:` (a leading `~` is `home`,
    the home of the account the job runs as, as in runs_root), a container's python3,
    else the submitting interpreter; inside apptainer, run through `apptainer exec`
    (`sites check` runs the same command to ask which torch it imports)."""
    if site.python:
        python = _from_home(python_words(site.python), home)
    elif container is not None:
        python = ("python3",)
    else:
        if shell.hidden_characters(submitting) or shell.text_problem(submitting):
            raise ConfigKeyError("python", f"the submitting interpreter {submitting!r} is not a usable command "
                                 "name on the nodes; set python: in the site profile", site=True)
        python = (submitting,)
    if container is not None and container.runtime == "apptainer":
        binds = [word for mount in container.mounts for word in ("--bind", mount)]
        python = ("apptainer", "exec", "--nv", *binds, container.image, *python)
    return python


def _from_home(words: tuple[str, ...], home: str | None) -> tuple[str, ...]:
    """`python:`'s words with a leading `~` or `~/` made `home` (a quoted word never expands
    on the nodes); `~user` is refused, as in paths."""
    first = words[0]
    if not first.startswith("~"):
        return words
    if first != "~" and not first.startswith("~/"):
        raise ConfigKeyError("python", f"{first!r}: ~{first[1:].split('/', 1)[0]} (another user's home) is not "
                             "expanded; write the full path (only ~/... is, as the account's home)", site=True)
    if not home:
        raise ConfigKeyError("python", f"{first!r} uses ~ but HOME is not set", site=True)
    return (home.rstrip("/") + first[1:], *words[1:])


# --- the code snapshot and hparams -----------------------------------------------------


def code_anchor(exp_loaded: LoadedExperiment, site_loaded: LoadedSite, ctx: SubmitContext) -> str | None:
    """The folder whose work tree a snapshot copies (the script's folder; for a module, the
    working directory), or None when this run takes no snapshot. The caller finds the work
    tree around it (launcher.runner.snapshot.locate) and passes it in as ctx.code_root."""
    if not snapshot_enabled(exp_loaded.config, site_loaded.config):
        return None
    with locating(exp_loaded.provenance, site_loaded.provenance):
        script = _entry_script(exp_loaded, ctx)
    return os.path.dirname(script) if script else ctx.cwd


def snapshot_enabled(exp: schema.Experiment, site: schema.Site) -> bool:
    """code.snapshot; unset: on for Slurm, where a job waits in the queue and is requeued."""
    setting = exp.code.snapshot
    return site.scheduler == "slurm" if setting is None else setting


def code_entry(ctx: SubmitContext, script: str) -> str:
    """The script's path relative to the snapshot's root."""
    root = ctx.code_root
    entry_dir = root.entry_dir if root is not None else "."
    return os.path.join(entry_dir, os.path.basename(script))


def _entry_script(exp_loaded: LoadedExperiment, ctx: SubmitContext) -> str | None:
    """The entry point's script as an absolute path (relative: from the experiment file's folder)."""
    exp = exp_loaded.config
    if not exp.entrypoint.script:
        return None
    exp_dir = os.path.dirname(os.path.abspath(os.path.join(ctx.cwd, str(exp_loaded.path))))
    return paths.expand(exp.entrypoint.script, "entrypoint.script", ctx.environ, exp_dir)


def _code(exp: schema.Experiment, site: schema.Site, ctx: SubmitContext, script: str | None, run_dir: str, *,
          skip: tuple[str, ...]) -> CodeSnapshot | None:
    if not snapshot_enabled(exp, site):
        return None
    max_mb = exp.code.max_mb
    if not math.isfinite(max_mb) or max_mb <= 0:
        raise ConfigKeyError("code.max_mb", f"must be a finite number more than 0, got {max_mb!r}")
    exclude = tuple(exp.code.exclude)
    for i, pattern in enumerate(exclude):
        problem = shell.text_problem(pattern) or ("is empty" if not pattern.strip() else None)
        if problem:
            raise ConfigKeyError(f"code.exclude[{i}]", f"{pattern!r} {problem}")
    anchor = os.path.dirname(script) if script else ctx.cwd
    root = ctx.code_root or CodeRoot(anchor, False, ".", paths.inside(ctx.cwd, anchor))
    dest = ctx.code_dir or os.path.join(run_dir, CODE_DIR)
    return CodeSnapshot(
        source=root.path, git=root.git, dest=dest, script=script, exclude=exclude,
        max_bytes=int(max_mb * 1024 * 1024), skip=tuple(sorted(set(skip))),
        import_path=os.path.normpath(os.path.join(dest, root.workdir)) if root.workdir is not None else None,
        module=exp.entrypoint.module)


def _hparams(exp: schema.Experiment) -> dict[str, Any]:
    """hparams: any mapping that JSON can carry (hparams.json), with finite numbers."""
    hparams = dict(exp.hparams)
    for key, value in hparams.items():
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigKeyError(f"hparams.{key}", f"not a JSON value: {exc}") from None
    return hparams


# --- pieces -----------------------------------------------------------------------


def _positive(value: int, key: str) -> int:
    if value < 1:
        raise ConfigKeyError(key, f"must be 1 or more, got {value}")
    return value


def _time(value: str, key: str, *, site: bool = False) -> int:
    try:
        return slurmtime.parse(value)
    except ValueError as exc:
        raise ConfigKeyError(key, str(exc), site=site) from None


# --- values that reach rendered text --------------------------------------------------
#
# shell.quote and shell.expandable carry any text literally; what is checked here is what
# they cannot carry (NUL, lone surrogates) and what exec() refuses. What other parsers
# read differently (sbatch's directives, pyxis/apptainer mount lists, the module command)
# and sbatch extras that would replace what glaunch writes are the site's own checks
# (launcher.config.sitechecks).

def _check_experiment_text(exp: schema.Experiment) -> None:
    for i, arg in enumerate(exp.entrypoint.args):
        _check_text(str(arg), f"entrypoint.args[{i}]")
    for i, arg in enumerate(exp.entrypoint.resume_args):
        _check_text(str(arg), f"entrypoint.resume_args[{i}]")
    if exp.entrypoint.progress is not None:
        _check_progress(exp.entrypoint.progress)
    for key, value in exp.env.items():
        _check_text(str(value), f"env.{key}")
    if exp.strategy.nvme_path is not None:
        _check_text(exp.strategy.nvme_path, "strategy.nvme_path")
        if os.path.isabs(exp.strategy.nvme_path):       # DeepSpeed swaps tensors to files there
            paths.check_writable_place(exp.strategy.nvme_path, "strategy.nvme_path")


# Linux starts no program with one argument or environment string over MAX_ARG_STRLEN
# (32 pages, its NUL included), nor with all of them over ARG_MAX (2 MiB by default,
# shared with what the job inherits): every rank would fail with "Argument list too long".
MAX_EXEC_STRING = 32 * 4096 - 1
MAX_EXEC_TOTAL = 1 << 20


def _check_exec_sizes(env: dict[str, str], exp: schema.Experiment) -> None:
    """The environment, and torchrun's workers' arguments (under srun the script runs in
    the task's own process), within what exec() takes."""
    strings = [(f"env.{k}", k not in exp.env, f"{k}={v}") for k, v in env.items()]
    if exp.launcher == "torchrun":
        strings += [(f"entrypoint.args[{i}]", False, str(a)) for i, a in enumerate(exp.entrypoint.args)]
    total = 0
    for key, in_site, text in strings:
        size = len(text.encode())
        total += size + 1
        if size > MAX_EXEC_STRING:
            raise ConfigKeyError(key, f"{size} bytes long: Linux starts no program with a single argument or "
                                 f"environment variable of more than {MAX_EXEC_STRING} bytes (MAX_ARG_STRLEN)",
                                 site=in_site)
        if total > MAX_EXEC_TOTAL:
            what = "the environment and arguments reach" if exp.launcher == "torchrun" else "the environment reaches"
            raise ConfigKeyError(key, f"{what} {total} bytes here, more than the {MAX_EXEC_TOTAL} a job may add to "
                                 "what every program it starts receives (ARG_MAX)", site=in_site)


# A progress pattern is matched against every line rank 0 prints; one that backtracks
# without bound would stall whoever reads the log, so its length is bounded too.
MAX_PROGRESS_PATTERN = 500


def _check_progress(progress: schema.Progress) -> None:
    _check_text(progress.pattern, "entrypoint.progress.pattern")
    if len(progress.pattern) > MAX_PROGRESS_PATTERN:
        raise ConfigKeyError("entrypoint.progress.pattern", f"{len(progress.pattern)} characters: at most "
                             f"{MAX_PROGRESS_PATTERN}")
    try:
        groups = re.compile(progress.pattern).groups
    except re.error as exc:
        raise ConfigKeyError("entrypoint.progress.pattern", f"not a regular expression: {exc}") from None
    if groups < 1:
        raise ConfigKeyError("entrypoint.progress.pattern", "needs a group for the step, e.g. '^iter (\\d+):'")
    if progress.total is not None and progress.total < 1:
        raise ConfigKeyError("entrypoint.progress.total", f"{progress.total}: the last step is 1 or more")


def _check_text(text: str, key: str) -> None:
    problem = shell.text_problem(text)
    if problem:
        raise ConfigKeyError(key, problem)


def _as_dict(obj: Any) -> Any:
    return asdict(obj) if is_dataclass(obj) and not isinstance(obj, type) else obj

