"""Goodput and the settings it suggests, from hand-written run.json records (the fields
jobend and the local scheduler record at the end of each start)."""

import json
import math

import pytest

from launcher.runner import goodput
from launcher.rundir.records import RunRecord
from launcher.views.status_text import format_status

T0 = "2025-03-01T10:00:00+00:00"


def at(seconds: float) -> str:
    """T0 + seconds, as run.json writes times."""
    whole, frac = divmod(seconds, 1)
    minutes, secs = divmod(int(whole), 60)
    return f"2025-03-01T10:{minutes:02d}:{secs:02d}.{round(frac * 1000):03d}+00:00"


def start(restart, job, started, ended, state, reason=None, **fields):
    return {"job_id": job, "restart": restart, "started": at(started), "ended": None if ended is None else at(ended),
            "state": state, "reason": reason, **fields}


def preempted_twice() -> RunRecord:
    """Three starts of a 300-step run: two graceful stops (saved), then to the end.
    Step time 0.5 s; each save 2 s."""
    starts = [
        start(0, "100", 10, 100, "REQUEUED", "preemption", submitted=T0,
              first_step=1, first_step_at=at(30), last_step=120, last_step_at=at(90),
              step_time_s={"median": 0.5, "p90": 0.6}, save_s={"median": 2.0, "max": 2.0, "count": 2},
              stop_requested_at=at(91), stop_saved_at=at(94), stop_checkpoint="/c/step-00000120", stopped_at=120),
        start(1, "100", 130, 220, "REQUEUED", "timeout", resumed_from=120, resume_at=at(150),
              first_step=121, first_step_at=at(151), last_step=240, last_step_at=at(210.5),
              step_time_s={"median": 0.5, "p90": 0.6}, save_s={"median": 2.0, "max": 3.0, "count": 1},
              stop_requested_at=at(211), stop_saved_at=at(214), stop_checkpoint="/c/step-00000240", stopped_at=240),
        start(2, "100", 250, 330, "COMPLETED", None, resumed_from=240, resume_at=at(270),
              first_step=241, first_step_at=at(271), last_step=300, last_step_at=at(300.5),
              step_time_s={"median": 0.5, "p90": 0.7}),
    ]
    return RunRecord.from_dict({"run_id": "r", "state": "COMPLETED", "requeue_max": 3, "starts": starts})


def test_run_preempted_twice():
    report = goodput.summarize(preempted_twice(), now=10_000, settings={"checkpoint.every_steps": 500,
                                                                        "requeue.signal_lead_s": 30})
    good = report["goodput"]
    assert good["wall_s"] == 320                      # first start 10 s -> last end 330 s
    assert good["productive_s"] == 150                 # 300 kept steps x 0.5 s
    assert good["ettr"] == round(150 / 320, 4)
    assert good["lost_steps"] == 0
    assert good["interruptions"] == 2
    # begin -> stop request: 81 s and 81 s
    assert good["mean_time_between_interruptions_s"] == 81
    rows = good["starts"]
    assert [r["steps_done"] for r in rows] == [120, 120, 60]
    assert rows[0]["queue_wait_s"] == 10 and rows[1]["queue_wait_s"] == 30 and rows[2]["queue_wait_s"] == 30
    assert rows[0]["startup_s"] == 20 and rows[1]["startup_s"] == 21
    assert rows[0]["stop_s"] == 3 and rows[0]["teardown_s"] == 6
    assert rows[1]["resume_load_s"] == 0.5             # 150 s chosen -> 151 s first step, less a 0.5 s step
    # starts 1 and 2: queue + start-up; starts 0 and 1: stop + teardown
    assert good["restart_overhead_s"] == (30 + 21) + (30 + 21) + (3 + 6) + (3 + 6)
    assert good["save_s"] == {"median": 2.0, "max": 3.0}

    assert good["unwarned_interruptions"] == 0 and good["mean_time_between_unwarned_s"] is None
    every = report["suggest"]["checkpoint.every_steps"]
    assert every["value"] == round(math.sqrt(2 * 2.0 * 81) / 0.5)      # 36 steps
    assert every["current"] == 500 and "all warned so far" in every["why"]
    lead = report["suggest"]["requeue.signal_lead_s"]
    assert lead["value"] == 5 * math.ceil((0.7 + 2 * 3.0 + 10) / 5) == 20
    assert lead["current"] == 30
    assert report["warnings"] == []


