"""watchdog.stall_s: auto and the slow-node report, decided from recorded heartbeat
contents without a job: the bound the step and save times call for, when a hang is found
under it, and which rank the busy times single out as slow (and none among equal ranks)."""

from __future__ import annotations

import json
import random
import statistics
from datetime import datetime

import pytest

from launcher.rundir.records import RunRecord
from launcher.rundir.taskspec import write_task_spec
from launcher.jobcontrol import jobend
from launcher.rundir.heartbeatrecord import BUSY_WINDOW
from launcher.runtime.heartbeats import Beats
from launcher.jobcontrol.watchdog import (
    AUTO_EARLY_STEPS,
    AUTO_STALL_FACTOR,
    AUTO_WARMUP_STEPS,
    SAVE_BOUND_MIN_S,
    SLOW_WINDOWS,
    WINDOW_S,
    Limits,
    SlowRanks,
    Watch,
    bounds_in_force,
    busy_ratios,
    find_hang,
)
from test_watchdog import spec

T0 = 1_700_000_000.0
AUTO = Limits(stall_s=600, first_step_s=1800, auto=True, floor_s=1.0)


def beat(rank, step, at, *, p99=None, timed=0, save_s=None, node="n1", interval_s=1.0, **more):
    return {"rank": rank, "node": node, "step": step, "time": at, "state": "running", "interval_s": interval_s,
            "step_s": p99, "step_p99_s": p99, "steps_timed": timed, "save_s": save_s, "job_id": "7", "restart": 0,
            **more}


def test_a_fixed_bound_stays_fixed():
    bounds = bounds_in_force({0: beat(0, 100, T0, p99=0.1, timed=500)}, Limits(stall_s=60, first_step_s=300))
    assert (bounds.basis, bounds.stall_s, bounds.save_s) == ("fixed", 60, SAVE_BOUND_MIN_S)


def test_before_the_first_steps_are_timed_the_initial_bound_holds():
    records = {0: beat(0, 3, T0, p99=0.1, timed=AUTO_EARLY_STEPS - 1), 1: beat(1, 1, T0, timed=0)}
    bounds = bounds_in_force(records, AUTO)
    assert (bounds.basis, bounds.stall_s, bounds.save_s) == ("initial", 600, max(4 * 600, SAVE_BOUND_MIN_S))
    assert bounds_in_force({}, AUTO).basis == "initial"


FLOOR_60 = Limits(600, 1800, auto=True, floor_s=60)
FLOOR_TENTH = Limits(600, 1800, auto=True, floor_s=0.1)


# (each rank's (p99, steps timed), limits, the basis, the bound): before warm-up the bound
# fits the run's first steps (AUTO_EARLY_FACTOR x the slowest of them, at least the floor);
# a first step of compilation is no timed step and moves nothing.
@pytest.mark.parametrize("ranks,limits,basis,bound", [
    ([(None, 0), (None, 0)], AUTO, "initial", 600),                     # no step timed yet
    ([(0.1, 2), (0.1, 1)], AUTO, "initial", 600),                       # not yet AUTO_EARLY_STEPS
    ([(0.1, 3), (None, 0)], FLOOR_TENTH, "early", 5 * 0.1),             # a fast run: 0.5 s
    ([(0.1, 3), (None, 0)], FLOOR_60, "early", 60),                     # ... at least the floor
    ([(0.1, 5), (0.3, 3)], AUTO, "early", 5 * 0.3),                     # the slowest rank's first steps
    ([(30.0, 3), (30.0, 3)], FLOOR_60, "early", 150),                   # 30 s steps: 150 s, not 600
    ([(200.0, 4), (150.0, 4)], FLOOR_60, "early", 1000),                # steps of minutes: beyond the initial bound
    ([(0.1, 19), (0.1, 3)], FLOOR_TENTH, "early", 5 * 0.1),             # not yet warm
    ([(0.1, 20), (0.5, 3)], FLOOR_TENTH, "steps", AUTO_STALL_FACTOR * 0.1),   # the warm ranks speak for all
    ([(0.1, 3), (0.1, 3)], Limits(60, 300), "fixed", 60),               # a fixed bound stays fixed
], ids=["none-timed", "too-few", "fast", "floor", "slowest-rank", "slow-steps", "minutes", "not-warm", "warm",
        "fixed"])
def test_the_bound_before_warm_up_comes_from_the_first_timed_steps(ranks, limits, basis, bound):
    records = {rank: beat(rank, timed + 1, T0, p99=p99, timed=timed) for rank, (p99, timed) in enumerate(ranks)}
    bounds = bounds_in_force(records, limits)
    assert (bounds.basis, bounds.stall_s) == (basis, pytest.approx(bound))


