"""Slurm's part of job.sbatch, from the plan: the #SBATCH directives and the job
controller's command line (the srun words of each job step in it). Pure."""

from __future__ import annotations

import math
from typing import Any

from launcher import shell
from launcher.rendering.render import submitit_command, task_log_patterns
from launcher.resolution.jobplan import PORT_BASE, PORT_SPAN, PORT_STRIDE, JobPlan
from launcher.rundir.layout import RunDir


def sbatch_directives(plan: JobPlan) -> list[str]:
    alloc = plan.allocation
    opts: list[tuple[str, Any]] = [("job-name", plan.name)]
    if alloc.partition:
        opts.append(("partition", alloc.partition))
    if alloc.account:
        opts.append(("account", alloc.account))
    if alloc.qos:
        opts.append(("qos", alloc.qos))
    if alloc.constraint:
        opts.append(("constraint", alloc.constraint))
    if alloc.segment:
        opts.append(("segment", alloc.segment))
    opts += [("nodes", alloc.allocated_nodes), ("ntasks-per-node", alloc.tasks_per_node)]
    if alloc.gpus_per_node:
        if alloc.gpu_directive == "gres":
            opts.append(("gres", f"gpu:{alloc.gpus_per_node}"))
        else:
            opts.append(("gpus-per-node", alloc.gpus_per_node))
    if alloc.cpus_per_task:
        opts.append(("cpus-per-task", alloc.cpus_per_task))
    if alloc.mem_gb is not None:
        opts.append(("mem", slurm_mem(alloc.mem_gb)))
    opts += [
        ("time", alloc.time),
        ("chdir", plan.workdir),
        ("output", RunDir(plan.run_dir).batch_log_pattern()),
        ("open-mode", "append"),
        # Warn every task ahead of the limit; the runtime checkpoints on it (a plain
        # Lightning script: Lightning does, on its own signal).
        ("signal", f"{plan.recovery.warning_signal}@{plan.recovery.signal_lead_s}"),
        ("requeue", True),
    ]
    if alloc.dependency:
        opts.append(("dependency", alloc.dependency))
    # Loading the site refuses extras that name one of these (config.sitechecks.OWN_SBATCH_OPTIONS).
    opts += [(key, value) for key, value in alloc.extra_sbatch if value is not False and value is not None]
    return [shell.sbatch_directive(k, v) for k, v in opts]


def slurm_mem(mem_gb: float) -> str:
    """Whole GB as G, else MiB rounded up: never less than asked, never 0 (which Slurm
    reads as all of the node's memory; resolution refuses less than 1 MiB)."""
    if float(mem_gb).is_integer():
        return f"{int(mem_gb)}G"
    return f"{max(math.ceil(mem_gb * 1024), 1)}M"


def _container_words(plan: JobPlan) -> list[str]:
    """srun's pyxis options: the image, the mounts, the working directory."""
    container = plan.launch.container
    if container is None or container.runtime != "pyxis":
        return []
    words = [f"--container-image={container.image}"]
    if container.mounts:
        words.append(f"--container-mounts={','.join(container.mounts)}")
    return words + [f"--container-workdir={plan.workdir}"]


def srun_words(plan: JobPlan) -> list[str]:
    """srun and its options for a job step, up to its node list (the job controller's
    choice among the allocation's nodes: launcher.jobcontrol.controller)."""
    out, err = task_log_patterns(plan)
    alloc = plan.allocation
    # recovery.peer (one task per rank): a lost rank's peers go on and its process is started
    # again (launcher.jobcontrol.replace); srun must not end them when its task ends.
    replaced = plan.recovery.peer and plan.launch.launcher == "srun"
    words = ["srun", "--unbuffered", f"--output={out}", f"--error={err}", "--open-mode=append",
             f"--kill-on-bad-exit={0 if replaced else 1}", f"--nodes={alloc.nodes}",
             f"--ntasks-per-node={alloc.tasks_per_node}",
             # The job's own count (SLURM_NTASKS) includes its spare nodes' tasks.
             f"--ntasks={alloc.nodes * alloc.tasks_per_node}"]
    if alloc.cpus_per_task:
        # Slurm 22.05 stopped passing the batch's --cpus-per-task on to srun.
        words.append(f"--cpus-per-task={alloc.cpus_per_task}")
    return words + _container_words(plan)


def controller_python(plan: JobPlan) -> list[str]:
    """The interpreter of the job controller on the batch host: the nodes' own, outside any
    container (the controller runs srun, scontrol and sbatch, which a container lacks)."""
    container, python = plan.launch.container, plan.launch.python
    if container is not None and container.runtime == "apptainer" and container.image in python:
        return list(python[python.index(container.image) + 1:])
    return list(python)


def controller_command(plan: JobPlan, *, batch: bool) -> str:
    """job.sbatch's last line: the job controller (launcher.jobcontrol.controller) of this run,
    with the step's srun words and the tasks' command. `batch`: a batch job, which requeues,
    restarts in its allocation and (requeue.mode resubmit) resubmits itself."""
    options = [plan.run_dir, "--nodes", str(plan.allocation.nodes)]
    if plan.launch.derive_master_port:
        options += ["--master-port", f"{PORT_BASE},{PORT_SPAN},{PORT_STRIDE}"]
    if batch:
        options += ["--requeue"] + (["--resubmit"] if plan.recovery.requeue_mode == "resubmit" else [])
    head = shell.join(["exec", *controller_python(plan), "-m", "launcher.jobcontrol.controller", *options])
    return f"{head} \\\n    -- {shell.join(srun_words(plan))} \\\n    -- {submitit_command(plan)}"
