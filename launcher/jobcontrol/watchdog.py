"""The hang watchdog: beside a start's job step, from the ranks' heartbeats alone.

It runs on the batch host (Slurm: a thread of the job controller,
launcher.jobcontrol.controller, from the start of each job step to its end; the local
scheduler: inside localrun, the stand-in for srun). It asks nothing of the ranks: no collective, no
work in the training loop. Each rank's heartbeat (launcher.runtime.heartbeats) says when
it last finished a step, its pid, node and job step; the job's task.json
(launcher.rundir.taskspec) gives the bounds (``watchdog.stall_s``,
``watchdog.first_step_s``) and the number of ranks.

The watchdog acts only on evidence it has. A start is watched once a rank of it has
announced that its script reports its steps through the runtime (the heartbeat's
``announced_at``: launcher.runtime.heartbeats.announce) or has reported one; until then
nothing ends it: an unchanged torchrun or Lightning script never beats, and the
``starting`` record the task writes for every rank says nothing of the script.
``watchdog.stall_s: 0`` turns every bound off, the first step's included. :func:`armed_at`
is the decision, pure; :func:`watch_entry` what run.json (and so `glaunch status`) says
of it: ``off``, ``not watched`` and why, or the bound in force.

A watched start hangs when no rank has finished a step for ``stall_s`` (a record's ``time`` plus
its ``interval_s``: a rank writes at most that often, so it may have stepped that much
later), or no rank has reached its first step ``first_step_s`` after the first rank
announced itself (not before the start began). A
checkpoint save in progress (heartbeat state ``saving``, or ``stopping``: the save a stop
makes) is not a stall: it has its own bound, SAVE_BOUND_FACTOR times ``stall_s`` and at
least SAVE_BOUND_MIN_S, because a save that never ends (a hung filesystem, a collective in
the save's planning) must still end the start before its time limit does. Once a save
has ended (``save_ended``), the step or first-step bound counts from there, not from the
step before it.

``watchdog.stall_s: auto`` (the default) derives the bounds from the run's own times, which
each rank's heartbeat carries (launcher.runtime.heartbeats): until a rank has timed
AUTO_EARLY_STEPS steps, the task spec's initial bound (STALL_AUTO_INITIAL_S); then, until
a rank has timed AUTO_WARMUP_STEPS, an early bound: AUTO_EARLY_FACTOR times the slowest of
the first steps (the largest ``step_p99_s`` of the ranks that timed them: of so few steps,
their slowest), and at least ``watchdog.auto_floor_s``, so that a hang early in a fast run is
found in a small multiple of its first steps, or the floor, instead of the initial bound.
The first step itself (loading, compilation, the first collective) is never timed as a
step: the first-step bound judges it. From AUTO_WARMUP_STEPS on, AUTO_STALL_FACTOR times
the largest ``step_p99_s`` of the ranks that have (the 99th percentile of their recent
step times), and at least the floor. The watchdog polls at least every tenth of the bound,
so a hang is found within 1.1 x the bound (3 x p99 of a step once warm) plus the heartbeat
interval (the steps a rank made since it last wrote). A rank writes its heartbeat at the
beat that times its AUTO_EARLY_STEPS-th step, whatever its interval, so a rank that hangs
right after has left the times the early bound is taken from. A save's bound: SAVE_BOUND_FACTOR times the
longest last save of any rank (``save_s``), at least the floor; before any save was
measured, the fixed bound's save bound. :func:`bounds_in_force` is the decision, pure.

Slow nodes (:class:`SlowRanks`): every rank's heartbeat carries its busy time (``busy_s``,
the median of its recent ones: its step less what it waited for its peers, in
should_stop's collective and, where the runtime times them, in the training's own
gradient collectives: launcher.runtime.peerwaits). Each window (every rank has BUSY_WINDOW more busy times, or
WINDOW_S passed and every rank has WINDOW_MIN_STEPS more) compares each rank's busy time
with the median of its peers'; a rank above SLOW_RATIO (and at least SLOW_MIN_BEHIND_S
behind) in SLOW_WINDOWS windows running is slow, named with its node. Nothing is added to
the training loop: no collective, no I/O.

The bounds in force and the slow ranks go into the start's entry of run.json
(``watchdog``: {"state": "watching", "in_force": "first_step" | "stall", "first_step_s",
"watched_since", "stall_s", "bound_s", "save_bound_s", "basis", "step_p99_s", "save_s",
"slow": [{"rank", "node", "ratio", "busy_s", "peers_busy_s", "named_at"}]}; unwatched:
{"state": "off" | "not watched", "why", "slow": []}, no bound) when they
change (a bound by more than RECORD_CHANGE), so `glaunch status` shows them while the
start runs. With ``watchdog.slow_node: exclude`` the start's end adds a slow node to the
run's excluded nodes (launcher.jobcontrol.jobend), as for a node a crash points at; and where
the allocation holds a spare (``resources.spare_nodes``: a node in no step, left out by no
earlier restart; :func:`swap_for`), the watchdog does not wait for an end: it records
``swap`` ({"node", "rank", "spare", "asked_at"}) in the start's ``watchdog`` entry and
sends the ranks the stop signal of the time limit's warning (STOP_SIGNAL). They save and
stop, and jobend starts the next step in the allocation on the spare instead of the slow
node (reason ``slow node``: a graceful stop, which crash_retries does not count).

Then the watchdog writes hang.json (the start, the silent ranks and their nodes, the node
the hang points at), every rank's Python stack into ``logs/stack-JOB_RESTART_RANK.txt``,
and ends the step; the start's end (jobend, or the local loop) records reason ``hang`` and
requeues within ``crash_retries``.

The stacks (launcher.rundir.rankstacks): ``py-spy dump`` for a rank on this host when py-spy
is on PATH, else the faulthandler each rank registered at its start on SIGWINCH, which
reaches the ranks of every node through Slurm (``scancel --signal=28 JOB``: every step of
the job, not the batch script; the job controller runs scancel, outside any container:
:class:`SlurmSteps`) or, on the local scheduler, from localrun, their parent.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from launcher.processes import run_command
from launcher.rundir import registry
from launcher.rundir.files import RunError, atomic_write_text, read_json
from launcher.rundir.heartbeatrecord import BUSY_WINDOW, EARLY_STEPS, SAVING_STATES, checked_heartbeat
from launcher.rundir.layout import RunDir, name_part, read_heartbeat
from launcher.rundir.rankcontext import RuntimeConfigError, context
from launcher.rundir.rankstacks import Ranks, log, write_stacks
from launcher.rundir.records import (
    NOT_WATCHED,
    RecordError,
    StartRecord,
    State,
    free_spares,
    is_job_id,
    is_node_name,
)
from launcher.rundir.startsummary import iso, quantile
from launcher.rundir.taskspec import TaskSpec, TaskSpecError, read_task_spec
from launcher.jobcontrol.logprogress import LogProgress, beat_from_log

SAVE_BOUND_FACTOR = 4
SAVE_BOUND_MIN_S = 1800.0
AUTO_WARMUP_STEPS = 20
AUTO_EARLY_STEPS = EARLY_STEPS     # timed steps before the early bound: 3
# Three steps say less of a run than twenty: twice the warm factor over their slowest.
AUTO_EARLY_FACTOR = 5.0
# With the poll at a tenth of the bound: found within 2.75 x p99 after the heartbeat interval.
AUTO_STALL_FACTOR = 2.5
SLOW_RATIO = 1.3
# Nor is a rank slow by a few milliseconds a step: with busy times that small, the load of
# the machine alone (another process on a core) moves equal ranks past SLOW_RATIO.
SLOW_MIN_BEHIND_S = 0.01
SLOW_WINDOWS = 3
WINDOW_S = 60.0
WINDOW_MIN_STEPS = 3
MIN_POLL_S = 0.1
RECORD_CHANGE = 0.25      # a bound recorded again once it moved by more than this share
DONE_STATES = frozenset({"stopped", "finished"})
# The signal that asks the ranks to save and stop: the time limit's warning, which every
# rank handles (launcher.runtime.task.WARNING_SIGNAL; forwarded by torchrun's agent).
STOP_SIGNAL = signal.SIGUSR2
STEP_ID = re.compile(r"[0-9]{1,10}")      # a Slurm job step's number (isdigit() would take any script's digits)
# srun returns within seconds of its last task's exit, once every node's slurmstepd has said
# so. A step that outlives every rank's exit by this long (on the batch host's clock, from
# the poll that saw the last exit) waits for a slurmstepd that is gone (killed, or its
# node's slurmd restarted), or for a rank stuck in its teardown after its exit handlers:
# left alone, it holds the allocation to the time limit.
OUTLIVED_S = 30.0


# --- the decision: pure ---------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    stall_s: float              # with auto: the bound until the ranks have warmed up
    first_step_s: float
    auto: bool = False
    floor_s: float = 60.0       # auto's least bound
    slow_node: str = "report"   # watchdog.slow_node: report | exclude

    @property
    def off(self) -> bool:
        """watchdog.stall_s: 0 turns every bound off (auto's initial bound is never 0)."""
        return self.stall_s <= 0

    @property
    def save_s(self) -> float:
        return max(SAVE_BOUND_FACTOR * self.stall_s, SAVE_BOUND_MIN_S) if self.stall_s > 0 else 0.0

    @classmethod
    def of(cls, spec: TaskSpec) -> Limits:
        """The bounds the job was submitted with."""
        return cls(float(spec.watchdog_stall_s), float(spec.watchdog_first_step_s), spec.watchdog_stall_auto,
                   float(spec.watchdog_auto_floor_s), spec.watchdog_slow_node)


@dataclass(frozen=True)
class Bounds:
    """The bounds in force: fixed, auto's initial one, or auto's from the step times."""

    stall_s: float
    save_s: float
    first_step_s: float
    basis: str                          # fixed | initial | early | steps
    step_p99_s: float | None = None     # the largest of the ranks' p99 step times (early: their slowest)
    last_save_s: float | None = None    # the longest of the ranks' last saves

    def to_dict(self, auto: bool) -> dict[str, Any]:
        return {"stall_s": "auto" if auto else self.stall_s, "bound_s": round(self.stall_s, 3),
                "save_bound_s": round(self.save_s, 3), "basis": self.basis, "step_p99_s": self.step_p99_s,
                "save_s": self.last_save_s}


def bounds_in_force(records: Mapping[int, Mapping[str, Any]], limits: Limits) -> Bounds:
    """Pure: the bounds these heartbeats of one start call for (the module's docstring)."""
    if not limits.auto or limits.stall_s <= 0:
        return Bounds(limits.stall_s, limits.save_s, limits.first_step_s, "fixed")
    saves = [s for r in records.values() if (s := _seconds(r.get("save_s"))) is not None]
    last_save = max(saves, default=None)
    save = limits.save_s if last_save is None else max(limits.floor_s, SAVE_BOUND_FACTOR * last_save)
    warm = _slowest_p99(records, AUTO_WARMUP_STEPS)
    if warm is not None:
        return Bounds(max(limits.floor_s, AUTO_STALL_FACTOR * warm), save, limits.first_step_s, "steps", warm,
                      last_save)
    early = _slowest_p99(records, AUTO_EARLY_STEPS)
    if early is not None:
        return Bounds(max(limits.floor_s, AUTO_EARLY_FACTOR * early), save, limits.first_step_s, "early", early,
                      last_save)
    return Bounds(limits.stall_s, save, limits.first_step_s, "initial", None, last_save)


def _slowest_p99(records: Mapping[int, Mapping[str, Any]], least_steps: int) -> float | None:
    """The largest p99 step time of the ranks that timed at least `least_steps` steps. In
    step with each other, the ranks' times are alike: those that timed enough speak for all
    (a rank that writes every few seconds may not show its steps until after a hang)."""
    times = [p99 for r in records.values() if isinstance(r.get("steps_timed"), int)
             and r["steps_timed"] >= least_steps and (p99 := _seconds(r.get("step_p99_s"))) is not None]
    return max(times, default=None)


def armed_at(records: Mapping[int, Mapping[str, Any]]) -> float | None:
    """Pure: when the watch of this start began, from these heartbeats of it: the first
    rank's announcement (``announced_at``) or step, whichever came first; None while no
    rank has given either, and nothing may end the start."""
    times = [t for r in records.values() for key in ("announced_at", "first_time", "time")
             if (t := _seconds(r.get(key))) is not None]
    return min(times, default=None)


STALL_OFF = "watchdog.stall_s is 0"


def watch_entry(records: Mapping[int, Mapping[str, Any]], limits: Limits, bounds: Bounds) -> dict[str, Any]:
    """Pure: what the start's run.json entry says of the watch (what `glaunch status`
    shows): off, not watched and why, or the bound in force (the first step's until a
    rank has stepped) and those that follow; never a bound that is not enforced."""
    if limits.off:
        return {"state": "off", "why": STALL_OFF}
    since = armed_at(records)
    if since is None:
        return {"state": "not watched", "why": NOT_WATCHED}
    stepped = any(_step(r) is not None for r in records.values())
    return {"state": "watching", "in_force": "stall" if stepped else "first_step",
            "first_step_s": bounds.first_step_s, "watched_since": iso(since), **bounds.to_dict(limits.auto)}


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        return None
    return float(value)


def of_start(record: Mapping[str, Any] | None, job_id: str, restart: int) -> bool:
    """Whether `record` is a heartbeat of this start (a rank's file outlives its start)."""
    return (record is not None and str(record.get("job_id")) == str(job_id)
            and type(record.get("restart")) is int and record.get("restart") == restart)


def own_records(records: Iterable[Mapping[str, Any] | None], job_id: str, restart: int, *,
                world_size: int | None = None, now: float | None = None) -> dict[int, dict]:
    """The heartbeats of this start, by rank, each checked (heartbeatrecord.checked_heartbeat);
    one that fails its check is left out."""
    out: dict[int, dict] = {}
    for record in records:
        if record is not None and of_start(record, job_id, restart):
            try:
                checked = checked_heartbeat(record, world_size=world_size, now=now)
            except ValueError:
                continue
            out[checked["rank"]] = checked
    return out


@dataclass(frozen=True)
class Silent:
    rank: int
    node: str | None
    step: int | None
    last_step_at: float | None     # when it finished `step` (epoch seconds); None: no step yet

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "node": self.node, "step": self.step, "last_step_at": self.last_step_at}


