"""Slurm: job.sbatch's directives and srun line, the profile checked against the live
cluster, preflight with `sbatch --test-only`, submission through submitit with glaunch's
rendered job.sbatch as the exact submission text, state from squeue and sacct, scancel.

Every Slurm command runs through slurm_client: a timeout, a bounded retry on transient
errors, an environment without the submitting shell's SLURM_* variables or Slurm's input
variables (SBATCH_*, SALLOC_*, SRUN_*), which would otherwise reach or reshape the job."""

from __future__ import annotations

import dataclasses
import getpass
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import ConfigError, SchedulerError
from ..rendering import shell
from ..rendering.render import JobShell, python_command
from ..rendering.taskspec import task_spec
from ..resolution.jobplan import PORT_BASE, PORT_SPAN, JobPlan
from ..runs import registry
from ..runs.layout import RunDir, RunRecord, State, is_terminal
from . import cluster_check, slurm_client, slurm_state
from . import slurm_array
from .base import Echo, Launched, LaunchedBatch, Scheduler, SweepBatch, SweepPlan
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

    def __init__(self) -> None:
        self._cluster: cluster_check.Cluster | None = None   # read once per submission

    def cluster(self) -> cluster_check.Cluster:
        """The live cluster's facts (one scontrol call, sacctmgr), read once."""
        if self._cluster is None:
            self._cluster = cluster_check.read_cluster("glaunch submit")
        return self._cluster

    def version(self) -> str | None:
        """Slurm's version, where this submission read the cluster (run.json's provenance)."""
        version = self._cluster.settings.get("SLURM_VERSION") if self._cluster is not None else None
        return f"slurm {version}" if version else None

    # --- rendering ---------------------------------------------------------------------

    def job_shell(self, plan: JobPlan) -> JobShell:
        jobend = shell.join([*end_of_start_python(plan), "-m", "launcher.runtime.jobend", plan.run_dir])
        # A sweep's element is one task of an array job: Slurm's id for it, ARRAYJOB_TASK,
        # stays the same across its requeues, and `scontrol requeue` of it requeues it alone.
        directives = tuple(sbatch_directives(plan))
        if plan.sweep_id is not None:
            job_ref = "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
            job_env: tuple[str, str, Any] = ("GLAUNCH_JOB_ID", job_ref, "raw")
            directives += (f"# an element of sweep {plan.sweep_id}: run by the sweep's array script "
                           "(the directives above are its array's)",)
        else:
            job_ref = "$SLURM_JOB_ID"
            job_env = ("GLAUNCH_JOB_ID", "$SLURM_JOB_ID", True)
        return JobShell(
            directives=directives, launch=srun_line(plan),
            launch_template="slurm.launch.sh.j2", launch_context={"jobend": jobend, "requeue_job": f'"{job_ref}"'},
            rendezvous_template="slurm.rendezvous.sh.j2",
            rendezvous_context={"derive_master_port": plan.derive_master_port, "port_base": PORT_BASE,
                                "port_span": PORT_SPAN},
            submitit_executor="slurm", node_rank="$SLURM_NODEID", job_id="$SLURM_JOB_ID",
            extra_env=(job_env, ("GLAUNCH_RESTART", "${SLURM_RESTART_COUNT:-0}", "raw")))

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
                                          request=cluster_check.Request.of_plan(plan), cluster=self.cluster())
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
            _record_refused(run_dir, exc, warnings)
            raise
        _record_queued(run_dir, plan, job_id, warnings, self.version())
        return Launched(job_id, State.PENDING.value)

    # --- sweeps: job arrays -------------------------------------------------------------

    def plan_sweep(self, plans, *, sweep_id: str, sweep_dir: str, max_parallel: int | None,
                   dry_run: bool) -> SweepPlan:
        """One array per allocation shape, within the cluster's MaxArraySize (Slurm's
        default on a dry run, which asks the cluster nothing)."""
        limit = slurm_array.DEFAULT_MAX_ARRAY_SIZE
        if not dry_run:
            self.require()
            limit = slurm_array.max_array_size(self.cluster().settings)
        groups = slurm_array.group(plans, limit)
        files, batches = {}, []
        for group in groups:
            name = slurm_array.array_script(sweep_dir, group.number).name
            files[name] = slurm_array.render_array(group, plans, sweep_id=sweep_id, sweep_dir=sweep_dir,
                                                   arrays=len(groups), max_parallel=max_parallel)
            batches.append(SweepBatch(name, group.elements))
        return SweepPlan(tuple(batches), files)

    def launch_sweep(self, plans, sweep: SweepPlan, sweep_dir: Path, *, max_parallel: int | None, check: bool,
                     echo: Echo | None) -> list[LaunchedBatch]:
        """Check every array (the profile against the cluster, sbatch --test-only), then
        submit them: one sbatch call per array. An array sbatch refuses leaves its elements
        REFUSED; those already queued stay queued."""
        env, ignored = slurm_client.clean_env(os.environ)
        warnings = [w for w in (slurm_client.ignored_inputs_warning(ignored),) if w]
        scripts = [Path(sweep_dir) / str(batch.script) for batch in sweep.batches]
        try:
            if check:
                for batch, script in zip(sweep.batches, scripts):
                    first = plans[batch.elements[0]]
                    warnings += [w for w in self.check_cluster(first) if w not in warnings]
                    preflight(first, script, env)
        except SchedulerError as exc:
            for plan in plans:
                _record_refused(Path(plan.run_dir), exc, warnings)
            raise
        for warning in warnings:
            log.warning("glaunch: warning: %s", warning)
        version = self.version()
        results = []
        for number, (batch, script) in enumerate(zip(sweep.batches, scripts)):
            members = [plans[i] for i in batch.elements]
            for plan in members:
                _dump_task(plan, _task_template(plan.log_dir))
            try:
                array_id = submit_array(members[0], script, slurm_array.submission_marker(
                    str(members[0].sweep_id), number), env)
            except SubmissionUncertain as exc:
                for task, plan in enumerate(members):
                    with registry.updating(plan.run_dir) as record:
                        record.state = State.UNKNOWN.value
                        record.reason = "submission uncertain"
                        record.detail = exc.message
                        record.extra["submission"] = {"script": exc.script, "marker": exc.marker, "task": task}
                        record.extra["request"] = request_values(plan)
                results.append(LaunchedBatch(batch.script, None, batch.elements, (None,) * len(members),
                                             exc.message))
                continue
            except SchedulerError as exc:
                for plan in members:
                    _record_refused(Path(plan.run_dir), exc, warnings)
                results.append(LaunchedBatch(batch.script, None, batch.elements, (None,) * len(members),
                                             exc.message))
                continue
            launched = []
            for task, plan in enumerate(members):
                job_id = f"{array_id}_{task}"
                _link_task(plan.log_dir, job_id)
                _record_queued(Path(plan.run_dir), plan, job_id, warnings, version)
                launched.append(Launched(job_id, State.PENDING.value))
            results.append(LaunchedBatch(batch.script, array_id, batch.elements, tuple(launched)))
        return results

    # --- following ---------------------------------------------------------------------

    def refresh(self, run_dir: Path, record: RunRecord) -> RunRecord:
        """squeue says what is live now (and why a pending job waits); sacct fills in
        starts the job could not record (killed at the time limit, node failure). With
        the controller unreachable: SchedulerError, and run.json says so."""
        uncertain = isinstance(record.extra.get("submission"), dict)
        if shutil.which("squeue") is None or not (record.job_id or uncertain) or record.extra.get("allocation"):
            return record       # a run inside an allocation: its own record says all (the job is the allocation)
        try:
            if not record.job_id:
                return _settle_uncertain(run_dir, record)
            live, reason = squeue_job(record.job_id)
        except Unreachable as exc:
            with registry.updating(run_dir) as rec:
                rec.extra["unreachable"] = {"at": registry.now(), "message": exc.message}
            raise
        return _fold(run_dir, live, reason, sacct_records(record.job_id))

    def refresh_many(self, runs):
        """One squeue and one sacct call for all of them (a sweep's elements: by their
        array jobs), instead of two per run."""
        if shutil.which("squeue") is None:
            return [record for _, record in runs]
        queued = [(d, r) for d, r in runs if r.job_id and not r.dry_run and not r.extra.get("allocation")]
        ids = sorted({slurm_array.array_job_id(r.job_id) for _, r in queued if r.job_id})
        live: dict[str, tuple[str | None, str | None]] = {}
        histories: dict[str, list[dict[str, Any]]] | None = {}
        if ids:
            try:
                live = squeue_jobs(ids)
            except Unreachable as exc:
                for run_dir, _ in queued:
                    with registry.updating(run_dir) as rec:
                        rec.extra["unreachable"] = {"at": registry.now(), "message": exc.message}
                raise
            rows = sacct_records(",".join(ids))
            histories = None if rows is None else {}
            for row in slurm_array.task_rows(rows or []):
                histories.setdefault(row["job_id"], []).append(row)  # type: ignore[union-attr]
        asked = {id(r) for _, r in queued}
        out = []
        for run_dir, record in runs:
            if id(record) in asked and record.job_id:
                state, reason = live.get(record.job_id, (None, None))
                history = None if histories is None else histories.get(record.job_id, [])
                out.append(_fold(run_dir, state, reason, history))
            else:
                out.append(self.refresh(run_dir, record))
        return out

    def cancel_many(self, runs, job_ids=()):
        """One scancel for all: the arrays' jobs, and the runs outside them."""
        arrays = set(job_ids)
        targets = list(job_ids) + [r.job_id for _, r in runs if r.job_id and not is_terminal(r.state)
                                   and slurm_array.array_job_id(r.job_id) not in arrays]
        if not targets:
            return ["nothing to cancel"]
        proc = run_command("scancel", *targets)
        if proc.returncode != 0:
            raise SchedulerError(f"scancel {' '.join(targets)} failed: {proc.stderr.strip()}")
        return [f"cancelled job {t}" for t in targets]

    def cancel(self, run_dir: Path, record: RunRecord) -> str:
        if not record.job_id:
            return f"run {record.run_id}: nothing to cancel ({record.state})"
        if record.extra.get("allocation"):
            return _inside_allocation(record)
        proc = run_command("scancel", record.job_id)
        if proc.returncode != 0:
            raise SchedulerError(f"scancel {record.job_id} failed: {proc.stderr.strip()}")
        return f"run {record.run_id}: cancelled job {record.job_id}"


