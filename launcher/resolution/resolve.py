"""Resolve: site profile + experiment -> one frozen JobPlan, with every cross-check.

Pure: the caller passes in everything from the outside world (cwd, the submitting
interpreter, the environment used to expand `$VAR` in paths, the run id).
"""

from __future__ import annotations

import math
import os
from typing import Any

from launcher.config import schema
from launcher.config.load import LoadedExperiment
from launcher.config.sites import LoadedSite
from launcher.config.provenance import Provenance
from launcher.config.sitechecks import OWN_SBATCH_OPTIONS, python_words  # noqa: F401 (re-exported)
from launcher import shell
from launcher.rundir.layout import CODE_DIR
from launcher.resolution import deepspeed_config, paths
from launcher.config import slurmtime
from launcher.resolution.jobplan import CodeRoot, CodeSnapshot, Container, JobPlan, SubmitContext
from launcher.resolution.strategy import resolve_strategy

# Counts beyond what the job's consumers hold: PyTorch ranks are C ints; Slurm keeps CPUs
# per task in 16 bits and memory in MB in 64, their top values meaning "unset"/"unlimited".
MAX_WORLD_SIZE = 2 ** 31 - 1
MAX_CPUS_PER_TASK = 2 ** 16 - 3
MAX_MEM_MB = 2 ** 62
MAX_BATCH = 2 ** 63 - 1


