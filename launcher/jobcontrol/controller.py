"""The job's controller: what job.sbatch runs on the batch host, once, after its directives
and environment::

    exec PYTHON -m launcher.jobcontrol.controller RUN_DIR --nodes N [--master-port BASE,SPAN,STRIDE]
         [--requeue | --requeue --resubmit] -- SRUN_WORDS -- TASK_WORDS

It runs the job's steps (``SRUN_WORDS --nodelist=NODES TASK_WORDS``: srun, then submitit's
loader of the pickled task), one after another in the same allocation, and decides and
performs how the run goes on after each:

- before the first step, whether this start is one of the run's at all, and its number
  (:func:`launcher.jobcontrol.jobstart.begin`): a start after the run ended exits 0 at once;
- during each step, the hang watchdog (:func:`launcher.jobcontrol.watchdog.watch_slurm`) in a
  thread of this process; its requests (a signal to every step, the end of a step) are
  scancel calls made here; with ``recovery.peer``, a second thread starts a lost rank's
  process again when its peers ask (:mod:`launcher.jobcontrol.replace`), and the step's
  status is 0 where only tasks started again failed and their new processes ended well;
- after each step, its end (:func:`launcher.jobcontrol.jobend.end_of_start`: run.json, and
  the road): a new step in the allocation (a crash or a hang within crash_retries, a
  slow node swapped for a spare), a requeue (``scontrol requeue``, then ``scontrol update
  ExcNodeList`` for the nodes a failure pointed at), a new job at the time limit
  (``requeue.mode: resubmit``: sbatch of job.sbatch again, chained afterany), or the end.

``--requeue`` marks a batch job (not a script run inside someone's allocation by ``glaunch
run``): only a batch job is requeued, restarts in its allocation, or numbers its start past
the steps it restarted before. ``--master-port``: the rendezvous port is derived from the
job id and the start's number (each restarted step rendezvous on a port of its own;
:func:`master_port`).

Slurm's signals: the time limit's warning reaches the steps from Slurm itself (``--signal``
without ``B:``); a SIGTERM or SIGUSR2 this process gets (a preemption, a cancel) is passed
on to the running step, whose ranks save and stop, and its end is recorded. While a requeue
is being made, SIGTERM is ignored (the requeue sends it) until the job is kept off the nodes
(Slurm takes ExcNodeList only for a pending job); SIGKILL ends the script KillWait later.

At the time limit, and at a cancel (`scancel` of the job), Slurm sends SIGTERM to this
process and to every task at once, and SIGKILL to all of them KillWait later; srun waits that
long for tasks that do not end on SIGTERM (a script without glaunch's runtime, or one still
saving). Waiting for srun would leave this process no time to record the start (and requeue
the run), so the step is given KillWait less what the controller needs (:func:`step_grace_s`),
and its end is recorded then, while Slurm ends what is left of it. A preemption's SIGTERM
leaves the step the partition's GraceTime.

The decisions are pure functions (:func:`start_number`, :func:`after_step`,
:func:`master_port`, and jobend's :func:`launcher.jobcontrol.jobend.decide`); every command
runs through :class:`SlurmEdge`, which the tests replace. Imports no torch.
"""

from __future__ import annotations

import enum
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, MutableMapping, Protocol, Sequence

from launcher import storeprocess
from launcher.errors import RunError
from launcher.processes import run_command
from launcher.rundir import envnames
from launcher.rundir.layout import RunDir
from launcher.rundir.rankcontext import RuntimeConfigError, context, port_taken
from launcher.rundir.records import RecordError, is_job_id, is_node_name
from launcher.jobcontrol import jobend, jobstart, replace, watchdog
from launcher.jobcontrol.jobend import NextRoad, StepEnd
from launcher.jobcontrol.jobstart import Action, Begun