def _fold(run_dir: Path, live: str | None, reason: str | None, history: list[dict[str, Any]] | None) -> RunRecord:
    """squeue's state and reason and sacct's rows of one job, folded into its run.json."""
    with registry.updating(run_dir) as rec:
        rec.extra.pop("unreachable", None)
        rec.extra["accounting"] = history is not None
        if history:
            rec.extra["scheduler_history"] = history
            slurm_state.merge_history(rec, history)
        rec.state = slurm_state.current_state(rec.state, live, history)
        _record_pending_reason(rec, live, reason)
    return rec


def _record_refused(run_dir: Path, exc: SchedulerError, warnings: list[str]) -> None:
    with registry.updating(run_dir) as record:
        record.state = State.REFUSED.value
        record.reason = exc.message
        if isinstance(exc, Unreachable):
            record.extra["unreachable"] = {"at": registry.now(), "message": exc.message}
        if warnings:
            record.extra["warnings"] = warnings


def _record_queued(run_dir: Path, plan: JobPlan, job_id: str, warnings: list[str], version: str | None) -> None:
    with registry.updating(run_dir) as record:
        record.job_id = job_id
        record.state = State.PENDING.value
        record.starts.append(registry.new_start(job_id, 0))
        record.extra["request"] = request_values(plan)
        if warnings:
            record.extra["warnings"] = warnings
        origin = record.extra.get("provenance")
        if isinstance(origin, dict) and version:
            origin["scheduler_version"] = version


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
    task = sub.get("task")
    if job_id and isinstance(task, int) and not isinstance(task, bool):
        # A sweep's element: its array was queued after all; its task gets its pickle now.
        job_id = f"{slurm_array.array_job_id(job_id)}_{task}"
        try:
            _link_task(RunDir(run_dir).log_dir, job_id)
        except OSError:
            pass
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


