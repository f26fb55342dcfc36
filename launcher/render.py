"""Render: JobPlan -> the run bundle's files, as text. Pure.

Templates receive only text that `launcher.shell` has already quoted.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import yaml

from . import __version__, launchspec, shell
from .errors import ConfigError
from .resolve import PORT_BASE, PORT_SPAN, STOP_SIGNALS, JobPlan

NETWORK_PREFIXES = ("NCCL_", "TORCH_NCCL_", "FI_", "UCX_", "GLOO_", "CUDA_DEVICE_MAX_CONNECTIONS")
TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    if TEMPLATES.is_dir():
        loader: jinja2.BaseLoader = jinja2.FileSystemLoader(str(TEMPLATES))
    else:
        loader = jinja2.PackageLoader("launcher", "templates")
    return jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined, autoescape=False,
                              keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


def render(plan: JobPlan) -> dict[str, str]:
    """File name (relative to the run dir) -> content."""
    files = {
        "job.sbatch": render_job_script(plan),
        "env.sh": render_env(plan),
        "resolved.yaml": render_resolved(plan),
    }
    if plan.ds_config is not None:
        files["ds_config.json"] = json.dumps(plan.ds_config, indent=2) + "\n"
    return files


# --- job.sbatch ------------------------------------------------------------------------


def log_pattern(plan: JobPlan, stream: str) -> str:
    """Per-task log path; %j and %t are filled in by srun (or localrun)."""
    return os.path.join(plan.log_dir, f"%j_%t_log.{stream}")


def sbatch_directives(plan: JobPlan) -> list[str]:
    opts: list[tuple[str, Any]] = [("job-name", plan.name)]
    if plan.partition:
        opts.append(("partition", plan.partition))
    if plan.account:
        opts.append(("account", plan.account))
    if plan.qos:
        opts.append(("qos", plan.qos))
    if plan.constraint:
        opts.append(("constraint", plan.constraint))
    opts += [("nodes", plan.nodes), ("ntasks-per-node", plan.tasks_per_node)]
    if plan.gpus_per_node:
        if plan.gpu_directive == "gres":
            opts.append(("gres", f"gpu:{plan.gpus_per_node}"))
        else:
            opts.append(("gpus-per-node", plan.gpus_per_node))
    if plan.cpus_per_task:
        opts.append(("cpus-per-task", plan.cpus_per_task))
    if plan.mem_gb is not None:
        opts.append(("mem", _slurm_mem(plan.mem_gb)))
    opts += [
        ("time", plan.time),
        ("chdir", plan.workdir),
        ("output", os.path.join(plan.log_dir, "%j_batch.log")),
        ("open-mode", "append"),
        # Warn every task ahead of the limit; the runtime checkpoints on it.
        ("signal", f"USR2@{plan.signal_lead_s}"),
        ("requeue", True),
    ]
    ours = {k for k, _ in opts}
    for key, value in plan.extra_sbatch:
        if value is False or value is None:
            continue
        if key in ours:
            opts = [(k, v) for k, v in opts if k != key]
        opts.append((key, value))
    try:
        return [shell.sbatch_directive(k, v) for k, v in opts]
    except ValueError as exc:
        raise ConfigError(str(exc), file=plan.site_file, key="sbatch") from None


def _slurm_mem(mem_gb: float) -> str:
    return f"{int(mem_gb)}G" if float(mem_gb).is_integer() else f"{int(mem_gb * 1024)}M"


def launch_line(plan: JobPlan) -> str:
    out, err = log_pattern(plan, "out"), log_pattern(plan, "err")
    if plan.scheduler == "local":
        words = [*plan.python, "-u", "-m", "launcher.runtime.localrun",
                 f"--ntasks={plan.tasks_per_node}", f"--time-limit={plan.time_seconds}",
                 f"--signal=USR2@{plan.signal_lead_s}", f"--output={out}", f"--error={err}", "--"]
        return shell.join(words) + " " + plan.submitit_command
    words = ["srun", "--unbuffered", f"--output={out}", f"--error={err}", "--open-mode=append",
             "--kill-on-bad-exit=1", f"--nodes={plan.nodes}", f"--ntasks-per-node={plan.tasks_per_node}"]
    if plan.cpus_per_task:
        # Slurm 22.05 stopped passing the batch's --cpus-per-task on to srun.
        words.append(f"--cpus-per-task={plan.cpus_per_task}")
    if plan.container is not None and plan.container.runtime == "pyxis":
        words.append(f"--container-image={plan.container.image}")
        if plan.container.mounts:
            words.append(f"--container-mounts={','.join(plan.container.mounts)}")
        words.append(f"--container-workdir={plan.workdir}")
    return shell.join(words) + " " + plan.submitit_command


def end_of_start_python(plan: JobPlan) -> list[str]:
    """The interpreter for launcher.runtime.jobend on the batch host: the tasks' own, or,
    in a pyxis container (which the batch shell is not in), one more one-task step in it."""
    if plan.container is not None and plan.container.runtime == "pyxis":
        words = ["srun", "--nodes=1", "--ntasks=1", f"--container-image={plan.container.image}"]
        if plan.container.mounts:
            words.append(f"--container-mounts={','.join(plan.container.mounts)}")
        return words + [f"--container-workdir={plan.workdir}", *plan.python]
    return list(plan.python)


def end_of_start(plan: JobPlan) -> list[str]:
    """After the step: record the start in run.json and requeue unless the run is done.
    The job requeues itself on preemption too (see launcher.runtime.jobend)."""
    jobend = shell.join([*end_of_start_python(plan), "-m", "launcher.runtime.jobend", plan.run_dir])
    return [
        "# End of this start: record it in run.json; requeue the job unless the run is finished.",
        "glaunch_preempted=$(scontrol show job \"$SLURM_JOB_ID\" 2>/dev/null | grep -c 'PreemptTime=[0-9]' || true)",
        f'glaunch_next=$({jobend} --status "$glaunch_status" --preempted "$glaunch_preempted" '
        '--started "$glaunch_started") && glaunch_rc=0 || glaunch_rc=$?',
        'if [ "$glaunch_next" = requeue ]; then',
        '    scontrol requeue "$SLURM_JOB_ID" || exit 1',
        "    sleep 300  # the requeue ends this script",
        "fi",
        'exit "$glaunch_rc"',
    ]


def task_description(plan: JobPlan) -> list[str]:
    spec = launchspec.task_spec(plan)
    entry = launchspec.entry_words(spec)
    if plan.launcher == "torchrun":
        node_rank = "$SLURM_NODEID" if plan.scheduler == "slurm" else "0"
        job_id = "$SLURM_JOB_ID" if plan.scheduler == "slurm" else "$GLAUNCH_JOB_ID"
        args = launchspec.torchrun_args(spec, node_rank=node_rank, master_addr="$MASTER_ADDR",
                                        master_port="$MASTER_PORT", job_id=job_id)
        return ["torchrun " + " ".join(args) + " " + shell.join(entry),
                f"(one task per node, {plan.ranks_per_node} worker(s) each)"]
    return ["python " + shell.join(entry),
            "(one task per rank; RANK, LOCAL_RANK and WORLD_SIZE come from the task's rank "
            "in the allocation)"]


def render_job_script(plan: JobPlan) -> str:
    directives = sbatch_directives(plan) if plan.scheduler == "slurm" else [
        "# scheduler: local -- run with bash on this machine by `glaunch submit`",
    ]
    return _environment().get_template("job.sbatch.j2").render(
        run_id=plan.run_id, name=plan.name, site=plan.site_name, scheduler=plan.scheduler,
        directives=directives,
        env_sh=shell.quote(os.path.join(plan.run_dir, "env.sh")),
        total_tasks=plan.nodes * plan.tasks_per_node, task_description=task_description(plan),
        submitit_executor="slurm" if plan.scheduler == "slurm" else "local",
        launch=launch_line(plan), end_of_start=end_of_start(plan) if plan.scheduler == "slurm" else [])


# --- env.sh --------------------------------------------------------------------------


def glaunch_env(plan: JobPlan) -> list[tuple[str, str, bool]]:
    """(name, value, how) of the variables the in-job runtime reads; how is False (literal),
    True ($NAME expands) or "raw" (glaunch's own shell text, e.g. a ${X:-default})."""
    slurm = plan.scheduler == "slurm"
    values = [
        ("GLAUNCH_RUN_ID", plan.run_id, False),
        ("GLAUNCH_RUN_DIR", plan.run_dir, False),
        ("GLAUNCH_CHECKPOINT_DIR", plan.checkpoint_dir, False),
        ("GLAUNCH_CHECKPOINT_EVERY", str(plan.checkpoint_every), False),
        ("GLAUNCH_CHECKPOINT_KEEP", str(plan.checkpoint_keep), False),
        ("GLAUNCH_STRATEGY", plan.strategy, False),
        ("GLAUNCH_PRECISION", plan.precision, False),
        ("GLAUNCH_LAUNCHER", plan.launcher, False),
        ("GLAUNCH_NODES", str(plan.nodes), False),
        ("GLAUNCH_RANKS_PER_NODE", str(plan.ranks_per_node), False),
        ("GLAUNCH_MICRO_BATCH", str(plan.micro_batch), False),
        ("GLAUNCH_GLOBAL_BATCH", str(plan.global_batch), False),
        ("GLAUNCH_STOP_SIGNALS", ",".join(STOP_SIGNALS), False),
    ]
    if plan.ds_config is not None:
        values.append(("GLAUNCH_DS_CONFIG", os.path.join(plan.run_dir, "ds_config.json"), False))
    if slurm:
        values += [("GLAUNCH_JOB_ID", "$SLURM_JOB_ID", True),
                   ("GLAUNCH_RESTART", "${SLURM_RESTART_COUNT:-0}", "raw")]
    return values


def rendezvous_lines(plan: JobPlan) -> list[str]:
    if plan.scheduler == "local":
        return ["# localrun picks a free port on this machine for each start",
                "export MASTER_ADDR=127.0.0.1"]
    lines = [
        "# The first host of the allocation, by the address slurmctld reaches it at.",
        "glaunch_first_host() {",
        "    local host addr",
        '    host=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        '    addr=$(scontrol show node "$host" 2>/dev/null | sed -n \'s/.*NodeAddr=\\([^ ]*\\).*/\\1/p\' | head -n 1)',
        '    printf \'%s\\n\' "${addr:-$host}"',
        "}",
        "MASTER_ADDR=$(glaunch_first_host)",
        "export MASTER_ADDR",
    ]
    if plan.derive_master_port:
        lines += [f"# Derived from the job id, below the ephemeral range 32768-60999.",
                  f"export MASTER_PORT=$(( {PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN} ))"]
    return lines


def render_env(plan: JobPlan) -> str:
    exports, network = [], []
    for name, value in plan.env:
        (network if name.startswith(NETWORK_PREFIXES) else exports).append(shell.export(name, value))
    modules = [f"module load {shell.quote(m)}" for m in plan.modules]
    return _environment().get_template("env.sh.j2").render(
        run_id=plan.run_id, site=plan.site_name, modules=modules, setup=list(plan.setup),
        exports=exports, network_exports=network,
        glaunch_exports=[f'export {n}="{v}"' if e == "raw" else shell.export(n, v, expand=e)
                         for n, v, e in glaunch_env(plan)],
        rendezvous=rendezvous_lines(plan))


# --- resolved.yaml ---------------------------------------------------------------------


def resolved_document(plan: JobPlan) -> dict[str, Any]:
    derived: dict[str, Any] = {
        "scheduler": plan.scheduler,
        "partition": plan.partition,
        "nodes": plan.nodes,
        "gpus_per_node": plan.gpus_per_node,
        "ranks_per_node": plan.ranks_per_node,
        "tasks_per_node": plan.tasks_per_node,
        "world_size": plan.world_size,
        "cpus_per_task": plan.cpus_per_task,
        "time": plan.time,
        "strategy": plan.strategy,
        "zero_stage": plan.zero_stage,
        "global_batch": plan.global_batch,
        "micro_batch": plan.micro_batch,
        "gradient_accumulation_steps": plan.accumulation,
        "run_dir": plan.run_dir,
        "checkpoint_dir": plan.checkpoint_dir,
        "workdir": plan.workdir,
        "python": list(plan.python),
    }
    if plan.strategy_choice is not None:
        derived["strategy_choice"] = dict(plan.strategy_choice)
    return {
        "glaunch": __version__,
        "run_id": plan.run_id,
        "experiment_file": plan.experiment_file,
        "site_file": plan.site_file,
        "derived": derived,
        "experiment": plan.experiment,
        "site": plan.site,
    }


def render_resolved(plan: JobPlan) -> str:
    return yaml.safe_dump(resolved_document(plan), sort_keys=False, allow_unicode=True, width=100)