def test_an_early_hang_in_a_fast_run_is_found_within_the_early_bound_and_the_first_step_is_not_judged_by_it():
    """0.1 s steps after a first step of 20 s (compilation): while no rank has stepped the
    first-step bound holds; once the first steps are timed, a silence is a hang after
    AUTO_EARLY_FACTOR x their slowest (the floor: 1 s) plus the heartbeat interval."""
    started = T0 - 25.0
    compiling = {0: {"rank": 0, "node": "n1", "state": "running", "job_id": "7", "restart": 0,
                     "announced_at": T0 - 24.0, "interval_s": 1.0}}
    assert find_hang(compiling, now=T0 - 4.0, started=started, limits=AUTO) is None       # 20 s into its first step
    records = {r: beat(r, 4, T0, p99=0.1, timed=AUTO_EARLY_STEPS, first_time=T0 - 0.3, announced_at=T0 - 24.0)
               for r in range(2)}
    bounds = bounds_in_force(records, AUTO)
    assert (bounds.basis, bounds.stall_s) == ("early", 1.0)
    assert find_hang(records, now=T0 + 1.0 + 0.99, started=started, limits=AUTO) is None
    hang = find_hang(records, now=T0 + 1.0 + 1.0, started=started, limits=AUTO)
    assert hang is not None and (hang.kind, hang.bound_s) == ("stall", 1.0)


def test_one_warm_rank_speaks_for_the_others_whose_files_lag():
    """Rank 1 writes every 5 s: its record may still show its first steps when it hangs."""
    records = {0: beat(0, 27, T0, p99=0.3, timed=AUTO_WARMUP_STEPS), 1: beat(1, 1, T0 - 5, timed=0)}
    bounds = bounds_in_force(records, AUTO)
    assert (bounds.basis, bounds.step_p99_s) == ("steps", 0.3)


def test_after_warm_up_the_bound_is_a_multiple_of_the_slowest_p99_and_at_least_the_floor():
    records = {0: beat(0, 50, T0, p99=2.0, timed=40), 1: beat(1, 50, T0, p99=4.0, timed=40)}
    bounds = bounds_in_force(records, AUTO)
    assert (bounds.basis, bounds.step_p99_s, bounds.stall_s) == ("steps", 4.0, AUTO_STALL_FACTOR * 4.0)
    fast = {0: beat(0, 50, T0, p99=0.01, timed=40)}
    assert bounds_in_force(fast, Limits(600, 1800, auto=True, floor_s=60)).stall_s == 60


def test_a_save_s_bound_comes_from_the_longest_last_save():
    records = {0: beat(0, 50, T0, p99=1.0, timed=40, save_s=30.0), 1: beat(1, 50, T0, p99=1.0, timed=40, save_s=45.0)}
    bounds = bounds_in_force(records, AUTO)
    assert (bounds.save_s, bounds.last_save_s) == (4 * 45.0, 45.0)
    quick = {0: beat(0, 50, T0, p99=1.0, timed=40, save_s=0.1)}
    assert bounds_in_force(quick, Limits(600, 1800, auto=True, floor_s=60)).save_s == 60


def test_a_save_in_progress_is_judged_by_the_save_bound_not_the_step_bound():
    saving = beat(0, 50, T0, p99=1.0, timed=40, save_s=10.0, state="saving", saving_since=T0)
    records = {0: saving, 1: dict(saving, rank=1)}
    assert find_hang(records, now=T0 + 39, started=T0 - 100, limits=AUTO) is None      # 2.5 s step bound long past
    hang = find_hang(records, now=T0 + 40, started=T0 - 100, limits=AUTO)
    assert hang is not None and (hang.kind, hang.bound_s) == ("save", 40.0)


@pytest.mark.parametrize("p99,interval", [(0.4, 1.0), (2.0, 5.0), (30.0, 5.0)])
def test_a_hang_is_found_within_three_p99_and_the_heartbeat_interval(p99, interval):
    """The ranks stop at T0: the last step any rank wrote was at most the interval earlier.
    Polled at the Watch's own pace, the hang is found within 3 x p99 + the interval."""
    limits = Limits(600, 1800, auto=True, floor_s=0.5)
    records = {r: beat(r, 100, T0 - interval, p99=p99, timed=100, interval_s=interval) for r in range(4)}
    watch = Watch("/nonexistent", "7", 0, limits=limits, world_size=4, started=T0 - 1000)
    watch.bounds = bounds_in_force(records, limits)
    now, found = T0, None
    while found is None and now < T0 + 10 * (p99 + interval):
        found = find_hang(records, now=now, started=T0 - 1000, limits=limits)
        now += watch.poll_s() if found is None else 0
    assert found is not None and found.kind == "stall"
    assert found.bound_s == max(limits.floor_s, AUTO_STALL_FACTOR * p99)
    assert now - T0 <= 3 * p99 + interval, (now - T0, p99, interval)
    # Never before the bound: a rank that stepped unwritten within its interval is alive.
    assert find_hang(records, now=T0 + found.bound_s - 0.01, started=T0 - 1000, limits=limits) is None