def _task_template(log_dir: str | os.PathLike) -> Path:
    """An element's pickled task, written before its array is submitted; its task's id
    (ARRAYJOB_TASK, known once sbatch answers) gets a link to it."""
    return Path(log_dir) / ".glaunch_task.pkl"


def _dump_task(plan: JobPlan, path: Path) -> None:
    from submitit.core.utils import DelayedSubmission

    from ..runtime.task import TrainingTask

    DelayedSubmission(TrainingTask(task_spec(plan))).dump(path)


def _link_task(log_dir: str | os.PathLike, job_id: str) -> None:
    """The pickle submitit's loader reads for task `job_id` (it waits a minute for it)."""
    from submitit.core.utils import JobPaths

    target = JobPaths(Path(log_dir), job_id=job_id).submitted_pickle
    if not target.exists():
        os.link(_task_template(log_dir), target)
    _task_template(log_dir).unlink()


def submit_array(plan: JobPlan, script: Path, marker: str, env: Mapping[str, str]) -> str:
    """sbatch the array script; the array's job id. Never queued twice: after a lost
    answer the array is looked up by its marker (--comment) or its script."""
    with_comment = "comment" not in dict(plan.extra_sbatch)
    cmd = ["sbatch", *([f"--comment={marker}"] if with_comment else []), str(script)]

    def lookup(deadline: float) -> str | None:
        try:
            found = find_submitted(str(script), marker if with_comment else "", deadline=deadline)
        except SchedulerError as exc:
            raise SubmissionUncertain(
                f"sbatch did not answer, and whether it queued the array cannot be told now: {exc.message}. "
                "`glaunch status` looks for it again (it carries the sweep's id)",
                script=str(script), marker=marker if with_comment else "") from None
        return slurm_array.array_job_id(found) if found else None

    output = slurm_client.CLIENT.submit(cmd, lookup=lookup, env=env)
    m = re.search(r"Submitted batch job (\d+)", output)
    if m is None:
        raise SchedulerError(f"sbatch answered without a job id: {output.strip()[:200]}")
    return m.group(1)


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


