"""A rank that holds its peers, under peer recovery (``recovery.peer: true``): hung in its own
work (a data loader that never returns, a read that blocks) while every other rank waits for
it in the step's collective. Nothing raises, so no recovery begins; without this the hang
watchdog would end the whole step at its bound, and the start would restart from a
checkpoint.

Each rank runs a thread (:class:`HoldWatch`, polling every POLL_S):

- While a collective of its own has waited longer than MARK_AFTER_S, the rank says so in
  ``peer-wait/JOB_RESTART_RANK.json`` of the run directory (the group's generation and since
  when, on its clock's epoch), removed once nothing waits.
- A rank with no collective pending (rank 0 too: the rendezvous store is in a process of
  its own, launcher.runtime.peerstore), inside a step that has run for half the hang bound
  in force (the watchdog's ``bound_s`` in this start's entry of run.json, read only once
  the step has run MARK_AFTER_S) and not saving, that finds a peer's mark of this
  generation as old, is one they wait for: a step's collectives need every rank, so a rank
  in none of them holds every rank waiting in one. It says so in its log and ends its own
  process. Its peers' collectives raise at once, and its process is started again as any
  lost process is (launcher.runtime.peer), losing at most the step in flight (two ranks
  hung at once: both end themselves, both are started again). Half the
  bound: the recovery has the other half before the watchdog would end the step, and a
  peer-replace request of the start postpones the watchdog (launcher.jobcontrol.watchdog).

The decision is pure (:func:`holds_peers`); the thread only reads files and the group's
pending collectives. Nothing is added to the step: no collective, no file written while
collectives complete within MARK_AFTER_S. A rank hung with the interpreter's lock held
cannot run the thread: the watchdog's bound ends such a start, as before.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from launcher.rundir.files import atomic_write_text, read_json
from launcher.rundir.layout import RunDir
from launcher.rundir.rankcontext import RankContext, log

POLL_S = 1.0
# A collective waiting this long is marked, and a step running this long is looked at: below
# it, nothing is read or written (a straggler's waits are shorter than any hang bound's half).
MARK_AFTER_S = 10.0
# The exit status of a process that ended itself for holding its peers.
HELD_PEERS_EXIT = 75
# run.json is read again at most this often (the bound moves slowly).
BOUND_READ_S = 10.0


@dataclass(frozen=True)
class Mark:
    rank: int
    generation: int
    since: float        # epoch seconds


def holds_peers(rank: int, world_size: int, generation: int, marks: Mapping[int, Mark], *, now: float,
                bound_s: float | None, pending: bool, in_step: bool, saving: bool) -> bool:
    """Pure: whether rank `rank` is one its peers wait for (the module's docstring): not
    waiting itself, inside a step and not saving, a bound in force, and a peer marked
    waiting in this generation for at least half the bound."""
    if pending or not in_step or saving or not bound_s or bound_s <= 0 or world_size < 2:
        return False
    return bool(waited_long(rank, world_size, generation, marks, now=now, bound_s=bound_s))


def waited_long(rank: int, world_size: int, generation: int, marks: Mapping[int, Mark], *, now: float,
                bound_s: float) -> list[Mark]:
    """Pure: the marks of `rank`'s peers waiting in this generation for at least half the bound."""
    return [mark for r in range(world_size) if r != rank and (mark := marks.get(r)) is not None
            and mark.generation == generation and now - mark.since >= bound_s / 2]


def mark_of(data: Mapping[str, Any] | None, rank: int, job_id: str, restart: int) -> Mark | None:
    """Pure: a peer-wait file's mark, where it is this start's and well formed."""
    if data is None or str(data.get("job_id")) != str(job_id) or data.get("restart") != restart:
        return None
    generation, since = data.get("generation"), data.get("since")
    if type(generation) is not int or not isinstance(since, (int, float)) or isinstance(since, bool):
        return None
    return Mark(rank, generation, float(since))


def bound_in_force(run_dir: str, job_id: str, restart: int) -> float | None:
    """The watchdog's stall bound in force for this start (run.json), or None when it
    watches no steps (off, not watched, before the first step)."""
    record = read_json(RunDir(run_dir).run_file) or {}
    for start in record.get("starts") or []:
        if isinstance(start, dict) and str(start.get("job_id")) == str(job_id) and start.get("restart") == restart:
            watch = start.get("watchdog")
            if isinstance(watch, dict) and watch.get("state") == "watching" and watch.get("in_force") == "stall":
                bound = watch.get("bound_s")
                if isinstance(bound, (int, float)) and not isinstance(bound, bool) and bound > 0:
                    return float(bound)
    return None


class HoldWatch:
    """The thread of the module's docstring for one rank. `group`: the PeerGroup
    (``waiting_since()``, ``generation``); `step_began`: when (time.monotonic()) the step the
    loop is in began, None outside a step; `end`: how the process ends (os._exit; replaced
    in tests)."""

    def __init__(self, ctx: RankContext, group: Any, step_began: Callable[[], float | None],
                 end: Callable[[int], None] = os._exit) -> None:
        self.ctx, self.group, self.step_began, self.end = ctx, group, step_began, end
        self.run_dir = str(ctx.run_dir)
        self.job_id, self.restart = str(ctx.job_id), int(ctx.restart)
        self.own = RunDir(self.run_dir).peer_wait(self.job_id, self.restart, ctx.rank)
        self.marked = False
        self.bound: tuple[float, float | None] | None = None     # (read at, bound)
        self.stopped = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, name="glaunch-peer-hold", daemon=True).start()

    def _run(self) -> None:
        while not self.stopped.wait(POLL_S):
            try:
                self.poll(time.monotonic(), time.time())
            except Exception as exc:   # never the run's failure: the watchdog stays the bound
                log(f"peer recovery: the watch of held peers stopped: {type(exc).__name__}: {exc}")
                return

    def poll(self, mono: float, now: float) -> None:
        waiting = self.group.waiting_since()
        if waiting is not None and mono - waiting >= MARK_AFTER_S:
            if not self.marked:
                self._mark(now - (mono - waiting))
            return
        if self.marked:
            self._unmark()
        began = self.step_began()
        if waiting is not None or began is None or mono - began < MARK_AFTER_S:
            return          # not in a step that runs long: nothing is read
        bound = self._bound(mono)
        if bound is None or mono - began < bound / 2:
            return
        from launcher.runtime import heartbeats
        from launcher.rundir.heartbeatrecord import SAVING_STATES

        marks = self._marks()
        saving = heartbeats.current().state in SAVING_STATES
        if holds_peers(self.ctx.rank, self.ctx.world_size, self.group.generation, marks, now=now, bound_s=bound,
                       pending=False, in_step=True, saving=saving):
            waiting = waited_long(self.ctx.rank, self.ctx.world_size, self.group.generation, marks, now=now,
                                  bound_s=bound)
            oldest = min(mark.since for mark in waiting)
            ranks = ", ".join(str(mark.rank) for mark in waiting)
            log(f"peer recovery: rank(s) {ranks} have waited {now - oldest:.0f} s for this rank in its step "
                f"(half the hang bound of {bound:g} s): this rank is hung; ending its process so that its "
                "peers recover it")
            self.end(HELD_PEERS_EXIT)

    def _mark(self, since: float) -> None:
        data = {"job_id": self.job_id, "restart": self.restart, "rank": self.ctx.rank,
                "generation": self.group.generation, "since": since}
        try:
            self.own.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.own, json.dumps(data) + "\n")
            self.marked = True
        except OSError as exc:
            log(f"peer recovery: {self.own} not written: {exc.strerror or exc}")

    def _unmark(self) -> None:
        self.marked = False
        try:
            self.own.unlink()
        except OSError:
            pass

    def _marks(self) -> dict[int, Mark]:
        layout = RunDir(self.run_dir)
        found = {}
        for rank in range(self.ctx.world_size):
            if rank == self.ctx.rank:
                continue
            mark = mark_of(read_json(layout.peer_wait(self.job_id, self.restart, rank)), rank, self.job_id,
                           self.restart)
            if mark is not None:
                found[rank] = mark
        return found

    def _bound(self, mono: float) -> float | None:
        if self.bound is None or mono - self.bound[0] >= BOUND_READ_S:
            self.bound = (mono, bound_in_force(self.run_dir, self.job_id, self.restart))
        return self.bound[1]
