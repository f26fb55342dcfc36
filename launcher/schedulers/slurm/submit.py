"""Submitting to Slurm: `sbatch --test-only` before, then sbatch through submitit with
glaunch's rendered job.sbatch as the exact submission text (a sweep's array script is
sbatch'ed directly), and the pickled tasks submitit's loader reads: each holds the run
directory, whose task.json (written here, before anything is queued) says the rest.

Every job is queued held (`sbatch --hold`), on either road: its run.json and its pickled
task are put in place while it cannot start, then `release` lets it go; a submission that
fails in between cancels the held job (`cancel_held`), so no job runs that its record does
not name. sbatch runs under slurm_client's timeout and retry; a submission whose answer
was lost is looked up by its marker (--comment) or its script, so a job is never queued
twice.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from launcher.errors import SchedulerError
from launcher.rendering.render import python_command
from launcher.resolution.jobplan import JobPlan
from launcher.schedulers.slurm import array as slurm_array, client as slurm_client, state as slurm_state
from launcher.schedulers.slurm.client import Client
from launcher.schedulers.slurm.queries import find_submitted


class SubmissionUncertain(SchedulerError):
    """sbatch failed in a way that may have queued the job, and the controller could not
    be asked whether it did. `glaunch status` looks again (the job carries the run id)."""

    def __init__(self, message: str, *, script: str, marker: str) -> None:
        super().__init__(message)
        self.script = script
        self.marker = marker


def _executor_class():
    from submitit.core.utils import JobPaths
    from submitit.slurm.slurm import SlurmExecutor

    class GlaunchSlurmExecutor(SlurmExecutor):
        """submitit's executor, submitting our rendered script byte for byte, with sbatch run
        by slurm_client (timeout, retry after a lookup, a clean environment)."""

        def __init__(self, client: Client, plan: JobPlan, job_text: str, env: Mapping[str, str]) -> None:
            super().__init__(plan.log_dir, max_num_timeout=plan.recovery.requeue_max, python=python_command(plan))
            self._client = client
            self._job_text = job_text
            self._env = dict(env)
            # The job carries the run id: a submission that may have gone through is found again.
            self._marker = submission_marker(plan.run_id)
            self._comment = "comment" not in dict(plan.allocation.extra_sbatch)
            alloc = plan.allocation
            self.update_parameters(nodes=alloc.allocated_nodes, ntasks_per_node=alloc.tasks_per_node,
                                   time=max(alloc.time_seconds // 60, 1))

        def _make_submission_file_text(self, command: str, uid: str) -> str:
            if command not in self._job_text:
                raise SchedulerError(f"internal: submitit's task command {command!r} is not in job.sbatch")
            return self._job_text

        def _make_submission_command(self, submission_file_path: Path) -> list[str]:
            comment = [f"--comment={self._marker}"] if self._comment else []
            return ["sbatch", "--hold", *comment, str(submission_file_path)]

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
                    return find_submitted(self._client, script, marker, deadline=deadline)
                except SchedulerError as exc:
                    raise SubmissionUncertain(
                        f"sbatch did not answer, and whether it queued the job cannot be told now: {exc.message}. "
                        "`glaunch status` looks for the job again (it carries the run id)",
                        script=script, marker=marker) from None

            with cancelled_if_stopped(self._client, script, marker):
                output = self._client.submit(self._make_submission_command(path), lookup=lookup, env=self._env)
            job_id = self._get_job_id_from_submission_command(output)
            try:
                job = self.job_class(folder=self.folder, job_id=job_id, tasks=list(range(self._num_tasks())))
                job.paths.move_temporary_file(path, "submission_file", keep_as_symlink=True)
                self._write_job_id(job.job_id, tmp_uuid)
                self._set_job_permissions(job.paths.folder)
            except BaseException:
                cancel_held(self._client, job_id)     # queued held, and no record will name it
                raise
            return job

    return GlaunchSlurmExecutor


def task_template(log_dir: str | os.PathLike) -> Path:
    """An element's pickled task, written before its array is submitted; its task's id
    (ARRAYJOB_TASK, known once sbatch answers) gets a link to it."""
    return Path(log_dir) / ".glaunch_task.pkl"


def dump_task(plan: JobPlan, path: Path) -> None:
    """At `path`, the pickled task: it reads the run's task.json (written with the bundle)."""
    from launcher.runtime.task import dump_task as dump_pickled

    dump_pickled(plan.run_dir, path)


def link_task(log_dir: str | os.PathLike, job_id: str) -> None:
    """The pickle submitit's loader reads for task `job_id` (it waits a minute for it)."""
    from submitit.core.utils import JobPaths

    target = JobPaths(Path(log_dir), job_id=job_id).submitted_pickle
    if not target.exists():
        os.link(task_template(log_dir), target)
    task_template(log_dir).unlink()


def submission_scripts(log_dir: str | os.PathLike) -> list[Path]:
    """The scripts the executor handed sbatch for a run (its log folder's
    .submission_file_*.sh, kept as links once the job was named), oldest first."""
    try:
        found = [(path.lstat().st_mtime, path) for path in Path(log_dir).glob(".submission_file_*.sh")]
    except OSError:
        return []
    return [path for _, path in sorted(found)]


def submitted_pickle(log_dir: str | os.PathLike, job_id: str) -> Path:
    from submitit.core.utils import JobPaths

    return JobPaths(Path(log_dir), job_id=job_id).submitted_pickle