def squeue_jobs(job_ids: list[str]) -> dict[str, tuple[str | None, str | None]]:
    """(state, pending reason) of every job or array task squeue lists for these ids (an
    array's tasks one by one, ARRAYJOB_TASK); jobs it no longer lists are left out."""
    proc = run_command("squeue", "-h", "-r", "-j", ",".join(job_ids), "-o", "%i|" + slurm_state.SQUEUE_FORMAT)
    if proc.returncode != 0:
        return {}           # none of them is known any more ("Invalid job id specified")
    out = {}
    for line in proc.stdout.splitlines():
        job_id, sep, rest = line.strip().partition("|")
        if sep:
            out[job_id] = (slurm_state.parse_squeue(rest), slurm_state.parse_squeue_reason(rest))
    return out


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


# --- glaunch run: inside an existing allocation ----------------------------------------------


@dataclass(frozen=True)
class Allocation:
    """The Slurm allocation this process runs in (salloc, an interactive job), from the
    variables Slurm sets in it."""

    job_id: str
    nodes: int
    nodelist: str

    @classmethod
    def of(cls, environ: Mapping[str, str]) -> Allocation | None:
        job_id = environ.get("SLURM_JOB_ID", "")
        if not re.fullmatch(r"[0-9]{1,18}", job_id):
            return None
        count = environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or ""
        return cls(job_id, int(count) if count.isdigit() else 0, environ.get("SLURM_JOB_NODELIST", ""))