SLURM_TIMEOUT_S = 60          # scontrol, sbatch, scancel: the controller's answer is seconds away
REQUEUE_WAIT_S = 300          # the requeue ends this process well before
WATCHDOG_JOIN_S = 120         # a watchdog writing the stacks of a hang it found
REPLACE_JOIN_S = replace.END_WAIT_S + 3 * replace.TERM_WAIT_S
# srun's own lines about each step that starts a lost rank again (the rank's n-th in start
# RESTART), apart from the batch log's and from each other's.
REPLACE_LOG = "{job_id}_{restart}_peer-replace_{rank}_{n}.log"
# Slurm took the job back while this start ran: a preemption sets PreemptTime; a requeue
# (`scontrol requeue`, as an admin or a preemption by requeue does) puts the job back in the
# queue, so the job this controller runs in reads as pending (or requeued) once its step
# ended, and counts one more restart as soon as it is asked (while its processes are still
# being ended: JobState=COMPLETING).
PREEMPT_TIME = re.compile(r"\bPreemptTime=[0-9]")
BACK_IN_QUEUE = re.compile(r"\bJobState=(?:PENDING|REQUEUE\w*)\b")
RESTARTS = re.compile(r"\bRestarts=([0-9]+)\b")
NODE_ADDR = re.compile(r"\bNodeAddr=([^\s]+)")
# The time limit ended the job (the state Slurm gives it while its processes are ended, then
# after): `JobState=COMPLETING Reason=TimeLimit`, then `JobState=TIMEOUT`.
TIME_LIMIT = re.compile(r"\bReason=TimeLimit\b|\bJobState=TIMEOUT\b")
# Slurm ends the job otherwise (a cancel: `JobState=COMPLETING Reason=None` while its
# processes are ended, then CANCELLED): SIGKILL follows the SIGTERM KillWait later, as at the
# time limit.
ENDING = re.compile(r"\bJobState=(?:COMPLETING|CANCELLED)\b")
# `scontrol show config`: how long Slurm waits between a job's SIGTERM and its SIGKILL, and
# the release slurmctld runs.
KILL_WAIT = re.compile(r"^KillWait\s*=\s*([0-9]{1,6}) sec\b", re.M)
SLURM_VERSION = re.compile(r"^SLURM_VERSION\s*=\s*([0-9]{1,3})\.([0-9]{1,2})(?:\D|$)", re.M)
# From Slurm 24.05 on, a job preempted with a GraceTime in a partition whose PreemptMode
# requeues is requeued by Slurm when its batch script ends, and a job requeued otherwise
# (`scontrol requeue`) keeps that mark: its next start is requeued again as it ends, with
# nothing preempting it (slurmctld's GRACE_PREEMPT flag, cleared only by the requeue at the
# batch script's end). Recorded on 24.11.5.
# Only where the partition decides the preemption's mode (preempt/partition_prio: under
# preempt/qos a job's QOS may say otherwise, which `scontrol show partition` does not show),
# and while Slurm's count of the job's requeues at a batch script's end stays within
# MaxBatchRequeue: past it, Slurm holds the job.
GRACE_REQUEUE_RELEASE = (24, 5)
PREEMPT_MODE = re.compile(r"\bPreemptMode=([A-Z,]+)")
PREEMPT_TYPE = re.compile(r"^PreemptType\s*=\s*(\S+)", re.M)
MAX_BATCH_REQUEUE = re.compile(r"^MaxBatchRequeue\s*=\s*([0-9]{1,6})\s*$", re.M)
DEFAULT_MAX_BATCH_REQUEUE = 5     # Slurm's own default
DEFAULT_KILL_WAIT_S = 30      # Slurm's own default, where the cluster's is not known
# What the controller keeps of KillWait for itself at the time limit (scontrol show job, the
# start's record, scontrol requeue: a second or two on a cluster that answers), at most: half
# of KillWait where that is less.
LIMIT_RESERVE_S = 10.0
STEP_POLL_S = 0.5             # how often the controller looks at a step it may stop waiting for
LIMIT_ASK_S = 3               # scontrol at the time limit, within KillWait
LIMIT_JOIN_S = 1              # the watchdog's and replacements' threads, at the time limit
PORT_TRIES = 16               # rendezvous ports tried, from the derived one on (port_not_in_use)


class TakenBack(enum.Enum):
    """How Slurm took the job back from this start."""

    PREEMPTED = "preempted"     # preempted: the job goes back to the queue only if asked
    REQUEUED = "requeued"       # already back in the queue: asking again fails ("pending")
    TIMED_OUT = "timed out"     # its time limit ended it: back in the queue only if asked
    ENDED = "ended"             # otherwise ended (a cancel): its processes are being ended


def taken_back(shown: str, restart_count: str) -> TakenBack | None:
    """Pure: whether `scontrol show job` of this start's job (`shown`) says Slurm took the job
    back: requeued (pending or requeued again, or its Restarts past the SLURM_RESTART_COUNT
    this start was given), preempted (PreemptTime set), ended by its time limit, otherwise
    being ended (COMPLETING or CANCELLED: a cancel), or none of them (None)."""
    counted = RESTARTS.search(shown)
    if BACK_IN_QUEUE.search(shown) or (counted is not None and restart_count.isdigit()
                                        and int(counted.group(1)) > int(restart_count)):
        return TakenBack.REQUEUED
    if PREEMPT_TIME.search(shown):
        return TakenBack.PREEMPTED
    if TIME_LIMIT.search(shown):
        return TakenBack.TIMED_OUT
    return TakenBack.ENDED if ENDING.search(shown) else None


def kill_wait_s(config: str) -> float:
    """Pure: KillWait from `scontrol show config` (Slurm's default where it is not there)."""
    match = KILL_WAIT.search(config)
    return float(match.group(1)) if match else float(DEFAULT_KILL_WAIT_S)


@dataclass(frozen=True)
class SlurmConfig:
    """What the controller reads of `scontrol show config`, once per start."""

    kill_wait_s: float = float(DEFAULT_KILL_WAIT_S)
    release: tuple[int, int] | None = None      # (24, 11) for 24.11.5; None: not known
    preempt_type: str = ""                      # "preempt/partition_prio"; "": not known
    max_batch_requeue: int = DEFAULT_MAX_BATCH_REQUEUE

    @classmethod
    def parse(cls, config: str) -> SlurmConfig:
        """Pure."""
        found = SLURM_VERSION.search(config)
        kind = PREEMPT_TYPE.search(config)
        limit = MAX_BATCH_REQUEUE.search(config)
        return cls(kill_wait_s(config), (int(found[1]), int(found[2])) if found else None,
                   kind.group(1) if kind else "", int(limit.group(1)) if limit else DEFAULT_MAX_BATCH_REQUEUE)