@dataclass(frozen=True)
class Hang:
    kind: str                       # stall | first_step | save
    bound_s: float
    silent: tuple[Silent, ...]      # the ranks the hang points at (all of them, when none stands out)
    node: str | None                # the node it points at, when the silent ranks single one out
    ranks: int                      # ranks of the start
    stacks: list[str] = field(default_factory=list)
    unanswered: tuple[int, ...] = ()    # ranks that wrote no stack when asked, where others did

    def describe(self) -> str:
        what = {"stall": f"no rank finished a step for {self.bound_s:g} s",
                "first_step": f"no first step {self.bound_s:g} s after the runtime began",
                "save": f"a checkpoint save still running after {self.bound_s:g} s"}[self.kind]
        if len(self.silent) == self.ranks:
            steps = sorted({s.step for s in self.silent}, key=lambda s: -1 if s is None else s)
            where = "every rank silent" + (f" at step {steps[0]}" if len(steps) == 1 and steps[0] is not None else "")
        else:
            where = "silent: " + ", ".join(f"rank {s.rank}" + (f" on {s.node}" if s.node else "") for s in self.silent)
        if self.unanswered:
            listed = ", ".join(map(str, self.unanswered[:8])) + (" ..." if len(self.unanswered) > 8 else "")
            where += (f"; rank(s) {listed}" + (f" on {self.node}" if self.node else "")
                      + " wrote no stack when asked (stopped, or stuck in the kernel)")
        return f"{what} ({where})"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "bound_s": self.bound_s, "silent": [s.to_dict() for s in self.silent],
                "node": self.node, "stacks": list(self.stacks), "detail": self.describe()}