def test_crash_loses_the_steps_after_the_last_checkpoint():
    record = RunRecord.from_dict({"run_id": "r", "state": "COMPLETED", "requeue_max": 3, "crash_retries": 2, "starts": [
        start(0, "7", 0, 80, "REQUEUED", "crash", first_step=1, first_step_at=at(10), last_step=130,
              last_step_at=at(75), step_time_s={"median": 0.5, "p90": 0.5},
              save_s={"median": 1.0, "max": 1.0, "count": 1}),
        start(1, "7", 90, 150, "COMPLETED", resumed_from=100, first_step=101, first_step_at=at(100),
              last_step=200, last_step_at=at(149.5), step_time_s={"median": 0.5, "p90": 0.5}),
    ]})
    report = goodput.summarize(record, now=0)
    good = report["goodput"]
    assert good["lost_steps"] == 30
    assert good["unwarned_interruptions"] == 1 and good["mean_time_between_unwarned_s"] == 80
    every = report["suggest"]["checkpoint.every_steps"]
    assert "without warning" in every["why"] and every["mtbi_s"] == 80
    assert every["value"] == round(math.sqrt(2 * 1.0 * 80) / 0.5)      # 25 steps
    assert good["lost_s"] == 15
    assert [r["steps_kept"] for r in good["starts"]] == [100, 100]
    assert good["productive_s"] == 100
    assert good["ettr"] == round(100 / 150, 4)


def test_requeues_without_checkpoints_lose_everything_and_warn():
    record = RunRecord.from_dict({"run_id": "r", "state": "COMPLETED", "requeue_max": 3, "starts": [
        start(0, "7", 0, 60, "REQUEUED", "timeout", stopped_at=50, stop_checkpoint=None, first_step=1,
              first_step_at=at(5), last_step=50, last_step_at=at(55), step_time_s={"median": 1.0, "p90": 1.0}),
        start(1, "7", 70, 200, "COMPLETED", first_step=1, first_step_at=at(75), last_step=120,
              last_step_at=at(195), step_time_s={"median": 1.0, "p90": 1.0}),
    ]})
    report = goodput.summarize(record, now=0)
    assert report["goodput"]["lost_steps"] == 50
    assert report["goodput"]["starts"][0]["steps_kept"] == 0
    (warning,) = report["warnings"]
    assert "start 0 stopped at step 50 without a checkpoint" in warning
    assert "start 1 began again from step 0" in warning
    assert "Each requeue restarts from step 0" in warning


def test_a_script_that_resumes_by_itself_is_not_warned_about():
    record = RunRecord.from_dict({"run_id": "r", "state": "COMPLETED", "requeue_max": 3, "starts": [
        start(0, "7", 0, 60, "REQUEUED", "timeout", stopped_at=50, first_step=1, last_step=50),
        start(1, "7", 70, 200, "COMPLETED", first_step=51, last_step=120),
    ]})
    report = goodput.summarize(record, now=0)
    assert report["warnings"] == []
    assert report["goodput"]["lost_steps"] == 0


def test_a_restart_from_zero_is_no_warning_when_nothing_was_lost_or_the_script_saves():
    """A start that hung or crashed before its first step (or before its first save, in a
    script that saves) had nothing to keep: the next start beginning at step 0 is expected."""
    def record(previous_last_step, **saved):
        return RunRecord.from_dict({"run_id": "r", "state": "COMPLETED", "requeue_max": 3, "starts": [
            start(0, "7", 0, 60, "REQUEUED", "hang", first_step=previous_last_step, last_step=previous_last_step),
            start(1, "7", 70, 200, "REQUEUED", "timeout", first_step=1, last_step=120, **saved),
            start(2, "7", 210, 300, "COMPLETED", resumed_from=120, first_step=121, last_step=200),
        ]})
    assert goodput.summarize(record(None), now=0)["warnings"] == []
    assert goodput.summarize(record(0), now=0)["warnings"] == []
    assert goodput.summarize(record(3, save_s={"median": 1.0, "max": 1.0, "count": 1}), now=0)["warnings"] == []
    # The same start losing 3 steps, in a run that never saved nor resumed, is warned about.
    never = RunRecord.from_dict({"run_id": "r", "state": "COMPLETED", "requeue_max": 3, "starts": [
        start(0, "7", 0, 60, "REQUEUED", "hang", first_step=1, last_step=3),
        start(1, "7", 70, 200, "COMPLETED", first_step=1, last_step=120),
    ]})
    (warning,) = goodput.summarize(never, now=0)["warnings"]
    assert "start 1 began again from step 0" in warning


