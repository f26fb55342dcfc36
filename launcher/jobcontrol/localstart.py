"""The end of one start of a local run, as the Slurm path's controller decides it: the local
scheduler (launcher.schedulers.local) hands over what its job step left (localrun's step
summary, its exit status, whether the user interrupted or cancelled it) and gets back the
outcome and the start's fields for run.json. One node: a node a failure points at is
recorded, never excluded."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from launcher.jobcontrol import jobend, watchdog
from launcher.rundir.layout import RunDir
from launcher.rundir.records import FAILURES, RunRecord, State


@dataclass(frozen=True)
class LocalEnd:
    """A local start's outcome, and what run.json records of the start besides it."""

    outcome: jobend.Outcome
    fields: Mapping[str, Any]


def end_of_local_start(run_dir: RunDir, record: RunRecord, *, job_id: str, restart: int, status: int,
                       summary: Mapping[str, Any], requeue_max: int, crash_retries: int, first_start: int = 0,
                       interrupted: bool = False, cancelled: bool = False) -> LocalEnd:
    """How start `restart` (job `job_id`) of the local run ended: its outcome (done,
    requeue, failed, cancelled) and the start's fields (resumed_from, stopped_at, hang,
    bad_node, the measured summary). `record`: run.json as the start ended."""
    from launcher.rundir.startsummary import start_summary

    stop = jobend.stopped_in(run_dir.path, restart)
    hang = watchdog.hang_in(run_dir.path, restart)
    crash = jobend.crash_in(run_dir.path, restart)
    warned, timed_out = bool(summary.get("warned")), bool(summary.get("timed_out"))
    crashes = sum(1 for s in record.starts[first_start:] if s.reason in FAILURES)
    # A cancel is Ctrl-C or `glaunch cancel`'s mark; a task a signal ended without either
    # (the OOM killer's SIGKILL) crashed.
    outcome = jobend.with_crash_note(jobend.decide(
        step_status=status, finished=run_dir.result_file.exists(),
        stopped=warned or stop is not None, preempted=False,
        timed_out=timed_out, restart=restart, requeue_max=requeue_max, crashes=crashes,
        crash_retries=crash_retries, hung=hang is not None, cancelled=interrupted or cancelled,
        killed=None if crash else first_killed_task(summary, status),
        runtime=jobend.used_runtime(run_dir.path, job_id, restart),
        # The local step's own warning (its time limit) explains whatever the ranks stopped on.
        stop_signal=None if warned else jobend.signal_of(stop)),
        run_dir.path, restart, job_id)
    if interrupted and outcome.state == State.CANCELLED:
        outcome = dataclasses.replace(outcome, detail=f"interrupted (Ctrl-C): {_how_it_stopped(stop, status)}")
    fields = dict(resumed_from=jobend.resumed_in(run_dir.path, restart), stopped_at=(stop or {}).get("step"),
                  hang=jobend.hang_entry(hang), bad_node=jobend.blamed_node(outcome.reason, crash, hang),
                  **start_summary(run_dir.path, job_id, restart))
    return LocalEnd(outcome, fields)


def _how_it_stopped(stop: Mapping[str, Any] | None, status: int) -> str:
    if stop is not None and stop.get("checkpoint"):
        return f"stopped at step {stop.get('step')} with a checkpoint"
    if stop is not None:
        return f"stopped at step {stop.get('step')} without a checkpoint"
    return "the ranks did not stop by themselves" if status else "no stop recorded"


def first_killed_task(summary: Mapping[str, Any], status: int) -> jobend.Killed | None:
    """Pure: the task a signal ended first, from localrun's step summary (`exit_codes`, one
    per task, -N for signal N; `first_failed_task`), else from the step's `status` alone."""
    codes, first = summary.get("exit_codes"), summary.get("first_failed_task")
    if (isinstance(codes, list) and type(first) is int and 0 <= first < len(codes)
            and type(codes[first]) is int and codes[first] < 0):
        return jobend.killed_by(codes[first], first)
    return jobend.killed_by(status)