def requeues_at_script_end(config: SlurmConfig, requeues: str) -> bool:
    """Pure: whether Slurm requeues a job preempted with a GraceTime as its batch script
    ends (where the partition's preemption requeues: preemption_requeues), on this release,
    with its preemptions' mode the partition's, and without holding it: each such requeue
    counts towards MaxBatchRequeue, and `requeues` (SLURM_RESTART_COUNT) bounds how many came
    before. Not known: no."""
    return (config.release is not None and config.release >= GRACE_REQUEUE_RELEASE
            and config.preempt_type == "preempt/partition_prio"
            and requeues.isdigit() and int(requeues) + 2 <= config.max_batch_requeue)


def preemption_requeues(partition: str) -> bool:
    """Pure: whether `scontrol show partition` says its preemption requeues (PreemptMode
    REQUEUE, alone or beside GANG); not known: no."""
    mode = PREEMPT_MODE.search(partition)
    return mode is not None and "REQUEUE" in mode.group(1).split(",")


def step_grace_s(kill_wait: float) -> float:
    """Pure: how long after the time limit's SIGTERM the controller waits for the step
    before it records the start's end: KillWait less the controller's own reserve."""
    return max(0.0, kill_wait - min(LIMIT_RESERVE_S, kill_wait / 2))


# Slurm's variables that would reach or reshape a job submitted from this one (SLURM_CONF
# stays: it names the cluster).
JOB_INPUTS = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_")


@dataclass(frozen=True)
class JobSteps:
    """What job.sbatch hands the controller: the run, the step's command, the roads open."""

    run_dir: Path
    nodes: int                          # training nodes: the allocation's first; the rest are spares
    srun: tuple[str, ...]               # srun and its options, up to the step's node list
    task: tuple[str, ...]               # what every task runs (submitit's loader)
    requeue: bool = False               # a batch job: requeue, restart in the allocation
    resubmit: bool = False              # requeue.mode resubmit: at the time limit, a new job
    port: tuple[int, int, int] | None = None    # derive MASTER_PORT: (base, span, stride)

    def command(self, nodes: Sequence[str]) -> list[str]:
        """The step's command words, on these nodes."""
        return [*self.srun, f"--nodelist={','.join(nodes)}", *self.task]

    @property
    def job_script(self) -> Path:
        return RunDir(self.run_dir).job_script


class UsageError(ValueError):
    """job.sbatch's command line is not the controller's."""


def parse(argv: Sequence[str]) -> JobSteps:
    """``RUN_DIR [--nodes N] [--master-port BASE,SPAN,STRIDE] [--requeue] [--resubmit] -- SRUN -- TASK``."""
    words = list(argv)
    if words.count("--") < 2 or not words or words[0].startswith("-"):
        raise UsageError("usage: RUN_DIR [OPTIONS] -- SRUN_WORDS -- TASK_WORDS")
    first = words.index("--")
    second = words.index("--", first + 1)
    options, srun, task = words[1:first], tuple(words[first + 1:second]), tuple(words[second + 1:])
    if not srun or not task:
        raise UsageError("the step's srun words and task words are both needed")
    values: dict[str, Any] = {"nodes": 1, "requeue": False, "resubmit": False, "port": None}
    rest = iter(options)
    for option in rest:
        if option in ("--requeue", "--resubmit"):
            values[option[2:]] = True
        elif option == "--nodes":
            values["nodes"] = _positive(next(rest, ""), option)
        elif option == "--master-port":
            numbers = next(rest, "").split(",")
            if len(numbers) != 3:
                raise UsageError(f"{option} takes BASE,SPAN,STRIDE, not {','.join(numbers)!r}")
            base, span, stride = (_positive(n, option) for n in numbers)
            values["port"] = (base, span, stride)
        else:
            raise UsageError(f"unknown option {option!r}")
    return JobSteps(Path(words[0]), srun=srun, task=task, **values)


def _positive(text: str, option: str) -> int:
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise UsageError(f"{option} takes a positive number, not {text!r}")
    return int(text)


# --- the decisions: pure -----------------------------------------------------------------------


def start_number(begun: Begun, requeues: int, *, requeue: bool) -> int:
    """Pure: this start's number: Slurm's requeue count (`requeues`), or, in a batch job,
    the number the run gives it past the steps earlier starts of the job restarted in
    their allocations (jobstart.begin)."""
    return begun.number if requeue else requeues


def master_port(job_id: str, start: int, port: tuple[int, int, int]) -> int:
    """Pure: the rendezvous port of a start, derived from the job id and the start's number,
    below the ephemeral range (env.sh's glaunch_master_port, for the first start): base +
    (job id x stride + start) mod span. Job ids step by the stride, so a job's later starts
    do not land on the next jobs' ports, as they would with a stride of 1 (job N's second
    start on job N+1's first), which a shared node or one host running several nodes
    makes a rendezvous that cannot bind (jobplan.PORT_STRIDE)."""
    base, span, stride = port
    digits = "".join(c for c in job_id if c.isascii() and c.isdigit())[:18]
    return base + ((int(digits or 0) % span) * stride + start) % span