def test_in_flight_run_counts_wall_time_to_now():
    record = RunRecord.from_dict({"run_id": "r", "state": "RUNNING", "requeue_max": 3, "starts": [
        start(0, "7", 0, None, "RUNNING", first_step=1, first_step_at=at(10), last_step=40,
              last_step_at=at(29.5), step_time_s={"median": 0.5, "p90": 0.5}),
    ]})
    now = goodput.epoch(at(50))
    good = goodput.summarize(record, now=now)["goodput"]
    assert good["wall_s"] == 50
    assert good["productive_s"] == 20
    assert good["ettr"] == 0.4
    assert good["starts"][0]["wall_s"] == 50


def test_no_interruption_no_young_daly():
    record = RunRecord.from_dict({"run_id": "r", "state": "COMPLETED", "requeue_max": 3, "starts": [
        start(0, "7", 0, 60, "COMPLETED", first_step=1, last_step=50, step_time_s={"median": 1.0, "p90": 1.0},
              save_s={"median": 1.0, "max": 1.0, "count": 1}),
    ]})
    suggestions = goodput.summarize(record, now=0)["suggest"]
    assert "checkpoint.every_steps" not in suggestions
    assert suggestions["requeue.signal_lead_s"]["value"] == 15


HOSTILE = ["x", -1, float("inf"), True, None, [1], {"median": "0.5"}, "2025-13-45T99:00:00"]


@pytest.mark.parametrize("value", HOSTILE)
def test_damaged_fields_read_as_unknown(value):
    fields = {k: value for k in ("first_step", "first_step_at", "last_step", "last_step_at", "step_time_s",
                                 "save_s", "stop_requested_at", "stop_saved_at", "resume_at", "resume_load_s",
                                 "peak_memory_gb", "memory", "stop_checkpoint")}
    data = {"run_id": "r", "state": "REQUEUED", "requeue_max": 3, "starts": [
        {"job_id": "1", "restart": 0, "started": value if isinstance(value, str) else T0, "state": "REQUEUED",
         "reason": "timeout", **fields},
        {"job_id": "1", "restart": 1, "state": "RUNNING", **fields}]}
    record = RunRecord.from_dict(json.loads(json.dumps(data, default=str).replace("Infinity", "1e999")))
    report = goodput.summarize(record, now=1e9, settings={"checkpoint.every_steps": value})
    json.dumps(report)
    text = format_status({"run_id": "r", "state": "RUNNING", "site": "s", "job_id": "1", "restarts": 1,
                          "run_dir": "/r", "starts": [s.to_dict() for s in record.starts], **report})
    assert "goodput:" in text


def resumed_after_idle(**fields) -> RunRecord:
    """A 120-step run that completed at 100 s, left ended for 900 s, then resumed (at
    1000 s) to 240 steps: queued 30 s, its first step 10 s later. Step time 0.5 s."""
    starts = [
        start(0, "100", 10, 100, "COMPLETED", None, submitted=T0, first_step=1, first_step_at=at(20),
              last_step=120, last_step_at=at(80), step_time_s={"median": 0.5, "p90": 0.5}),
        start(0, "200", 1030, 1100, "COMPLETED", None, resumed_from=120, first_step=121,
              first_step_at=at(1040), last_step=240, last_step_at=at(1099.5), step_time_s={"median": 0.5}),
    ]
    entry = {"number": 1, "at": at(1000), "overrides": ["entrypoint.args=[--steps,240]"], "first_start": 1,
             "previous_files": "resumes/1", "ended": {"state": "COMPLETED", "job_id": "100"}, **fields}
    return RunRecord.from_dict({"run_id": "r", "state": "COMPLETED", "requeue_max": 3, "starts": starts,
                                "resumes": [entry]})


def test_idle_time_before_a_resume_is_not_wall_time():
    good = goodput.summarize(resumed_after_idle(), now=10_000)["goodput"]
    assert good["idle_s"] == 900                       # ended at 100 s, resumed at 1000 s
    assert good["wall_s"] == (1100 - 10) - 900
    assert good["productive_s"] == 120 and good["ettr"] == round(120 / 190, 4)
    rows = good["starts"]
    assert [r["resume"] for r in rows] == [0, 1]
    assert rows[1]["queue_wait_s"] == 30               # from the resume, not from the earlier job's end
    assert good["restart_overhead_s"] == 30 + 10        # queue + start-up of the resumed job's start
    assert good["lost_steps"] == 0


