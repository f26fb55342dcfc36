"""The watchdog's decisions from recorded heartbeat contents, without a job: when a start
hangs, which ranks fell silent, which node it points at; and the rank's stack dump."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from launcher.rundir import registry
from launcher.rundir.layout import RunDir, heartbeat_bytes
from launcher.rundir.records import RunRecord
from launcher.rundir.taskspec import TaskSpec, write_task_spec
from launcher.rundir.heartbeatrecord import checked_heartbeat
from launcher.rundir.rankstacks import write_stacks
from launcher.jobcontrol.watchdog import (
    SAVE_BOUND_MIN_S,
    Limits,
    Watch,
    armed_at,
    blamed_node,
    bounds_in_force,
    find_hang,
    hang_in,
    own_records,
    silent_ranks,
    watch_entry,
)

T0 = 1_700_000_000.0
LIMITS = Limits(stall_s=60, first_step_s=300)


def beat(rank, step, at, *, node="n1", state="running", interval_s=5.0, step_s=0.5, **more):
    return {"rank": rank, "node": node, "step": step, "time": at, "state": state, "interval_s": interval_s,
            "step_s": step_s, "job_id": "7", "restart": 0, **more}


def test_no_hang_while_any_rank_steps_within_the_bound():
    records = {0: beat(0, 100, T0), 1: beat(1, 100, T0 + 50)}
    assert find_hang(records, now=T0 + 70, started=T0 - 100, limits=LIMITS) is None


def test_a_stall_counts_from_the_last_step_a_rank_may_have_made_unwritten():
    records = {0: beat(0, 100, T0), 1: beat(1, 100, T0)}
    # The files say T0, but each rank may have stepped until T0 + interval_s without writing.
    assert find_hang(records, now=T0 + 64, started=T0 - 100, limits=LIMITS) is None
    hang = find_hang(records, now=T0 + 65, started=T0 - 100, limits=LIMITS)
    assert hang is not None and hang.kind == "stall" and hang.bound_s == 60
    assert [s.rank for s in hang.silent] == [0, 1]            # nothing singles a rank out
    assert hang.node is None
    assert "every rank silent at step 100" in hang.describe()


def test_a_peer_recovery_under_way_postpones_a_stall_by_one_bound():
    """A request for a lost rank's process (peer recovery) at T0 + 40: the ranks are busy
    recovering, not hung, until one bound after it."""
    records = {0: beat(0, 100, T0), 1: beat(1, 100, T0)}
    assert find_hang(records, now=T0 + 70, started=T0 - 100, limits=LIMITS, recovering_at=T0 + 40) is None
    hang = find_hang(records, now=T0 + 100, started=T0 - 100, limits=LIMITS, recovering_at=T0 + 40)
    assert hang is not None and hang.kind == "stall"


def test_first_step_bound_from_the_start_and_ranks_without_a_record():
    records = {0: beat(0, None, None, announced_at=T0 - 5)}
    assert find_hang(records, now=T0 + 299, started=T0, limits=LIMITS, world_size=2) is None
    hang = find_hang(records, now=T0 + 300, started=T0, limits=LIMITS, world_size=2)
    assert hang.kind == "first_step" and [s.rank for s in hang.silent] == [0, 1]
    assert "no first step 300 s after the runtime began" in hang.describe()
    assert find_hang(records, now=T0 + 10**6, started=T0, limits=Limits(60, 0), world_size=2) is None


A_WEEK = 7 * 86400.0
STARTING = beat(0, None, None, state="starting")       # what the task writes for every rank


# (heartbeats of the start, seconds after it began, limits, the hang's kind or None). The
# watchdog judges only once a rank announced that it reports its steps (or stepped).
@pytest.mark.parametrize("records,after,limits,kind", [
    ({}, A_WEEK, LIMITS, None),                                           # no heartbeat at all
    ({0: STARTING, 1: dict(STARTING, rank=1)}, A_WEEK, LIMITS, None),    # the task's, not the script's
    ({0: beat(0, None, None, announced_at=T0)}, 299, LIMITS, None),
    ({0: beat(0, None, None, announced_at=T0)}, 300, LIMITS, "first_step"),
    # Counted from the first announcement, not the start: a script may load data for long.
    ({0: beat(0, None, None, announced_at=T0 + 3000)}, 3299, LIMITS, None),
    ({0: beat(0, None, None, announced_at=T0 + 3000)}, 3300, LIMITS, "first_step"),
    ({0: beat(0, None, None, announced_at=T0 + 100), 1: beat(1, None, None, announced_at=T0 + 200)}, 400,
     LIMITS, "first_step"),
    # A step without announced_at (a heartbeat written before the field existed): evidence.
    ({0: beat(0, 5, T0 + 10), 1: beat(1, 5, T0 + 10)}, 74, LIMITS, None),
    ({0: beat(0, 5, T0 + 10), 1: beat(1, 5, T0 + 10)}, 75, LIMITS, "stall"),
    # stall_s: 0 turns the first-step bound off too.
    ({0: beat(0, None, None, announced_at=T0)}, A_WEEK, Limits(0, 300), None),
    ({0: beat(0, 5, T0 + 10)}, A_WEEK, Limits(0, 300), None),
    # first_step_s: 0: no bound before the first step, the stall bound after it.
    ({0: beat(0, None, None, announced_at=T0)}, A_WEEK, Limits(60, 0), None),
], ids=["none", "starting-only", "announced-within", "announced-past", "late-announcement-within",
        "late-announcement-past", "first-announcement-counts", "stepped-old-record-within", "stepped-old-record", "stall-0-announced",
        "stall-0-stepped", "first-step-0"])
def test_the_watchdog_acts_only_on_evidence(records, after, limits, kind):
    hang = find_hang(records, now=T0 + after, started=T0, limits=limits, world_size=2)
    assert (hang.kind if hang else None) == kind


@pytest.mark.parametrize("records,expected", [
    ({}, None),
    ({0: STARTING}, None),
    ({0: beat(0, None, None, announced_at=T0 + 7), 1: beat(1, None, None, announced_at=T0 + 3)}, T0 + 3),
    ({0: beat(0, 4, T0 + 9, first_time=T0 + 2)}, T0 + 2),
    ({0: beat(0, None, None, announced_at=float("nan"))}, None),
    ({0: beat(0, None, None, announced_at="soon")}, None),
])
def test_the_watch_is_armed_by_the_first_announcement_or_step(records, expected):
    assert armed_at(records) == expected


AUTO = Limits(stall_s=600, first_step_s=1800, auto=True, floor_s=60)


# (heartbeats, limits, what run.json says of the watch): never a bound that is not enforced.
@pytest.mark.parametrize("records,limits,expected", [
    ({0: STARTING}, Limits(0, 1800), {"state": "off", "why": "watchdog.stall_s is 0"}),
    ({0: STARTING}, AUTO, {"state": "not watched", "why": "no rank uses glaunch's runtime"}),
    ({}, LIMITS, {"state": "not watched", "why": "no rank uses glaunch's runtime"}),
    ({0: beat(0, None, None, announced_at=T0)}, AUTO,
     {"state": "watching", "in_force": "first_step", "first_step_s": 1800, "bound_s": 600, "basis": "initial"}),
    ({0: beat(0, None, None, announced_at=T0), 1: beat(1, 3, T0 + 5)}, LIMITS,
     {"state": "watching", "in_force": "stall", "first_step_s": 300, "bound_s": 60, "basis": "fixed"}),
], ids=["off", "not-watched", "no-heartbeats", "first-step", "stepping"])
def test_what_run_json_says_of_the_watch(records, limits, expected):
    entry = watch_entry(records, limits, bounds_in_force(records, limits))
    assert {k: entry.get(k) for k in expected} == expected
    if expected["state"] != "watching":
        assert set(entry) == {"state", "why"}             # no bound: none is in force
    else:
        assert entry["watched_since"].startswith("2023-11-14T22:13:20")


def test_a_save_has_its_own_bound():
    records = {0: beat(0, 100, T0, state="saving", saving_since=T0), 1: beat(1, 100, T0)}
    assert LIMITS.save_s == SAVE_BOUND_MIN_S
    assert find_hang(records, now=T0 + 1000, started=T0 - 100, limits=LIMITS) is None
    hang = find_hang(records, now=T0 + SAVE_BOUND_MIN_S, started=T0 - 100, limits=LIMITS)
    assert hang is not None and hang.kind == "save"
    assert Limits(1000, 0).save_s == 4000


def test_after_a_save_the_bounds_count_from_its_end():
    # The save took 500 s: the step before it is old, the bound runs from the save's end.
    records = {0: beat(0, 100, T0, save_ended=T0 + 500), 1: beat(1, 100, T0, save_ended=T0 + 500)}
    assert find_hang(records, now=T0 + 564, started=T0 - 100, limits=LIMITS) is None
    hang = find_hang(records, now=T0 + 565, started=T0 - 100, limits=LIMITS)
    assert hang is not None and hang.kind == "stall"
    # A save before the first step (a universal copy made at resume): the first-step bound too.
    records = {0: beat(0, None, None, save_ended=T0 + 400, announced_at=T0)}
    assert find_hang(records, now=T0 + 699, started=T0, limits=LIMITS, world_size=1) is None
    assert find_hang(records, now=T0 + 700, started=T0, limits=LIMITS, world_size=1).kind == "first_step"


def test_stopped_or_finished_ranks_and_no_limits_mean_no_judgement():
    records = {0: beat(0, 100, T0, state="stopped"), 1: beat(1, 90, T0)}
    assert find_hang(records, now=T0 + 10**6, started=T0, limits=LIMITS) is None
    records = {0: beat(0, 100, T0), 1: beat(1, 90, T0)}
    assert find_hang(records, now=T0 + 10**6, started=T0, limits=Limits(0, 0)) is None


def test_the_rank_behind_by_more_than_its_writes_hide_is_silent_and_its_node_blamed():
    records = {r: beat(r, 500, T0, node="n1") for r in range(4)}
    records.update({r: beat(r, 200, T0 - 300, node="n2") for r in range(4, 8)})
    hang = find_hang(records, now=T0 + 100, started=T0 - 1000, limits=LIMITS)
    assert [s.rank for s in hang.silent] == [4, 5, 6, 7] and hang.node == "n2"
    assert "silent: rank 4 on n2" in hang.describe()


def test_a_lag_within_what_unwritten_steps_explain_blames_no_one():
    # Rank 1 writes every 5 s at 0.5 s a step: its file may be 10 steps (and one) behind.
    records = {0: beat(0, 100, T0, node="n1", interval_s=1.0), 1: beat(1, 90, T0, node="n2")}
    assert [s.rank for s in silent_ranks(records, [0, 1])] == [0, 1]
    records[1] = beat(1, 80, T0, node="n2")
    assert [s.rank for s in silent_ranks(records, [0, 1])] == [1]
    records[1] = beat(1, 80, T0, node="n2", step_s=None)        # no step time: nothing to go by
    assert [s.rank for s in silent_ranks(records, [0, 1])] == [0, 1]


def test_a_rank_without_a_first_step_while_others_step():
    records = {0: beat(0, 3, T0), 1: beat(1, None, None, node="n2", state="starting")}
    silent = silent_ranks(records, [0, 1, 2])
    assert [(s.rank, s.node, s.step) for s in silent] == [(1, "n2", None), (2, None, None)]
    assert blamed_node(silent, records, 3) is None           # rank 2's node is not known


def test_blame_needs_a_node_the_others_are_not_all_on():
    one_node = {0: beat(0, 90, T0), 1: beat(1, 1, T0 - 500)}
    silent = silent_ranks(one_node, [0, 1])
    assert [s.rank for s in silent] == [1] and blamed_node(silent, one_node, 2) is None


def test_records_of_other_starts():
    records = [beat(0, 1, T0), dict(beat(1, 1, T0), restart=1), dict(beat(2, 1, T0), job_id="8"), None,
               dict(beat(3, 1, T0), rank=True)]
    assert list(own_records(records, "7", 0)) == [0]


def spec(run_dir, **fields):
    values = dict(launcher="srun", script="/home/alice/train.py", module=None, args=(), nodes=1, ranks_per_node=2,
                  world_size=2, run_dir=str(run_dir), run_id="r", requeue_max=3, crash_retries=1,
                  exclude_bad_nodes=True, watchdog_stall_s=60.0, watchdog_first_step_s=300.0)
    values.update(fields)
    return TaskSpec(**values)


def test_the_watch_takes_its_bounds_and_ranks_from_task_json(tmp_path):
    write_task_spec(tmp_path, spec(tmp_path))
    clock = [T0]
    watch = Watch(tmp_path, "7", 0, started=T0, clock=lambda: clock[0])
    assert watch.limits == LIMITS and watch.world_size == 2 and not watch.off
    path = RunDir(tmp_path).heartbeat(0)
    path.parent.mkdir()
    path.write_bytes(heartbeat_bytes(beat(0, None, None, state="starting")))
    clock[0] = T0 + 10**6         # the task's record alone: no evidence, no judgement
    assert watch.check() is None and watch.noted["state"] == "not watched"
    path.write_bytes(heartbeat_bytes(beat(0, None, None, announced_at=T0 + 10**6)))
    clock[0] = T0 + 10**6 + 299
    assert watch.check() is None and watch.noted["in_force"] == "first_step"
    clock[0] = T0 + 10**6 + 300   # rank 1 never wrote: the first-step bound holds for it too
    hang = watch.check()
    assert hang.kind == "first_step" and [s.rank for s in hang.silent] == [0, 1]


def test_stall_s_0_is_recorded_as_off_and_ends_nothing(tmp_path):
    write_task_spec(tmp_path, spec(tmp_path, watchdog_stall_s=0.0, watchdog_first_step_s=300.0))
    record = RunRecord(run_id="r")
    record.record_start("7", 0, state="RUNNING")
    registry.write(tmp_path, record)
    watch = Watch(tmp_path, "7", 0, started=T0, clock=lambda: T0 + 10**6)
    assert watch.off and watch.check() is None
    assert registry.read(tmp_path).start("7", 0).get("watchdog") == {"state": "off", "why": "watchdog.stall_s is 0",
                                                                     "slow": []}


def test_no_bounds_or_no_task_json_means_no_watch(tmp_path, capsys):
    write_task_spec(tmp_path, spec(tmp_path, watchdog_stall_s=0.0, watchdog_first_step_s=0.0))
    assert Watch(tmp_path, "7", 0).off
    missing = Watch(tmp_path / "elsewhere", "7", 0)
    assert missing.off and missing.check() is None
    err = capsys.readouterr().err
    assert "glaunch: watchdog: off: " in err and "elsewhere/task.json: missing" in err


class Children:
    """Signals the processes the test started (the watchdog's way to reach the ranks)."""

    def __init__(self, procs):
        self.procs = procs
        self.ended = False

    def signal(self, signum):
        for p in self.procs:
            os.kill(p.pid, signum)

    def end(self):
        self.ended = True
        for p in self.procs:
            p.kill()


def test_a_rank_stuck_in_a_sleep_writes_its_stack_on_the_dump_signal(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", os.defpath)          # no py-spy: faulthandler's way
    script = (f"import sys, time; sys.path.insert(0, {os.getcwd()!r})\n"
              "from launcher.runtime.stackdump import arm_stack_dump\n"
              f"arm_stack_dump({str(tmp_path)!r}, int(sys.argv[1]))\n"
              "def stuck_in_here():\n    print('armed', flush=True); time.sleep(600)\n"
              "stuck_in_here()\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r)], stdout=subprocess.PIPE, text=True)
             for r in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "armed"
        records = {r: beat(r, 5, time.time(), pid=p.pid) for r, p in enumerate(procs)}
        written = write_stacks(tmp_path, "7", 0, records, Children(procs), wait_s=10)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert written == ["logs/stack-7_0_0.txt", "logs/stack-7_0_1.txt"]
    for rank, path in enumerate(written):
        text = (tmp_path / path).read_text()
        assert text.startswith(f"# rank {rank} on n1 (pid {procs[rank].pid}), last step 5")
        assert "stuck_in_here" in text and "faulthandler" in text.splitlines()[0]
    assert RunDir(tmp_path).stack_files("7", 0) == [tmp_path / p for p in written]


@pytest.mark.parametrize("signum", [signal.SIGWINCH])
def test_the_dump_signal_is_harmless_to_a_process_that_did_not_ask_for_it(signum):
    proc = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(2)"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    os.kill(proc.pid, signum)
    assert proc.wait(timeout=10) == 0


# --- heartbeats the watchdog cannot trust -------------------------------------------------------

HOSTILE = {
    "a list as its state": {"state": ["running"]},
    "an unknown state": {"state": "zombie"},
    "a world size beyond the run's": {"world_size": 10**12},
    "a rank beyond the run's": {"rank": 5},
    "a negative rank": {"rank": -1},
    "a rank that is a boolean": {"rank": True},
    "a restart that is a boolean": {"restart": False},
    "an infinite time": {"time": float("inf")},
    "a time not a number": {"time": float("nan")},
    "a time far in the future": {"time": T0 + 10**9},
    "a time as text": {"time": "now"},
    "a step too large for a float": {"step": 10**400},
    "a step time that overflows the slack": {"step_s": 1e-320},
    "an interval beyond any writer's": {"interval_s": 1e300},
    "a save start as text": {"saving_since": "yesterday", "state": "saving"},
    "a node that is a list": {"node": ["n1"]},
    "a pid as text": {"pid": "1234"},
    "a job step that is a number": {"job_step": 5},
}


@pytest.mark.parametrize("change", HOSTILE.values(), ids=list(HOSTILE))
def test_a_bad_heartbeat_is_refused_with_its_field_named(change):
    record = dict(beat(1, 100, T0, pid=4321, host="h", job_step="0", world_size=2), **change)
    with pytest.raises(ValueError) as caught:
        checked_heartbeat(record, world_size=2, now=T0 + 100)
    assert next(iter(change)) in str(caught.value)


def test_a_good_heartbeat_passes_with_only_the_fields_it_knows():
    record = dict(beat(1, 100, T0, pid=4321, host="h", job_step="0", world_size=2), extra={"x": 1})
    checked = checked_heartbeat(record, world_size=2, now=T0 + 100)
    assert checked["rank"] == 1 and checked["state"] == "running" and "extra" not in checked
    assert checked_heartbeat(beat(0, None, None, state="starting"), world_size=1)["step"] is None


@pytest.mark.parametrize("change", HOSTILE.values(), ids=list(HOSTILE))
def test_a_bad_heartbeat_never_hides_the_hang_of_the_others(change):
    good = {0: beat(0, 100, T0), 1: beat(1, 100, T0)}
    hostile = dict(beat(1, 100, T0 + 10**4), **change)
    records = own_records([good[0], hostile, good[1]], "7", 0, world_size=2, now=T0 + 100)
    assert records[0] == checked_heartbeat(good[0], world_size=2)
    hang = find_hang(records, now=T0 + 100, started=T0 - 100, limits=LIMITS, world_size=2)
    assert hang is not None and hang.kind == "stall" and [s.rank for s in hang.silent] == [0, 1]


def test_the_watch_skips_and_names_a_bad_heartbeat_and_keeps_watching(tmp_path, capsys):
    write_task_spec(tmp_path, spec(tmp_path))
    clock = [T0]
    watch = Watch(tmp_path, "7", 0, started=T0, clock=lambda: clock[0])
    rd = RunDir(tmp_path)
    rd.heartbeat_dir.mkdir()
    rd.heartbeat(0).write_bytes(heartbeat_bytes(beat(0, 100, T0)))
    rd.heartbeat(1).write_bytes(heartbeat_bytes(beat(1, 100, T0 + 10**6, state=["saving"], world_size=10**12)))
    clock[0] = T0 + 10
    assert watch.check() is None
    clock[0] = T0 + 400        # rank 1 counts as silent since the start: no usable record
    hang = watch.check()
    assert hang is not None and [s.rank for s in hang.silent] == [1]
    err = capsys.readouterr().err
    assert f"{rd.heartbeat(1)} skipped" in err and "state" in err
    assert err.count("skipped") == 1            # said once, not at every poll


def test_a_heartbeat_in_another_rank_s_file_is_skipped(tmp_path, capsys):
    write_task_spec(tmp_path, spec(tmp_path))
    watch = Watch(tmp_path, "7", 0, started=T0, clock=lambda: T0 + 10)
    rd = RunDir(tmp_path)
    rd.heartbeat_dir.mkdir()
    rd.heartbeat(0).write_bytes(heartbeat_bytes(beat(0, 100, T0)))
    rd.heartbeat(1).write_bytes(heartbeat_bytes(beat(0, 100, T0 + 5)))
    watch.check()
    assert list(watch.records) == [0] and watch.records[0]["time"] == T0
    assert f"{rd.heartbeat(1)} skipped: it names rank 0" in capsys.readouterr().err


def as_slurm_job_7(monkeypatch) -> None:
    """The environment of start 0 of Slurm job 7's batch host (no rank's variables)."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GLAUNCH_JOB_ID", "7")
    monkeypatch.setenv("GLAUNCH_RESTART", "0")
    monkeypatch.setenv("SLURM_JOB_ID", "7")


def test_the_slurm_watchdog_finds_the_hang_beside_a_hostile_heartbeat(tmp_path, monkeypatch, capsys):
    import launcher.jobcontrol.watchdog as watchdog

    write_task_spec(tmp_path, spec(tmp_path, watchdog_stall_s=1.0, watchdog_first_step_s=1.0))
    as_slurm_job_7(monkeypatch)
    real = watchdog.write_stacks
    monkeypatch.setattr(watchdog, "write_stacks", lambda *a, **kw: real(*a, **kw, wait_s=0.5))
    rd = RunDir(tmp_path)
    rd.heartbeat_dir.mkdir()
    stalled = time.time() - 100
    for rank in (0, 1):
        rd.heartbeat(rank).write_bytes(heartbeat_bytes(beat(rank, 5, stalled)))
    hostile = dict(beat(2, 5, time.time() + 10**6), state=["running"], world_size=10**12)
    rd.heartbeat(2).write_bytes(heartbeat_bytes(hostile))
    deadline = time.monotonic() + 20
    cancels: list[list[str]] = []
    assert watchdog.watch_slurm(str(tmp_path), stop=lambda: time.monotonic() > deadline, cancel=cancels.append) == 0
    hang = json.loads(rd.hang_file.read_text())
    assert hang["kind"] == "stall" and [s["rank"] for s in hang["silent"]] == [0, 1]
    assert ["--signal=28", "7"] in cancels
    assert f"{rd.heartbeat(2)} skipped" in capsys.readouterr().err


def test_a_start_that_ends_before_the_next_poll_is_recorded_as_watched_once_its_ranks_beat(tmp_path, monkeypatch):
    """The first poll comes before any rank has beaten ("not watched"); the ranks then beat
    and the step ends before the next poll: the last look records the watch as it stood."""
    import launcher.jobcontrol.watchdog as watchdog

    write_task_spec(tmp_path, spec(tmp_path))
    record = RunRecord(run_id="r")
    record.record_start("7", 0, state="RUNNING")
    registry.write(tmp_path, record)
    as_slurm_job_7(monkeypatch)
    rd = RunDir(tmp_path)
    asked = []

    def stop() -> bool:
        asked.append(1)
        if len(asked) == 2:         # during the first sleep: the ranks beat, and the step ends
            rd.heartbeat_dir.mkdir()
            for rank in (0, 1):
                rd.heartbeat(rank).write_bytes(heartbeat_bytes(beat(rank, 6, time.time(), state="finished")))
        return len(asked) >= 2

    assert watchdog.watch_slurm(str(tmp_path), stop=stop) == 0
    entry = registry.read(tmp_path).start("7", 0).get("watchdog")
    assert entry["state"] == "watching" and entry["in_force"] == "stall", entry


def test_a_job_id_not_of_slurm_s_shape_is_named_not_called_missing(tmp_path, monkeypatch, capsys):
    from launcher.jobcontrol.watchdog import watch_slurm

    monkeypatch.setenv("GLAUNCH_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_ID", "abc\x1b[2J")
    assert watch_slurm(str(tmp_path), stop=lambda: True) == 0
    err = capsys.readouterr().err
    assert "SLURM_JOB_ID='abc\\x1b[2J' is not a Slurm job id" in err and "\x1b" not in err


def test_hang_json_read_back_is_checked(tmp_path):
    rd = RunDir(tmp_path)
    good = {"job_id": "7", "restart": 0, "detected_at": "2024-01-01T00:00:00+00:00", "kind": "stall",
            "bound_s": 60, "silent": [{"rank": 1, "node": "n2", "step": 5, "last_step_at": T0}], "node": "n2",
            "stacks": ["logs/stack-7_0_1.txt"], "detail": "no rank finished a step for 60 s"}
    rd.hang_file.write_text(json.dumps(good))
    assert hang_in(tmp_path, 0) == good and hang_in(tmp_path, 1) is None
    for change in ({"node": ["n2"]}, {"silent": "everyone"}, {"kind": "sleepy"}, {"bound_s": "forever"},
                   {"stacks": [1]}, {"detail": {"x": 1}}, {"restart": True}, {"silent": [{"rank": "one"}]}):
        rd.hang_file.write_text(json.dumps(dict(good, **change)))
        assert hang_in(tmp_path, 0 if change != {"restart": True} else 1) is None, change
    os.unlink(rd.hang_file)
    os.mkfifo(rd.hang_file)
    assert hang_in(tmp_path, 0) is None


# --- a step that outlives every rank's exit (a node's slurmstepd gone) ---------------------


@pytest.mark.parametrize("exits, world_size, outlived", [
    ({0: T0, 1: T0 + 5}, 2, True),
    ({0: T0, 1: None}, 2, False),           # a rank that has not exited may still run
    ({0: T0}, 2, False),                    # a rank without a record may still run
    ({}, 2, False),
    ({}, None, False),
])
def test_a_step_outlives_its_ranks_only_once_every_one_exited(exits, world_size, outlived):
    from launcher.jobcontrol.watchdog import step_outlives_ranks

    records = {rank: beat(rank, 100, T0, state="finished", exited=at) for rank, at in exits.items()}
    assert step_outlives_ranks(records, world_size) is outlived


def test_the_grace_runs_on_the_watchdog_s_clock_from_the_poll_that_saw_every_exit(tmp_path):
    """A node whose clock runs 10 min behind wrote its exit 'long ago': the grace counts from
    when this host first saw every rank exited, not from the nodes' times."""
    from launcher.jobcontrol.watchdog import OUTLIVED_S

    write_task_spec(tmp_path, spec(tmp_path))
    clock = [T0]
    watch = Watch(tmp_path, "7", 0, started=T0 - 100, clock=lambda: clock[0])
    rd = RunDir(tmp_path)
    rd.heartbeat_dir.mkdir()
    for rank in (0, 1):
        rd.heartbeat(rank).write_bytes(heartbeat_bytes(beat(rank, 50, T0 - 600, state="finished", exited=T0 - 600)))
    watch.check()
    assert watch.outlived_s() is None                    # first seen now
    clock[0] = T0 + OUTLIVED_S - 1
    watch.check()
    assert watch.outlived_s() is None
    clock[0] = T0 + OUTLIVED_S
    watch.check()
    assert watch.outlived_s() == OUTLIVED_S
    # A rank started again (peer recovery) has not exited: the count begins anew.
    rd.heartbeat(1).write_bytes(heartbeat_bytes(beat(1, 50, T0 + 40)))
    clock[0] = T0 + 41
    watch.check()
    assert watch.outlived_s() is None and watch.exits_seen is None


def test_the_slurm_watchdog_ends_a_step_that_outlived_its_ranks_even_with_the_watch_off(tmp_path, monkeypatch,
                                                                                      capsys):
    """Every rank finished and exited 40 s ago (their exit handler's last beat), and srun
    still waits: a node's slurmstepd is gone. The watch is off (no hang bound), and still
    the step is ended; a rank's record that claims an exit it is not of this start is not read."""
    import launcher.jobcontrol.watchdog as watchdog

    write_task_spec(tmp_path, spec(tmp_path, watchdog_stall_s=0.0, watchdog_first_step_s=0.0))
    as_slurm_job_7(monkeypatch)
    rd = RunDir(tmp_path)
    rd.heartbeat_dir.mkdir()
    exited = time.time() - 40
    rd.heartbeat(0).write_bytes(heartbeat_bytes(beat(0, 50, exited, state="finished", exited=exited)))
    rd.heartbeat(1).write_bytes(heartbeat_bytes(dict(beat(1, 50, exited, state="finished", exited=exited),
                                                     restart=1)))
    ended: list[int] = []
    deadline = time.monotonic() + 3
    assert watchdog.watch_slurm(str(tmp_path), stop=lambda: time.monotonic() > deadline, cancel=print,
                                end_step=lambda: ended.append(1)) == 0
    assert ended == []          # rank 1's exit is an earlier start's: it may still run
    rd.heartbeat(1).write_bytes(heartbeat_bytes(beat(1, 50, exited, state="finished", exited=exited)))
    monkeypatch.setattr(watchdog, "OUTLIVED_S", 2.0)
    deadline = time.monotonic() + 30
    assert watchdog.watch_slurm(str(tmp_path), stop=lambda: bool(ended) or time.monotonic() > deadline,
                                cancel=print, end_step=lambda: ended.append(1)) == 0
    assert ended == [1]
    err = capsys.readouterr().err
    assert re.search(r"every rank of start 0 has exited \(seen [0-9]+ s ago\), and its step still runs", err), err
