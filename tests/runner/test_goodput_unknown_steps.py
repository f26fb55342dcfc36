"""Goodput's lost steps of a run whose starts counted no steps (a script without the runtime
and without entrypoint.progress): not known once a start was interrupted, never 0."""

from launcher.rundir.records import RunRecord
from launcher.runner import goodput


def start(restart, state, reason=None, **fields):
    return {"job_id": "7", "restart": restart, "submitted": "2026-01-01T00:00:00+00:00",
            "started": f"2026-01-01T00:{restart * 10:02d}:10+00:00", "ended": f"2026-01-01T00:{restart * 10 + 9:02d}:00+00:00",
            "state": state, "reason": reason, **fields}


def lost_steps(*starts):
    record = RunRecord.from_dict({"run_id": "r", "state": starts[-1]["state"], "requeue_max": 3,
                                  "starts": list(starts)})
    return goodput.summarize(record, now=0)["goodput"]["lost_steps"]


def test_an_interruption_of_a_script_that_counts_no_steps_loses_an_unknown_number():
    assert lost_steps(start(0, "REQUEUED", "preemption"), start(1, "COMPLETED")) is None
    assert lost_steps(start(0, "REQUEUED", "crash"), start(1, "FAILED", "crash")) is None


def test_nothing_is_lost_without_an_interruption():
    assert lost_steps(start(0, "COMPLETED")) == 0


def test_counted_steps_are_summed_as_before():
    assert lost_steps(start(0, "REQUEUED", "timeout", first_step=1, last_step=50, stopped_at=50),
                      start(1, "COMPLETED", first_step=51, last_step=120)) == 0