def test_a_resumed_run_waiting_for_its_job_counts_from_the_resume():
    record = resumed_after_idle()
    del record.starts[1]
    record.state = "PENDING"
    good = goodput.summarize(record, now=goodput.epoch(at(1020)))["goodput"]
    assert good["idle_s"] == 900 and good["wall_s"] == (1020 - 10) - 900


@pytest.mark.parametrize("entry", [{"at": "yesterday"}, {"first_start": 7}, {"first_start": "1"}, {"number": None}])
def test_damaged_resume_entries_leave_nothing_out(entry):
    good = goodput.summarize(resumed_after_idle(**entry), now=10_000)["goodput"]
    assert good["wall_s"] == 1090 and good["idle_s"] in (None, 0)


# --- goodput projected from what the run measured -------------------------------------------

RESOLVED = {"derived": {"nodes": 2, "gpus_per_node": 4, "time": "04:00:00"},
            "experiment": {"checkpoint": {"every_steps": 100}},
            "site": {"goodput": {"failures_per_node_hour": 0.002}}}


def test_projection_costs_are_what_the_run_measured():
    good = goodput.summarize(preempted_twice(), now=10_000)["goodput"]
    costs = goodput.projection_costs(good)
    # start-up less resume load: 20 s, then 21 - 0.5 s twice (resume load: first step - resume - one step)
    assert costs == {"save_s": 2.0, "startup_s": 20.5, "load_s": 0.5, "queue_wait_s": 30.0, "step_s": 0.5,
                     "restart_s": None}
    assert goodput.projection_costs({}) == dict.fromkeys(costs)


def test_status_carries_the_projection_from_measured_costs():
    from launcher.runner.status import projection

    good = goodput.summarize(preempted_twice(), now=10_000)["goodput"]
    data = projection(RESOLVED, good)
    assert data["failures_per_node_hour"] == 0.002 and data["rate_source"] == "site goodput.failures_per_node_hour"
    assert data["costs"]["defaults"] == [] and data["costs"]["interval_s"] == 50.0
    assert data["allocation_s"] == 4 * 3600
    (size,) = data["sizes"]
    assert (size["nodes"], size["gpus"]) == (2, 8) and size["mtbf_s"] == 900_000
    requeue = next(r for r in size["roads"] if r["road"] == "requeue")
    assert requeue["restart_s"] == 51.0          # 30 s queue + 20.5 s start-up + 0.5 s load
    # No site rate and nothing measured: the published rate and the default costs, said so.
    data = projection({"derived": RESOLVED["derived"]}, {})
    assert "Kokolis" in data["rate_source"] and "save_s" in data["costs"]["defaults"]
    assert projection({}, good) is None


def test_status_text_shows_the_projection():
    from launcher.runner.status import projection

    report = goodput.summarize(preempted_twice(), now=10_000)
    report["goodput"]["projection"] = projection(RESOLVED, report["goodput"])
    text = format_status({"run_id": "r", "state": "COMPLETED", "site": "s", "job_id": "100", "restarts": 2,
                          "run_dir": "/r", "starts": [s.to_dict() for s in preempted_twice().starts], **report})
    block = text.split("goodput projected", 1)[1]
    for fragment in ["0.002 failures per node-hour", "save stall 2.0 s, start-up 20.5 s", "queue wait after "
                     "requeue 30.0 s", "at 8 GPUs (2 node(s) x 4): job MTBF 250h00m", "requeue", "spare nodes"]:
        assert fragment in block, fragment
    assert "(default)" not in block


