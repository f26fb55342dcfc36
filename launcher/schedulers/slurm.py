"""Slurm: job.sbatch's directives and srun line, the profile checked against the live
cluster, preflight with `sbatch --test-only`, submission through submitit with glaunch's
rendered job.sbatch as the exact submission text, state from squeue and sacct, scancel.

Every Slurm command runs through slurm_client: a timeout, a bounded retry on transient
errors, an environment without the submitting shell's SLURM_* variables or Slurm's input
variables (SBATCH_*, SALLOC_*, SRUN_*), which would otherwise reach or reshape the job."""

from __future__ import annotations

import getpass
import logging
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any, Mapping

from ..errors import SchedulerError
from ..rendering import shell
from ..rendering.render import JobShell, python_command
from ..rendering.taskspec import task_spec
from ..resolution.jobplan import PORT_BASE, PORT_SPAN, JobPlan
from ..runs import registry
from ..runs.layout import RunDir, RunRecord, State
from . import cluster_check, slurm_client, slurm_state
from .base import Echo, Launched, Scheduler
from .slurm_client import ACCOUNTING_POLICY, Unreachable, run_command
from .slurm_script import end_of_start_python, sbatch_directives, srun_line

log = logging.getLogger(__name__)

# What refresh writes in run.json for a pending job that will never start.
NEVER_STARTS = "never starts"


class SubmissionUncertain(SchedulerError):
    """sbatch failed in a way that may have queued the job, and the controller could not
    be asked whether it did. `glaunch status` looks again (the job carries the run id)."""

    def __init__(self, message: str, *, script: str, marker: str) -> None:
        super().__init__(message)
        self.script = script
        self.marker = marker


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

    def check_cluster(self, plan: JobPlan) -> list[str]:
        """The site profile against the live cluster, for the partition this job uses:
        SchedulerError naming every difference that would get the job refused, leave it
        pending forever or run it on other hardware; the harmless ones as warnings."""
        report = cluster_check.check_site(plan.site, partition=plan.partition,
                                          request=cluster_check.Request.of_plan(plan))
        if report.fatal:
            raise report.error(plan.site_file)
        return [str(d) for d in report.warnings] + list(report.notes)

    def launch(self, plan: JobPlan, run_dir: Path, *, check: bool, echo: Echo | None) -> Launched:
        job_text = RunDir(run_dir).job_script.read_text(encoding="utf-8")
        env, ignored = slurm_client.clean_env(os.environ)
        warnings = [w for w in (slurm_client.ignored_inputs_warning(ignored),) if w]
        try:
            if check:
                warnings += self.check_cluster(plan)
            for warning in warnings:
                log.warning("glaunch: warning: %s", warning)
            if check:
                preflight(plan, RunDir(run_dir).job_script, env)
            job_id = submit(plan, job_text, env)
        except SubmissionUncertain as exc:
            with registry.updating(run_dir) as record:
                record.state = State.UNKNOWN.value
                record.reason = "submission uncertain"
                record.detail = exc.message
                record.extra["submission"] = {"script": exc.script, "marker": exc.marker}
                record.extra["request"] = request_values(plan)
            raise
        except SchedulerError as exc:
            with registry.updating(run_dir) as record:
                record.state = State.REFUSED.value
                record.reason = exc.message
                if isinstance(exc, Unreachable):
                    record.extra["unreachable"] = {"at": registry.now(), "message": exc.message}
                if warnings:
                    record.extra["warnings"] = warnings
            raise
        with registry.updating(run_dir) as record:
            record.job_id = job_id
            record.state = State.PENDING.value
            record.starts.append(registry.new_start(job_id, 0))
            record.extra["request"] = request_values(plan)
            if warnings:
                record.extra["warnings"] = warnings
        return Launched(job_id, State.PENDING.value)

    # --- following ---------------------------------------------------------------------

    def refresh(self, run_dir: Path, record: RunRecord) -> RunRecord:
        """squeue says what is live now (and why a pending job waits); sacct fills in
        starts the job could not record (killed at the time limit, node failure). With
        the controller unreachable: SchedulerError, and run.json says so."""
        uncertain = isinstance(record.extra.get("submission"), dict)
        if shutil.which("squeue") is None or not (record.job_id or uncertain):
            return record
        try:
            if not record.job_id:
                return _settle_uncertain(run_dir, record)
            live, reason = squeue_job(record.job_id)
        except Unreachable as exc:
            with registry.updating(run_dir) as rec:
                rec.extra["unreachable"] = {"at": registry.now(), "message": exc.message}
            raise
        history = sacct_records(record.job_id)
        with registry.updating(run_dir) as rec:
            rec.extra.pop("unreachable", None)
            rec.extra["accounting"] = history is not None
            if history:
                rec.extra["scheduler_history"] = history
                slurm_state.merge_history(rec, history)
            rec.state = slurm_state.current_state(rec.state, live, history)
            _record_pending_reason(rec, live, reason)
        return rec

    def cancel(self, run_dir: Path, record: RunRecord) -> str:
        if not record.job_id:
            return f"run {record.run_id}: nothing to cancel ({record.state})"
        proc = run_command("scancel", record.job_id)
        if proc.returncode != 0:
            raise SchedulerError(f"scancel {record.job_id} failed: {proc.stderr.strip()}")
        return f"run {record.run_id}: cancelled job {record.job_id}"