def submit_array(client: Client, plan: JobPlan, script: Path, marker: str, env: Mapping[str, str]) -> str:
    """sbatch the array script; the array's job id. Never queued twice: after a lost
    answer the array is looked up by its marker (--comment) or its script."""
    with_comment = "comment" not in dict(plan.allocation.extra_sbatch)
    cmd = ["sbatch", "--hold", *([f"--comment={marker}"] if with_comment else []), str(script)]

    def lookup(deadline: float) -> str | None:
        try:
            found = find_submitted(client, str(script), marker if with_comment else "", deadline=deadline)
        except SchedulerError as exc:
            raise SubmissionUncertain(
                f"sbatch did not answer, and whether it queued the array cannot be told now: {exc.message}. "
                "`glaunch status` looks for it again (it carries the sweep's id)",
                script=str(script), marker=marker if with_comment else "") from None
        return slurm_array.array_job_id(found) if found else None

    with cancelled_if_stopped(client, str(script), marker if with_comment else ""):
        output = client.submit(cmd, lookup=lookup, env=env)
    m = re.search(r"Submitted batch job (\d+)", output)
    if m is None:
        raise SchedulerError(f"sbatch answered without a job id: {output.strip()[:200]}")
    return m.group(1)


@contextlib.contextmanager
def cancelled_if_stopped(client: Client, script: str, marker: str) -> Iterator[None]:
    """Around sbatch: when something other than Slurm's answer stops it (Ctrl-C, a kill),
    the job it may have queued held is looked up (by `marker` or `script`) and cancelled,
    so no held job is left that no record names."""
    try:
        yield
    except SchedulerError:
        raise               # Slurm's answer: refused, or uncertain (looked up again later)
    except BaseException:
        try:
            found = find_submitted(client, script, marker, deadline=time.monotonic() + LOOKUP_AFTER_STOP_S)
        except SchedulerError:
            found = None
        if found:
            cancel_held(client, slurm_array.array_job_id(found))
        raise


# How long a submission stopped during sbatch looks for the job it may have queued.
LOOKUP_AFTER_STOP_S = 20.0


def release(client: Client, job_ids: Sequence[str]) -> None:
    """`scontrol release` of held jobs (an array's id releases its tasks), through `client`;
    SchedulerError when Slurm did not release them. A release whose answer was lost and
    was asked again finds the jobs released already ("not held" or the like): squeue is
    asked, and jobs no longer held count as released."""
    proc = client.call("scontrol", "release", ",".join(job_ids))
    if proc.returncode != 0 and not _none_held(job_ids, client):
        said = (proc.stderr or proc.stdout).strip()[:300]
        raise SchedulerError(f"scontrol release {','.join(job_ids)} failed: {said}")


def _none_held(job_ids: Sequence[str], client: Client) -> bool:
    """Whether squeue lists every job (or array task) of `job_ids`, none held by a user."""
    try:
        proc = client.call("squeue", "-h", "-j", ",".join(job_ids), "-o", "%i|%r")
    except SchedulerError:
        return False
    rows = [line.split("|", 1) for line in proc.stdout.splitlines() if "|" in line]
    return proc.returncode == 0 and bool(rows) and all(reason.strip() != "JobHeldUser" for _, reason in rows)


def cancel_held(client: Client, job_id: str) -> bool:
    """scancel of a held job whose submission failed: whether it is gone (cancelled, or
    never known to Slurm); False when Slurm could not be asked or refused."""
    try:
        proc = client.call("scancel", job_id)
    except SchedulerError:
        return False
    return proc.returncode == 0 or "Invalid job id" in proc.stderr


def submission_marker(run_id: str) -> str:
    """The job's --comment: which run it belongs to."""
    return f"glaunch:{run_id}"


def preflight_call(job_file: str | Path) -> tuple[str, ...]:
    """The one command of preflight."""
    return ("sbatch", "--test-only", str(job_file))


def preflight(client: Client, plan: JobPlan, job_file: Path, env: Mapping[str, str] | None = None) -> None:
    """`sbatch --test-only`: Slurm validates the request without queueing anything."""
    proc = client.call(*preflight_call(job_file), env=env)
    if proc.returncode == 0:
        return
    raw = (proc.stderr or proc.stdout).strip()
    alloc = plan.allocation
    values = dict(partition=alloc.partition, gpus=alloc.gpus_per_node, directive=alloc.gpu_directive,
                  time=alloc.time, account=alloc.account, qos=alloc.qos, nodes=alloc.allocated_nodes,
                  tasks=alloc.tasks_per_node, cpus=alloc.cpus_per_task or "default",
                  mem=f"{alloc.mem_gb} GB" if alloc.mem_gb is not None else "default")
    raise SchedulerError(slurm_state.preflight_message(raw, values))


def submit(client: Client, plan: JobPlan, job_text: str, env: Mapping[str, str] | None = None) -> str:
    from submitit.core.utils import FailedJobError, FailedSubmissionError

    from launcher.runtime.task import TrainingTask

    env = env if env is not None else slurm_client.clean_env(os.environ)[0]
    executor = _executor_class()(client, plan, job_text, env)
    try:
        job = executor.submit(TrainingTask(plan.run_dir))
    except (FailedSubmissionError, FailedJobError, subprocess.CalledProcessError, OSError) as exc:
        raise SchedulerError(f"sbatch refused the job: {exc}") from None
    return str(job.job_id)