def unanswering_node(records: Mapping[int, Mapping[str, Any]],
                     answered: Iterable[int]) -> tuple[tuple[int, ...], str | None]:
    """Pure: after every rank of a hung start was asked for its stack, those that wrote none
    while others did (a process stopped, or stuck in the kernel, cannot answer; a rank
    merely waiting in a collective can), and their node where they all sit on one: the
    node the hang points at, when the heartbeats, all at one step, single out none."""
    answered = set(answered)
    quiet = tuple(sorted(rank for rank in records if rank not in answered))
    if not quiet or not answered & set(records):
        return (), None
    nodes = {records[rank].get("node") for rank in quiet}
    node = nodes.pop() if len(nodes) == 1 else None
    spans = {records[rank].get("node") for rank in records if rank not in quiet}
    return quiet, node if is_node_name(node) and node not in spans else None


def find_hang(records: Mapping[int, Mapping[str, Any]], *, now: float, started: float, limits: Limits,
              world_size: int | None = None, bounds: Bounds | None = None,
              recovering_at: float | None = None) -> Hang | None:
    """Pure: the hang these heartbeats of one start show at `now`, or None.

    `records`: each rank's last heartbeat of this start; `started`: when the start began;
    `world_size`: its ranks (a rank without a record has not reached its first step).
    Not judged before a rank announced itself or stepped (:func:`armed_at`): no evidence.
    Hung only when every rank is past its bound: a rank still stepping, or still within
    its first-step or save bound, means the start is alive. A rank that stopped or
    finished means the start is ending: not judged. `bounds`: those in force (default:
    :func:`bounds_in_force` of these records). `recovering_at`: when the ranks last asked
    for a lost rank's process (peer recovery under way): no stall within a bound of it.
    """
    if limits.off or any(_state(r) in DONE_STATES for r in records.values()):
        return None
    armed = armed_at(records)
    if armed is None:
        return None
    bounds = bounds_in_force(records, limits) if bounds is None else bounds
    if recovering_at is not None and now - recovering_at < bounds.stall_s:
        return None
    ranks = watched_ranks(records, world_size)
    kinds = set()
    for rank in ranks:
        record = records.get(rank, {})
        last = _seconds(record.get("time"))
        save_ended = _seconds(record.get("save_ended")) or 0.0
        if _state(record) in SAVING_STATES:
            since, bound, kind = _seconds(record.get("saving_since")) or last or started, bounds.save_s, "save"
        elif last is not None:
            since = max(last, save_ended) + (_seconds(record.get("interval_s")) or 0.0)
            bound, kind = bounds.stall_s, "stall"
        else:
            since, bound, kind = max(started, armed, save_ended), bounds.first_step_s, "first_step"
        if bound <= 0 or now - since < bound:
            return None
        kinds.add(kind)
    kind = next(k for k in ("save", "stall", "first_step") if k in kinds)
    bound = {"save": bounds.save_s, "stall": bounds.stall_s, "first_step": bounds.first_step_s}[kind]
    silent = silent_ranks(records, ranks)
    return Hang(kind, bound, silent, blamed_node(silent, records, len(ranks)), len(ranks))