def request_values(plan: JobPlan) -> dict[str, Any]:
    """What the job asked, and the profile's limits for it: the words a pending reason is
    said in (run.json `request`)."""
    part = (plan.site.get("partitions") or {}).get(plan.partition or "") or {}
    return {"partition": plan.partition, "nodes": plan.nodes, "gpus_per_node": plan.gpus_per_node,
            "time": plan.time, "account": plan.account, "qos": plan.qos, "constraint": plan.constraint,
            "max_time": part.get("max_time"), "max_nodes": part.get("max_nodes")}


def _record_pending_reason(rec: RunRecord, live: str | None, reason: str | None) -> None:
    """A pending job's reason in run.json; one that never clears by itself as
    reason "never starts", detail in the profile's terms, and `blocked: true`."""
    if live == "PENDING" and reason:
        rec.extra["pending_reason"] = reason
    else:
        rec.extra.pop("pending_reason", None)
    request = rec.extra.get("request")
    values = dict(request) if isinstance(request, dict) else {"partition": rec.partition, "nodes": rec.nodes}
    verdict = slurm_state.pending_verdict(reason, values) if live == "PENDING" else None
    if verdict:
        rec.reason = NEVER_STARTS
        rec.detail = (f"job {rec.job_id} {NEVER_STARTS}: {verdict}. It stays queued until cancelled "
                      f"(glaunch cancel {rec.run_id})")
        rec.extra["blocked"] = True
    else:
        rec.extra.pop("blocked", None)
        if rec.reason == NEVER_STARTS:
            rec.reason = rec.detail = None


def _settle_uncertain(run_dir: Path, record: RunRecord) -> RunRecord:
    """A submission whose sbatch failed without a clear answer: the job, if the
    controller queued it after all, carries the run's marker."""
    sub = record.extra["submission"]
    job_id = find_submitted(str(sub.get("script") or ""), str(sub.get("marker") or ""))
    with registry.updating(run_dir) as rec:
        rec.extra.pop("submission", None)
        if job_id:
            rec.job_id = job_id
            rec.state = State.PENDING.value
            rec.reason = rec.detail = None
            rec.starts.append(registry.new_start(job_id, 0))
        else:
            rec.state = State.REFUSED.value
            rec.reason = "sbatch did not queue the job (Slurm has no job carrying this run's id)"
    return rec if not job_id else SlurmScheduler().refresh(run_dir, rec)


# --- Slurm's commands ------------------------------------------------------------------------


