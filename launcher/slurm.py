"""Submission to Slurm through submitit, with glaunch's rendered job.sbatch as the exact
submission text; preflight with `sbatch --test-only`; status from squeue / sacct."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .errors import SchedulerError
from .resolve import JobPlan


def _executor_class():
    from submitit.slurm.slurm import SlurmExecutor

    class GlaunchSlurmExecutor(SlurmExecutor):
        """submitit's executor, submitting our rendered script byte for byte."""

        def __init__(self, plan: JobPlan, job_text: str) -> None:
            super().__init__(plan.log_dir, max_num_timeout=plan.requeue_max, python=plan.python_command)
            self._job_text = job_text
            self.update_parameters(nodes=plan.nodes, ntasks_per_node=plan.tasks_per_node,
                                   time=max(plan.time_seconds // 60, 1))

        def _make_submission_file_text(self, command: str, uid: str) -> str:
            if command not in self._job_text:
                raise SchedulerError(f"internal: submitit's task command {command!r} is not in job.sbatch")
            return self._job_text

    return GlaunchSlurmExecutor


def require_slurm() -> None:
    if shutil.which("sbatch") is None or shutil.which("srun") is None:
        raise SchedulerError("Slurm's sbatch/srun are not on PATH: is this a Slurm login node? "
                             "(--dry-run renders the bundle without Slurm)")


# sbatch's refusals (Slurm 22.05 wording, matched loosely) in the profile's terms.
PREFLIGHT_HINTS = (
    (r"invalid partition", "partition {partition!r} does not exist on this cluster (resources.partition / "
                           "the site's default_partition)"),
    (r"invalid generic resource|invalid gres|gres.*invalid",
     "the cluster refused the GPU request ({gpus} per node as --{directive}): check the site's "
     "gpu_directive and partitions.{partition}.gpus_per_node"),
    (r"time limit", "time {time} is over the limit of partition {partition!r} on the cluster (resources.time, "
                    "partitions.{partition}.max_time)"),
    (r"invalid account", "account {account!r} is not valid here, or not on partition {partition!r} "
                         "(the site's account)"),
    (r"invalid qos", "QOS {qos!r} is not valid here (the site's qos, partitions.{partition}.qos)"),
    (r"node count specification invalid|node count|more processors requested than permitted",
     "partition {partition!r} cannot give {nodes} node(s) of {tasks} task(s) x {cpus} CPU(s) "
     "(resources.nodes, partitions.{partition}.max_nodes, cpus_per_node)"),
    (r"requested node configuration is not available",
     "no node of partition {partition!r} has what one node of this job asks: {gpus} GPU(s), {tasks} task(s) "
     "x {cpus} CPU(s), memory {mem} (resources.gpus_per_node, cpus_per_task, mem_gb; "
     "partitions.{partition}.gpus_per_node, cpus_per_node, mem_gb)"),
)


def preflight(plan: JobPlan, job_file: Path) -> None:
    """`sbatch --test-only`: Slurm validates the request without queueing anything."""
    proc = subprocess.run(["sbatch", "--test-only", str(job_file)], capture_output=True, text=True)
    if proc.returncode == 0:
        return
    raw = (proc.stderr or proc.stdout).strip()
    values = dict(partition=plan.partition, gpus=plan.gpus_per_node, directive=plan.gpu_directive,
                  time=plan.time, account=plan.account, qos=plan.qos, nodes=plan.nodes,
                  tasks=plan.tasks_per_node, cpus=plan.cpus_per_task or "default",
                  mem=f"{plan.mem_gb} GB" if plan.mem_gb is not None else "default")
    for pattern, message in PREFLIGHT_HINTS:
        if re.search(pattern, raw, re.IGNORECASE):
            raise SchedulerError(f"preflight: {message.format(**values)}\n  sbatch said: {raw}")
    raise SchedulerError(f"preflight: sbatch --test-only refused the job\n  sbatch said: {raw}")


def submit(plan: JobPlan, job_text: str) -> str:
    from submitit.core.utils import FailedJobError, FailedSubmissionError

    from .launchspec import task_spec
    from .runtime.task import TrainingTask

    executor = _executor_class()(plan, job_text)
    try:
        job = executor.submit(TrainingTask(task_spec(plan)))
    except (FailedSubmissionError, FailedJobError, subprocess.CalledProcessError, OSError) as exc:
        raise SchedulerError(f"sbatch refused the job: {exc}") from None
    return str(job.job_id)


# --- following jobs ----------------------------------------------------------------------


def squeue_state(job_id: str) -> str | None:
    proc = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    state = proc.stdout.strip().splitlines()
    return state[0] if state else None


def sacct_records(job_id: str) -> list[dict[str, Any]] | None:
    """Every start of the job (requeues included), or None without accounting."""
    proc = subprocess.run(["sacct", "-n", "-P", "-D", "-X", "-j", job_id,
                           "-o", "JobID,State,ExitCode,Start,End,Elapsed,NodeList,Reason"],
                          capture_output=True, text=True)
    if proc.returncode != 0 or "not running" in proc.stderr.lower():
        return None
    records = []
    for line in proc.stdout.strip().splitlines():
        fields = line.split("|")
        if len(fields) >= 8:
            records.append(dict(zip(("job_id", "state", "exit_code", "start", "end", "elapsed", "nodes",
                                     "reason"), fields)))
    return records


def cancel(job_id: str) -> None:
    proc = subprocess.run(["scancel", job_id], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SchedulerError(f"scancel {job_id} failed: {proc.stderr.strip()}")
