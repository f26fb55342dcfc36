"""A follower (`--wait`, api.wait) through an outage of its scheduler, or of the link to the
login node: it says so once, goes on from the record last known here, says when the state can
be asked again, and gives up (exit 3, the cause named) only once the outage outlasts
FOLLOW_OUTAGE_S."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.errors import SchedulerError
from launcher.rundir.records import RunRecord
from launcher.runner import manage
from launcher.runner.direct import NotRefreshed

RUNNING = RunRecord.from_dict({"run_id": "r", "state": "RUNNING", "job_id": "7"})
DONE = dataclasses.replace(RUNNING, state="COMPLETED")
DOWN = SchedulerError("cannot reach login1 (ssh: connection timed out)")


class Console:
    def __init__(self):
        self.events: list[str] = []

    def observe(self, record): ...

    def pump(self): ...

    def event(self, text):
        self.events.append(text)

    def finish(self, record):
        self.events.append(f"end {record.state}")

    def clear(self): ...


def follow(monkeypatch, answers, *, bound_s=300.0, clock_step=10.0):
    """_follow over a refresh that answers `answers` in turn (a record, or the outage), each
    poll `clock_step` seconds after the last."""
    now = [0.0]
    monkeypatch.setattr(manage.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(manage.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    monkeypatch.setattr(manage, "FOLLOW_OUTAGE_S", bound_s)
    queue = list(answers)

    def refreshed(run_dir):
        now[0] += clock_step
        answer = queue.pop(0)
        if answer is DOWN:
            raise NotRefreshed(DOWN, RUNNING)
        return answer

    monkeypatch.setattr(manage, "refreshed", refreshed)
    console = Console()
    return manage._follow(None, None, None, 2.0, console), console.events


def test_a_blip_is_said_asked_through_and_the_run_followed_to_its_end(monkeypatch):
    state, events = follow(monkeypatch, [RUNNING, DOWN, DOWN, DOWN, RUNNING, DONE])
    assert state == "COMPLETED"
    assert events[0].startswith("the run's state cannot be asked now (cannot reach login1 (ssh: connection timed "
                                "out)); asking again for up to 300 s")
    assert events[1].startswith("the run's state can be asked again, after ") and events[2] == "end COMPLETED"
    assert len(events) == 3


def test_an_outage_longer_than_the_bound_is_exit_3_naming_its_cause(monkeypatch):
    with pytest.raises(NotRefreshed) as raised:
        follow(monkeypatch, [RUNNING] + [DOWN] * 50, bound_s=60.0)
    assert raised.value.exit_code == 3 and "cannot reach login1" in str(raised.value)


def test_a_sweep_s_wait_asks_through_an_outage_from_the_records_it_last_had(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(manage.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(manage, "FOLLOW_OUTAGE_S", 60.0)
    answers = [DOWN, {"a": RUNNING}, DOWN, DOWN, {"a": DONE}]

    def sweep_records(sweep_dir):
        now[0] += 20.0
        answer = answers.pop(0)
        if answer is DOWN:
            raise DOWN
        return answer

    monkeypatch.setattr(manage, "sweep_records", sweep_records)
    outage = manage._Outage(None)
    with pytest.raises(SchedulerError):
        outage.sweep_records(None, None)        # nothing asked yet: nothing to go on from
    records = outage.sweep_records(None, None)
    assert outage.sweep_records(None, records) == {"a": RUNNING}       # the link is down: the last records
    assert outage.sweep_records(None, records) == {"a": RUNNING}
    assert outage.sweep_records(None, records) == {"a": DONE} and outage.since is None