def _executor_class():
    from submitit.core.utils import JobPaths
    from submitit.slurm.slurm import SlurmExecutor

    class GlaunchSlurmExecutor(SlurmExecutor):
        """submitit's executor, submitting our rendered script byte for byte, with sbatch run
        by slurm_client (timeout, retry after a lookup, a clean environment)."""

        def __init__(self, plan: JobPlan, job_text: str, env: Mapping[str, str]) -> None:
            super().__init__(plan.log_dir, max_num_timeout=plan.requeue_max, python=python_command(plan))
            self._job_text = job_text
            self._env = dict(env)
            # The job carries the run id: a submission that may have gone through is found again.
            self._marker = submission_marker(plan.run_id)
            self._comment = "comment" not in dict(plan.extra_sbatch)
            self.update_parameters(nodes=plan.nodes, ntasks_per_node=plan.tasks_per_node,
                                   time=max(plan.time_seconds // 60, 1))

        def _make_submission_file_text(self, command: str, uid: str) -> str:
            if command not in self._job_text:
                raise SchedulerError(f"internal: submitit's task command {command!r} is not in job.sbatch")
            return self._job_text

        def _make_submission_command(self, submission_file_path: Path) -> list[str]:
            comment = [f"--comment={self._marker}"] if self._comment else []
            return ["sbatch", *comment, str(submission_file_path)]

        def _submit_command(self, command: str):
            # submitit's own (core.PicklingExecutor._submit_command), with sbatch run under a
            # timeout and retry, in the cleaned environment, looked up before a retry.
            tmp_uuid = uuid.uuid4().hex
            path = JobPaths.get_first_id_independent_folder(self.folder) / f".submission_file_{tmp_uuid}.sh"
            with path.open("w") as f:
                f.write(self._make_submission_file_text(command, tmp_uuid))
            script, marker = str(path), self._marker

            def lookup(deadline: float) -> str | None:
                try:
                    return find_submitted(script, marker, deadline=deadline)
                except SchedulerError as exc:
                    raise SubmissionUncertain(
                        f"sbatch did not answer, and whether it queued the job cannot be told now: {exc.message}. "
                        "`glaunch status` looks for the job again (it carries the run id)",
                        script=script, marker=marker) from None

            output = slurm_client.CLIENT.submit(self._make_submission_command(path), lookup=lookup,
                                                env=self._env)
            job_id = self._get_job_id_from_submission_command(output)
            job = self.job_class(folder=self.folder, job_id=job_id, tasks=list(range(self._num_tasks())))
            job.paths.move_temporary_file(path, "submission_file", keep_as_symlink=True)
            self._write_job_id(job.job_id, tmp_uuid)
            self._set_job_permissions(job.paths.folder)
            return job

    return GlaunchSlurmExecutor


def submission_marker(run_id: str) -> str:
    """The job's --comment: which run it belongs to."""
    return f"glaunch:{run_id}"


def preflight(plan: JobPlan, job_file: Path, env: Mapping[str, str] | None = None) -> None:
    """`sbatch --test-only`: Slurm validates the request without queueing anything."""
    proc = run_command("sbatch", "--test-only", str(job_file), env=env)
    if proc.returncode == 0:
        return
    raw = (proc.stderr or proc.stdout).strip()
    values = dict(partition=plan.partition, gpus=plan.gpus_per_node, directive=plan.gpu_directive,
                  time=plan.time, account=plan.account, qos=plan.qos, nodes=plan.nodes,
                  tasks=plan.tasks_per_node, cpus=plan.cpus_per_task or "default",
                  mem=f"{plan.mem_gb} GB" if plan.mem_gb is not None else "default")
    raise SchedulerError(slurm_state.preflight_message(raw, values))


def submit(plan: JobPlan, job_text: str, env: Mapping[str, str] | None = None) -> str:
    from submitit.core.utils import FailedJobError, FailedSubmissionError

    from ..runtime.task import TrainingTask

    executor = _executor_class()(plan, job_text, env if env is not None else slurm_client.clean_env(os.environ)[0])
    try:
        job = executor.submit(TrainingTask(task_spec(plan)))
    except (FailedSubmissionError, FailedJobError, subprocess.CalledProcessError, OSError) as exc:
        raise SchedulerError(f"sbatch refused the job: {exc}") from None
    return str(job.job_id)


def find_submitted(script: str, marker: str, *, deadline: float | None = None) -> str | None:
    """The id of the job submitted from `script` or carrying comment `marker`, if Slurm
    has it (pending, running or recently ended); None when it has no such job."""
    proc = run_command("squeue", "-h", "--states=all", "-u", getpass.getuser(), "-o", "%i|%k|%o",
                       deadline=deadline)
    if proc.returncode != 0:
        raise SchedulerError(f"squeue failed: {(proc.stderr or proc.stdout).strip()}")
    for line in proc.stdout.splitlines():
        fields = line.strip().split("|", 2)
        if len(fields) == 3 and ((marker and fields[1] == marker) or (script and fields[2] == script)):
            return fields[0]
    return None


def squeue_job(job_id: str) -> tuple[str | None, str | None]:
    """(state, pending reason) of the job as squeue lists it; (None, None) once it is gone."""
    proc = run_command("squeue", "-h", "-j", job_id, "-o", slurm_state.SQUEUE_FORMAT)
    if proc.returncode != 0:
        return None, None
    return slurm_state.parse_squeue(proc.stdout), slurm_state.parse_squeue_reason(proc.stdout)


def squeue_state(job_id: str) -> str | None:
    return squeue_job(job_id)[0]


def sacct_records(job_id: str) -> list[dict[str, Any]] | None:
    """Every start of the job (requeues included), or None without accounting."""
    try:
        proc = run_command("sacct", "-n", "-P", "-D", "-X", "-j", job_id, "-o", ",".join(slurm_state.SACCT_FORMAT),
                           policy=ACCOUNTING_POLICY, controller=False)
    except Unreachable:
        return None
    if proc.returncode != 0 or "not running" in proc.stderr.lower():
        return None
    return slurm_state.parse_sacct(proc.stdout)