def step_outlives_ranks(records: Mapping[int, Mapping[str, Any]], world_size: int | None) -> bool:
    """Pure: whether every rank of the start has exited (its record's ``exited``, which the
    exit handler of every rank under a launcher writes). A rank without a record, or whose
    record has no exit, may still run."""
    ranks = set(records) | set(range(world_size or 0))
    exits = [_seconds(records.get(rank, {}).get("exited")) for rank in ranks]
    return bool(exits) and all(exited is not None for exited in exits)


def watched_ranks(records: Mapping[int, Mapping[str, Any]], world_size: int | None) -> set[int]:
    """The ranks whose silence is evidence: every rank of the start, where the ranks report
    through the runtime; only those with a report of their own where the steps come from a
    script's log lines (entrypoint.progress gives rank 0's alone, and the others' silence
    says nothing)."""
    ranks = set(records) | set(range(world_size or 0))
    if not any(r.get("source") == "log" for r in records.values()):
        return ranks
    return {rank for rank in ranks if any(records.get(rank, {}).get(k) is not None for k in ("announced_at", "time"))}


def _state(record: Mapping[str, Any]) -> str | None:
    state = record.get("state")
    return state if isinstance(state, str) else None


def silent_ranks(records: Mapping[int, Mapping[str, Any]], ranks: Iterable[int]) -> tuple[Silent, ...]:
    """The ranks that fell behind: without a first step while others have one, or further
    behind the leading rank than their own writes could hide (a rank writes at most every
    interval_s, so up to interval_s / step_s steps, plus the one its peers may be ahead in
    a collective, may be missing from its file). When none stands out, every rank: peers
    waiting for a hung rank in a collective stop at its step, and only the stacks tell
    them apart."""
    ranks = sorted(ranks)
    steps = {r: _step(records.get(r, {})) for r in ranks}
    lead = max((s for s in steps.values() if s is not None), default=None)
    behind = [r for r in ranks if lead is not None and ((step := steps[r]) is None or step + _slack(records[r]) < lead)]
    out = []
    for rank in behind or ranks:
        record = records.get(rank, {})
        node = record.get("node")
        out.append(Silent(rank, node if is_node_name(node) else None, steps[rank], _seconds(record.get("time"))))
    return tuple(out)


def _step(record: Mapping[str, Any]) -> int | None:
    step = record.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) and record.get("time") is not None else None


def _slack(record: Mapping[str, Any]) -> float:
    """Steps a rank may have made since it last wrote its heartbeat, plus one."""
    interval, step_s = _seconds(record.get("interval_s")) or 0.0, _seconds(record.get("step_s"))
    steps = interval / step_s if step_s else math.inf
    return 1 + math.ceil(steps) if math.isfinite(steps) else math.inf


