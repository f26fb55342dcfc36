"""Slurm's part of job.sbatch, from the plan: the #SBATCH directives, the srun line, and
the interpreter for the end-of-start step. Pure."""

from __future__ import annotations

import math
from typing import Any

from launcher import shell
from launcher.rendering.render import submitit_command, task_log_patterns
from launcher.resolution.jobplan import JobPlan
from launcher.rundir.layout import RunDir

STEP_NODES = '--nodelist="$glaunch_nodes"'


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
    if plan.segment:
        opts.append(("segment", plan.segment))
    opts += [("nodes", plan.allocated_nodes), ("ntasks-per-node", plan.tasks_per_node)]
    if plan.gpus_per_node:
        if plan.gpu_directive == "gres":
            opts.append(("gres", f"gpu:{plan.gpus_per_node}"))
        else:
            opts.append(("gpus-per-node", plan.gpus_per_node))
    if plan.cpus_per_task:
        opts.append(("cpus-per-task", plan.cpus_per_task))
    if plan.mem_gb is not None:
        opts.append(("mem", slurm_mem(plan.mem_gb)))
    opts += [
        ("time", plan.time),
        ("chdir", plan.workdir),
        ("output", RunDir(plan.run_dir).batch_log_pattern()),
        ("open-mode", "append"),
        # Warn every task ahead of the limit; the runtime checkpoints on it (a plain
        # Lightning script: Lightning does, on its own signal).
        ("signal", f"{plan.warning_signal}@{plan.signal_lead_s}"),
        ("requeue", True),
    ]
    if plan.dependency:
        opts.append(("dependency", plan.dependency))
    # Loading the site refuses extras that name one of these (config.sitechecks.OWN_SBATCH_OPTIONS).
    opts += [(key, value) for key, value in plan.extra_sbatch if value is not False and value is not None]
    return [shell.sbatch_directive(k, v) for k, v in opts]


def slurm_mem(mem_gb: float) -> str:
    """Whole GB as G, else MiB rounded up: never less than asked, never 0 (which Slurm
    reads as all of the node's memory; resolution refuses less than 1 MiB)."""
    if float(mem_gb).is_integer():
        return f"{int(mem_gb)}G"
    return f"{max(math.ceil(mem_gb * 1024), 1)}M"


def _container_words(plan: JobPlan) -> list[str]:
    """srun's pyxis options: the image, the mounts, the working directory."""
    if plan.container is None or plan.container.runtime != "pyxis":
        return []
    words = [f"--container-image={plan.container.image}"]
    if plan.container.mounts:
        words.append(f"--container-mounts={','.join(plan.container.mounts)}")
    return words + [f"--container-workdir={plan.workdir}"]


def srun_line(plan: JobPlan) -> str:
    out, err = task_log_patterns(plan)
    words = ["srun", "--unbuffered", f"--output={out}", f"--error={err}", "--open-mode=append",
             "--kill-on-bad-exit=1", f"--nodes={plan.nodes}", f"--ntasks-per-node={plan.tasks_per_node}",
             # The job's own count (SLURM_NTASKS) includes its spare nodes' tasks.
             f"--ntasks={plan.nodes * plan.tasks_per_node}"]
    if plan.cpus_per_task:
        # Slurm 22.05 stopped passing the batch's --cpus-per-task on to srun.
        words.append(f"--cpus-per-task={plan.cpus_per_task}")
    # The step's nodes: the batch script's choice among the allocation's (slurm.launch.sh.j2).
    return " ".join([shell.join(words + _container_words(plan)), STEP_NODES, submitit_command(plan)])


def end_of_start_python(plan: JobPlan) -> list[str]:
    """The interpreter for launcher.runtime.jobend on the batch host: the tasks' own, or,
    in a pyxis container (which the batch shell is not in), one more one-task step in it,
    sharing the job's resources (--overlap): the watchdog's runs beside the job step."""
    container = _container_words(plan)
    if container:
        return ["srun", "--overlap", "--nodes=1", "--ntasks=1", *container, *plan.python]
    return list(plan.python)