class AllocationScheduler(SlurmScheduler):
    """`glaunch run`: every rank started with srun inside an allocation that exists
    already, no sbatch. The run's job.sbatch is the same script as a batch job's (env.sh,
    rendezvous, srun line, end of start), run here by bash with this shell's environment,
    the allocation's SLURM_* included; it is never requeued (the allocation ends when its
    owner says), and its checkpoints resume in a later run (the same checkpoint.dir)."""

    runs_to_completion = True

    def __init__(self, allocation: Allocation) -> None:
        super().__init__()
        self.allocation = allocation

    def check(self, plan: JobPlan) -> None:
        if self.allocation.nodes and plan.nodes > self.allocation.nodes:
            raise ConfigError(f"{plan.nodes} nodes requested, the allocation (job {self.allocation.job_id}) has "
                              f"{self.allocation.nodes}", file=plan.experiment_file, key="resources.nodes")

    def job_shell(self, plan: JobPlan) -> JobShell:
        batch = super().job_shell(plan)
        directives = (f"# run by `glaunch run` inside allocation {self.allocation.job_id} with bash; "
                      "never submitted with sbatch",)
        return dataclasses.replace(batch, directives=directives,
                                   launch_context=dict(batch.launch_context, requeue_job=None))

    def launch(self, plan: JobPlan, run_dir: Path, *, check: bool, echo: Echo | None) -> Launched:
        from ..runs.console import Console
        from ..runtime.telemetry import iso

        job_id = self.allocation.job_id
        paths = RunDir(run_dir)
        _dump_task(plan, _submitted_pickle(plan.log_dir, job_id))
        with registry.updating(run_dir) as record:
            record.job_id = job_id
            record.state = State.RUNNING.value
            record.requeue_max = record.crash_retries = 0      # nothing requeues an allocation
            record.extra["allocation"] = {"job_id": job_id, "nodes": self.allocation.nodelist}
            record.starts.append(registry.new_start(job_id, 0, started=iso(time.time()), state=State.RUNNING.value))
        console = echo if isinstance(echo, Console) else Console(run_dir, echo or _stdout, live=False)
        console.observe(record)
        # The caller's environment as it is: srun needs the allocation's SLURM_* variables.
        env = dict(os.environ, SLURM_TIME_FORMAT="standard")
        env.pop("MASTER_PORT", None)
        interrupts = 0
        with open(paths.batch_log(job_id), "ab") as batch_log:
            proc = subprocess.Popen(["bash", str(paths.job_script)], cwd=plan.workdir, env=env,
                                    stdin=subprocess.DEVNULL, stdout=batch_log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            while True:
                try:
                    while proc.poll() is None:
                        console.pump()
                        time.sleep(0.2)
                    break
                except KeyboardInterrupt:
                    interrupts += 1
                    _interrupt(proc.pid, interrupts, console)
        with registry.updating(run_dir) as record:
            start = record.starts[-1] if record.starts else None
            stopped = start.stopped_at if start is not None else None
            at = f"stopped at step {stopped} with a checkpoint" if stopped is not None else "no checkpoint saved"
            if interrupts or record.state == State.RUNNING.value:
                record.state, record.reason = State.CANCELLED.value, "cancelled"
                if start is not None:
                    start.state, start.reason = State.CANCELLED.value, "cancelled"
                record.detail = ("interrupted (Ctrl-C)" if interrupts else
                                 f"the job script exited {proc.returncode} without recording the start") + f": {at}"
            elif record.state in (State.TIMEOUT.value, State.PREEMPTED.value):
                record.detail = (f"{at}; inside an allocation nothing requeues: a later glaunch run with the same "
                                 "checkpoint.dir continues from it")
        console.finish(record)
        return Launched(job_id, record.state, 0 if record.state == State.COMPLETED.value else 1)

    def cancel(self, run_dir: Path, record: RunRecord) -> str:
        return _inside_allocation(record)


def _inside_allocation(record: RunRecord) -> str:
    return (f"run {record.run_id} runs inside allocation {record.job_id}: stop it with Ctrl-C where `glaunch run` "
            f"runs (scancel {record.job_id} would end the whole allocation)")


def _interrupt(bash_pid: int, count: int, console) -> None:
    """Ctrl-C in `glaunch run`: the first asks the ranks to stop as before a time limit
    (the warning signal to srun, which passes it on to every task: they save a checkpoint
    and exit, and the script records the start; srun would end the step at once on
    SIGTERM); the second kills everything the script started."""
    from ..runtime.task import WARNING_SIGNAL, child_pids

    if count == 1:
        console.event("interrupted: the ranks stop and save a checkpoint (Ctrl-C again kills them)")
        for pid in child_pids(bash_pid):
            try:
                os.kill(pid, WARNING_SIGNAL)
            except ProcessLookupError:
                pass
    else:
        console.event("killing the job step")
        try:
            os.killpg(bash_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _submitted_pickle(log_dir: str | os.PathLike, job_id: str) -> Path:
    from submitit.core.utils import JobPaths

    return JobPaths(Path(log_dir), job_id=job_id).submitted_pickle


def _stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