def blamed_node(silent: tuple[Silent, ...], records: Mapping[int, Mapping[str, Any]], ranks: int) -> str | None:
    """The node a hang points at: the one node of the silent ranks, when they are not every
    rank (a hang of all ranks alike points at no node)."""
    nodes = {s.node for s in silent}
    if len(silent) == ranks or len(nodes) != 1 or None in nodes:
        return None
    (node,) = nodes
    if all(r.get("node") == node for r in records.values()) and len(records) == ranks:
        return None       # every rank is on that node: nothing singles it out
    return node


# --- slow ranks ---------------------------------------------------------------------------------


def busy_ratios(busy: Mapping[int, float]) -> dict[int, float]:
    """Pure: each rank's busy time over the median of its peers' (no ratio where the peers
    were not busy at all)."""
    out = {}
    for rank, mine in busy.items():
        peers = sorted(v for r, v in busy.items() if r != rank)
        peer = quantile(peers, 0.5) if peers else 0.0
        if peer > 0:
            out[rank] = mine / peer
    return out


@dataclass(frozen=True)
class SlowRank:
    rank: int
    node: str | None
    ratio: float             # its busy time over its peers' median, in the window that named it
    busy_s: float
    peers_busy_s: float
    named_at: float          # epoch seconds

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "node": self.node, "ratio": round(self.ratio, 3), "busy_s": self.busy_s,
                "peers_busy_s": round(self.peers_busy_s, 6), "named_at": iso(self.named_at)}


class SlowRanks:
    """The ranks of one start whose busy time stays above their peers' (the module's
    docstring): fed every poll's heartbeats, it judges once per window."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}       # each rank's busy_count when the last window closed
        self.window_began: float | None = None
        self.streak: dict[int, int] = {}       # windows running a rank was above SLOW_RATIO
        self.named: dict[int, SlowRank] = {}

    def observe(self, records: Mapping[int, Mapping[str, Any]], now: float) -> bool:
        """Whether a rank was named slow now."""
        busy: dict[int, tuple[float, int]] = {}
        for rank, record in records.items():
            value, count = _seconds(record.get("busy_s")), record.get("busy_count")
            if value is not None and type(count) is int:
                busy[rank] = (value, count)
        if len(busy) < 2 or len(busy) < len(records):
            return False
        if self.window_began is None:
            self.window_began = now
        grown = min(count - self.counts.get(rank, 0) for rank, (_, count) in busy.items())
        if grown < BUSY_WINDOW and not (grown >= WINDOW_MIN_STEPS and now - self.window_began >= WINDOW_S):
            return False
        self.counts = {rank: count for rank, (_, count) in busy.items()}
        self.window_began = now
        times = {rank: value for rank, (value, _) in busy.items()}
        named = False
        for rank, ratio in busy_ratios(times).items():
            behind = times[rank] - times[rank] / ratio      # its busy time past its peers' median
            slow = ratio > SLOW_RATIO and behind >= SLOW_MIN_BEHIND_S
            self.streak[rank] = self.streak.get(rank, 0) + 1 if slow else 0
            if self.streak[rank] >= SLOW_WINDOWS and rank not in self.named:
                node = records[rank].get("node")
                self.named[rank] = SlowRank(rank, node if is_node_name(node) else None, ratio, times[rank],
                                            times[rank] / ratio, now)
                named = True
        return named

    def to_list(self) -> list[dict[str, Any]]:
        return [self.named[rank].to_dict() for rank in sorted(self.named)]


def swap_for(slow: Iterable[SlowRank], *, allocation: Sequence[str], in_use: Sequence[str],
             left_out_before: Iterable[str]) -> tuple[SlowRank, str] | None:
    """Pure: (the slow rank whose node to leave out now, the spare that takes its place),
    the first one named on a node of this step, when the allocation holds a node that is in
    no step and that no earlier restart left out; else None. The spare is the one jobend's
    restart_in_allocation takes: the first in the allocation's order."""
    spares = free_spares(allocation, in_use, left_out_before)
    named = [s for s in sorted(slow, key=lambda s: (s.named_at, s.rank)) if s.node in in_use]
    return (named[0], spares[0]) if spares and named else None


# --- the watch ---------------------------------------------------------------------------------