def port_not_in_use(first: int, port: tuple[int, int, int], in_use: Callable[[int], bool | None]) -> int:
    """Pure: the rendezvous port of a step: `first` (:func:`master_port`), or where another
    process listens on it at the rendezvous host (a daemon's port inside the span, another
    job's rendezvous), the next of the PORT_TRIES ports after it (within the span) that none
    listens on. `in_use(p)` says whether one does, or None where it cannot tell (the
    rendezvous host is not this one): `first` then stands, as it does where all are taken."""
    base, span, _ = port
    if not base <= first < base + span:
        return first
    for k in range(PORT_TRIES):
        candidate = base + (first - base + k) % span
        taken = in_use(candidate)
        if taken is None:
            return first
        if not taken:
            return candidate
    return first


def after_step(road: NextRoad, job: JobSteps) -> str:
    """Pure: what the controller does after a step, from the end's road: ``restart`` (a new
    step on road.nodes), ``requeue``, ``resubmit``, or ``end`` (exit with road.exit_code).
    Only a batch job restarts, requeues or resubmits; resubmission only with its script."""
    if not job.requeue:
        return "end"
    if road.road == "restart" and road.nodes and all(is_node_name(n) for n in road.nodes):
        return "restart"
    if road.road == "requeue" or (road.road == "resubmit" and job.resubmit):
        return road.road
    return "end"


# --- the effects -------------------------------------------------------------------------------


class Edge(Protocol):
    """Every command the controller runs (SlurmEdge; the tests' fake)."""

    def hostnames(self, nodelist: str) -> list[str] | None: ...
    def node_addr(self, host: str) -> str | None: ...
    def taken_back(self, job_id: str, timeout_s: float = SLURM_TIMEOUT_S) -> TakenBack | None: ...
    def run_step(self, argv: Sequence[str], env: MutableMapping[str, str],
                 leave: Callable[[], bool] = lambda: False) -> int: ...
    def signal_step(self, signum: int) -> None: ...
    def requeue(self, job_ref: str) -> bool: ...
    def exclude(self, job_ref: str, nodes: Sequence[str]) -> bool: ...
    def submit_next(self, script: Path, after: str, exclude: Sequence[str]) -> str | None: ...
    def cancel(self, args: list[str]) -> bool: ...
    def watch(self, run_dir: Path, stop: threading.Event, allocation: Sequence[str],
              in_use: Sequence[str], end_step: Callable[[], None]) -> None: ...
    def end_step(self) -> None: ...
    def replace(self, job: JobSteps, stop: threading.Event, nodes: Sequence[str],
                env: MutableMapping[str, str], spares: Sequence[str]) -> int: ...
    def end_on_term(self) -> None: ...
    def ignore_term(self) -> None: ...
    def wait_for_requeue(self) -> None: ...
    def config(self) -> SlurmConfig: ...
    def partition(self) -> str: ...
    def port_in_use(self, host: str, port: int) -> bool | None: ...
    def serve_store(self, host: str, world_size: int) -> tuple[subprocess.Popen[bytes], int] | None: ...


