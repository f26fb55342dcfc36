"""The local scheduler: run job.sbatch with bash on this machine and follow it."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from . import runs
from .runtime import jobend
from .resolve import JobPlan

POLL_S = 0.2


def next_job_id() -> str:
    path = runs.state_dir() / "local_job_counter"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read().strip()
        value = int(text) + 1 if text.isdigit() else 1000
        f.seek(0)
        f.truncate()
        f.write(str(value))
    return str(value)


def dump_task(plan: JobPlan, job_id: str) -> None:
    from submitit.core.utils import DelayedSubmission, JobPaths

    from .launchspec import task_spec
    from .runtime.task import TrainingTask

    paths = JobPaths(plan.log_dir, job_id=job_id)
    DelayedSubmission(TrainingTask(task_spec(plan))).dump(paths.submitted_pickle)


def start(plan: JobPlan, job_id: str, restart: int) -> subprocess.Popen:
    env = dict(os.environ, GLAUNCH_JOB_ID=job_id, GLAUNCH_RESTART=str(restart))
    env.pop("MASTER_PORT", None)
    batch_log = open(Path(plan.log_dir) / f"{job_id}_batch.log", "ab")
    try:
        return subprocess.Popen(["bash", os.path.join(plan.run_dir, "job.sbatch")], cwd=plan.workdir, env=env,
                                stdin=subprocess.DEVNULL, stdout=batch_log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    finally:
        batch_log.close()


def step_summary(plan: JobPlan, job_id: str) -> dict:
    import json
    try:
        return json.loads((Path(plan.log_dir) / f"{job_id}_step.json").read_text())
    except (OSError, ValueError):
        return {}


class LogFollower:
    """Print what a growing file gains, from where we last stopped."""

    def __init__(self, path: Path, write: Callable[[str], None]) -> None:
        self.path, self.write, self.offset = path, write, 0

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        if data:
            self.offset += len(data)
            self.write(data.decode(errors="replace"))


def run(plan: JobPlan, *, echo: Callable[[str], None] | None = None) -> int:
    """Run the job to its end, requeueing on time limit or stop request like Slurm would.
    Returns the job's exit status."""
    echo = echo or (lambda text: (sys.stdout.write(text), sys.stdout.flush()))
    run_dir = Path(plan.run_dir)
    restart = 0
    while True:
        job_id = next_job_id()
        dump_task(plan, job_id)
        with runs.updating(run_dir) as record:
            record["job_id"] = job_id
            record["state"] = "RUNNING"
            record["starts"].append(runs.start_record(job_id, restart, started=runs.now(), state="RUNNING"))
        proc = start(plan, job_id, restart)
        with runs.updating(run_dir) as record:
            record["starts"][-1]["pid"] = proc.pid
        followers = [LogFollower(Path(plan.log_dir) / f"{job_id}_0_log.out", echo)]
        try:
            while proc.poll() is None:
                for f in followers:
                    f.poll()
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
        for f in followers:
            f.poll()
        status = proc.returncode
        stop = jobend.stopped_in(run_dir, restart)
        outcome = _outcome(plan, status, step_summary(plan, job_id), run_dir, restart, stop)
        with runs.updating(run_dir) as record:
            jobend.record_start(record, job_id, restart, ended=runs.now(), exit_code=status, state=outcome.state,
                                reason=outcome.reason, detail=outcome.detail,
                                resumed_from=jobend.resumed_in(run_dir, restart), stopped_at=(stop or {}).get("step"))
            record["state"], record["reason"], record["detail"] = outcome.state, outcome.reason, outcome.detail
        if not outcome.requeue:
            return 0 if outcome.state == "COMPLETED" else (status or outcome.exit_code or 1)
        restart += 1


def _outcome(plan: JobPlan, status: int, summary: dict, run_dir: Path, restart: int,
             stop: dict | None) -> "jobend.Outcome":
    """localrun's step summary in the terms of the Slurm path's decision."""
    warned, timed_out = bool(summary.get("warned")), bool(summary.get("timed_out"))
    signalled = status < 0 or status > 128
    crashes = jobend.crash_count(runs.read(run_dir).get("starts", [])[:-1])
    return jobend.with_crash_note(jobend.decide(
        step_status=status, finished=(run_dir / jobend.RESULT_FILE).exists(),
        stopped=warned or stop is not None, preempted=False,
        timed_out=timed_out, restart=restart, requeue_max=plan.requeue_max, crashes=crashes,
        crash_retries=plan.crash_retries, cancelled=signalled and not (warned or timed_out)), run_dir, restart)