def test_a_crash_restarted_in_its_allocation_on_a_spare():
    """A 1-node run with one spare: start 0 crashes at step 55 (saved at 50), start 1 is a new
    step in the same allocation, 3 s later, on the spare; the spare's idle hours are a cost."""
    starts = [
        start(0, "100", 10, 70, "RESTARTED", "crash", submitted=T0, spare_nodes=1, bad_node="n1", left_out="n1",
              first_step=1, first_step_at=at(20), last_step=55, last_step_at=at(47.5),
              step_time_s={"median": 0.5, "p90": 0.6}),
        start(1, "100", 73, 130, "COMPLETED", None, spare_nodes=1, resumed_from=50, resume_at=at(80),
              first_step=51, first_step_at=at(81), last_step=100, last_step_at=at(105.5),
              step_time_s={"median": 0.5, "p90": 0.6}),
    ]
    record = RunRecord.from_dict({"run_id": "r", "state": "COMPLETED", "requeue_max": 3, "crash_retries": 1,
                                  "starts": starts})
    good = goodput.summarize(record, now=10_000)["goodput"]
    rows = good["starts"]
    assert [r["steps_kept"] for r in rows] == [50, 50] and good["lost_steps"] == 5
    assert rows[1]["queue_wait_s"] == 3                     # the crash -> the new step: no queue
    assert [r["spare_node_hours"] for r in rows] == [round(60 / 3600, 4), round(57 / 3600, 4)]
    assert good["spare_node_hours"] == round(60 / 3600, 4) + round(57 / 3600, 4)
    assert good["unwarned_interruptions"] == 1
    text = format_status({"run_id": "r", "state": "COMPLETED", "site": "s", "job_id": "100", "restarts": 1,
                          "run_dir": "/r", "starts": [s.to_dict() for s in record.starts], "goodput": good})
    assert "spare nodes idle 0.03 node-hour(s)" in text and "RESTARTED" in text, text
    assert good["restarts_in_allocation"] == 1 and good["spare_swaps"] == 1
    assert "1 restart(s) in the allocation, not through the queue (1 on a spare node)" in text
    # The projection's in-allocation road costs what this restart did (3 s to the new step,
    # 8 s to its first step), not start-up + load; no start went through the queue.
    costs = goodput.projection_costs(good)
    assert costs["restart_s"] == 11 and costs["queue_wait_s"] is None
    from launcher.resolution.goodput_projection import costs_with_defaults, project
    projected = project(None, costs_with_defaults(costs, 100), [(128, 8)], 4 * 3600).to_json()
    roads = {r["road"]: r["restart_s"] for r in projected["sizes"][0]["roads"]}
    assert roads["in_allocation"] == 11 and roads["requeue"] > 11
    assert projected["costs"]["in_allocation_measured"] is True
    from launcher.views.goodput_text import projection_lines
    assert any("restart in the allocation 11" in line for line in projection_lines(projected))


# --- odd times: status never fails on them, and says what the projection cannot compute --------


def one_start(**fields) -> dict:
    """A completed start of 100 steps of 0.3 s with saves of 2 s, `fields` changed (None: left out)."""
    values = start(0, "100", 10, 60, "COMPLETED", submitted=T0, first_step=1, first_step_at=at(20),
                   last_step=100, last_step_at=at(50), step_time_s={"median": 0.3, "p90": 0.4},
                   save_s={"median": 2.0, "max": 3.0, "count": 1})
    values.update(fields)
    return {key: value for key, value in values.items() if value is not None}