def is_this_host(host: str) -> bool:
    """Whether `host` (a name or address) is this machine's: an address of it binds."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
    except (OSError, ValueError):       # not this host's address; a name that is none (UnicodeError)
        return False
    return True


class SlurmEdge:
    """Slurm's commands, each bounded by SLURM_TIMEOUT_S; the job step, bounded by the job's
    time limit (Slurm ends it). What a command prints is read for what was asked only."""

    def __init__(self) -> None:
        self.step: subprocess.Popen[bytes] | None = None

    def _ask(self, words: list[str], env: MutableMapping[str, str] | None = None,
             timeout_s: float = SLURM_TIMEOUT_S) -> str | None:
        return run_command(words, timeout_s=timeout_s, env=env, say=say)

    def hostnames(self, nodelist: str) -> list[str] | None:
        text = self._ask(["scontrol", "show", "hostnames", nodelist])
        names = None if text is None else text.split()
        return names if names and all(is_node_name(n) for n in names) else None

    def node_addr(self, host: str) -> str | None:
        match = NODE_ADDR.search(self._ask(["scontrol", "show", "node", host]) or "")
        return match.group(1) if match and is_node_name(match.group(1)) else None

    def taken_back(self, job_id: str, timeout_s: float = SLURM_TIMEOUT_S) -> TakenBack | None:
        return taken_back(self._ask(["scontrol", "show", "job", job_id], timeout_s=timeout_s) or "",
                          os.environ.get("SLURM_RESTART_COUNT", "0"))

    def config(self) -> SlurmConfig:
        return SlurmConfig.parse(self._ask(["scontrol", "show", "config"], timeout_s=LIMIT_ASK_S) or "")

    def partition(self) -> str:
        """`scontrol show partition` of the job's partition ("" where it does not answer)."""
        name = os.environ.get("SLURM_JOB_PARTITION", "")
        return (self._ask(["scontrol", "show", "partition", name], timeout_s=LIMIT_ASK_S) or "") if name else ""

    @staticmethod
    def port_in_use(host: str, port: int) -> bool | None:
        """Whether a process listens on `port` at `host`, where `host` is this machine (an
        address of it binds); None where it is another, or the question fails otherwise
        (launcher.rundir.rankcontext.port_taken)."""
        return port_taken(port) if is_this_host(host) else None

    @staticmethod
    def serve_store(host: str, world_size: int) -> tuple[subprocess.Popen[bytes], int] | None:
        """The rendezvous store of a step under recovery.peer, served from here (outside the
        step: launcher.storeprocess) where `host`, the step's rendezvous host, is this
        machine: its process and port. None elsewhere, or where it cannot listen (said):
        rank 0 then starts one, as on a step whose first node is another."""
        if not host or not is_this_host(host):
            return None
        try:
            return storeprocess.start(host, 0, world_size, os.getpid())
        except (RuntimeError, OSError) as exc:
            say(f"{exc}: rank 0 starts the step's store instead")
            return None

    def run_step(self, argv: Sequence[str], env: MutableMapping[str, str],
                 leave: Callable[[], bool] = lambda: False) -> int:
        """The job step to its end (the job's time limit bounds it), or until `leave()`,
        asked every STEP_POLL_S while it runs, says to stop waiting: srun's status, 128 + N
        where a signal ended srun itself, as a shell reports it (128 + SIGTERM for a step
        left to Slurm to end)."""
        try:
            self.step = subprocess.Popen(list(argv), env=dict(env))
        except OSError as exc:
            say(f"{argv[0]}: {exc}")
            return 127
        try:
            code = self._wait(self.step, leave)
        finally:
            self.step = None
        if code is None:
            say("Slurm ends the job (its time limit, a cancel, a requeue): the end of this start is recorded now; "
                "Slurm ends what is left of its step")
            return jobend.SIGNALLED_STATUS + signal.SIGTERM
        return jobend.SIGNALLED_STATUS - code if code < 0 else code

    @staticmethod
    def _wait(step: subprocess.Popen[bytes], leave: Callable[[], bool]) -> int | None:
        """The step's return code, or None once `leave()` says so."""
        while True:
            try:
                return step.wait(timeout=STEP_POLL_S)
            except subprocess.TimeoutExpired:
                if leave():
                    return None

    def signal_step(self, signum: int) -> None:
        step = self.step
        if step is not None:
            try:
                step.send_signal(signum)
            except OSError:
                pass      # it has ended meanwhile

    def end_step(self) -> None:
        """End the running step and all its tasks: srun ends them at once on a second SIGINT
        within a second of the first."""
        self.signal_step(signal.SIGINT)
        time.sleep(0.3)
        self.signal_step(signal.SIGINT)

    def requeue(self, job_ref: str) -> bool:
        return self._ask(["scontrol", "requeue", job_ref]) is not None

    def exclude(self, job_ref: str, nodes: Sequence[str]) -> bool:
        return self._ask(["scontrol", "update", f"JobId={job_ref}", f"ExcNodeList={','.join(nodes)}"]) is not None

    def submit_next(self, script: Path, after: str, exclude: Sequence[str]) -> str | None:
        env = {k: v for k, v in os.environ.items() if k == "SLURM_CONF" or not k.startswith(JOB_INPUTS)}
        words = ["sbatch", "--parsable", f"--dependency=afterany:{after}",
                 *([f"--exclude={','.join(exclude)}"] if exclude else []), str(script)]
        out = self._ask(words, env)
        job = None if out is None else out.strip().split(";")[0]
        if out is not None and not is_job_id(job):
            say(f"sbatch answered {out.strip()[:100]!r}, not a job id")
        return job if is_job_id(job) else None

    def cancel(self, args: list[str]) -> bool:
        return self._ask(["scancel", *args]) is not None

    def watch(self, run_dir: Path, stop: threading.Event, allocation: Sequence[str],
              in_use: Sequence[str], end_step: Callable[[], None]) -> None:
        watchdog.watch_slurm(str(run_dir), stop=stop.is_set, allocation=allocation, in_use=in_use,
                             cancel=self.cancel, end_step=end_step)

    def replace(self, job: JobSteps, stop: threading.Event, nodes: Sequence[str],
                env: MutableMapping[str, str], spares: Sequence[str]) -> int:
        """Lost ranks started again until `stop` is set (launcher.jobcontrol.replace), then
        each new process to its end: 0 where srun's failed tasks (the batch log's lines)
        were all started again and ended well, else -1 (the step's status stands)."""
        try:
            ctx = context()
        except RuntimeConfigError as exc:
            say(f"lost ranks are not started again: {exc}")
            return -1
        if ctx.job_id is None:
            return -1
        log_dir, job_id, restart = RunDir(job.run_dir).log_dir, ctx.job_id, ctx.restart

        def log_of(rank: int, n: int) -> Path:
            return log_dir / REPLACE_LOG.format(job_id=job_id, restart=restart, rank=rank, n=n)

        started = replace.Replacements(replace.popen_starter(env), spares, logs=log_of)
        log = RunDir(job.run_dir).batch_log(ctx.job_id)
        replace.serve(job.run_dir, started, stop=stop.is_set, job_id=ctx.job_id, restart=ctx.restart,
                      step_nodes=nodes, srun=job.srun, task=job.task, batch_log=lambda: jobend.batch_log_tail(log),
                      end_step=self.end_step)
        started.end()
        failed = replace.failed_tasks(jobend.batch_log_tail(RunDir(job.run_dir).batch_log(ctx.job_id)))
        return replace.step_status(1, failed, started.statuses()) if started.procs else -1

    def end_on_term(self) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def ignore_term(self) -> None:
        # Ignored, not handled: the commands run from now on inherit it, and Slurm sends the
        # requeue's SIGTERM to every process of the job, not only to this one.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def wait_for_requeue(self) -> None:
        time.sleep(REQUEUE_WAIT_S)