class Watch:
    """One start's watch: `check` reads the heartbeats, `act` handles a hang. The bounds
    and the number of ranks are the job's task.json's unless given."""

    def __init__(self, run_dir: str | os.PathLike[str], job_id: str, restart: int, *, limits: Limits | None = None,
                 world_size: int | None = None, started: float | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.run_dir = Path(run_dir)
        self.job_id, self.restart = str(job_id), restart
        self.limits, self.world_size = limits, world_size
        self.clock = clock
        self.started = clock() if started is None else started
        self.records: dict[int, dict] = {}
        self.bounds: Bounds | None = None
        self.slow = SlowRanks()
        self.noted: dict[str, Any] | None = None     # what run.json says of this watch
        self.hang: Hang | None = None
        self.swap: dict[str, Any] | None = None     # the slow node this watch stopped the start to leave out
        self.left_out: list[str] | None = None     # the nodes earlier restarts in this allocation left out
        self.said: dict[Path, str] = {}     # each skipped file's problem, said once (not at every poll)
        self.unread = False                 # task.json could not be read: off, and nothing to record
        self.progress: LogProgress | None = None    # entrypoint.progress: rank 0's log, followed
        self.progress_total: int | None = None
        self.exits_seen: float | None = None    # when a poll first saw every rank of the start exited
        if self.limits is None:
            self._read_spec()

    def _read_spec(self) -> None:
        try:
            spec = read_task_spec(self.run_dir)
        except TaskSpecError as exc:
            log(f"off: {exc}")
            self.limits, self.unread = Limits(0, 0), True
            return
        self.limits = Limits.of(spec)
        self.world_size = self.world_size or spec.world_size
        if spec.progress_pattern is not None:
            # Task 0 is rank 0 under srun, and node 0's agent (its workers' output) under torchrun.
            log_file = RunDir(self.run_dir).task_log(self.job_id, 0)
            self.progress = LogProgress.following(log_file, spec.progress_pattern)
            self.progress_total = spec.progress_total

    def check(self) -> Hang | None:
        self.follow_log()
        if self.limits is None:
            return None
        if self.limits.off:
            if not self.unread:
                self._note({})
            return None
        now = self.clock()
        self.records = self._read_records(now)
        self.bounds = bounds_in_force(self.records, self.limits)
        self.slow.observe(self.records, now)
        self._note(self.records)
        return find_hang(self.records, now=now, started=self.started, limits=self.limits,
                         world_size=self.world_size, bounds=self.bounds, recovering_at=self._recovering_at())

    def _read_records(self, now: float) -> dict[int, dict[str, Any]]:
        """This start's heartbeats, each checked (one that is not is said once, and skipped)."""
        records: dict[int, dict[str, Any]] = {}
        for rank, path in RunDir(self.run_dir).heartbeats():
            record = read_heartbeat(path)
            if record is None or not of_start(record, self.job_id, self.restart):
                continue
            try:
                checked = checked_heartbeat(record, world_size=self.world_size, now=now)
                if checked["rank"] != rank:
                    raise ValueError(f"it names rank {checked['rank']}")
            except ValueError as exc:
                self._say_once(path, f"{path} skipped: {exc}")
                continue
            records[rank] = checked
        return records

    def outlived_s(self) -> float | None:
        """How long the step has outlived every rank of this start (step_outlives_ranks),
        from the records :meth:`check` read, or, with the watch off, read now: counted on
        this host's clock from the poll that first saw every exit (a node's clock may be
        off), and said once OUTLIVED_S have passed; else None."""
        now = self.clock()
        records = self._read_records(now) if self.off else self.records
        if not step_outlives_ranks(records, self.world_size):
            self.exits_seen = None
            return None
        if self.exits_seen is None:
            self.exits_seen = now
        waited = now - self.exits_seen
        return waited if waited >= OUTLIVED_S else None

    def _recovering_at(self) -> float | None:
        """When a rank of this start last asked for a lost rank's process (peer-replace/)."""
        prefix = f"{name_part(self.job_id)}_{self.restart}_"
        try:
            times = [path.stat().st_mtime for path in RunDir(self.run_dir).peer_replace_dir.iterdir()
                     if path.name.startswith(prefix)]
        except OSError:
            return None
        return max(times, default=None)

    def follow_log(self) -> None:
        """With entrypoint.progress: rank 0's newest step from its log into its heartbeat
        (launcher.jobcontrol.logprogress), which the checks below then read as a beat."""
        if self.progress is None:
            return
        now = self.clock()
        self.progress.poll(now)
        beat_from_log(RunDir(self.run_dir).heartbeat(0), self.progress, self.progress_total, now=now,
                      start={"job_id": self.job_id, "restart": self.restart, "world_size": self.world_size})

    def _note(self, records: Mapping[int, Mapping[str, Any]]) -> None:
        """What the watch is (watch_entry: off, not watched, the bounds in force) and the
        slow ranks into this start's entry of run.json, when they changed (a bound by more
        than RECORD_CHANGE)."""
        if self.limits is None:
            return
        bounds = self.bounds or bounds_in_force(records, self.limits)
        entry = {**watch_entry(records, self.limits, bounds), "slow": self.slow.to_list(),
                 **({"swap": self.swap} if self.swap else {})}
        if not _changed(self.noted, entry):
            return
        set_watch_entry(self.run_dir, self.job_id, self.restart, entry)
        known = {s["rank"] for s in (self.noted or {}).get("slow") or []}
        for slow in entry["slow"]:
            if slow["rank"] not in known:
                log(f"rank {slow['rank']}" + (f" on {slow['node']}" if slow["node"] else "")
                    + f" is slow: busy {slow['busy_s']:g} s a step, its peers {slow['peers_busy_s']:g} s")
        self.noted = entry

    def _say_once(self, path: Path, message: str) -> None:
        # By the field at fault: a time ahead of the clock reads differently at each poll.
        field = message.removeprefix(f"{path} skipped: ").split(" ", 1)[0]
        if self.said.get(path) != field:
            self.said[path] = field
            log(message)

    @property
    def off(self) -> bool:
        return self.limits is None or self.limits.off

    @property
    def follows_log(self) -> bool:
        """Whether rank 0's log gives the steps (entrypoint.progress): followed, watched or not."""
        return self.progress is not None

    def poll_s(self) -> float:
        limits = self.bounds or self.limits
        bounds = [b for b in (limits.stall_s, limits.first_step_s) if b > 0] if limits else []
        if self.limits is not None and self.limits.auto and self.limits.floor_s > 0 and (
                self.bounds is None or self.bounds.basis in ("initial", "early")):
            # Until warm-up the early bound may come into force at any beat, as low as the floor.
            bounds.append(self.limits.floor_s)
        return min([5.0] + [max(b / 10, MIN_POLL_S) for b in bounds])

    def swap_due(self, allocation: Sequence[str], in_use: Sequence[str]) -> tuple[SlowRank, str] | None:
        """With watchdog.slow_node: exclude, once a start: a slow rank's node to leave for
        a spare of the allocation now (swap_for), or None."""
        if (self.swap is not None or self.limits is None or self.limits.slow_node != "exclude" or not self.slow.named
                or not allocation):
            return None
        if self.left_out is None:     # what earlier restarts left out does not change while this start runs
            try:
                self.left_out = registry.read(self.run_dir).left_out_in_allocation(self.job_id, self.restart)
            except (OSError, RunError, RecordError, ValueError) as exc:
                log(f"no swap for a slow node: run.json not read: {exc}")
                return None
        return swap_for(self.slow.named.values(), allocation=allocation, in_use=in_use, left_out_before=self.left_out)

    def ask_swap(self, slow: SlowRank, spare: str, ranks: Ranks) -> None:
        """Record the swap in run.json (the start's end reads it there), then ask every rank
        to save and stop."""
        self.swap = {"node": slow.node, "rank": slow.rank, "spare": spare, "asked_at": iso(self.clock())}
        log(f"rank {slow.rank} on {slow.node} is slow and {spare} is a spare: the ranks save and stop, and the "
            f"next step runs on {spare} instead")
        self._note(self.records)
        ranks.signal(STOP_SIGNAL)

    def act(self, hang: Hang, ranks: Ranks) -> Hang:
        """Record the hang, write the stacks, end the step."""
        log(f"start {self.restart} of job {self.job_id} hangs: {hang.describe()}; writing every rank's stack "
            "and ending the step")
        detected = iso(self.clock())    # not when the stacks, which take a second or more, are written
        self._record(hang, detected)
        try:
            stacks = write_stacks(self.run_dir, self.job_id, self.restart, self.records, ranks)
        finally:
            ranks.end()
        rank_of = {RunDir(self.run_dir).stack_file(self.job_id, self.restart, rank).name: rank for rank in self.records}
        answered = [rank_of[name] for name in map(os.path.basename, stacks) if name in rank_of]
        # Only where the heartbeats single out no node: the hang's node is then the quiet ranks'.
        quiet, node = unanswering_node(self.records, answered) if hang.node is None else ((), None)
        self.hang = Hang(hang.kind, hang.bound_s, hang.silent, hang.node or node, hang.ranks, stacks, quiet)
        self._record(self.hang, detected)
        return self.hang

    def _record(self, hang: Hang, detected: str | None) -> None:
        record = {"job_id": self.job_id, "restart": self.restart, "detected_at": detected, **hang.to_dict()}
        try:
            atomic_write_text(RunDir(self.run_dir).hang_file, json.dumps(record) + "\n")
        except OSError as exc:
            log(f"hang.json not written: {exc.strerror or exc}")


def _changed(noted: Mapping[str, Any] | None, entry: Mapping[str, Any]) -> bool:
    if noted is None or any(noted.get(k) != entry.get(k)
                            for k in ("state", "in_force", "first_step_s", "basis", "slow", "stall_s", "swap")):
        return True
    return any(k in entry and abs(float(entry[k]) - float(noted[k])) > RECORD_CHANGE * float(noted[k])
               for k in ("bound_s", "save_bound_s"))


def set_watch_entry(run_dir: str | os.PathLike, job_id: str, restart: int, entry: Mapping[str, Any]) -> None:
    """The start's `watchdog` entry in run.json (said, not raised, where it cannot be written)."""
    try:
        with registry.updating(Path(run_dir)) as record:
            start = record.start(job_id, restart)
            if start is None:       # a requeued start: its entry is made by its end, or here
                start = record.record_start(job_id, restart, state=State.RUNNING.value)
            start.set("watchdog", dict(entry))
    except (OSError, RunError, RecordError) as exc:
        log(f"run.json not updated: {exc}")


def note_failed(run_dir: str | os.PathLike, job_id: str, restart: int, error: str) -> None:
    """Record in the start's run.json entry that its watchdog failed (a defect of its own,
    `error`): `status` then says the start is not watched, and why, where it would otherwise
    show nothing at all."""
    set_watch_entry(run_dir, job_id, restart, {"state": "off", "why": f"the watchdog failed ({error[:200]})",
                                               "slow": []})


def hang_in(run_dir: str | os.PathLike, restart: int) -> dict | None:
    """hang.json, if the watchdog wrote it for this start; None also when it is not a
    record the watchdog writes (it reaches run.json and the requeue's choice of node)."""
    hang = read_json(RunDir(run_dir).hang_file)
    if hang is None or type(hang.get("restart")) is not int or hang.get("restart") != restart:
        return None
    problem = hang_problem(hang)
    if problem is not None:
        log(f"{RunDir(run_dir).hang_file} ignored: {problem}")
        return None
    return hang


HANG_KINDS = ("stall", "first_step", "save")
MAX_DETAIL = 4096


def swap_asked(start: StartRecord | None) -> dict[str, Any] | None:
    """The swap this start's watchdog asked for (its run.json entry's ``watchdog.swap``), if
    it names a node."""
    watch = start.get("watchdog") if start is not None else None
    swap = watch.get("swap") if isinstance(watch, Mapping) else None
    return dict(swap) if isinstance(swap, Mapping) and is_node_name(swap.get("node")) else None


def hang_problem(hang: Mapping[str, Any]) -> str | None:
    """Pure: which field of a hang.json is not as the watchdog writes it, or None. A field
    left out reads as not known."""
    checks: dict[str, Callable[[Any], bool]] = {
        "kind": lambda v: isinstance(v, str) and v in HANG_KINDS,
        "bound_s": lambda v: _seconds(v) is not None,
        "node": is_node_name,
        "detail": lambda v: isinstance(v, str) and len(v) <= MAX_DETAIL,
        "detected_at": lambda v: isinstance(v, str) and len(v) <= 64,
        "stacks": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
        "silent": lambda v: isinstance(v, list) and all(_silent_ok(x) for x in v),
    }
    bad = next((name for name, ok in checks.items() if hang.get(name) is not None and not ok(hang[name])), None)
    return None if bad is None else f"{bad} is {_shown(hang.get(bad))}"


def _silent_ok(entry: object) -> bool:
    if not isinstance(entry, dict):
        return False
    rank, step, node = entry.get("rank"), entry.get("step"), entry.get("node")
    return (type(rank) is int and rank >= 0 and (step is None or type(step) is int)
            and (node is None or is_node_name(node))
            and (entry.get("last_step_at") is None or _seconds(entry.get("last_step_at")) is not None))


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- Slurm: the batch host's watchdog ----------------------------------------------------------


class SlurmSteps:
    """The ranks of a Slurm job's steps, reached through scancel: ``cancel`` runs it with
    the arguments given (the job controller's, on the batch host, outside any container).
    A signal reaches every step of the job, not the batch script (scancel without
    --full); an end is SIGKILL to one step."""

    def __init__(self, job_id: str, records: Callable[[], Mapping[int, Mapping[str, Any]]],
                 cancel: Callable[[list[str]], object]) -> None:
        self.job_id, self.records, self.cancel = job_id, records, cancel

    def signal(self, signum: int) -> None:
        # By number: Slurm 22.05's scancel knows no WINCH by name.
        self.cancel([f"--signal={int(signum)}", self.job_id])

    def end(self) -> None:
        steps = {r["job_step"] for r in self.records().values()
                 if isinstance(r.get("job_step"), str) and STEP_ID.fullmatch(r["job_step"])}
        for step in sorted(steps or self._steps(), key=int):
            self.cancel(["--signal=KILL", f"{self.job_id}.{step}"])

    def _steps(self) -> set[str]:
        """The job's steps, when the ranks' heartbeats do not name theirs (squeue; nothing
        where it is absent). The batch script is no numbered step."""
        text = run_command(["squeue", "--steps", "--noheader", "--format=%i", f"--jobs={self.job_id}"],
                           say=log) or ""
        return {step for line in text.split() if STEP_ID.fullmatch(step := line.rpartition(".")[2])}


def scancel(args: list[str]) -> bool:
    """scancel with these arguments, bounded (processes.run_command); False when it failed."""
    return run_command(["scancel", *args], say=log) is not None


def watch_slurm(run_dir: str, *, stop: Callable[[], bool], allocation: Sequence[str] = (),
                in_use: Sequence[str] = (), cancel: Callable[[list[str]], object] = scancel,
                end_step: Callable[[], None] | None = None) -> int:
    """Watch this start's step until `stop()`: end it when it hangs; with slow_node: exclude,
    stop it to swap a slow node of `in_use` (the step's nodes) for a spare of `allocation`
    (the job's nodes; empty: no restart in the allocation, so no swap). `cancel` runs
    scancel (the job controller's, in the same process). `end_step` ends the step where it
    outlives every rank's exit (step_outlives_ranks), the watch off or on: srun then waits
    for a slurmstepd that will never answer."""
    try:
        ctx = context()
    except RuntimeConfigError as exc:
        log(f"off: {exc}")
        return 0
    slurm_job = os.environ.get("SLURM_JOB_ID")
    if slurm_job is None or not ctx.job_id:
        log("no Slurm job to watch (SLURM_JOB_ID or GLAUNCH_JOB_ID is not set): watchdog off")
        return 0
    if not is_job_id(slurm_job):
        log(f"SLURM_JOB_ID={_shown(slurm_job)} is not a Slurm job id: watchdog off")
        return 0
    watch = Watch(run_dir, ctx.job_id, ctx.restart)
    while not stop():
        hang = watch.check()
        if end_step is not None and (outlived := watch.outlived_s()) is not None:
            log(f"every rank of start {watch.restart} has exited (seen {outlived:.0f} s ago), and its step still "
                "runs (a node's slurmstepd is gone, or a rank is stuck after its exit): ending the step")
            end_step()
            return 0
        if watch.off and not watch.follows_log and end_step is None:
            return 0
        if hang is not None:
            watch.act(hang, SlurmSteps(slurm_job, lambda: watch.records, cancel))
            return 0
        swap = watch.swap_due(allocation, in_use)
        if swap is not None:
            # Watching goes on: a stop that hangs is a hang, bounded as a save.
            watch.ask_swap(*swap, SlurmSteps(slurm_job, lambda: watch.records, cancel))
        _sleep(watch.poll_s(), stop)
    # One last look as the step ends (never acted on): the lines rank 0 printed since the last
    # poll, and the watch as it stood, so that a start shorter than a poll, whose first look
    # came before any rank had beaten, is not recorded as one no rank let be watched.
    watch.check()
    return 0


def _sleep(seconds: float, stop: Callable[[], bool]) -> None:
    deadline = time.monotonic() + seconds
    while not stop() and time.monotonic() < deadline:
        time.sleep(min(0.5, seconds))
