"""The end of one start of a job: what happened, whether to requeue, and run.json.

On Slurm, the job controller (launcher.jobcontrol.controller) calls :func:`end_of_start`
after each job step ends (every rank has exited), with what it knows of the step
(:class:`StepEnd`). It records the start in run.json, with what its ranks measured (peak
memory, step and save times, first and last step:
:func:`launcher.rundir.startsummary.start_summary`), and answers how the run goes on
(:class:`NextRoad`) and the status the job should end with. The controller itself calls
``scontrol requeue``, after run.json is written: the requeue ends the batch script. The
same end, by hand: ``python -m launcher.jobcontrol.jobend RUN_DIR --status S`` prints the
road as one line.

A start that crashed or hung (the watchdog's hang.json) and points at one node (the node
of the first failing task, crash.json; the node of the silent ranks) is requeued without
that node (``requeue.exclude_bad_nodes``, from the job's task.json) while the partition
keeps enough usable nodes for the job (sinfo): the output is then ``requeue NODE,NODE``
(every node the job is kept off, for ``scontrol update ExcNodeList=``), and run.json
lists them. With ``watchdog.slow_node: exclude`` a start that requeues also leaves out the
nodes the watchdog named slow (its run.json entry's ``watchdog.slow``), under the same
check of the partition; what became of each is that entry's ``exclusion``.

A crash or a hang within ``crash_retries`` in a batch job (the controller passes the job's
nodes, ``allocation``, and the failed step's, ``step_nodes``) starts again in the same
allocation without a requeue: the road is ``restart NODE,NODE``, the nodes of the new job
step (:func:`restart_in_allocation`): the failed step's healthy nodes, and a
spare (``resources.spare_nodes``) in place of the node it points at. The start is
recorded RESTARTED, with the node it left out. Only when the allocation cannot spare that
node does the job requeue without it, as above. A step restarted in the allocation takes
the next start number (GLAUNCH_RESTART), so the batch script of a later requeue asks for
its own (:func:`launcher.jobcontrol.jobstart.begin`): Slurm's requeue count no longer is one. A start whose
watchdog stopped it to leave a slow node for a spare (``watchdog.slow_node: exclude``; the
start's ``watchdog.swap`` in run.json) goes on the same way, reason ``slow node``: a
graceful stop, which crash_retries does not count.

A start that reached the time limit is followed by a new job instead
(``requeue.mode: resubmit``, the default; :func:`next_start`): the road is ``resubmit``
(or ``resubmit NODES``, the nodes the job is kept off), the controller submits job.sbatch
again chained after this job (``--dependency=afterany``), and records the new job
(:func:`record_successor`): run.json's job id is then the new job's, so status and
cancel follow it. A requeued job cannot start again until Slurm's hold on it ends (about
120 s: the launch credential's lifetime); a new job starts as soon as this one has ended
and a node is free. Preemption and crashes requeue
(Slurm requeues a preempted job itself; a crash's bad node is kept off with
ExcNodeList), and so does a sweep's element (a task of a job array).

Before anything of a start runs, the controller asks whether it is a start of the run at
all (launcher.jobcontrol.jobstart): a start that begins after its run has ended exits at once,
changing nothing. While the step runs, the controller's thread watches it (the hang
watchdog, launcher.jobcontrol.watchdog).

A task a signal ended (srun's status 128 + N) crashed, unless a cancel was asked for the
job (glaunch's mark in run.json): the reason names the signal, and the rank where srun's
line in the batch log names the task (:func:`killed_in_step`).

Why glaunch requeues itself even on preemption: a job whose tasks exit 0 within the
preemption grace time ends COMPLETED and is never requeued by Slurm, so a graceful
save would lose the run.

The local scheduler (launcher.local) makes the same decision through :func:`decide`.
It imports no torch: on the batch host it needs only the Python that runs the tasks.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from typing import Any, Iterable, Mapping, Sequence

from launcher.rundir import registry
from launcher.processes import run_bounded
from launcher.rundir.files import atomic_write_text, open_regular, read_json
from launcher.rundir.lifecycle import IllegalMove, move
from launcher.rundir.records import (
    FAILURES,
    REQUEUED_BY_HAND,
    RESUBMITTED_AFTER,
    SLOW_NODE,
    TERMINATED,
    RunRecord,
    State,
    free_spares,
    is_job_id,
    is_node_name,
    is_terminal,
    node_list,
)
from launcher.rundir.layout import PEER_REPLACE_FILE, RunDir, array_task_log, name_part, read_heartbeat
from launcher.rundir.rankcontext import RuntimeConfigError, context
from launcher.rundir.startsummary import iso, not_started_note, start_summary
from launcher.rundir.taskspec import TaskSpecError, read_task_spec
from launcher.jobcontrol import jobstart, watchdog

SINFO_TIMEOUT_S = 20
# sinfo's node states (%T, lower case) that can take a job; a trailing * (not responding),
# ~ (powered off) and the like make any state unusable.
USABLE_STATES = frozenset({"idle", "mixed", "allocated", "completing"})
# The reasons a start may go on in a new step of its allocation: a failure within
# crash_retries, or the watchdog's stop to swap a slow node for a spare.
IN_ALLOCATION = FAILURES | {SLOW_NODE}


# A clean end of a script that uses glaunch's runtime but did not call rt.write_result.
NO_RESULT = "the entry point wrote no result.json"


@dataclass(frozen=True)
class Outcome:
    state: str              # COMPLETED | REQUEUED | TIMEOUT | PREEMPTED | FAILED | CANCELLED
    reason: str | None      # timeout | preemption | slow node | crash | hang | cancelled (None: finished)
    requeue: bool
    exit_code: int
    detail: str | None = None


def decide(*, step_status: int, finished: bool, stopped: bool, preempted: bool, timed_out: bool,
           restart: int, requeue_max: int, crashes: int, crash_retries: int,
           cancelled: bool = False, hung: bool = False, swapping: bool = False,
           killed: Killed | None = None, runtime: bool = True, failed_node: str | None = None,
           requeued: bool = False, stop_signal: str | None = None) -> Outcome:
    """Pure: the outcome of a start from what is known when its step ended.

    finished: result.json exists (the run is done, whatever ended the step);
    stopped: the ranks stopped gracefully in this start (stop.json of this restart);
    preempted: the scheduler preempted the job; timed_out: the time limit ended the step;
    crashes: earlier starts that ended in a crash or a hang; hung: the watchdog ended the
    step (hang.json of this restart): a hang is retried like a crash; swapping: the watchdog
    asked the ranks to stop, to leave a slow node for a spare (a stop then has that reason);
    cancelled: a cancel was asked for this job (glaunch's own mark, or Ctrl-C): only that
    makes a start CANCELLED; killed: the signal that ended the first failing task, which
    no cancel asked for: a crash like any other (the kernel's OOM killer sends SIGKILL);
    runtime: a rank of this start reported through glaunch's runtime (:func:`used_runtime`);
    failed_node: Slurm took the job back for a node's failure (its name; "" where not
    said), not a preemption: the start ends with reason "node failure". requeued: someone's
    `scontrol requeue` took it back (slurmstepd's line), not a preemption: reason "requeued".
    stop_signal: the signal the ranks stopped on (stop.json): a SIGTERM that no time limit,
    preemption, requeue or cancel explains is reason "terminated", not a time limit.
    A clean exit without result.json is noted only then: result.json is the runtime's
    (``rt.write_result``), and a script without it never writes one: its clean exit is its end.
    """
    if finished:
        return Outcome(State.COMPLETED.value, None, False, 0)
    if cancelled:
        return Outcome(State.CANCELLED.value, "cancelled", False, 1)
    # A step that ended cleanly as the limit came was not ended by it (a script without the
    # runtime that ended by itself is done).
    if preempted and failed_node is not None:
        detail = (f"node {failed_node} failed" if is_node_name(failed_node) else
                  f"nodes {failed_node} failed" if failed_node else "a node failed")
        if restart < requeue_max:
            return Outcome(State.REQUEUED.value, NODE_FAILURE, True, 0, detail)
        return Outcome(State.NODE_FAIL.value, NODE_FAILURE, False, 1, f"{detail}; requeue.max ({requeue_max}) reached")
    if stopped or preempted or (timed_out and step_status != 0):
        reason = ((REQUEUED_BY_HAND if requeued else "preemption") if preempted
                  else SLOW_NODE if swapping and stopped
                  else TERMINATED if stopped and stop_signal == "SIGTERM" and not timed_out else "timeout")
        if restart < requeue_max:
            return Outcome(State.REQUEUED.value, reason, True, 0)
        ended = State.PREEMPTED if preempted else State.FAILED if reason == TERMINATED else State.TIMEOUT
        return Outcome(ended.value, reason, False, 1, f"requeue.max ({requeue_max}) reached")
    if step_status == 0 and not hung:
        # The step ended cleanly: nothing to resume for, with or without a result.
        return Outcome(State.COMPLETED.value, None, False, 0, NO_RESULT if runtime else None)
    reason = "hang" if hung else "crash"
    detail = ("the watchdog ended the step" if hung else str(killed) if killed is not None
              else f"exit status {step_status}")
    if crashes < crash_retries and restart < requeue_max:
        return Outcome(State.REQUEUED.value, reason, True, 0, f"{detail}; retry {crashes + 1} of {crash_retries}")
    if crash_retries:
        detail += (f"; crash_retries ({crash_retries}) used up" if crashes >= crash_retries
                   else f"; requeue.max ({requeue_max}) reached")
    return Outcome(State.FAILED.value, reason, False, step_status if 0 < step_status < 256 else 1, detail)


@dataclass(frozen=True)
class Killed:
    """A task of the step ended by a signal (`rank`: which, None when not known)."""

    signum: int
    rank: int | None = None
    cancelled_step: str | None = None   # JOB.STEP where someone's scancel of the step ended it

    def __str__(self) -> str:
        if self.cancelled_step is not None:
            return f"job step {self.cancelled_step} was cancelled (scancel of the step, not of the job)"
        try:
            name = signal.Signals(self.signum).name
        except ValueError:
            name = f"signal {self.signum}"
        who = f"rank {self.rank}" if self.rank is not None else "a rank"
        # What the kernel's OOM killer sends; glaunch itself never sends a rank SIGKILL
        # unless the watchdog ends a hung step (a hang, not a crash).
        return f"{who} killed by {name}" + (" (out of memory?)" if self.signum == signal.SIGKILL else "")


# A step's status past this is 128 + the signal that killed a task (srun, localrun, bash).
SIGNALLED_STATUS = 128


def killed_by(step_status: int, rank: int | None = None) -> Killed | None:
    """Pure: the signal a step's status says ended a task (128 + N as srun and localrun
    report it; -N where Python saw the process itself killed), or None."""
    signum = -step_status if step_status < 0 else step_status - SIGNALLED_STATUS
    if step_status == 0 or not 0 < signum < signal.NSIG:
        return None
    return Killed(signum, rank)


# srun's line for a task that ended other than by exiting ("srun: error: node1: task 1:
# Killed"; "tasks 0-3: ..." for several): its first in a start names the task a signal
# ended first (the others srun ends itself, after it, under --kill-on-bad-exit).
SRUN_TASK_LINE = re.compile(r"srun: error: ([A-Za-z0-9][A-Za-z0-9._-]{0,99}): tasks? ([0-9]{1,9})[0-9,-]*: (.{1,200})")
SRUN_EXITED = "Exited with exit code"
# The part of the batch log read for it: its end, where this start's lines are.
BATCH_LOG_TAIL_BYTES = 65536


def this_start(batch_log: str) -> str:
    """Pure: this start's part of the batch log, after the last line a start's end or
    restart wrote ("glaunch: start ...")."""
    return batch_log.rsplit("glaunch: start ", 1)[-1]


def first_signalled_task(batch_log: str) -> int | None:
    """Pure: the task srun says a signal ended first, in this start's part of the batch log
    (after the last line a start's end or restart wrote, "glaunch: start ..."), or None."""
    part = this_start(batch_log)
    for line in part.splitlines():
        match = SRUN_TASK_LINE.fullmatch(line.strip())
        if match and not match.group(3).startswith(SRUN_EXITED):
            return int(match.group(2))
    return None


# slurmstepd's line in the batch log when the job is cancelled ("slurmstepd-n1: error: *** JOB
# 4765 ON n1 CANCELLED AT 2026-12-06T23:50:29 ***", Slurm 22.05 and 24.11 alike). Slurm's own
# ends of a job add why (" DUE TO TIME LIMIT", "DUE TO PREEMPTION", "DUE TO JOB REQUEUE"),
# and a signal sent with `scancel --signal` (the watchdog's) writes no such line.
# (The time is as slurmd's SLURM_TIME_FORMAT writes it: any text but a reason.)
# slurmstepd's error line about a job or step ("slurmstepd-n1: error: *** ").
SLURMSTEPD_NOTICE = r"^slurmstepd(?:-[A-Za-z0-9._-]{1,100})?: error: \*\*\* "
JOB_CANCELLED = re.compile(SLURMSTEPD_NOTICE + r"JOB ([0-9]{1,12}) ON "
                           r"[A-Za-z0-9][A-Za-z0-9._-]{0,99} CANCELLED AT (?:(?!DUE TO)[^*\n]){1,40} \*\*\*$",
                           re.MULTILINE)


# srun's line when a node of the step fails ("srun: error: Node failure on dnode2"), and
# slurmstepd's when Slurm ends the job for it ("*** JOB 12 ON dnode1 CANCELLED AT ... DUE TO
# NODE FAILURE ***"): Slurm then requeues the job as it does a preempted one.
NODE_FAILURE = "node failure"
# (srun names the failed nodes as a hostlist: "dnode[2-3]" names no one node to blame.)
SRUN_NODE_FAILURE = re.compile(r"^srun: error: Node failure on ([A-Za-z0-9][A-Za-z0-9._,\[\]-]{0,199})$",
                               re.MULTILINE)
JOB_NODE_FAILURE = re.compile(SLURMSTEPD_NOTICE + r"JOB [0-9]{1,12} ON "
                              r"[A-Za-z0-9][A-Za-z0-9._-]{0,99} CANCELLED AT [^*\n]{1,40} DUE TO NODE FAILURE",
                              re.MULTILINE)


# slurmstepd's line when someone put the running job back in the queue (`scontrol requeue`:
# a user, an administrator, or the script's own framework, as Lightning's on SIGUSR1), not a
# preemption: that writes "DUE TO PREEMPTION", or nothing where the ranks stop within its
# GraceTime. glaunch's own requeue writes it too, after the start's end and before the next
# start's first line, so never in a start's own part of the log.
JOB_REQUEUED = re.compile(SLURMSTEPD_NOTICE + r"JOB [0-9]{1,12} ON "
                          r"[A-Za-z0-9][A-Za-z0-9._-]{0,99} CANCELLED AT [^*\n]{1,40} DUE TO JOB REQUEUE \*\*\*$",
                          re.MULTILINE)


def requeued_in_log(batch_log: str) -> bool:
    """Pure: whether slurmstepd says, in this start's part of the batch log, that the job was
    requeued (:data:`JOB_REQUEUED`)."""
    return JOB_REQUEUED.search(this_start(batch_log)) is not None


def failed_node_in_log(batch_log: str) -> str | None:
    """Pure: the node whose failure srun or slurmstepd names in this start's part of the
    batch log (after the last "glaunch: start " line): its name; "" where only the job's
    end says a node failed; None where nothing says so."""
    part = this_start(batch_log)
    named = SRUN_NODE_FAILURE.search(part)
    if named:
        return named.group(1)
    return "" if JOB_NODE_FAILURE.search(part) else None


def cancelled_in_log(batch_log: str, job_id: str | None) -> bool:
    """Pure: whether slurmstepd says, in this start's part of the batch log (after the last
    "glaunch: start " line), that job `job_id` was cancelled: a user's scancel, which
    glaunch's own mark does not name. An array element's line names its own job id, which
    `job_id` (ARRAY_TASK) does not spell: any cancel line of the job's own log counts then."""
    part = this_start(batch_log)
    own = None if job_id is None or not job_id.isdigit() else job_id
    return any(own is None or match.group(1) == own for match in JOB_CANCELLED.finditer(part))


def batch_log_tail(path: Path) -> str:
    """The end of the job's batch log, as text ("" when it cannot be read)."""
    try:
        fd = open_regular(path)
    except OSError:
        return ""
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - BATCH_LOG_TAIL_BYTES), os.SEEK_SET)
        return os.read(fd, BATCH_LOG_TAIL_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def scancelled(batch_log: str, array_log: str, job_id: str | None) -> bool:
    """Pure: whether the job's batch log says the job was cancelled in this start
    (:func:`cancelled_in_log`); for a sweep's element (ARRAY_TASK), slurmstepd writes it in
    its array task's log (`array_log`, :func:`array_log_tail`), the batch log being the
    element's own."""
    if job_id is None:
        return False
    return cancelled_in_log(batch_log, job_id) or cancelled_in_log(array_log, None)


def array_log_tail(run_dir: Path, job_id: str | None) -> str:
    """The end of a sweep element's array task log (layout.ARRAY_TASK_LOG_PATTERN, in the
    sweep's folder, the element's parent), where slurmstepd writes its lines about the task
    and each run of the task begins with its own "glaunch: start " line (array.sbatch); ""
    for a job that is no array task (ARRAYJOB_TASK)."""
    array_job, _, task = (job_id or "").partition("_")
    if not (task.isdigit() and array_job.isdigit()):
        return ""
    return batch_log_tail(array_task_log(Path(run_dir).parent, array_job, task))


# srun's words for a task a signal ended -> the signal (its other words are kept as they are).
SRUN_SIGNAL_WORDS = {"Killed": signal.SIGKILL, "Terminated": signal.SIGTERM, "Segmentation fault": signal.SIGSEGV,
                     "Aborted": signal.SIGABRT, "Bus error": signal.SIGBUS, "Illegal instruction": signal.SIGILL,
                     "Floating point exception": signal.SIGFPE}


def first_task_line(batch_log: str) -> tuple[int, str, str] | None:
    """Pure: (task, node, srun's words) of the first task srun says ended in this start's
    part of the batch log, where a signal ended it (not "Exited with exit code N"); None
    where the first ended by itself, or srun named none."""
    part = this_start(batch_log)
    for line in part.splitlines():
        match = SRUN_TASK_LINE.fullmatch(line.strip())
        if match:
            words = match.group(3).strip()
            return None if words.startswith(SRUN_EXITED) else (int(match.group(2)), match.group(1), words)
    return None


def killed_first(crash: Mapping[str, Any] | None, first: tuple[int, str, str] | None,
                 restart: int) -> dict[str, Any] | None:
    """Pure: the crash record of a start where srun says a signal ended a task (`first`,
    :func:`first_task_line`) before any other ended, and crash.json (`crash`) names another
    task: the killed task could write nothing (SIGKILL), and its peers' errors ("Connection
    closed by peer") followed from its end. None where crash.json stands."""
    if first is None or crash is None or crash.get("task") == first[0]:
        return None
    task, node, words = first
    signum = SRUN_SIGNAL_WORDS.get(words)
    how = str(Killed(signum, task)).removeprefix(f"rank {task} ") if signum is not None else f"ended: {words}"
    return {"restart": restart, "job_id": crash.get("job_id"), "task": task, "node": node, "error": how,
            "followed_by": f"task {crash.get('task')} on {crash.get('node')}: {crash.get('error')}"}


def started_again(run_dir: Path, job_id: str, restart: int, rank: int) -> bool:
    """Whether a peer asked, in this start, for rank `rank`'s lost process to be started
    again (launcher.jobcontrol.replace serves such a request)."""
    folder = RunDir(run_dir).peer_replace_dir
    pattern = glob.escape(PEER_REPLACE_FILE.format(job_id=name_part(job_id), restart=int(restart), generation="@",
                                                   rank=int(rank))).replace("@", "*")
    return folder.is_dir() and any(folder.glob(pattern))


def note_killed_first(run_dir: Path, job_id: str | None, restart: int, batch_log: str) -> None:
    """crash.json made to name the task srun says a signal ended first (:func:`killed_first`),
    for the start's end, its blamed node and `glaunch status`, under launcher srun (a task
    per rank; torchrun's tasks are nodes' agents)."""
    if job_id is None:
        return
    try:
        per_rank = read_task_spec(run_dir).launcher == "srun"
    except TaskSpecError:
        return
    if not per_rank:
        return
    if cancelled_step_in_log(batch_log) is not None:
        return      # someone's scancel of the step ended every task: no rank was first
    first = first_task_line(batch_log)
    if first is not None and started_again(run_dir, job_id, restart, first[0]):
        return      # its loss was recovered (recovery.peer): a later failure is the start's
    record = killed_first(crash_in(run_dir, restart), first, restart)
    if record is not None:
        try:
            atomic_write_text(RunDir(run_dir).crash_file, json.dumps(record) + "\n")
        except OSError as exc:
            print(f"glaunch: cannot write {RunDir(run_dir).crash_file}: {exc}", file=sys.stderr, flush=True)


def killed_in_step(run_dir: Path, job_id: str | None, step_status: int, batch_log: str) -> Killed | None:
    """The signal that ended a task of a Slurm job step (its status), and the rank, where
    srun named the task in the job's batch log (one task per rank under launcher srun;
    torchrun's are nodes)."""
    killed = killed_by(step_status)
    if killed is None or job_id is None:
        return killed
    try:
        per_rank = read_task_spec(run_dir).launcher == "srun"
    except TaskSpecError:
        per_rank = False
    task = first_signalled_task(batch_log) if per_rank else None
    first = first_task_line(batch_log) if per_rank else None
    said = SRUN_SIGNAL_WORDS.get(first[2]) if first is not None and first[0] == task else None
    # srun's status is the step's last task's signal (the SIGTERM with which srun ended the
    # others, say); its word for the first task ("Killed") is that task's own.
    signum = int(said) if said is not None else killed.signum
    return dataclasses.replace(killed, signum=signum, rank=task, cancelled_step=cancelled_step_in_log(batch_log))


# slurmstepd's line when one step is cancelled (`scancel JOB.STEP`: "*** STEP 12.0 ON n1
# CANCELLED AT ... ***"); the watchdog's `scancel --signal` sends a signal, which writes none.
STEP_CANCELLED = re.compile(SLURMSTEPD_NOTICE + r"STEP ([0-9]{1,12}\.[0-9]{1,9}) "
                            r"ON [A-Za-z0-9][A-Za-z0-9._-]{0,99} CANCELLED AT (?:(?!DUE TO)[^*\n]){1,40} \*\*\*$",
                            re.MULTILINE)


def cancelled_step_in_log(batch_log: str) -> str | None:
    """Pure: the step (JOB.STEP) slurmstepd says was cancelled in this start's part of the
    batch log, or None."""
    match = STEP_CANCELLED.search(this_start(batch_log))
    return match.group(1) if match else None


def next_start(outcome: Outcome, mode: str) -> str | None:
    """Pure: how the run goes on after this start: "requeue" (the same job, back to the
    queue), "resubmit" (a new job chained after this one: only after the time limit, or a
    stop on a SIGTERM nothing explains, with requeue.mode resubmit) or None (it does not)."""
    if not outcome.requeue:
        return None
    return "resubmit" if mode == "resubmit" and outcome.reason in ("timeout", TERMINATED) else "requeue"


def stopped_in(run_dir: Path, restart: int) -> dict | None:
    """stop.json, if the ranks wrote it in this start."""
    return _of_restart(read_json(RunDir(run_dir).stop_file), restart)


def _of_restart(record: dict | None, restart: int) -> dict | None:
    """A record the ranks left, if it is of this start (`restart: true` is no start's)."""
    if record is None or type(record.get("restart")) is not int or record["restart"] != restart:
        return None
    return record


def signal_of(stop: Mapping[str, Any] | None) -> str | None:
    """Pure: the signal a stop.json says the ranks stopped on (a signal's name), or None."""
    name = None if stop is None else stop.get("signal")
    return name if isinstance(name, str) and re.fullmatch(r"SIG[A-Z0-9]{1,10}", name) else None


def resumed_in(run_dir: Path, restart: int) -> int | None:
    """The step this start resumed from (resume.json, written by resume_checkpoint)."""
    resume = _of_restart(read_json(RunDir(run_dir).resume_file), restart)
    return None if resume is None else resume.get("step")


def used_runtime(run_dir: Path, job_id: str | None, restart: int) -> bool:
    """Whether a rank of this start reported through glaunch's runtime: its own heartbeat
    of this start announced it (launcher.runtime.heartbeats.announce; a step it beat does
    too). Not the `starting` record the task writes for every rank, nor a beat that
    entrypoint.progress wrote from the log (``source: "log"``): a script without the runtime
    leaves those."""
    if job_id is None:
        return False
    for _, path in RunDir(run_dir).heartbeats():
        record = read_heartbeat(path)
        if (record is not None and watchdog.of_start(record, job_id, restart)
                and record.get("announced_at") is not None and record.get("source") != "log"):
            return True
    return False


# The detail of a start whose step glaunch ended after every rank had exited
# (watchdog.step_outlives_ranks).
OUTLIVED = "every rank had exited and the step still ran (a node's slurmstepd gone?): glaunch ended it"


# srun's first line once glaunch's interrupt reached it: the task lines after it are of the
# tasks that interrupt ended ("task 2: Killed" of a rank stuck in its teardown).
SRUN_INTERRUPTED = "srun: interrupt (one more within 1 sec to abort)"


def outlived_step_status(status: int, batch_log: str, crashed: bool) -> int:
    """Pure: the status of a step glaunch ended after every rank had exited: 0 where no task
    failed, as far as srun (no task line in this start's part of the batch log before
    glaunch's interrupt) and the ranks (`crashed`: crash.json of this start) tell, for
    srun's own status then says only that it was ended; else srun's."""
    before = this_start(batch_log).split(SRUN_INTERRUPTED, 1)[0]
    failed = any(SRUN_TASK_LINE.fullmatch(line.strip()) for line in before.splitlines())
    return status if failed or crashed else 0


def crash_in(run_dir: Path, restart: int) -> dict | None:
    """crash.json, if a task of this start wrote it."""
    return _of_restart(read_json(RunDir(run_dir).crash_file), restart)


NOT_STARTED_AGAIN = "lost its process and could not be started again"


def not_started_in(run_dir: Path, restart: int, job_id: str | None) -> dict | None:
    """Why a lost rank's new process could not be started in this start (of job `job_id`: a
    resumed run's new job numbers its starts from 0 again), if that is what ended its step
    (launcher.jobcontrol.replace)."""
    return not_started_note(RunDir(run_dir), job_id, restart)


def with_crash_note(outcome: Outcome, run_dir: Path, restart: int, job_id: str | None) -> Outcome:
    """Name the task that failed first, and how (crash.json, written by the task), and a lost
    rank that could not be started again (peer recovery); or what the watchdog found (hang.json)."""
    if outcome.reason == "hang":
        where = str((watchdog.hang_in(run_dir, restart) or {}).get("detail") or "")
    elif outcome.reason == "crash":
        where = _crash_where(run_dir, restart, job_id)
    else:
        return outcome
    return dataclasses.replace(outcome, detail=f"{outcome.detail}; {where}" if outcome.detail and where
                               else outcome.detail or where)


def first_failure_record(run_dir: Path, restart: int, job_id: str | None) -> Mapping[str, Any] | None:
    """The record of a start's first failure, with its node (what :func:`_crash_where`
    says): a lost rank's that could not be started again, else crash.json's first task."""
    return not_started_in(run_dir, restart, job_id) or crash_in(run_dir, restart)


def _crash_where(run_dir: Path, restart: int, job_id: str | None) -> str:
    """The first failure of a start that ended in a crash: a lost rank that could not be
    started again, whose end the step was ended for (the other ranks' crash.json then says
    only how they were stopped), else the task that wrote crash.json first."""
    lost = not_started_in(run_dir, restart, job_id)
    if lost is not None:
        return f"rank {lost.get('rank')} {NOT_STARTED_AGAIN} on {lost.get('node')}: {lost.get('error')}"
    crash = crash_in(run_dir, restart)
    return "" if crash is None else f"task {crash.get('task')} on {crash.get('node')}: {crash.get('error')}"


# --- bad nodes: pure ------------------------------------------------------------------------


def blamed_node(reason: str | None, crash: Mapping[str, Any] | None, hang: Mapping[str, Any] | None,
                 swap: Mapping[str, Any] | None = None, failed: Mapping[str, Any] | None = None) -> str | None:
    """The node a start that went wrong points at: a hang's silent node; a crash's first
    failing task's; the slow node the watchdog stopped the start to leave out; the node
    whose failure Slurm took the job back for."""
    source = {"hang": hang, "crash": crash, SLOW_NODE: swap, NODE_FAILURE: failed}.get(reason or "")
    node = (source or {}).get("node")
    return node if is_node_name(node) else None


def exclusion(bad: str | None, excluded: Iterable[str], *, needed: int, usable: list[str] | None,
              partition: str | None, why_unknown: str = "") -> tuple[list[str] | None, str | None]:
    """Pure: (every node to keep the job off from now on, or None for no change; what
    became of `bad`, for run.json). `usable`: the partition's nodes that can take a job
    (None: not known, `why_unknown`)."""
    excluded = list(excluded)
    if bad is None:
        return None, None
    if bad in excluded:
        return None, f"{bad} already excluded"
    if usable is None:
        return None, f"{bad} not excluded: the partition's nodes are not known ({why_unknown})"
    left = [n for n in usable if n != bad and n not in excluded]
    if len(left) < needed:
        return None, (f"{bad} not excluded: partition {partition or '(default)'} would keep {len(left)} usable "
                      f"node(s), the job needs {needed}")
    return excluded + [bad], f"{bad} excluded from later starts"


@dataclass(frozen=True)
class NextStep:
    """A crash or a hang restarted inside the allocation: the new job step's nodes."""

    nodes: tuple[str, ...]       # in the allocation's order: the first is rank 0's
    left_out: str | None         # the node the failure pointed at, left out of the new step
    note: str                    # for run.json's `exclusion` and the batch log


def restart_in_allocation(outcome: Outcome, *, bad: str | None, avoid_bad: bool, allocation: Sequence[str],
                          in_use: Sequence[str], left_out_before: Iterable[str], needed: int) -> NextStep | None:
    """Pure: where a crash or a hang within crash_retries, or a stop to leave a slow node
    (reason SLOW_NODE), starts again without a requeue.

    `allocation`: the job's nodes, in Slurm's order (empty: not a batch job, no restart in
    it); `in_use`: the nodes of the step that failed; `left_out_before`: nodes earlier
    restarts in this allocation left out; `bad`: the node this failure points at, left out
    of the new step (`avoid_bad`: requeue.exclude_bad_nodes) while the allocation keeps
    `needed` others. The step's healthy nodes stay, spares fill in. None: the allocation
    cannot spare the bad node, and the job requeues without it as before."""
    if not outcome.requeue or outcome.reason not in IN_ALLOCATION or not allocation:
        return None
    left_out = bad if avoid_bad and bad is not None else None
    off = set(left_out_before) | ({left_out} if left_out is not None else set())
    keep = [n for n in in_use if n in allocation and n not in off]
    spares = free_spares(allocation, in_use, off)
    chosen = set((keep + spares)[:needed])
    if len(chosen) < needed:
        return None
    nodes = tuple(n for n in allocation if n in chosen)
    if left_out is None:
        return NextStep(nodes, None, "restarted in its allocation on the same nodes")
    added = [n for n in nodes if n not in in_use]
    slow = " (slow)" if outcome.reason == SLOW_NODE else ""
    return NextStep(nodes, left_out, f"{left_out}{slow} left out of the next step in the allocation"
                    + (f"; {','.join(added)} took its place" if added else ""))


def usable_nodes(sinfo_lines: str) -> list[str]:
    """Pure: the nodes of `sinfo --Node --format='%N %T'` output whose state can take a job."""
    out: list[str] = []
    for line in sinfo_lines.splitlines():
        words = line.split()
        if len(words) == 2 and words[1].lower() in USABLE_STATES and is_node_name(words[0]) and words[0] not in out:
            out.append(words[0])
    return out


def partition_nodes(partition: str | None) -> tuple[list[str] | None, str]:
    """The partition's usable nodes from sinfo, or (None, why not)."""
    words = ["sinfo", "--noheader", "--Node", "--format=%N %T"] + ([f"--partition={partition}"] if partition else [])
    try:
        proc = run_bounded(words, timeout_s=SINFO_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"sinfo: {exc}"
    if proc is None:
        return None, f"sinfo: no answer within {SINFO_TIMEOUT_S} s"
    if proc.returncode != 0:
        return None, f"sinfo: exit status {proc.returncode}: {proc.err.strip()[:200]}"
    return usable_nodes(proc.out), ""


def slow_nodes(entry: Mapping[str, Any] | None) -> list[str]:
    """Pure: the nodes the watchdog named slow in a start's run.json entry, once each."""
    watch = (entry or {}).get("watchdog")
    slow = watch.get("slow") if isinstance(watch, Mapping) else None
    nodes: list[str] = []
    for item in slow if isinstance(slow, list) else []:
        node = item.get("node") if isinstance(item, Mapping) else None
        if isinstance(node, str) and is_node_name(node) and node not in nodes:
            nodes.append(node)
    return nodes


def exclude_slow_nodes(run_dir: Path, record: RunRecord, job_id: str, restart: int,
                       excluded: list[str], needed: int) -> list[str] | None:
    """With watchdog.slow_node: exclude, the nodes this start's watchdog named slow added
    to `excluded` (None: no change); what became of each goes into the start's entry."""
    start = record.start(job_id, restart)
    nodes = slow_nodes(start.to_dict()) if start is not None else []
    if start is None or not nodes:
        return None
    try:
        wanted = read_task_spec(run_dir).watchdog_slow_node == "exclude"
    except TaskSpecError:
        wanted = False
    if not wanted:
        return None
    usable, why = partition_nodes(record.partition)
    changed, notes = None, []
    for node in nodes:
        more, note = exclusion(node, changed or excluded, needed=needed, usable=usable,
                               partition=record.partition, why_unknown=why)
        changed = more or changed
        notes.append(f"slow: {note}")
    start.set("watchdog", {**start.get("watchdog"), "exclusion": "; ".join(notes)})
    return changed


def requeue_mode_setting(run_dir: Path) -> str:
    """requeue.mode as the job was submitted with it; "requeue" when task.json cannot be read."""
    try:
        return read_task_spec(run_dir).requeue_mode
    except TaskSpecError:
        return "requeue"


def record_successor(run_dir: Path, job_id: str, predecessor: str | None, restart: int) -> bool:
    """The new job that carries the run on after this start (resubmitted, pending until
    this job ends): run.json's job id and its next start, and submitit's pickled task under
    the new id. False, recording nothing, when the run has ended or `glaunch cancel` was
    asked for this job meanwhile: the new job is then to be cancelled."""
    if not is_job_id(job_id) or "_" in job_id:
        raise ValueError(f"{job_id!r} is not a job id")
    logs = RunDir(run_dir).log_dir
    with registry.updating(run_dir) as record:
        if is_terminal(record.state) or registry.cancel_asked(run_dir, record, predecessor):
            return False
        if predecessor is not None:
            # submitit's loader in each task reads LOG_DIR/JOB_submitted.pkl (JobPaths).
            source, target = logs / f"{predecessor}_submitted.pkl", logs / f"{job_id}_submitted.pkl"
            if source.exists() and not target.exists():
                os.link(source, target)
        record.job_id = job_id
        if record.start(job_id, restart + 1) is None:
            record.starts.append(registry.new_start(job_id, restart + 1, **{RESUBMITTED_AFTER: predecessor}))
    return True


def exclude_bad_nodes_setting(run_dir: Path) -> tuple[bool, str]:
    """(requeue.exclude_bad_nodes as the job was submitted with it, why not when it cannot
    be read): a task.json that cannot be read excludes no node."""
    try:
        return read_task_spec(run_dir).exclude_bad_nodes, ""
    except TaskSpecError as exc:
        return False, str(exc)


@dataclass(frozen=True)
class StepEnd:
    """What is known of a job step that ended, besides the run directory: srun's status,
    whether Slurm preempted the job, when the start began (ISO 8601), the job's nodes
    (empty: not a batch job, so no restart in the allocation), the step's, and whether the
    job's time limit ended it."""

    status: int
    preempted: bool = False
    started: str | None = None
    allocation: tuple[str, ...] = ()
    step_nodes: tuple[str, ...] = ()
    timed_out: bool = False
    outlived: bool = False      # glaunch ended the step, which outlived every rank's exit


@dataclass(frozen=True)
class NextRoad:
    """How the run goes on after a start: ``done``; ``restart`` (a new step in this
    allocation, on `nodes`); ``requeue`` or ``resubmit`` (`nodes`: every node the job is
    kept off). `exit_code`: the status the job ends with where it ends."""

    road: str
    nodes: tuple[str, ...] = ()
    exit_code: int = 0

    def line(self) -> str:
        """The road as one line: the road, then its nodes, comma-separated."""
        return self.road + (" " + ",".join(self.nodes) if self.nodes else "")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m launcher.jobcontrol.jobend")
    parser.add_argument("run_dir")
    parser.add_argument("--status", type=int, help="the job step's exit status")
    parser.add_argument("--preempted", default="0", help="non-zero: Slurm preempted the job")
    parser.add_argument("--started", default=None, help="when this start began (ISO 8601)")
    parser.add_argument("--allocation", type=node_list, default=[], help="the job's nodes (comma-separated): "
                        "a crash or a hang may start a new step among them; none: the job requeues")
    parser.add_argument("--step-nodes", type=node_list, default=[],
                        help="the nodes of the step that ended (comma-separated)")
    parser.add_argument("--begin", action="store_true", help="whether the start the batch script begins is one "
                        "of the run's, and its number (launcher.jobcontrol.jobstart): print `start N` or `end`, and "
                        "record nothing unless the job takes on a dry run's bundle; exit 1 refuses the start")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir)
    try:
        ctx = context()   # env.sh, sourced by job.sbatch, exported the job's id and its restart count
    except RuntimeConfigError as exc:
        if args.begin:
            # Its end could not be recorded either: it does not train.
            print(f"glaunch: this start does not begin: {exc}", file=sys.stderr, flush=True)
            return 1
        # Without its own start's number the end cannot be decided: nothing is recorded, and
        # the job ends rather than requeue blind (the next command reading the run says so).
        print(f"glaunch: the end of this start is not recorded: {exc}", file=sys.stderr, flush=True)
        print("done", flush=True)
        return 1
    if args.begin:
        return jobstart.begin_start(run_dir, ctx.job_id, ctx.restart)
    if args.status is None:
        parser.error("--status is required")
    end = StepEnd(args.status, args.preempted not in ("", "0"), args.started, tuple(args.allocation),
                  tuple(args.step_nodes))
    road = end_of_start(run_dir, end, ctx.job_id, ctx.restart)
    print(road.line(), flush=True)
    return road.exit_code


def step_node_list(step_nodes: Sequence[str], allocation: Sequence[str]) -> str | None:
    """A start's nodes for run.json: Slurm's own form of the job's list (as sacct gives it)
    when the step ran on the whole allocation, else the step's nodes one by one."""
    if not step_nodes or set(step_nodes) == set(allocation):
        return os.environ.get("SLURM_JOB_NODELIST") or ",".join(step_nodes) or None
    return ",".join(step_nodes)


def nodes_requested(record: RunRecord, args: StepEnd) -> int:
    """The nodes the job asks Slurm for: its training nodes and its spares (the allocation's
    size); excluding nodes past what leaves this many would keep the requeued job pending."""
    return max(record.nodes or 1, len(args.allocation))


def _restart_or_exclude(record: RunRecord, run_dir: Path, outcome: Outcome, bad: str | None, job_id: str | None,
                        restart: int, args: StepEnd) -> tuple[NextStep | None, list[str] | None, str | None]:
    """(the next step in this allocation, or None; every node to keep the job off from now
    on, or None for no change; what became of `bad`, for run.json)."""
    # A slow node is left out under watchdog.slow_node (its watchdog asked for the swap).
    wanted, unread = ((True, "") if outcome.reason == SLOW_NODE else
                      exclude_bad_nodes_setting(run_dir) if bad is not None else (False, ""))
    if outcome.requeue and job_id is not None:
        step = restart_in_allocation(outcome, bad=bad, avoid_bad=wanted, allocation=args.allocation,
                                     in_use=args.step_nodes,
                                     left_out_before=record.left_out_in_allocation(job_id, restart),
                                     needed=record.nodes or 1)
        if step is not None:
            return step, None, step.note
    if not outcome.requeue or bad is None or outcome.reason == SLOW_NODE:
        return None, None, None      # a slow node with no spare left: exclude_slow_nodes decides
    if unread:
        return None, None, f"{bad} not excluded: {unread}"
    if not wanted:
        return None, None, f"{bad} not excluded: requeue.exclude_bad_nodes is false"
    usable, why = partition_nodes(record.partition)
    exclude, note = exclusion(bad, record.excluded_nodes, needed=nodes_requested(record, args), usable=usable,
                              partition=record.partition, why_unknown=why)
    return None, exclude, note


def end_of_start(run_dir: Path, args: StepEnd, ctx_job_id: str | None, restart: int) -> NextRoad:
    """Record the start that ended and decide what follows: done, requeue or resubmit
    (with the nodes the job is kept off), or restart (a new step on those nodes, in this
    allocation)."""
    stop = stopped_in(run_dir, restart)
    hang = watchdog.hang_in(run_dir, restart)
    # The job's batch log (and a sweep element's array task's log), read once for all below.
    batch_log = batch_log_tail(RunDir(run_dir).batch_log(ctx_job_id)) if ctx_job_id else ""
    array_log = array_log_tail(run_dir, ctx_job_id)
    failed = failed_node_in_log(batch_log) if ctx_job_id else None
    if args.outlived:
        args = dataclasses.replace(args, status=outlived_step_status(args.status, batch_log,
                                                                     crash_in(run_dir, restart) is not None))
    with registry.updating(run_dir) as record:
        # Only an id of Slurm's shape goes into run.json (it may reach scancel later).
        job_id = ctx_job_id if is_job_id(ctx_job_id) else record.job_id
        swap = watchdog.swap_asked(record.start(job_id, restart)) if job_id is not None else None
        cancelled = registry.cancel_asked(run_dir, record, job_id) or scancelled(batch_log, array_log, job_id)
        if (args.status != 0 and hang is None and stop is None and not cancelled and not args.preempted
                and not args.timed_out):
            # A crash's first failure (the watchdog's end of a hung step, a cancel or the
            # scheduler taking the job back end every task themselves).
            note_killed_first(run_dir, ctx_job_id, restart, batch_log)
        outcome = decide(
            step_status=args.status, finished=RunDir(run_dir).result_file.exists(), stopped=stop is not None,
            preempted=args.preempted, timed_out=args.timed_out,
            restart=restart if job_id is None else record.requeues_before(job_id, restart),
            requeue_max=record.requeue_max, crashes=record.crash_count(job_id=job_id),
            crash_retries=record.crash_retries, hung=hang is not None, swapping=swap is not None,
            # A cancel is glaunch's own mark on the job, or slurmstepd's line that the job was
            # cancelled (a scancel of the user's); never read from how a task ended.
            cancelled=cancelled,
            killed=(killed_in_step(run_dir, job_id, args.status, batch_log) if crash_in(run_dir, restart) is None
                    else None),
            runtime=used_runtime(run_dir, ctx_job_id or job_id, restart), failed_node=failed,
            requeued=requeued_in_log(batch_log) or requeued_in_log(array_log), stop_signal=signal_of(stop))
        outcome = with_crash_note(outcome, run_dir, restart, ctx_job_id or job_id)
        if args.outlived:
            outcome = dataclasses.replace(outcome, detail="; ".join(x for x in (outcome.detail, OUTLIVED) if x))
        # A lost rank that could not be started again is the failure: its peers' crash.json
        # says only how the ended step stopped them, on nodes that did nothing wrong.
        bad = blamed_node(outcome.reason, first_failure_record(run_dir, restart, ctx_job_id or job_id), hang, swap,
                          {"node": failed})
        kept_off = list(record.excluded_nodes)
        step, exclude, note = _restart_or_exclude(record, run_dir, outcome, bad, job_id, restart, args)
        if step is not None:
            outcome = dataclasses.replace(outcome, state=State.RESTARTED.value, requeue=False)
        elif outcome.requeue and job_id is not None:
            exclude = exclude_slow_nodes(run_dir, record, job_id, restart, exclude or kept_off,
                                         nodes_requested(record, args)) or exclude
        if job_id is not None:
            measured = start_summary(run_dir, ctx_job_id or job_id, restart)
            record.record_start(job_id, restart, started=args.started, ended=iso(time.time()), state=outcome.state,
                                reason=outcome.reason, detail=outcome.detail, exit_code=args.status,
                                nodes=step_node_list(args.step_nodes, args.allocation),
                                resumed_from=resumed_in(run_dir, restart),
                                stopped_at=None if stop is None else stop.get("step"), hang=hang_entry(hang),
                                bad_node=bad if outcome.reason in IN_ALLOCATION else None, exclusion=note,
                                excluded_nodes=kept_off, left_out=None if step is None else step.left_out,
                                spare_nodes=(len(args.allocation) - len(args.step_nodes)
                                             if args.allocation and args.step_nodes else None),
                                **measured)
            record.job_id = job_id
        if exclude is not None:
            record.excluded_nodes = exclude
        # The job's own end is known now: a controller once unreachable from a login node is
        # not what the run stands at (an ended run's record is read without asking Slurm).
        record.extra.pop("unreachable", None)
        try:
            move(record, State.RUNNING.value if step is not None else outcome.state, reason=outcome.reason,
                 detail=outcome.detail, why="the job's end")
        except IllegalMove as exc:
            # The run ended meanwhile (cancelled while this start ended): that end stands and
            # nothing requeues or restarts; the start keeps its own end.
            outcome = dataclasses.replace(outcome, requeue=False, exit_code=outcome.exit_code or 1)
            step = None
            note = f"{note}; {exc.problem}" if note else exc.problem
    then = "; requeueing" if outcome.requeue else f"; a new step on {','.join(step.nodes)}" if step else ""
    print(f"glaunch: start {restart} of job {job_id} ended: {outcome.state}"
          + "".join(f" ({x})" for x in (outcome.reason, outcome.detail, note) if x) + then,
          file=sys.stderr, flush=True)
    if step is not None:
        return NextRoad("restart", step.nodes, outcome.exit_code)
    return next_road(outcome, run_dir, exclude, kept_off)


def next_road(outcome: Outcome, run_dir: Path, exclude: list[str] | None, kept_off: list[str]) -> NextRoad:
    """done; requeue (with the new exclusion, for ExcNodeList: none where it did not
    change) or resubmit (with every node the job is kept off, for --exclude)."""
    road = next_start(outcome, requeue_mode_setting(run_dir) if outcome.requeue else "requeue")
    # `exclude`, when set, is every node the job is kept off now (a slow node may have joined).
    kept = exclude if road == "requeue" or exclude is not None else kept_off
    return NextRoad(road, tuple(kept or ()), outcome.exit_code) if road else NextRoad("done", (), outcome.exit_code)


def next_start_line(outcome: Outcome, run_dir: Path, exclude: list[str] | None, kept_off: list[str]) -> str:
    """next_road as one line: "done", "requeue [NODES]" or "resubmit [NODES]"."""
    return next_road(outcome, run_dir, exclude, kept_off).line()


def hang_entry(hang: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What a start's run.json entry keeps of hang.json."""
    if hang is None:
        return None
    return {k: hang.get(k) for k in ("kind", "detected_at", "bound_s", "silent", "node", "stacks")}


if __name__ == "__main__":
    sys.exit(main())