def test_until_warm_up_the_watch_polls_at_the_floor_s_pace():
    """The early bound comes into force at the beat that times the first steps: polled at
    the initial bound's pace (5 s), a hang under a bound of 1 s would be found seconds late."""
    limits = Limits(600, 1800, auto=True, floor_s=1.0)
    watch = Watch("/nonexistent", "7", 0, limits=limits, world_size=2, started=T0)
    watch.bounds = bounds_in_force({}, limits)
    assert watch.poll_s() == pytest.approx(0.1)
    watch.bounds = bounds_in_force({0: beat(0, 40, T0, p99=4.0, timed=AUTO_WARMUP_STEPS)}, limits)
    assert watch.poll_s() == pytest.approx(AUTO_STALL_FACTOR * 4.0 / 10)      # warm: the bound's own pace


# --- slow ranks ---------------------------------------------------------------------------------


def busy_records(busy_by_rank: dict[int, float], counts: dict[int, int], nodes: dict[int, str]) -> dict[int, dict]:
    return {r: {"rank": r, "node": nodes[r], "busy_s": round(busy_by_rank[r], 6), "busy_count": counts[r]}
            for r in busy_by_rank}


def simulate(slowdown: dict[int, float], *, ranks=4, step_s=0.2, noise=0.05, write_s=5.0, seconds=600.0, seed=1):
    """Every rank's busy times (step_s x its slowdown, with Gaussian noise), as its
    heartbeat shows them: the median of its last BUSY_WINDOW at each write (every
    write_s); the watchdog polls every second. Returns {rank: seconds after the start
    it was named} and the watch."""
    rng = random.Random(seed)
    nodes = {r: f"gpu{r // 2:03d}" for r in range(ranks)}
    # The slowest rank sets the pace: a step takes its busy time, the others wait.
    pace = step_s * max([1.0] + list(slowdown.values()))
    samples: dict[int, list[float]] = {r: [] for r in range(ranks)}
    shown: dict[int, tuple[float, int]] = {}
    slow, named, t, last_write = SlowRanks(), {}, 0.0, -write_s
    while t < seconds:
        t += 1.0
        steps = int(t / pace) - len(samples[0])
        for r in range(ranks):
            samples[r] += [step_s * slowdown.get(r, 1.0) * max(0.1, rng.gauss(1.0, noise)) for _ in range(steps)]
        if t - last_write >= write_s and samples[0]:
            last_write = t
            shown = {r: (statistics.median(samples[r][-BUSY_WINDOW:]), len(samples[r])) for r in range(ranks)}
        if shown:
            slow.observe(busy_records({r: v for r, (v, _) in shown.items()}, {r: c for r, (_, c) in shown.items()},
                                      nodes), T0 + t)
        for rank, found in slow.named.items():
            named.setdefault(rank, found.named_at - T0)
    return named, slow


def test_a_rank_half_as_slow_again_is_named_with_its_node_within_the_stated_window():
    named, slow = simulate({3: 1.5})
    assert set(named) == {3}
    # A window closes once every rank has BUSY_WINDOW more busy times (here 4 s of steps at
    # the slow rank's pace, seen at the next 5 s write), or WINDOW_S passed.
    window = max(BUSY_WINDOW * 0.2 * 1.5, 5.0)
    assert named[3] <= (SLOW_WINDOWS + 1) * min(window + 5.0, WINDOW_S), named
    entry = slow.to_list()[0]
    assert entry["node"] == "gpu001" and 1.3 < entry["ratio"] < 1.8 and entry["named_at"]


def test_slow_steps_of_ten_seconds_are_named_within_a_few_minutes():
    """A window of long steps closes after WINDOW_S with a few new steps of every rank."""
    named, _ = simulate({1: 1.5}, step_s=10.0, write_s=5.0, seconds=1800.0)
    assert set(named) == {1}
    assert named[1] <= 300, named


@pytest.mark.parametrize("seed", range(5))
def test_equal_ranks_with_noise_are_never_named(seed):
    named, _ = simulate({}, noise=0.15, seed=seed, seconds=1800.0)
    assert named == {}