NAN, INF = float("nan"), float("inf")
# (id, the start's fields, resolved.yaml's values changed, what the projection says it cannot
# compute: {field: fragment of the reason}, none when everything is computable)
ODD_TIMES = [
    ("steps-faster-than-a-millisecond", {"step_time_s": {"median": 0.0004, "p90": 0.0005}}, {}, {}),
    ("save-stall-zero", {"save_s": {"median": 0.0, "max": 0.0, "count": 3}}, {},
     {"ettr_optimal": "the Young-Daly interval is 0 s (the save stall measured 0 s)"}),
    ("save-stall-below-a-millisecond", {"save_s": {"median": 0.0001, "max": 0.0002, "count": 3}}, {}, {}),
    ("step-time-subnormal", {"step_time_s": {"median": 1e-320}}, {},
     {"optimal_every_steps": "in steps of 1e-320 s"}),
    ("step-time-huge", {"step_time_s": {"median": 1.7e308, "p90": 1.7e308}}, {}, {}),
    ("save-stall-huge", {"save_s": {"median": 1.7e308, "max": 1.7e308, "count": 1}}, {},
     {"ettr_optimal": "the Young-Daly interval is not a finite time"}),
    ("save-stall-infinite", {"save_s": {"median": INF, "max": INF}}, {}, {}),
    ("times-nan", {"step_time_s": {"median": NAN, "p90": NAN}, "save_s": {"median": NAN, "max": NAN},
                   "resume_load_s": NAN}, {}, {}),
    ("times-negative", {"step_time_s": {"median": -1}, "save_s": {"median": -2, "max": -3}, "resume_load_s": -1,
                        "last_step": -5}, {}, {}),
    ("numbers-as-strings", {"step_time_s": "fast", "save_s": "slow", "last_step": "100", "first_step_at": 5,
                            "resume_load_s": "1"}, {}, {}),
    ("times-missing", {"started": None, "ended": None, "first_step_at": None, "last_step_at": None,
                       "step_time_s": None, "save_s": None, "submitted": None}, {}, {}),
    ("times-reversed", {"started": at(60), "ended": at(10), "first_step_at": at(5), "last_step_at": at(1)}, {}, {}),
    ("year-one-local-time", {"started": "0001-01-01T00:00:00", "first_step_at": "0001-01-01T00:00:00"}, {}, {}),
    ("year-9999", {"ended": "9999-12-31T23:59:59", "last_step_at": "9999-12-31T23:59:59+00:00"}, {}, {}),
    ("step-count-huge", {"last_step": 2**62, "step_time_s": {"median": 1e300}}, {}, {}),
    ("steps-from-times-huge", {"step_time_s": None, "first_step": 1, "last_step": 2**62}, {}, {}),
    ("rate-subnormal", {}, {"site": {"goodput": {"failures_per_node_hour": 1e-320}}},
     {"mtbf_s": "1e-320 failures per node-hour"}),
    ("rate-huge", {}, {"site": {"goodput": {"failures_per_node_hour": 1e300}}},
     {"spares": "failures expected per allocation"}),
    ("rate-text", {}, {"site": {"goodput": {"failures_per_node_hour": "often"}}}, {}),
    ("nodes-huge", {}, {"derived": {"nodes": 2**52}}, {"spares": "failures expected per allocation"}),
    ("nodes-past-a-float", {}, {"derived": {"nodes": 10**400}}, {}),
    ("every-steps-huge", {}, {"experiment": {"checkpoint": {"every_steps": 10**30}}}, {}),
    ("allocation-longest", {}, {"derived": {"time": "1491308-02:06:00"}}, {}),
]


def odd_run(tmp_path, fields: dict, resolved: dict):
    """A run directory of one start with `fields`, its resolved.yaml RESOLVED with `resolved` merged in."""
    import yaml

    run_dir = tmp_path / "runs" / "odd"
    run_dir.mkdir(parents=True)
    record = {"run_id": "odd", "name": "odd", "site": "local", "scheduler": "local", "created": T0,
              "dry_run": False, "nodes": 2, "world_size": 8, "requeue_max": 3, "crash_retries": 0,
              "state": "COMPLETED", "job_id": "100", "starts": [one_start(**fields)]}
    (run_dir / "run.json").write_text(json.dumps(record))
    values = {key: {**RESOLVED[key], **resolved.get(key, {})} for key in RESOLVED}
    (run_dir / "resolved.yaml").write_text(yaml.safe_dump(values))
    return run_dir


@pytest.mark.parametrize("fields, resolved, cannot", [c[1:] for c in ODD_TIMES], ids=[c[0] for c in ODD_TIMES])
def test_status_of_a_record_with_odd_times_never_fails(tmp_path, isolated_env, monkeypatch, capsys, fields,
                                                       resolved, cannot):
    from badinput import run_cli, within
    from launcher import api

    run_dir = odd_run(tmp_path, fields, resolved)
    with within(20):
        summary = api.status(str(run_dir))
    json.dumps(summary["goodput"], allow_nan=False)          # what status computes is plain JSON
    projection = summary["goodput"]["projection"]
    reasons = {size_key: why for size in projection["sizes"] for size_key, why in size["not_computable"].items()}
    assert set(reasons) >= set(cannot), reasons
    for key, fragment in cannot.items():
        assert fragment in reasons[key], (key, reasons[key])
    text = format_status(summary)
    assert ("not computable" in text) == bool(reasons), text
    for fragment in cannot.values():
        assert fragment in text
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "status", str(run_dir)])
    assert code == 0 and "Traceback" not in err and out == text + "\n", err
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "status", str(run_dir), "--json"])
    assert code == 0 and "Traceback" not in err, err
    assert json.loads(out)["goodput"]["projection"]["sizes"][0]["not_computable"] == projection["sizes"][0][
        "not_computable"]
