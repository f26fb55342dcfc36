"""Progress heartbeats and step times, taken from the training loop itself.

Every rank calls :func:`beat` once per step: :func:`launcher.runtime.should_stop` does
(so every training loop does), or a script calls ``rt.heartbeat(step, total)``. A beat
costs a clock read and an append; at most every ``GLAUNCH_HEARTBEAT_S`` seconds (default
5, 0: no files; rank 0, whose file the console shows, at most every RANK0_INTERVAL_S)
it also replaces ``<run dir>/heartbeats/rank-RRRRR.json``::

    {"rank": 3, "node": "gpu012", "job_id": "4711", "restart": 1, "step": 120, "total": 400,
     "time": 1733230000.12, "first_step": 101, "first_time": ..., "step_s": 0.41,
     "checkpoint_step": 100, "state": "running", "written": ..., "interval_s": 5.0,
     "pid": 5120, "host": "gpu012.cluster", "job_step": "0", "world_size": 16,
     "step_p99_s": 0.52, "steps_timed": 19, "save_s": 31.5, "busy_s": 0.38, "busy_count": 19,
     "announced_at": 1733229990.3, ...}

``state``: ``starting`` (written by the task before the entry point runs, so the watchdog
knows every rank before its first step), ``running``, ``saving`` (a checkpoint save that
holds up the loop, :func:`saving`; ``saving_since`` when it began, ``save_ended`` when the
last one ended), ``stopping`` (the save of an agreed stop), ``stopped``, ``finished``.
``exited``: when the rank's interpreter began to exit (written once more by its exit
handler, after its non-daemon threads ended; every rank under a launcher has one, from its
first beat or the task's ``starting``): a step whose ranks have all exited and that Slurm
still runs has lost a node's slurmstepd, or a rank is stuck in its teardown, and the
watchdog ends it (:func:`launcher.jobcontrol.watchdog.step_outlives_ranks`).
The batch host's watchdog (:mod:`launcher.jobcontrol.watchdog`) reads these files, each
checked (:mod:`launcher.rundir.heartbeatrecord`), and its bounds from the job's task.json.

``announced_at``: when the script itself said it reports its steps through the runtime
(:func:`announce`): it installed the stop handler (whose flag only should_stop reads),
made glaunch's Lightning callback, or reached its first step. Until a rank of the start
has announced, the watchdog has no evidence to judge by: an unchanged torchrun or
Lightning script never beats, and the ``starting`` record the task writes for every rank
says nothing of the script. ``init_distributed`` alone does not announce: a script may take
its process group from the runtime and never report a step.

``time`` is when the rank reached ``step`` (not when the file was written), so a rank
that hangs leaves a file that ages while its peers' files move on: no collective is
needed to tell which rank fell silent. A rank writes at most every ``interval_s``, and at
its first step after that (besides: at its first step, and at the beat that times its
EARLY_STEPS-th step, which the watchdog's early bound needs): a record whose ``time`` is well over ``interval_s`` plus a
step behind its peers' is a rank that stopped stepping. The record is written over the previous one in
place, with its checksum (layout.heartbeat_bytes; read it with layout.read_heartbeat),
and never fsynced: a reader needs a whole record, not a durable one, and a rename or an
fsync per beat from every rank would load a shared filesystem's metadata server for
nothing (bench/heartbeat.py measures the cost).

What ``watchdog.stall_s: auto`` and the slow-node report read (launcher.jobcontrol.watchdog):
``step_p99_s``, the 99th percentile of the last RECENT_STEPS step times (``steps_timed``:
how many steps this start has timed); ``save_s``, how long this rank's last checkpoint
save held up its loop; ``busy_s``, the median of this rank's last BUSY_WINDOW busy times.
A rank's busy time is the part of its step it spent on its own work: from its return
from the last :func:`launcher.runtime.should_stop` (whose all_reduce every rank leaves
together) to its next beat, less the time it waited for its peers inside the training's
own collectives in that interval (DDP's gradient all-reduces, FSDP2's all-gathers and
reduce-scatters: :mod:`launcher.runtime.peerwaits` measures them and reports them here
through a wait source, :meth:`Beats.add_wait_source`). In synchronous data parallel every
rank's step takes as long as the slowest rank's; the others wait for it, in the gradient
collective where the slowness comes before it (data, forward, backward), in should_stop's
where it comes after (the optimizer, logging): a slow rank is busy longer than its peers,
a rank that waits is busy less. Without should_stop the busy time is the whole interval
between beats less the measured waits; with neither, no rank stands out.
``busy_count``: the busy times taken so far.

The intervals between beats are the step times of the start's telemetry, which each rank
writes at the end of its start (:func:`write_telemetry`; what it holds:
:mod:`launcher.runtime.telemetry`; how the start folds it into run.json:
:mod:`launcher.rundir.startsummary`). A step whose number is a
checkpoint step (``GLAUNCH_CHECKPOINT_EVERY``) also saved a checkpoint: its interval is
kept apart, and what it took beyond a usual step is a save time. A beat without a step
number is the step after the last one (the first, the step after the one this start
resumed from: resume.json).

Only under a launcher (``GLAUNCH_RUN_DIR`` set) are files written; a script run by hand
times its steps and writes nothing. There the first beat also arms the rest of the
rank's start (:func:`began`): its telemetry at exit, the node's GPU sampler, its stack
dump.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import re
import socket
import sys
import time
from array import array
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterator

from launcher.rundir import envnames
from launcher.rundir.files import atomic_write_text, open_regular, read_json
from launcher.rundir.heartbeatrecord import BUSY_WINDOW, EARLY_STEPS, MAX_INTERVAL_S, MAX_STEP, SAVING_STATES
from launcher.rundir.layout import RunDir, heartbeat_bytes
from launcher.rundir.rankcontext import RankContext, RuntimeConfigError, context, log, node_name, seconds_from_env
from launcher.rundir.startsummary import quantile
from launcher.runtime import stackdump, stopflag, telemetry, versions

DEFAULT_INTERVAL_S = 5.0
RANK0_INTERVAL_S = 1.0
# Step times kept per start for the median and p90; beyond this a uniform sample of them.
MAX_SAMPLES = 1 << 16
EMA_WEIGHT = 0.1          # of the newest step in the step time the console shows
RECENT_STEPS = 200        # the step times step_p99_s is taken over


class Beats:
    """One rank's beats in this process (one start)."""

    def __init__(self, *, run_dir: Path | None, interval_s: float, checkpoint_every: int, rank: int = 0,
                 local_rank: int = 0, node: str = "", job_id: str | None = None, restart: int = 0,
                 world_size: int | None = None, node_index: int = 0) -> None:
        self.run_dir = run_dir
        self.node_index = node_index
        self.path = RunDir(run_dir).heartbeat(rank) if run_dir is not None and interval_s > 0 else None
        self.interval_s = interval_s
        self.checkpoint_every = checkpoint_every
        self.rank, self.local_rank, self.node = rank, local_rank, node
        self.job_id, self.restart, self.pid = job_id, restart, os.getpid()
        self.world_size = world_size
        self.host = socket.gethostname()
        step_id = os.environ.get("SLURM_STEP_ID", "")
        # Slurm's step number only: the watchdog asks job.sbatch to end that step.
        self.job_step = step_id if re.fullmatch(r"[0-9]{1,10}", step_id) else None
        self.saving_since: float | None = None
        self.save_ended: float | None = None
        self.step: int | None = None
        self.total: int | None = None
        self.first_step: int | None = None
        self.first_time: float | None = None
        self.time: float | None = None        # when `step` was reached
        self.step_s: float | None = None      # moving average, for the console's rate
        self.last_write = 0.0
        self.samples = array("d")
        self.seen = 0
        self.save_spans: list[tuple[float, int]] = []   # (interval, steps in it) of checkpoint steps
        self.saves: list[float] = []          # save times the checkpoint code reported
        self.checkpoint_step: int | None = None
        self.recent: deque[float] = deque(maxlen=RECENT_STEPS)
        self.last_save_s: float | None = None
        self.synced_at: float | None = None   # when this rank left the last should_stop's collective
        self.busy: deque[float] = deque(maxlen=BUSY_WINDOW)
        self.busy_count = 0
        self.wait_sources: list[Callable[[], float]] = []   # each: seconds waited for peers since asked last
        self.stop_decided: float | None = None
        self.announced_at: float | None = None   # when the script said it reports its steps (announce)
        self.exited: float | None = None      # when the interpreter began to exit (its exit handler)
        self.state = "running"
        self.untimed = False                  # the interval in flight is no step's time (interrupted)
        self._random = random.Random(rank)
        self._fd: int | None = None
        self._size = 0
        self._warned = False

    # --- the training loop's calls ------------------------------------------------------

    def beat(self, step: int | None = None, total: int | None = None) -> None:
        now = time.time()
        if step is None:                      # counted: the step after the last one
            step = (self.step if self.step is not None else self._resumed_step()) + 1
        if total is not None:
            self.total = int(total)
        step = int(step)
        previous = self.step
        if previous is not None and step == previous:
            return                            # called twice in one step: it was reached earlier
        self.step = step
        if previous is None and self.local_rank == 0 and self.run_dir is not None:
            # At the first step the script has imported what it trains with.
            versions.record(self.run_dir, self.job_id or "none", self.restart, self.node_index, self.node)
        if self.announced_at is None:         # a step is an announcement too
            self.announced_at = now
        waited = self.waited()                # since the last beat, whether this step is timed or not
        timed_before = self.seen
        if previous is None or step < previous or self.time is None:
            self.first_step, self.first_time = step, now     # the first step, or the loop went back
        elif self.untimed:
            pass                              # a peer recovery in it: neither a step's nor a rank's own time
        elif self._timed(now - self.time, previous, step):
            self._busy(busy_time(now - max(self.time, self.synced_at or 0.0), waited))
        self.time, self.untimed = now, False
        # The first step always: the watchdog stops waiting for it; and the step that makes
        # its early bound.
        early = timed_before < EARLY_STEPS <= self.seen
        if self.path is not None and (now - self.last_write >= self.interval_s or previous is None or early):
            self.write(now)

    def interrupted(self) -> None:
        """The interval in flight held what is no step (a peer recovery: a hang its peers
        waited out, a state sent): the next beat does not time it, so neither the watchdog's
        auto bound nor the slow-rank report takes it for a step."""
        self.untimed = True

    def add_wait_source(self, source: Callable[[], float]) -> None:
        """`source()`: the seconds this rank waited for its peers in a collective of the
        training since it was last called; each beat calls it."""
        self.wait_sources.append(source)

    def waited(self) -> float:
        """The seconds every wait source says this rank waited since the last beat (a source
        that fails is said once and dropped: the loop never sees it)."""
        total = 0.0
        for source in list(self.wait_sources):
            try:
                total += max(0.0, float(source()))
            except Exception as exc:  # a measurement, never worth the training loop
                self.wait_sources.remove(source)
                log(f"waits for peers no longer measured: {type(exc).__name__}: {exc}")
        return total

    def _timed(self, interval: float, previous: int, step: int) -> bool:
        """Keep the interval as a step time; False for a checkpoint step's (a save's)."""
        every, steps = self.checkpoint_every, step - previous
        if every > 0 and (step // every) > (previous // every):
            self.save_spans.append((interval, steps))
            return False
        per_step = interval / steps
        self.recent.append(per_step)
        self.step_s = per_step if self.step_s is None else (1 - EMA_WEIGHT) * self.step_s + EMA_WEIGHT * per_step
        self.seen += 1
        if len(self.samples) < MAX_SAMPLES:
            self.samples.append(per_step)
        else:                                  # reservoir sampling: every step equally likely kept
            slot = self._random.randrange(self.seen)
            if slot < MAX_SAMPLES:
                self.samples[slot] = per_step
        return True

    def _busy(self, seconds: float) -> None:
        self.busy.append(max(0.0, seconds))
        self.busy_count += 1

    def _resumed_step(self) -> int:
        if self.run_dir is None:
            return 0
        resume = read_json(RunDir(self.run_dir).resume_file) or {}
        step, restart = resume.get("step"), resume.get("restart")
        # A step beyond MAX_STEP would make every heartbeat of this rank one the watchdog refuses.
        if type(restart) is int and restart == self.restart and type(step) is int and 0 <= step < MAX_STEP:
            return step
        return 0

    # --- the file ------------------------------------------------------------------------

    def record(self) -> dict[str, Any]:
        return {"rank": self.rank, "local_rank": self.local_rank, "node": self.node, "pid": self.pid,
                "job_id": self.job_id, "restart": self.restart, "step": self.step, "total": self.total,
                "time": self.time, "first_step": self.first_step, "first_time": self.first_time,
                "step_s": None if self.step_s is None else round(self.step_s, 6),
                "checkpoint_step": self.checkpoint_step, "state": self.state, "written": time.time(),
                "interval_s": self.interval_s, "host": self.host, "job_step": self.job_step,
                "world_size": self.world_size, "saving_since": self.saving_since,
                "save_ended": self.save_ended, "announced_at": self.announced_at, "exited": self.exited,
                **self.pace()}

    def pace(self) -> dict[str, Any]:
        """What the watchdog's auto bound and slow-node report read (see the module's
        docstring)."""
        recent, busy = sorted(self.recent), sorted(self.busy)
        return {"step_p99_s": round(quantile(recent, 0.99), 6) if recent else None,
                "steps_timed": self.seen,
                "save_s": None if self.last_save_s is None else round(self.last_save_s, 6),
                "busy_s": round(quantile(busy, 0.5), 6) if busy else None, "busy_count": self.busy_count}

    def write(self, now: float | None = None) -> None:
        """Write this rank's heartbeat over the previous one; a failure is said once and
        never reaches the training loop."""
        if self.path is None:
            return
        self.last_write = time.time() if now is None else now
        try:
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # Refuses anything but a regular file in its place (and never blocks on one).
                self._fd = open_regular(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW)
                self._size = os.fstat(self._fd).st_size
            data = heartbeat_bytes(self.record(), self._size)
            os.pwrite(self._fd, data, 0)
            self._size = max(self._size, len(data))
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log(f"heartbeat not written to {self.path}: {exc.strerror or exc}")

    # --- what the start's telemetry reports ------------------------------------------------

    def step_times(self) -> dict[str, float | int] | None:
        """{"median", "p90", "count"} of the step times (checkpoint steps excluded)."""
        if not self.samples:
            return None
        ordered = sorted(self.samples)
        return {"median": round(quantile(ordered, 0.5), 6), "p90": round(quantile(ordered, 0.9), 6),
                "count": self.seen}

    def save_times(self) -> list[float]:
        """Seconds each checkpoint save kept the loop from its next step: as the checkpoint
        code reported them, else a checkpoint step's time beyond the usual step time."""
        if self.saves:
            return [round(s, 6) for s in self.saves]
        times = self.step_times()
        if times is None:
            return []
        return [round(max(0.0, interval - steps * float(times["median"])), 6) for interval, steps in self.save_spans]


def busy_time(interval_s: float, waited_s: float) -> float:
    """Pure: a rank's own work in a step: the interval it counts over (from its return from
    should_stop's collective, else its last beat, to this beat) less what it waited for its
    peers inside the training's collectives then; never below 0."""
    return max(0.0, interval_s - max(0.0, waited_s))


_beats: Beats | None = None


def interval_from_env() -> float:
    interval = seconds_from_env(envnames.HEARTBEAT_S, DEFAULT_INTERVAL_S)
    if interval > MAX_INTERVAL_S:
        log(f"{envnames.HEARTBEAT_S}={interval:g} is more than {MAX_INTERVAL_S:g} s; using {MAX_INTERVAL_S:g}")
        return MAX_INTERVAL_S
    return interval


def current() -> Beats:
    """This process's beats, begun at the first call."""
    global _beats
    if _beats is None:
        _beats = _begin()
    return _beats


def _begin() -> Beats:
    try:
        ctx = context()
    except RuntimeConfigError as exc:
        log(f"heartbeats off: {exc}")
        return Beats(run_dir=None, interval_s=0, checkpoint_every=0)
    under_launcher = bool(os.environ.get(envnames.RUN_DIR))
    interval = interval_from_env()
    if ctx.rank == 0 and interval > 0:
        interval = min(interval, RANK0_INTERVAL_S)
    beats = Beats(run_dir=ctx.run_dir if under_launcher else None, interval_s=interval,
                  checkpoint_every=ctx.checkpoint_every, rank=ctx.rank, local_rank=ctx.local_rank,
                  node=node_name(), job_id=ctx.job_id, restart=ctx.restart, world_size=ctx.world_size,
                  node_index=ctx.node_rank)
    if under_launcher:
        began(ctx)
    return beats


def began(ctx: RankContext) -> None:
    """The first beat of a rank under a launcher: its telemetry is written at exit if
    nothing else writes it, its local rank 0 samples the node's GPUs, and its stack can
    be asked for."""
    atexit.register(_at_exit)
    if ctx.local_rank == 0:
        telemetry.start_gpu_sampler(ctx)
    if not stackdump.armed():      # a torchrun worker: its task (the agent) armed only itself
        stackdump.arm_stack_dump(ctx.run_dir, ctx.rank)


def reset(beats: Beats | None = None) -> None:
    """Forget this process's beats and the telemetry it wrote (tests, benchmarks), or use
    `beats` from now on."""
    global _beats, _written
    _beats = beats
    _written = None


# --- the rank's telemetry of its start ------------------------------------------------------

_written: str | None = None        # why this rank's telemetry was last written ("stop", "finish", "exit")


def write_telemetry(reason: str, *, stop_requested: float | None = None) -> dict[str, Any] | None:
    """This rank's telemetry of this start (`reason`: stop, finish, exit): what its beats
    measured, its peak memory, and when a stop was asked for, agreed and saved. None when
    not under a launcher. Never raises for a file it cannot write."""
    global _written
    beats = current()
    if beats.run_dir is None:
        return None
    now = time.time()
    saves = beats.save_times()
    if reason == "stop" and beats.stop_decided is not None:
        saves.append(round(now - beats.stop_decided, 6))     # the stop's own save, timed exactly
    record = {
        "rank": beats.rank, "local_rank": beats.local_rank, "node": beats.node, "job_id": beats.job_id,
        "restart": beats.restart, "reason": reason, "time": now, "memory": telemetry.peak_memory(),
        "step_time_s": beats.step_times(), "save_s": saves,
        "first_step": beats.first_step, "first_time": beats.first_time,
        "last_step": beats.step, "last_time": beats.time, "total": beats.total,
        "stop": {"requested": stop_requested, "decided": beats.stop_decided,
                 "saved": now if reason == "stop" else None},
    }
    path = RunDir(beats.run_dir).telemetry(beats.job_id or "none", beats.restart, beats.rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(record) + "\n")
    except OSError as exc:
        log(f"telemetry not written to {path}: {exc.strerror or exc}")
    _written = reason
    return record


def _at_exit() -> None:
    try:
        if _written is None:
            write_telemetry("exit", stop_requested=stopflag.requested_at())
    except Exception as exc:  # at exit: say it, never fail the process for it
        log(f"telemetry at exit failed: {type(exc).__name__}: {exc}")
    telemetry.stop_gpu_sampler()
    if _beats is not None and not _after_children(_beats):
        _write_exited(_beats)


def _write_exited(beats: Beats) -> None:
    beats.exited = time.time()
    beats.write()


def _after_children(beats: Beats) -> bool:
    """Leave the `exited` beat to multiprocessing's own exit, when that is still to come
    (atexit runs the last registered first, and torch imports multiprocessing.util, which
    registers it, before the runtime begins): its finalizers run (a Manager's server shut
    down), its daemonic children are ended and the others (an upload, a writer) waited for,
    then its last finalizers, this one among them. The rank has exited only once they have:
    a step whose ranks all exited is ended soon after
    (launcher.jobcontrol.watchdog.step_outlives_ranks). False where it has run already,
    or multiprocessing was never imported."""
    util = sys.modules.get("multiprocessing.util")
    finalize = getattr(util, "Finalize", None)
    if finalize is None or getattr(util, "_exiting", True) is not False:
        return False
    try:
        finalize(None, _write_exited, args=(beats,), exitpriority=LAST_FINALIZER)
    except Exception as exc:  # at exit: say it, never fail the process for it
        log(f"the exit beat is written now: {type(exc).__name__}: {exc}")
        return False
    return True


# Below any finalizer's priority a program would choose: run after all of them.
LAST_FINALIZER = -(2 ** 31)


# --- the runtime's API ----------------------------------------------------------------------


def heartbeat(step: int | None = None, total: int | None = None) -> None:
    """Record that this rank finished `step` (of `total`, when known). Cheap: call it every
    step. Not needed in a loop that calls :func:`launcher.runtime.should_stop`, which does
    it (pass ``step=`` and ``total=`` there)."""
    current().beat(step, total)


def note_checkpoint(step: int, seconds: float | None = None) -> None:
    """A checkpoint of `step` was saved, taking `seconds` of the loop's time (the
    checkpoint code calls this; the console and the start's save times use it)."""
    beats = current()
    beats.checkpoint_step = int(step)
    if seconds is not None and seconds >= 0:
        beats.saves.append(float(seconds))
        beats.last_save_s = float(seconds)


def note_synced() -> None:
    """This rank left should_stop's collective: its busy time counts from here."""
    current().synced_at = time.time()


def note_stop_decided() -> None:
    """The ranks agreed to stop (should_stop returned True): the stop's save starts now
    (the watchdog gives it a save's bound, not a step's)."""
    beats = current()
    if beats.stop_decided is None:
        beats.stop_decided = beats.saving_since = time.time()
        beats.state = "stopping"
        beats.write()


def announced() -> bool:
    """Whether this rank's script has announced itself (:func:`announce`), read without
    beginning its beats (a signal handler's question)."""
    return _beats is not None and _beats.announced_at is not None


def announce() -> None:
    """This rank's script reports its steps through the runtime: from now on the watchdog
    may hold the start to its first-step bound. The heartbeat is written at once, so a
    script that hangs before its first step is still seen."""
    beats = current()
    if beats.announced_at is None:
        beats.announced_at = time.time()
        beats.write()


def starting() -> Beats:
    """The task, before the entry point runs: this rank's record (pid, node, job step) for
    the watchdog, before its first step."""
    beats = current()
    beats.state = "starting"
    beats.write()
    beats.state = "running"
    return beats


@contextlib.contextmanager
def saving(step: int | None = None) -> Iterator[None]:
    """Around a checkpoint save that holds up the loop: the watchdog gives it a save's
    bound, not a step's. The heartbeat is written as it begins and as it ends; its end
    (``save_ended``) is where the next step's bound starts. `step`, when given, becomes
    the heartbeat's ``checkpoint_step`` once the block ends without an error.

    Main thread only: the heartbeat's writer is not thread-safe, and a save that goes on
    in the background while the loop steps is not a stall (the steps beat). Within a save
    or a stop's save it changes nothing: the outer bound holds.
    """
    beats = current()
    outer = beats.state in SAVING_STATES
    previous = beats.state
    if not outer:
        beats.state, beats.saving_since = "saving", time.time()
        beats.write()
    saved = False
    try:
        yield
        saved = True
    finally:
        if not outer:
            ended = time.time()
            beats.last_save_s = ended - (beats.saving_since or ended)
            beats.state, beats.saving_since, beats.save_ended = previous, None, ended
        if saved and step is not None:
            beats.checkpoint_step = int(step)
        if not outer or (saved and step is not None):
            beats.write()


def flush(state: str | None = None, step: int | None = None) -> Beats:
    """Write the heartbeat now (at a stop or the end of training), with `step` as the last
    one when given."""
    beats = current()
    if step is not None and (beats.step is None or step > beats.step):
        beats.beat(step)
    if state is not None:
        beats.state = state
    beats.write()
    return beats