def test_a_brief_slowdown_is_not_persistent():
    """One window above the ratio, then back: SLOW_WINDOWS running are needed."""
    slow = SlowRanks()
    nodes = {0: "a", 1: "b", 2: "c"}
    for window, factor in enumerate([1.0, 2.0, 1.0, 2.0, 1.0, 1.0]):
        count = (window + 1) * BUSY_WINDOW
        slow.observe(busy_records({0: 0.1, 1: 0.1, 2: 0.1 * factor}, dict.fromkeys(nodes, count), nodes), T0 + window)
    assert slow.named == {}


def test_a_window_needs_every_rank_s_new_busy_times_or_the_time_limit():
    slow = SlowRanks()
    nodes = {0: "a", 1: "b"}
    for i in range(10):        # rank 1 reports no new busy times: nothing is judged
        slow.observe(busy_records({0: 0.1, 1: 0.5}, {0: (i + 1) * BUSY_WINDOW, 1: 5}, nodes), T0 + i)
    assert slow.streak == {}
    for i in range(SLOW_WINDOWS):     # a few new ones each, a window every WINDOW_S
        slow.observe(busy_records({0: 0.1, 1: 0.5}, {0: 1000 + i * 5, 1: 10 + i * 5}, nodes), T0 + 100 + i * WINDOW_S)
    assert list(slow.named) == [1]


def test_busy_ratios_against_the_median_of_the_peers():
    assert busy_ratios({0: 1.0, 1: 1.0, 2: 1.5}) == {0: pytest.approx(0.8), 1: pytest.approx(0.8), 2: 1.5}
    assert busy_ratios({0: 1.0}) == {}
    assert busy_ratios({0: 1.0, 1: 0.0}) == {1: 0.0}


def test_a_rank_measures_its_busy_time_from_its_return_from_the_collective(monkeypatch):
    clock = iter([100.0, 100.5, 101.0, 101.2, 102.0, 102.3]).__next__
    monkeypatch.setattr("launcher.runtime.heartbeats.time.time", clock)
    beats = Beats(run_dir=None, interval_s=0, checkpoint_every=0)
    beats.beat(1)                      # 100.0
    beats.synced_at = clock()          # 100.5: left should_stop's collective
    beats.beat(2)                      # 101.0: busy 0.5
    beats.synced_at = clock()          # 101.2
    beats.beat(3)                      # 102.0: busy 0.8
    pace = beats.pace()
    assert (pace["busy_count"], pace["steps_timed"]) == (2, 2)
    assert pace["busy_s"] == pytest.approx(0.65) and pace["step_p99_s"] == pytest.approx(1.0, abs=0.01)


# --- slow_node: exclude, at the start's end ------------------------------------------------------


@pytest.mark.parametrize("setting,excluded", [("exclude", ["x", "b"]), ("report", None)])
def test_a_slow_node_is_left_out_of_later_starts_only_with_exclude(tmp_path, monkeypatch, setting, excluded):
    monkeypatch.setattr(jobend, "partition_nodes", lambda partition: (["a", "b", "c", "d"], ""))
    write_task_spec(tmp_path, spec(tmp_path, watchdog_slow_node=setting))
    record = RunRecord(run_id="r", nodes=2, partition="gpu")
    record.record_start("7", 0, watchdog={"slow": [{"rank": 3, "node": "b"}, {"rank": 2, "node": "b"}]})
    assert jobend.exclude_slow_nodes(tmp_path, record, "7", 0, ["x"], 1) == excluded
    exclusion = record.start("7", 0).get("watchdog").get("exclusion")
    assert exclusion == ("slow: b excluded from later starts" if excluded else None)


def test_a_slow_node_stays_when_the_partition_could_not_spare_it(tmp_path, monkeypatch):
    monkeypatch.setattr(jobend, "partition_nodes", lambda partition: (["a", "b"], ""))
    write_task_spec(tmp_path, spec(tmp_path, watchdog_slow_node="exclude"))
    record = RunRecord(run_id="r", nodes=2, partition="gpu")
    record.record_start("7", 0, watchdog={"slow": [{"rank": 1, "node": "b"}]})
    assert jobend.exclude_slow_nodes(tmp_path, record, "7", 0, [], 2) is None
    assert "b not excluded: partition gpu would keep 1 usable node(s)" in record.start("7", 0).get("watchdog")["exclusion"]


def test_slow_nodes_read_from_a_start_s_entry_take_only_node_names():
    entry = {"watchdog": {"slow": [{"node": "a"}, {"node": "a"}, {"node": "-rf"}, "b", {"node": None}]}}
    assert jobend.slow_nodes(entry) == ["a"]
    assert jobend.slow_nodes({"watchdog": "x"}) == jobend.slow_nodes(None) == []