# --- the controller ----------------------------------------------------------------------------


class Controller:
    """One start of the job, and the steps it restarts in its allocation."""

    def __init__(self, job: JobSteps, edge: Edge, env: MutableMapping[str, str] | None = None) -> None:
        self.job, self.edge = job, edge
        self.env = os.environ if env is None else env
        self.slurm_config = SlurmConfig()       # what scontrol show config said, once read
        self.term_at: float | None = None       # time.monotonic() of a SIGTERM not yet looked into
        self.leave_at: float | None = None      # Slurm ends the job: when its step stops being waited for
        self.ending: TakenBack | None = None    # ... and how Slurm said it does, at its SIGTERM
        self.outlived = False      # the watchdog ended the running step: it outlived every rank's exit

    def on_signal(self, signum: int, _frame: Any = None) -> None:
        """SIGTERM or SIGUSR2 to the batch script: passed on to the running step. A SIGTERM
        is noted, for :meth:`past_time_limit` (a handler only notes: it may run while the
        main thread holds a lock)."""
        self.edge.signal_step(signum)
        if signum == signal.SIGTERM and self.term_at is None:
            self.term_at = time.monotonic()

    def past_time_limit(self) -> bool:
        """Asked while a step runs: whether to stop waiting for it. After a SIGTERM, once:
        where Slurm sent it to end the job (the time limit, a cancel: scontrol show job), whose
        SIGKILL comes KillWait later, the step is waited for until step_grace_s after it, so
        that the start's end is recorded before the SIGKILL. The same for a job Slurm has put
        back in the queue (`scontrol requeue`, or a preemption's requeue once its GraceTime is
        over): its processes are being ended as a cancel's are. A preemption's SIGTERM (its
        GraceTime) leaves the step its time."""
        if self.leave_at is None and self.term_at is not None:
            term_at, self.term_at = self.term_at, None
            taken = self.edge.taken_back(self.slurm_job, LIMIT_ASK_S)
            if taken in (TakenBack.TIMED_OUT, TakenBack.ENDED, TakenBack.REQUEUED):
                self.leave_at = term_at + step_grace_s(self.slurm_config.kill_wait_s)
                self.ending = taken
        return self.leave_at is not None and time.monotonic() >= self.leave_at

    @property
    def at_time_limit(self) -> bool:
        return self.ending is TakenBack.TIMED_OUT

    @property
    def being_ended(self) -> bool:
        """Slurm ends the job (its time limit, a cancel, a requeue): its SIGKILL is at most
        KillWait away."""
        return self.leave_at is not None

    def run(self) -> int:
        try:
            ctx = context()     # env.sh, sourced by job.sbatch, exported the job's id and Slurm's requeue count
        except RuntimeConfigError as exc:
            say(f"this start does not begin: {exc}")
            return 1
        allocation = self.edge.hostnames(self.env.get("SLURM_JOB_NODELIST", ""))
        if not allocation:
            say("the allocation's nodes are not known (scontrol show hostnames SLURM_JOB_NODELIST)")
            return 1
        begun = jobstart.begin(self.job.run_dir, ctx.job_id, ctx.restart)
        if begun.action is Action.REFUSE:
            return 1
        if begun.action is Action.END:
            return 0
        restart = start_number(begun, ctx.restart, requeue=self.job.requeue)
        if restart != ctx.restart:
            self._set_start(restart, None)
        # Where this start's part of the batch log begins (jobend.this_start): slurmstepd's
        # lines about the end of the one before (its requeue's) come before it.
        print(f"glaunch: start {restart} of job {ctx.job_id} begins", flush=True)
        if self.job.requeue:
            # Read now: at the time limit every second of KillWait counts.
            self.slurm_config = self.edge.config()
        return self.steps(ctx.job_id, restart, tuple(allocation))

    def steps(self, job_id: str | None, restart: int, allocation: tuple[str, ...]) -> int:
        """Each step of this start to its end, and what follows the last."""
        nodes = allocation[:self.job.nodes]
        while True:
            started = datetime.now().astimezone().isoformat(timespec="seconds")
            self._free_port()
            status = self.step(nodes, allocation)
            # While Slurm ends the job the job's record is asked within what is left of KillWait,
            # and what it said at its SIGTERM (the time limit, a requeue) stands where it does
            # not answer.
            taken = self.edge.taken_back(self.slurm_job, LIMIT_ASK_S if self.being_ended else SLURM_TIMEOUT_S)
            if taken is None and self.being_ended:
                taken = self.ending
            end = StepEnd(status, taken in (TakenBack.PREEMPTED, TakenBack.REQUEUED), started,
                          allocation if self.job.requeue else (), nodes, timed_out=taken is TakenBack.TIMED_OUT,
                          outlived=self.outlived)
            try:
                road = jobend.end_of_start(self.job.run_dir, end, job_id, restart)
            except (RunError, RecordError, OSError, ValueError) as exc:
                say(f"the end of this start is not recorded: {exc}")
                return 1
            action = after_step(road, self.job)
            if (action in ("restart", "requeue") and self.being_ended and not self.at_time_limit
                    and taken is not TakenBack.REQUEUED):
                # Slurm is ending the job (a cancel whose line the batch log's tail lost): a new
                # step would be cut short at once and a requeue refused. (A job Slurm put back in
                # the queue, a node failure's included, goes to requeued_by_slurm.)
                say(f"Slurm is ending job {self.slurm_job}: no {action} (the end read {road.line()})")
                return road.exit_code or 1
            if action != "restart":
                return self.finish(action, road, job_id, restart, taken)
            nodes, restart = road.nodes, restart + 1
            self._set_start(restart, nodes)
            print(f"glaunch: start {restart}: a new step on {','.join(nodes)}", flush=True)

    @property
    def slurm_job(self) -> str:
        return self.env.get("SLURM_JOB_ID", "")

    def _set_start(self, restart: int, nodes: Sequence[str] | None) -> None:
        """This start's number, and its rendezvous (host: the first of `nodes`, by the address
        slurmctld reaches it at; port: its own) for the next step's tasks and the watchdog."""
        self.env["GLAUNCH_RESTART"] = str(restart)
        if nodes:
            self.env["MASTER_ADDR"] = self.edge.node_addr(nodes[0]) or nodes[0]
        if self.job.port is not None:
            self.env["MASTER_PORT"] = str(master_port(self.slurm_job, restart, self.job.port))

    def _free_port(self) -> None:
        """The step's rendezvous port moved past one that a process at the rendezvous host
        (this one) already listens on, where the port is derived and the host is this one."""
        raw, host = self.env.get("MASTER_PORT", ""), self.env.get("MASTER_ADDR", "")
        if self.job.port is None or not (raw.isascii() and raw.isdigit()) or not host:
            return
        derived = int(raw)
        chosen = port_not_in_use(derived, self.job.port, lambda p: self.edge.port_in_use(host, p))
        if chosen != derived:
            say(f"the rendezvous port {derived} is in use on {host}: this step rendezvous on {chosen}")
            self.env["MASTER_PORT"] = str(chosen)

    def step(self, nodes: Sequence[str], allocation: Sequence[str]) -> int:
        """One job step on `nodes`, with the watchdog beside it (and, with recovery.peer, the
        thread that starts lost ranks again): srun's status, or 0 where only ranks started
        again failed and their new processes ended well."""
        stop = threading.Event()
        self.outlived = False
        watch = threading.Thread(target=self.watch, name="glaunch-watchdog", daemon=True,
                                 args=(self.job.run_dir, stop, allocation if self.job.requeue else (), nodes,
                                       self.end_outlived_step))
        watch.start()
        replaced: list[int] = []
        replacer = None
        store = None
        if self.env.get(envnames.RECOVERY_PEER) == "1":
            store = self._serve_store(nodes)
            spares = [node for node in allocation if node not in nodes]
            replacer = threading.Thread(target=lambda: replaced.append(self.edge.replace(self.job, stop, nodes,
                                                                                         self.env, spares)),
                                        name="glaunch-peer-replace", daemon=True)
            replacer.start()
        status = 1
        try:
            status = self.edge.run_step(self.job.command(nodes), self.env, self.past_time_limit)
        finally:
            stop.set()
            if self.term_at is not None:      # a SIGTERM as the step ended: asked about still
                self.past_time_limit()
            # Once Slurm ends the job the threads get LIMIT_JOIN_S, not their own bounds (both
            # are daemons: the process ends without them); their steps end with the job.
            limit = LIMIT_JOIN_S if self.being_ended else None
            watch.join(limit or WATCHDOG_JOIN_S)
            if replacer is not None:
                replacer.join(limit or REPLACE_JOIN_S)
            if store is not None:
                storeprocess.stop(store)
                self.env.pop(envnames.PEER_STORE, None)
        if status != 0 and replaced == [0]:
            print(f"glaunch: srun's status {status} came from ranks whose processes were started again and "
                  "ended well: the step's is 0", flush=True)
            return 0
        return status

    def _serve_store(self, nodes: Sequence[str]) -> subprocess.Popen[bytes] | None:
        """The step's rendezvous store under recovery.peer, served from here for the step's
        ranks (GLAUNCH_PEER_STORE), one task per rank (srun; torchrun's agent holds its
        workers' store): its process, or None where rank 0 is to start one."""
        per_node = self.env.get(envnames.RANKS_PER_NODE, "")
        if self.env.get(envnames.LAUNCHER) != "srun" or not (per_node.isascii() and per_node.isdigit()):
            return None
        host = self.env.get("MASTER_ADDR", "")
        served = self.edge.serve_store(host, len(nodes) * int(per_node))
        if served is None:
            return None
        store, port = served
        self.env[envnames.PEER_STORE] = f"{host}:{port}"
        say(f"the step's rendezvous store (recovery.peer) listens here, on port {port}: "
            "it outlives any rank's process")
        return store

    def watch(self, run_dir: Path, stop: threading.Event, allocation: Sequence[str], in_use: Sequence[str],
              end_step: Callable[[], None]) -> None:
        """The watchdog beside the step; should it fail (a defect of its own), the step runs
        on unwatched, and the batch log and the start's record say so."""
        try:
            self.edge.watch(run_dir, stop, allocation, in_use, end_step)
        except Exception as exc:        # the training goes on without its watchdog, said so
            error = f"{type(exc).__name__}: {exc}"
            say(f"the watchdog failed, and this start is no longer watched: {error}")
            job_id, restart = self.env.get(envnames.JOB_ID, ""), self.env.get(envnames.RESTART, "")
            if job_id and restart.isdigit():
                watchdog.note_failed(run_dir, job_id, int(restart), error)

    def end_outlived_step(self) -> None:
        """The watchdog's, for a step that outlived every rank's exit: srun ends it (it waits
        out the step's end up to KillWait, then gives up on a slurmstepd that is gone)."""
        self.outlived = True
        self.edge.end_step()

    def finish(self, action: str, road: NextRoad, job_id: str | None, restart: int,
               taken: TakenBack | None = None) -> int:
        """The road after the last step: requeue, resubmit, or the end."""
        if not self.job.requeue:
            print(f"glaunch: this start ended: {road.line()}", flush=True)
            return road.exit_code
        ref = job_id or self.slurm_job
        if action == "requeue" and taken is TakenBack.REQUEUED:
            return self.requeued_by_slurm(ref, road)
        if (action == "requeue" and taken is TakenBack.PREEMPTED
                and requeues_at_script_end(self.slurm_config, self.env.get("SLURM_RESTART_COUNT", "0"))
                and preemption_requeues(self.edge.partition())):
            return self.left_to_slurm(ref, road)
        if action == "requeue":
            return self.requeue(ref, road)
        if action == "resubmit":
            return self.resubmit(road, job_id, restart)
        if taken in (TakenBack.PREEMPTED, TakenBack.REQUEUED) and road.exit_code != 0:
            self.cancel_taken_back(ref, road)
        return road.exit_code

    def cancel_taken_back(self, ref: str, road: NextRoad) -> None:
        """The run has ended without its result (requeue.max reached, cancelled) in a start
        Slurm took back: a preemption by requeue puts the job back in the queue (now, or as
        this batch script ends), whence it would take nodes again only to find the run ended,
        and end COMPLETED, which a dependent's afterok would take for the run's success.
        Cancelled now, its start recorded already. A run that ended well is left to end
        COMPLETED (its requeued start, if any, ends at once), for afterok."""
        say(f"the run has ended ({road.line()}): job {ref}, which Slurm would start again, is cancelled")
        self.edge.cancel([ref])

    def requeue(self, ref: str, road: NextRoad) -> int:
        """The job back to the queue; kept off road.nodes, which Slurm takes only once it is
        pending: the requeue's SIGTERM is ignored until then (SIGKILL ends this process
        KillWait later). Without nodes to keep off, the requeue's SIGTERM ends it at once."""
        if road.nodes:
            self.edge.ignore_term()
        else:
            self.edge.end_on_term()
        if not self.edge.requeue(ref):
            return 1
        self.keep_off(ref, road)
        self.edge.wait_for_requeue()        # the requeue ends this process
        return road.exit_code

    def keep_off(self, ref: str, road: NextRoad) -> None:
        """The pending job kept off road.nodes (Slurm's ExcNodeList), or said where it is not."""
        if road.nodes and not self.edge.exclude(ref, road.nodes):
            say(f"the next start may run on {','.join(road.nodes)} again")

    def requeued_by_slurm(self, ref: str, road: NextRoad) -> int:
        """Slurm has put the job back in the queue itself (an admin's or a preemption's
        requeue): not asked again; the nodes to keep off are set on the pending job."""
        say(f"Slurm requeued job {ref} itself; its next start comes from the queue")
        self.keep_off(ref, road)
        return road.exit_code

    def left_to_slurm(self, ref: str, road: NextRoad) -> int:
        """Preempted, on a Slurm that requeues the job as this script ends: asked to requeue
        it now, Slurm would also requeue its next start as that ends (GRACE_REQUEUE_RELEASE).
        The nodes to keep off cannot be set before it is pending."""
        release = ".".join(map(str, self.slurm_config.release or ()))
        say(f"job {ref} was preempted: Slurm {release} requeues it as this start ends")
        if road.nodes:
            say(f"the next start may run on {','.join(road.nodes)} again")
        return road.exit_code

    def resubmit(self, road: NextRoad, job_id: str | None, restart: int) -> int:
        """The time limit (or a stop on a SIGTERM nothing explains): the next start is a new
        job, submitted now and started once this one has ended (afterany), where a requeued job
        would wait out Slurm's hold (about 120 s). A cancel from now on reaches the new job
        through run.json, or here."""
        self.edge.ignore_term()
        successor = self.edge.submit_next(self.job.job_script, self.slurm_job, road.nodes)
        if successor is None:
            return 1
        try:
            carried = jobend.record_successor(self.job.run_dir, successor, job_id, restart)
        except (RunError, RecordError, OSError, ValueError) as exc:
            say(f"job {successor} is not recorded as the run's next start: {exc}")
            carried = False
        if carried:
            say(f"the next start is job {successor}")
        else:
            say(f"the run has ended meanwhile; job {successor} is cancelled")
            self.edge.cancel([successor])
        return road.exit_code


def say(line: str) -> None:
    print(f"glaunch: {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    try:
        job = parse(sys.argv[1:] if argv is None else argv)
    except UsageError as exc:
        say(f"job controller: {exc}")
        return 2
    controller = Controller(job, SlurmEdge())
    for signum in (signal.SIGTERM, signal.SIGUSR2):
        signal.signal(signum, controller.on_signal)
    return controller.run()


if __name__ == "__main__":
    sys.exit(main())