def resolve(exp_loaded: LoadedExperiment, site_loaded: LoadedSite, ctx: SubmitContext) -> JobPlan:
    exp, site = exp_loaded.config, site_loaded.config
    eprov, sprov = exp_loaded.provenance, site_loaded.provenance
    res = exp.resources
    _check_experiment_text(exp, eprov)

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
    if world_size > MAX_WORLD_SIZE:
        raise eprov.error("resources.nodes", f"{nodes} nodes x {ranks_per_node} ranks = {world_size} ranks, more than "
                          f"PyTorch can number ({MAX_WORLD_SIZE})")
    cpus_per_task = _cpus_per_task(res, part, partition_name, ranks_per_node, tasks_per_node, eprov)
    if cpus_per_task is not None and cpus_per_task > MAX_CPUS_PER_TASK:
        raise eprov.error("resources.cpus_per_task", f"{cpus_per_task} CPUs per task, more than Slurm can request "
                          f"({MAX_CPUS_PER_TASK})")
    mem_gb = res.mem_gb
    if mem_gb is not None:
        if not math.isfinite(mem_gb) or mem_gb <= 0:
            raise eprov.error("resources.mem_gb", f"must be a finite number more than 0, got {mem_gb!r}")
        if mem_gb * 1024 > MAX_MEM_MB:
            raise eprov.error("resources.mem_gb", f"{mem_gb:g} GB is more than Slurm can request ({MAX_MEM_MB} MB)")
        if mem_gb * 1024 < 1:
            raise eprov.error("resources.mem_gb", f"{mem_gb:g} GB is less than 1 MiB, the smallest request "
                              "Slurm takes (--mem=0 would mean all of the node's memory)")
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
    for key in ("stall_s", "first_step_s"):
        if getattr(exp.watchdog, key) < 0:
            raise eprov.error(f"watchdog.{key}", "must be 0 (off) or more seconds")
    if exp.checkpoint.every_steps < 1:
        raise eprov.error("checkpoint.every_steps", "must be 1 or more")
    if exp.checkpoint.keep < 1:
        raise eprov.error("checkpoint.keep", "must be 1 or more")

    strategy, choice = resolve_strategy(exp, site, part, nodes, ranks_per_node, eprov)
    micro = _positive(exp.batch.micro_size, "batch.micro_size", eprov)
    global_batch = exp.batch.global_size if exp.batch.global_size is not None else micro * world_size
    _positive(global_batch, "batch.global_size", eprov)
    if micro * world_size > MAX_BATCH:
        raise eprov.error("batch.micro_size", f"{micro} x {world_size} ranks = {micro * world_size} samples per "
                          f"step, more than a 64-bit count holds")
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
            precision=exp.precision, extra=exp.deepspeed, error=eprov.error)
    elif exp.deepspeed:
        raise eprov.error("deepspeed", f"DeepSpeed keys given but strategy.name is {strategy.name!r}")

    cwd = ctx.cwd
    paths.check_text(cwd, "working directory", None)
    runs_prov: Provenance | None
    if ctx.runs_dir is not None and not str(ctx.runs_dir).strip():
        paths.error("--runs-dir", None, "is empty: give a directory, or leave the option out for the default")
    if ctx.runs_dir:
        runs_key, runs_prov = "--runs-dir", None
        runs_root = paths.expand(ctx.runs_dir, runs_key, runs_prov, ctx.environ, cwd)
    elif site.runs_root:
        runs_key, runs_prov = "runs_root", sprov
        runs_root = paths.expand(site.runs_root, runs_key, runs_prov, ctx.environ, cwd)
    else:
        runs_key, runs_prov = "working directory", None
        runs_root = os.path.join(cwd, "runs")
    bad = sorted(set(runs_root) & set("%\\"))
    if bad:
        paths.error(runs_key, runs_prov, f"{runs_root!r} holds {' and '.join(map(repr, bad))}: the run directory "
                    "is part of Slurm's log file patterns (%j, %t), where they would change the names")
    run_dir = os.path.join(runs_root, ctx.run_id)
    checkpoint_dir = (paths.expand(exp.checkpoint.dir, "checkpoint.dir", eprov, ctx.environ, cwd)
                      if exp.checkpoint.dir else os.path.join(run_dir, "checkpoints"))
    script = entry_script(exp_loaded, ctx)
    code = _code(exp, site, eprov, ctx, script, run_dir, skip=(runs_root, checkpoint_dir))
    hparams = _hparams(exp, eprov)

    env = dict(site.env)
    env.update(exp.env)
    reserved = sorted(k for k in env if k.startswith("GLAUNCH_"))
    if reserved:
        key = reserved[0]
        prov = eprov if key in exp.env else sprov
        raise prov.error(f"env.{key}", "GLAUNCH_* variables are set by glaunch itself")
    _check_exec_sizes(env, exp, eprov, sprov)

    container = None
    if site.container is not None:
        mounts = list(site.container.mounts)
        # The paths the job reads and writes are mounted too: ',' or ':' in one of them
        # would split it into other mounts (pyxis and apptainer have no escape for them).
        for path, key, path_prov in ((cwd, "working directory", None), (runs_root, runs_key, runs_prov),
                                     (checkpoint_dir, "checkpoint.dir" if exp.checkpoint.dir else runs_key,
                                      eprov if exp.checkpoint.dir else runs_prov)):
            bad = sorted(set(path) & set(",:"))
            if bad:
                paths.error(key, path_prov, f"{path!r} holds {' and '.join(map(repr, bad))}: it is mounted into the "
                            f"container ({site.container.runtime}), where ',' separates mounts and ':' source, "
                            "target and flags")
            if not any(m.split(":")[0] == path for m in mounts):
                mounts.append(path)
        container = Container(site.container.runtime, site.container.image, tuple(mounts))
    if site.python:
        python = python_words(site.python, sprov)
    elif container is not None:
        python = ("python3",)
    else:
        if shell.hidden_characters(ctx.python) or shell.text_problem(ctx.python):
            raise sprov.error("python", f"the submitting interpreter {ctx.python!r} is not a usable command name "
                              "on the nodes; set python: in the site profile")
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
        entry_script=code.copy_of(code_entry(ctx, script)) if code and script else script,
        entry_module=exp.entrypoint.module,
        entry_args=tuple(str(a) for a in exp.entrypoint.args),
        python=python, container=container, modules=tuple(site.modules), setup=tuple(site.setup),
        env=tuple(env.items()), derive_master_port="MASTER_PORT" not in env,
        strategy=strategy.name, zero_stage=strategy.zero_stage if strategy.name == "deepspeed" else None,
        precision=exp.precision, global_batch=global_batch, micro_batch=micro, accumulation=accumulation,
        ds_config=ds_config, strategy_choice=choice,
        checkpoint_every=exp.checkpoint.every_steps, checkpoint_keep=exp.checkpoint.keep,
        requeue_max=exp.requeue.max, signal_lead_s=lead, crash_retries=site.crash_retries,
        exclude_bad_nodes=exp.requeue.exclude_bad_nodes,
        watchdog_stall_s=exp.watchdog.stall_s, watchdog_first_step_s=exp.watchdog.first_step_s,
        experiment=_as_dict(exp), site=_as_dict(site), code=code, hparams=hparams,
        sweep_id=ctx.sweep_id, dependency=ctx.dependency,
    )


# --- the code snapshot and hparams -----------------------------------------------------


def entry_script(exp_loaded: LoadedExperiment, ctx: SubmitContext) -> str | None:
    """The entry point's script as an absolute path (relative: from the experiment file's folder)."""
    exp, eprov = exp_loaded.config, exp_loaded.provenance
    if not exp.entrypoint.script:
        return None
    exp_dir = os.path.dirname(os.path.abspath(os.path.join(ctx.cwd, str(exp_loaded.path))))
    return paths.expand(exp.entrypoint.script, "entrypoint.script", eprov, ctx.environ, exp_dir)