def test_a_hang_s_detection_time_is_when_it_was_found_not_when_the_stacks_were_written(tmp_path, monkeypatch):
    """Writing the stacks takes a second or more (faulthandler's output settling): the
    latency a hang.json shows is the watchdog's own."""
    now = [T0]
    watch = Watch(tmp_path, "7", 0, limits=AUTO, world_size=1, started=T0, clock=lambda: now[0])

    def slow_stacks(*args):
        now[0] += 3.0
        return ["logs/stack-7_0_0.txt"]

    monkeypatch.setattr("launcher.jobcontrol.watchdog.write_stacks", slow_stacks)
    ranks = type("Ranks", (), {"signal": lambda self, signum: None, "end": lambda self: None})()
    hang = find_hang({0: beat(0, 5, T0 - 700)}, now=T0, started=T0 - 800, limits=AUTO)
    assert hang is not None
    watch.act(hang, ranks)
    written = json.loads((tmp_path / "hang.json").read_text())
    assert written["stacks"] == ["logs/stack-7_0_0.txt"]
    assert datetime.fromisoformat(written["detected_at"]).timestamp() == pytest.approx(T0, abs=1e-3)


@pytest.mark.parametrize("busy, named", [
    ({0: 0.0056, 1: 0.0076}, []),        # x1.36, 2 ms behind: a loaded machine, not a slow rank
    ({0: 0.005, 1: 0.020}, [1]),          # x4, 15 ms behind: slow
    ({0: 0.100, 1: 0.140}, [1]),          # x1.4, 40 ms behind: slow
], ids=["milliseconds", "small-but-far-behind", "usual"])
def test_a_rank_is_slow_only_when_it_is_behind_by_more_than_a_few_milliseconds(busy, named):
    slow = SlowRanks()
    nodes = {0: "a", 1: "b"}
    for window in range(SLOW_WINDOWS):
        slow.observe(busy_records(busy, dict.fromkeys(nodes, (window + 1) * BUSY_WINDOW), nodes), T0 + window)
    assert list(slow.named) == named


@pytest.mark.parametrize("nodes, answered, quiet, node", [
    ({0: "a", 1: "a", 2: "b", 3: "b"}, {0, 1}, (2, 3), "b"),      # both of b's ranks answered nothing: b
    ({0: "a", 1: "a", 2: "b", 3: "b"}, {0, 1, 3}, (2,), None),     # one of b's answered: no node to blame
    ({0: "a", 1: "a", 2: "b", 3: "c"}, {0, 1}, (2, 3), None),      # two nodes
    ({0: "a", 1: "b"}, set(), (), None),                            # none answered: nothing stands out
    ({0: "a", 1: "b"}, {0, 1}, (), None),
])
def test_ranks_that_write_no_stack_when_others_do_point_at_their_node(nodes, answered, quiet, node):
    from launcher.jobcontrol.watchdog import unanswering_node

    records = {rank: beat(rank, 29, T0, node=n) for rank, n in nodes.items()}
    assert unanswering_node(records, answered) == (quiet, node)


def test_a_hang_whose_stopped_ranks_wrote_no_stack_names_them_and_their_node(tmp_path, monkeypatch):
    """Every rank silent at step 29 (its peers wait in a collective for it): the heartbeats
    single out no one. dnode2's ranks, stopped (SIGSTOP, a frozen host), write no stack."""
    watch = Watch(tmp_path, "7", 0, limits=AUTO, world_size=4, started=T0, clock=lambda: T0)
    watch.records = {rank: beat(rank, 29, T0 - 700, node="dnode1" if rank < 2 else "dnode2") for rank in range(4)}
    monkeypatch.setattr("launcher.jobcontrol.watchdog.write_stacks",
                        lambda *args: ["logs/stack-7_0_0.txt", "logs/stack-7_0_1.txt"])
    ranks = type("Ranks", (), {"signal": lambda self, signum: None, "end": lambda self: None})()
    hang = find_hang(watch.records, now=T0, started=T0 - 800, limits=AUTO, world_size=4)
    assert hang is not None and hang.node is None
    written = watch.act(hang, ranks)
    assert written.node == "dnode2" and written.unanswered == (2, 3)
    record = json.loads((tmp_path / "hang.json").read_text())
    assert record["node"] == "dnode2"
    assert record["detail"].endswith("; rank(s) 2, 3 on dnode2 wrote no stack when asked (stopped, or stuck in the "
                                     "kernel))")
