"""The end of one start of a job: what happened, whether to requeue, and run.json.

On Slurm, job.sbatch runs this after its job step ends (every rank has exited)::

    python -m launcher.runtime.jobend RUN_DIR --status S --preempted P --started T

It prints ``requeue`` or ``done`` on stdout, and exits with the status the job should
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
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .checkpoint import RESUME_FILE
from .context import context
from .result import RESULT_FILE, STOP_FILE
from .task import CRASH_FILE


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
        return Outcome("COMPLETED", None, False, 0)
    if cancelled:
        return Outcome("CANCELLED", "cancelled", False, 1)
    if stopped or preempted or timed_out:
        reason = "preemption" if preempted else "timeout"
        if restart < requeue_max:
            return Outcome("REQUEUED", reason, True, 0)
        return Outcome("PREEMPTED" if preempted else "TIMEOUT", reason, False, 1,
                       f"requeue.max ({requeue_max}) reached")
    if step_status == 0:
        # The step ended cleanly but the script wrote no result: nothing to resume for.
        return Outcome("COMPLETED", None, False, 0, "the entry point wrote no result.json")
    detail = f"exit status {step_status}"
    if crashes < crash_retries and restart < requeue_max:
        return Outcome("REQUEUED", "crash", True, 0, f"{detail}; retry {crashes + 1} of {crash_retries}")
    if crash_retries:
        detail += (f"; crash_retries ({crash_retries}) used up" if crashes >= crash_retries
                   else f"; requeue.max ({requeue_max}) reached")
    return Outcome("FAILED", "crash", False, step_status if 0 < step_status < 256 else 1, detail)


def read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def stopped_in(run_dir: Path, restart: int) -> dict | None:
    """stop.json, if the ranks wrote it in this start."""
    stop = read_json(Path(run_dir) / STOP_FILE)
    return stop if stop is not None and stop.get("restart") == restart else None


def resumed_in(run_dir: Path, restart: int) -> int | None:
    """The step this start resumed from (resume.json, written by resume_checkpoint)."""
    resume = read_json(Path(run_dir) / RESUME_FILE)
    if resume is None or resume.get("restart") != restart:
        return None
    return resume.get("step")


def with_crash_note(outcome: Outcome, run_dir: Path, restart: int) -> Outcome:
    """Name the task that failed first, and how (crash.json, written by the task)."""
    note = read_json(Path(run_dir) / CRASH_FILE)
    if outcome.reason != "crash" or note is None or note.get("restart") != restart:
        return outcome
    where = f"task {note.get('task')} on {note.get('node')}: {note.get('error')}"
    return dataclasses.replace(outcome, detail=f"{outcome.detail}; {where}" if outcome.detail else where)


def crash_count(starts: list[dict]) -> int:
    return sum(1 for s in starts if s.get("reason") == "crash")


def record_start(record: dict, job_id: str, restart: int, **fields) -> dict:
    """The entry of ``restart`` in record["starts"], created if the CLI has not made it."""
    from ..runs import start_record

    starts = record.setdefault("starts", [])
    for entry in starts:
        if entry.get("restart") == restart and str(entry.get("job_id")) == str(job_id):
            entry.update(fields)
            return entry
    # A start after a requeue was never submitted as such: it went back to the queue at the
    # previous start's end.
    entry = start_record(job_id, restart, **{"submitted": None, **fields})
    starts.append(entry)
    return entry


def main(argv: list[str] | None = None) -> int:
    from .. import runs

    parser = argparse.ArgumentParser(prog="python -m launcher.runtime.jobend")
    parser.add_argument("run_dir")
    parser.add_argument("--status", type=int, required=True, help="the job step's exit status")
    parser.add_argument("--preempted", default="0", help="non-zero: Slurm preempted the job")
    parser.add_argument("--started", default=None, help="when this start began (ISO 8601)")
    args = parser.parse_args(argv)

    run_dir = Path(args.run_dir)
    ctx = context()   # env.sh, sourced by job.sbatch, exported GLAUNCH_JOB_ID and GLAUNCH_RESTART
    job_id, restart = ctx.job_id or "?", ctx.restart
    stop = stopped_in(run_dir, restart)
    with runs.updating(run_dir) as record:
        outcome = decide(
            step_status=args.status, finished=(run_dir / RESULT_FILE).exists(), stopped=stop is not None,
            preempted=args.preempted not in ("", "0"), timed_out=False, restart=restart,
            requeue_max=int(record.get("requeue_max", 0)), crashes=crash_count(record.get("starts", [])),
            crash_retries=int(record.get("crash_retries", 0)))
        outcome = with_crash_note(outcome, run_dir, restart)
        record_start(record, job_id, restart, started=args.started, ended=runs.now(), state=outcome.state,
                     reason=outcome.reason, detail=outcome.detail, exit_code=args.status,
                     nodes=os.environ.get("SLURM_JOB_NODELIST"), resumed_from=resumed_in(run_dir, restart),
                     stopped_at=None if stop is None else stop.get("step"))
        record["job_id"] = job_id
        record["state"] = outcome.state
        record["reason"] = outcome.reason
        record["detail"] = outcome.detail
    print(f"glaunch: start {restart} of job {job_id} ended: {outcome.state}"
          + "".join(f" ({x})" for x in (outcome.reason, outcome.detail) if x)
          + ("; requeueing" if outcome.requeue else ""), file=sys.stderr, flush=True)
    print("requeue" if outcome.requeue else "done", flush=True)
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