def code_anchor(exp_loaded: LoadedExperiment, site_loaded: LoadedSite, ctx: SubmitContext) -> str | None:
    """The folder whose work tree a snapshot copies (the script's folder; for a module, the
    working directory), or None when this run takes no snapshot. The caller finds the work
    tree around it (launcher.runner.snapshot.locate) and passes it in as ctx.code_root."""
    if not snapshot_enabled(exp_loaded.config, site_loaded.config):
        return None
    script = entry_script(exp_loaded, ctx)
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


def _code(exp: schema.Experiment, site: schema.Site, prov: Provenance, ctx: SubmitContext, script: str | None,
          run_dir: str, *, skip: tuple[str, ...]) -> CodeSnapshot | None:
    if not snapshot_enabled(exp, site):
        return None
    max_mb = exp.code.max_mb
    if not math.isfinite(max_mb) or max_mb <= 0:
        raise prov.error("code.max_mb", f"must be a finite number more than 0, got {max_mb!r}")
    exclude = tuple(exp.code.exclude)
    for i, pattern in enumerate(exclude):
        problem = shell.text_problem(pattern) or ("is empty" if not pattern.strip() else None)
        if problem:
            raise prov.error(f"code.exclude[{i}]", f"{pattern!r} {problem}")
    anchor = os.path.dirname(script) if script else ctx.cwd
    root = ctx.code_root or CodeRoot(anchor, False, ".", paths.inside(ctx.cwd, anchor))
    dest = ctx.code_dir or os.path.join(run_dir, CODE_DIR)
    return CodeSnapshot(
        source=root.path, git=root.git, dest=dest, script=script, exclude=exclude,
        max_bytes=int(max_mb * 1024 * 1024), skip=tuple(sorted(set(skip))),
        import_path=os.path.normpath(os.path.join(dest, root.workdir)) if root.workdir is not None else None)


def _hparams(exp: schema.Experiment, prov: Provenance) -> dict[str, Any]:
    """hparams: any mapping that JSON can carry (hparams.json), with finite numbers."""
    import json

    hparams = dict(exp.hparams)
    for key, value in hparams.items():
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise prov.error(f"hparams.{key}", f"not a JSON value: {exc}") from None
    return hparams


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


# --- values that reach rendered text --------------------------------------------------
#
# shell.quote and shell.expandable carry any text literally; what is checked here is what
# they cannot carry (NUL, lone surrogates), what other parsers read differently (sbatch's
# directives, pyxis/apptainer mount lists, the module command), and sbatch extras that
# would replace what glaunch writes itself.

def _check_experiment_text(exp: schema.Experiment, prov: Provenance) -> None:
    for i, arg in enumerate(exp.entrypoint.args):
        _check_text(str(arg), f"entrypoint.args[{i}]", prov)
    for key, value in exp.env.items():
        _check_text(str(value), f"env.{key}", prov)
    if exp.strategy.nvme_path is not None:
        _check_text(exp.strategy.nvme_path, "strategy.nvme_path", prov)


# Linux starts no program with one argument or environment string over MAX_ARG_STRLEN
# (32 pages, its NUL included), nor with all of them over ARG_MAX (2 MiB by default,
# shared with what the job inherits): every rank would fail with "Argument list too long".
MAX_EXEC_STRING = 32 * 4096 - 1
MAX_EXEC_TOTAL = 1 << 20


def _check_exec_sizes(env: dict[str, str], exp: schema.Experiment, eprov: Provenance, sprov: Provenance) -> None:
    """The environment, and torchrun's workers' arguments (under srun the script runs in
    the task's own process), within what exec() takes."""
    strings = [(f"env.{k}", eprov if k in exp.env else sprov, f"{k}={v}") for k, v in env.items()]
    if exp.launcher == "torchrun":
        strings += [(f"entrypoint.args[{i}]", eprov, str(a)) for i, a in enumerate(exp.entrypoint.args)]
    total = 0
    for key, prov, text in strings:
        size = len(text.encode())
        total += size + 1
        if size > MAX_EXEC_STRING:
            raise prov.error(key, f"{size} bytes long: Linux starts no program with a single argument or "
                             f"environment variable of more than {MAX_EXEC_STRING} bytes (MAX_ARG_STRLEN)")
        if total > MAX_EXEC_TOTAL:
            what = "the environment and arguments reach" if exp.launcher == "torchrun" else "the environment reaches"
            raise prov.error(key, f"{what} {total} bytes here, more than the {MAX_EXEC_TOTAL} a job may add to what "
                             "every program it starts receives (ARG_MAX)")


def _check_text(text: str, key: str, prov: Provenance) -> None:
    problem = shell.text_problem(text)
    if problem:
        raise prov.error(key, problem)


def _as_dict(obj: Any) -> Any:
    from dataclasses import asdict, is_dataclass
    return asdict(obj) if is_dataclass(obj) and not isinstance(obj, type) else obj


__all__ = ["JobPlan", "SubmitContext", "resolve"]
