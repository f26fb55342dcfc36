"""The end of one start of a job: what happened, whether to requeue, and run.json.

On Slurm, job.sbatch runs this after its job step ends (every rank has exited)::

    python -m launcher.runtime.jobend RUN_DIR --status S --preempted P --started T

It records the start in run.json, with what its ranks measured (peak memory, step and
save times, first and last step: :func:`launcher.runtime.telemetry.start_summary`),
prints ``requeue`` or ``done`` on stdout, and exits with the status the job should
end with. The batch script itself calls ``scontrol requeue`` (this module may run inside
a container where Slurm's commands are absent), after run.json is written: the requeue
kills the batch script.

Why glaunch requeues itself even on preemption: a job whose tasks exit 0 within the
preemption grace time ends COMPLETED and is never requeued by Slurm, so a graceful
save would lose the run.

The local scheduler (launcher.local) makes the same decision through :func:`decide`.
It imports no torch: on the batch host it needs only the Python that runs the tasks.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..runs import registry
from ..runs.files import read_json
from ..runs.layout import RunDir, State, is_job_id
from .context import context
from .telemetry import iso, start_summary


@dataclass(frozen=True)
class Outcome:
    state: str              # COMPLETED | REQUEUED | TIMEOUT | PREEMPTED | FAILED | CANCELLED
    reason: str | None      # timeout | preemption | crash | cancelled (None: finished)
    requeue: bool
    exit_code: int
    detail: str | None = None


def decide(*, step_status: int, finished: bool, stopped: bool, preempted: bool, timed_out: bool,
           restart: int, requeue_max: int, crashes: int, crash_retries: int,
           cancelled: bool = False) -> Outcome:
    """Pure: the outcome of a start from what is known when its step ended.

    finished: result.json exists (the run is done, whatever ended the step);
    stopped: the ranks stopped gracefully in this start (stop.json of this restart);
    preempted: the scheduler preempted the job; timed_out: the time limit ended the step;
    crashes: earlier starts that ended in a crash.
    """
    if finished:
        return Outcome(State.COMPLETED.value, None, False, 0)
    if cancelled:
        return Outcome(State.CANCELLED.value, "cancelled", False, 1)
    if stopped or preempted or timed_out:
        reason = "preemption" if preempted else "timeout"
        if restart < requeue_max:
            return Outcome(State.REQUEUED.value, reason, True, 0)
        return Outcome((State.PREEMPTED if preempted else State.TIMEOUT).value, reason, False, 1,
                       f"requeue.max ({requeue_max}) reached")
    if step_status == 0:
        # The step ended cleanly but the script wrote no result: nothing to resume for.
        return Outcome(State.COMPLETED.value, None, False, 0, "the entry point wrote no result.json")
    detail = f"exit status {step_status}"
    if crashes < crash_retries and restart < requeue_max:
        return Outcome(State.REQUEUED.value, "crash", True, 0, f"{detail}; retry {crashes + 1} of {crash_retries}")
    if crash_retries:
        detail += (f"; crash_retries ({crash_retries}) used up" if crashes >= crash_retries
                   else f"; requeue.max ({requeue_max}) reached")
    return Outcome(State.FAILED.value, "crash", False, step_status if 0 < step_status < 256 else 1, detail)


def stopped_in(run_dir: Path, restart: int) -> dict | None:
    """stop.json, if the ranks wrote it in this start."""
    stop = read_json(RunDir(run_dir).stop_file)
    return stop if stop is not None and stop.get("restart") == restart else None


def resumed_in(run_dir: Path, restart: int) -> int | None:
    """The step this start resumed from (resume.json, written by resume_checkpoint)."""
    resume = read_json(RunDir(run_dir).resume_file)
    if resume is None or resume.get("restart") != restart:
        return None
    return resume.get("step")


def with_crash_note(outcome: Outcome, run_dir: Path, restart: int) -> Outcome:
    """Name the task that failed first, and how (crash.json, written by the task)."""
    note = read_json(RunDir(run_dir).crash_file)
    if outcome.reason != "crash" or note is None or note.get("restart") != restart:
        return outcome
    where = f"task {note.get('task')} on {note.get('node')}: {note.get('error')}"
    return dataclasses.replace(outcome, detail=f"{outcome.detail}; {where}" if outcome.detail else where)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.runtime.jobend")
    parser.add_argument("run_dir")
    parser.add_argument("--status", type=int, required=True, help="the job step's exit status")
    parser.add_argument("--preempted", default="0", help="non-zero: Slurm preempted the job")
    parser.add_argument("--started", default=None, help="when this start began (ISO 8601)")
    args = parser.parse_args(argv)

    run_dir = Path(args.run_dir)
    ctx = context()   # env.sh, sourced by job.sbatch, exported GLAUNCH_JOB_ID and GLAUNCH_RESTART
    restart = ctx.restart
    stop = stopped_in(run_dir, restart)
    with registry.updating(run_dir) as record:
        # Only an id of Slurm's shape goes into run.json (it may reach scancel later).
        job_id = ctx.job_id if is_job_id(ctx.job_id) else record.job_id
        outcome = decide(
            step_status=args.status, finished=RunDir(run_dir).result_file.exists(), stopped=stop is not None,
            preempted=args.preempted not in ("", "0"), timed_out=False, restart=restart,
            requeue_max=record.requeue_max, crashes=record.crash_count(), crash_retries=record.crash_retries)
        outcome = with_crash_note(outcome, run_dir, restart)
        if job_id is not None:
            measured = start_summary(run_dir, ctx.job_id or job_id, restart)
            record.record_start(job_id, restart, started=args.started, ended=iso(time.time()), state=outcome.state,
                                reason=outcome.reason, detail=outcome.detail, exit_code=args.status,
                                nodes=os.environ.get("SLURM_JOB_NODELIST"), resumed_from=resumed_in(run_dir, restart),
                                stopped_at=None if stop is None else stop.get("step"), **measured)
            record.job_id = job_id
        record.state = outcome.state
        record.reason = outcome.reason
        record.detail = outcome.detail
    print(f"glaunch: start {restart} of job {job_id} ended: {outcome.state}"
          + "".join(f" ({x})" for x in (outcome.reason, outcome.detail) if x)
          + ("; requeueing" if outcome.requeue else ""), file=sys.stderr, flush=True)
    print("requeue" if outcome.requeue else "done", flush=True)
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
