"""Slurm: job.sbatch's directives and srun line, preflight with `sbatch --test-only`,
submission through submitit with glaunch's rendered job.sbatch as the exact submission
text, state from squeue and sacct, scancel. Every Slurm command runs with a timeout."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from ..errors import SchedulerError
from ..rendering import shell
from ..rendering.render import JobShell, python_command
from ..rendering.taskspec import task_spec
from ..resolution.jobplan import PORT_BASE, PORT_SPAN, JobPlan
from ..runs import registry
from ..runs.layout import RunDir, RunRecord, State
from . import slurm_state
from .base import Echo, Launched, Scheduler
from .slurm_script import end_of_start_python, sbatch_directives, srun_line

COMMAND_TIMEOUT_S = 60


def run_command(*cmd: str, timeout: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run one Slurm client command; a hang or a missing binary is a SchedulerError."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SchedulerError(f"{cmd[0]} did not answer within {timeout:g} s: is slurmctld reachable?") from None
    except OSError as exc:
        raise SchedulerError(f"{cmd[0]}: {exc}") from None


class SlurmScheduler(Scheduler):
    name = "slurm"

    # --- rendering ---------------------------------------------------------------------

    def job_shell(self, plan: JobPlan) -> JobShell:
        jobend = shell.join([*end_of_start_python(plan), "-m", "launcher.runtime.jobend", plan.run_dir])
        return JobShell(
            directives=tuple(sbatch_directives(plan)), launch=srun_line(plan),
            launch_template="slurm.launch.sh.j2", launch_context={"jobend": jobend},
            rendezvous_template="slurm.rendezvous.sh.j2",
            rendezvous_context={"derive_master_port": plan.derive_master_port, "port_base": PORT_BASE,
                                "port_span": PORT_SPAN},
            submitit_executor="slurm", node_rank="$SLURM_NODEID", job_id="$SLURM_JOB_ID",
            extra_env=(("GLAUNCH_JOB_ID", "$SLURM_JOB_ID", True),
                       ("GLAUNCH_RESTART", "${SLURM_RESTART_COUNT:-0}", "raw")))

    # --- submission --------------------------------------------------------------------

    def require(self) -> None:
        if shutil.which("sbatch") is None or shutil.which("srun") is None:
            raise SchedulerError("Slurm's sbatch/srun are not on PATH: is this a Slurm login node? "
                                 "(--dry-run renders the bundle without Slurm)")

    def launch(self, plan: JobPlan, run_dir: Path, *, check: bool, echo: Echo | None) -> Launched:
        job_text = RunDir(run_dir).job_script.read_text(encoding="utf-8")
        try:
            if check:
                preflight(plan, RunDir(run_dir).job_script)
            job_id = submit(plan, job_text)
        except SchedulerError as exc:
            with registry.updating(run_dir) as record:
                record.state = State.REFUSED.value
                record.reason = exc.message
            raise
        with registry.updating(run_dir) as record:
            record.job_id = job_id
            record.state = State.PENDING.value
            record.starts.append(registry.new_start(job_id, 0))
        return Launched(job_id, State.PENDING.value)

    # --- following ---------------------------------------------------------------------

    def refresh(self, run_dir: Path, record: RunRecord) -> RunRecord:
        """squeue says what is live now; sacct fills in starts the job could not record
        (killed at the time limit, node failure)."""
        if not record.job_id or shutil.which("squeue") is None:
            return record
        live = squeue_state(record.job_id)
        history = sacct_records(record.job_id)
        with registry.updating(run_dir) as rec:
            rec.extra["accounting"] = history is not None
            if history:
                rec.extra["scheduler_history"] = history
                slurm_state.merge_history(rec, history)
            rec.state = slurm_state.current_state(rec.state, live, history)
        return rec

    def cancel(self, run_dir: Path, record: RunRecord) -> str:
        if not record.job_id:
            return f"run {record.run_id}: nothing to cancel ({record.state})"
        proc = run_command("scancel", record.job_id)
        if proc.returncode != 0:
            raise SchedulerError(f"scancel {record.job_id} failed: {proc.stderr.strip()}")
        return f"run {record.run_id}: cancelled job {record.job_id}"


# --- Slurm's commands ------------------------------------------------------------------------


def _executor_class():
    from submitit.slurm.slurm import SlurmExecutor

    class GlaunchSlurmExecutor(SlurmExecutor):
        """submitit's executor, submitting our rendered script byte for byte."""

        def __init__(self, plan: JobPlan, job_text: str) -> None:
            super().__init__(plan.log_dir, max_num_timeout=plan.requeue_max, python=python_command(plan))
            self._job_text = job_text
            self.update_parameters(nodes=plan.nodes, ntasks_per_node=plan.tasks_per_node,
                                   time=max(plan.time_seconds // 60, 1))

        def _make_submission_file_text(self, command: str, uid: str) -> str:
            if command not in self._job_text:
                raise SchedulerError(f"internal: submitit's task command {command!r} is not in job.sbatch")
            return self._job_text

    return GlaunchSlurmExecutor


def preflight(plan: JobPlan, job_file: Path) -> None:
    """`sbatch --test-only`: Slurm validates the request without queueing anything."""
    proc = run_command("sbatch", "--test-only", str(job_file))
    if proc.returncode == 0:
        return
    raw = (proc.stderr or proc.stdout).strip()
    values = dict(partition=plan.partition, gpus=plan.gpus_per_node, directive=plan.gpu_directive,
                  time=plan.time, account=plan.account, qos=plan.qos, nodes=plan.nodes,
                  tasks=plan.tasks_per_node, cpus=plan.cpus_per_task or "default",
                  mem=f"{plan.mem_gb} GB" if plan.mem_gb is not None else "default")
    raise SchedulerError(slurm_state.preflight_message(raw, values))


def submit(plan: JobPlan, job_text: str) -> str:
    from submitit.core.utils import FailedJobError, FailedSubmissionError

    from ..runtime.task import TrainingTask

    executor = _executor_class()(plan, job_text)
    try:
        job = executor.submit(TrainingTask(task_spec(plan)))
    except (FailedSubmissionError, FailedJobError, subprocess.CalledProcessError, OSError) as exc:
        raise SchedulerError(f"sbatch refused the job: {exc}") from None
    return str(job.job_id)


def squeue_state(job_id: str) -> str | None:
    proc = run_command("squeue", "-h", "-j", job_id, "-o", "%T")
    if proc.returncode != 0:
        return None
    return slurm_state.parse_squeue(proc.stdout)


def sacct_records(job_id: str) -> list[dict[str, Any]] | None:
    """Every start of the job (requeues included), or None without accounting."""
    proc = run_command("sacct", "-n", "-P", "-D", "-X", "-j", job_id, "-o", ",".join(slurm_state.SACCT_FORMAT))
    if proc.returncode != 0 or "not running" in proc.stderr.lower():
        return None
    return slurm_state.parse_sacct(proc.stdout)

