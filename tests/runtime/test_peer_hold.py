"""A rank hung in its own work while every peer waits for it (recovery.peer): the decision
that it is the one they wait for (launcher.runtime.peerhold.holds_peers), the marks the
waiting ranks leave, the bound read from run.json, and the thread's poll, which marks a
long wait, reads nothing while steps are short, and ends only the rank that holds its
peers. The live case is test_peer_recovery's hung rank."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from launcher.rundir.layout import RunDir
from launcher.runtime import peerhold
from launcher.runtime.peerhold import HELD_PEERS_EXIT, MARK_AFTER_S, HoldWatch, Mark, holds_peers, mark_of

NOW = 1_800_000_000.0


def marks(*ranks: int, age: float = 40.0, generation: int = 0) -> dict[int, Mark]:
    return {r: Mark(r, generation, NOW - age) for r in ranks}


@pytest.mark.parametrize("rank, world, found, bound, pending, in_step, saving, held", [
    (3, 4, marks(0, 1, 2), 60.0, False, True, False, True),             # every peer waited half the bound
    (3, 4, marks(0, 1, 2, age=29.0), 60.0, False, True, False, False),  # not yet half the bound
    (3, 4, marks(0, 1), 60.0, False, True, False, True),                # rank 2 waits for nothing too: both hold
    (3, 4, marks(1), 60.0, False, True, False, True),                   # three waiting for nothing: each holds
    (3, 4, {}, 60.0, False, True, False, False),                        # nobody waits for it
    (3, 4, marks(0, 1, 2, generation=1), 60.0, False, True, False, False),   # marks of another generation
    (0, 2, marks(1), 60.0, False, True, False, True),                   # rank 0 too: the store is not in it
    (1, 2, marks(0), 60.0, True, True, False, False),                   # it waits in a collective itself
    (1, 2, marks(0), 60.0, False, False, False, False),                 # outside a step (a recovery, an eval)
    (1, 2, marks(0), 60.0, False, True, True, False),                   # saving: the save's own bound holds
    (1, 2, marks(0), None, False, True, False, False),                  # no bound in force (off, not watched)
    (1, 1, {}, 60.0, False, True, False, False),                        # alone
])
def test_a_rank_holds_its_peers_only_when_a_peer_waits_for_it_half_a_bound(rank, world, found, bound, pending,
                                                                           in_step, saving, held):
    assert holds_peers(rank, world, 0, found, now=NOW, bound_s=bound, pending=pending, in_step=in_step,
                       saving=saving) is held


@pytest.mark.parametrize("data, expected", [
    ({"job_id": "7", "restart": 0, "generation": 2, "since": NOW}, Mark(1, 2, NOW)),
    ({"job_id": "8", "restart": 0, "generation": 2, "since": NOW}, None),        # another job's
    ({"job_id": "7", "restart": 1, "generation": 2, "since": NOW}, None),        # another start's
    ({"job_id": "7", "restart": 0, "generation": "2", "since": NOW}, None),
    ({"job_id": "7", "restart": 0, "generation": 2, "since": True}, None),
    (None, None),
])
def test_a_mark_is_read_only_where_it_is_this_start_s_and_well_formed(data, expected):
    assert mark_of(data, 1, "7", 0) == expected


def write_run(run_dir, watch):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(json.dumps({"starts": [{"job_id": "7", "restart": 0, "watchdog": watch}]}))


@pytest.mark.parametrize("watch, bound", [
    ({"state": "watching", "in_force": "stall", "bound_s": 60.0}, 60.0),
    ({"state": "watching", "in_force": "first_step", "bound_s": 1800.0}, None),
    ({"state": "off"}, None),
    ({"state": "watching", "in_force": "stall", "bound_s": "60"}, None),
])
def test_the_bound_is_the_watchdog_s_stall_bound_in_force(tmp_path, watch, bound):
    write_run(tmp_path, watch)
    assert peerhold.bound_in_force(str(tmp_path), "7", 0) == bound


class Group:
    def __init__(self, waiting):
        self.waiting, self.generation = waiting, 0

    def waiting_since(self):
        return self.waiting


def watch(tmp_path, rank, world, group, began):
    ctx = SimpleNamespace(run_dir=str(tmp_path), job_id="7", restart=0, rank=rank, world_size=world)
    ended: list[int] = []
    return HoldWatch(ctx, group, lambda: began, end=ended.append), ended


def test_a_long_wait_is_marked_and_unmarked_and_the_rank_they_wait_for_ends_itself(tmp_path):
    write_run(tmp_path, {"state": "watching", "in_force": "stall", "bound_s": 60.0})
    mono = 1000.0
    waiting, waiter_ended = watch(tmp_path, 0, 2, Group(mono - MARK_AFTER_S - 30), None)
    waiting.poll(mono, NOW)
    mark = json.loads(RunDir(tmp_path).peer_wait("7", 0, 0).read_text())
    assert (mark["generation"], mark["since"]) == (0, pytest.approx(NOW - MARK_AFTER_S - 30))

    # Rank 1, in its step for 45 s, waiting for nothing: it is the one rank 0 waits for.
    hung, ended = watch(tmp_path, 1, 2, Group(None), mono - 45)
    hung.poll(mono, NOW)
    assert ended == [HELD_PEERS_EXIT] and waiter_ended == []

    # The collective completed: the mark goes, and nobody else is taken for hung.
    waiting.group.waiting = None
    waiting.poll(mono + 1, NOW + 1)
    assert not RunDir(tmp_path).peer_wait("7", 0, 0).exists()
    again, ended_again = watch(tmp_path, 1, 2, Group(None), mono - 45)
    again.poll(mono + 1, NOW + 1)
    assert ended_again == []


def test_while_steps_are_short_nothing_is_read(tmp_path, monkeypatch):
    reads: list[str] = []
    monkeypatch.setattr(peerhold, "read_json", lambda path: reads.append(str(path)))
    fast, ended = watch(tmp_path, 1, 2, Group(None), 1000.0 - MARK_AFTER_S + 1)
    fast.poll(1000.0, NOW)
    outside, _ = watch(tmp_path, 1, 2, Group(None), None)
    outside.poll(1000.0, NOW)
    assert reads == [] and ended == []
