"""watchdog.slow_node: exclude with a spare in the allocation, decided without a cluster: the
watchdog stops the start as soon as it names a slow rank on a node of the step (its swap
recorded in run.json first, then the stop signal), and the start's end goes on in a new step
with the spare in place of the slow node, a graceful stop that crash_retries does not count."""

from __future__ import annotations

import json
import signal

import pytest

from launcher.rundir import registry
from launcher.rundir.records import SLOW_NODE, RunRecord, StartRecord
from launcher.jobcontrol import jobend
from launcher.jobcontrol.jobend import decide
from launcher.rundir.startsummary import iso
from launcher.jobcontrol.watchdog import STOP_SIGNAL, Limits, SlowRank, Watch, bounds_in_force, swap_asked, swap_for

T0 = 1_700_000_000.0


def slow(rank, node, at=T0):
    return SlowRank(rank, node, 1.5, 0.3, 0.2, at)


@pytest.mark.parametrize("named, allocation, in_use, before, expected", [
    ([slow(1, "n2")], "n1 n2 n3", "n1 n2", "", (1, "n2", "n3")),
    # The first named on a node of the step; the spare first in the allocation's order.
    ([slow(3, "n2", T0 + 5), slow(0, "n1")], "n1 n2 n3 n4", "n1 n2", "", (0, "n1", "n3")),
    ([slow(1, "n9"), slow(2, "n2", T0 + 1)], "n1 n2 n3", "n1 n2", "", (2, "n2", "n3")),
    ([slow(1, None)], "n1 n2 n3", "n1 n2", "", None),                  # no node to leave out
    ([slow(1, "n2")], "n1 n2", "n1 n2", "", None),                     # no spare
    ([slow(1, "n2")], "n1 n2 n3", "n2 n3", "n1", None),                # the spare went to an earlier restart
    ([slow(1, "n2")], "n1 n2 n3 n4", "n2 n3", "n1", (1, "n2", "n4")),
    ([slow(1, "n2")], "", "n1 n2", "", None),                          # not a batch job: no restart in it
    ([], "n1 n2 n3", "n1 n2", "", None),
])
def test_a_slow_node_is_swapped_only_for_a_spare_no_step_and_no_restart_took(named, allocation, in_use, before,
                                                                              expected):
    found = swap_for(named, allocation=allocation.split(), in_use=in_use.split(), left_out_before=before.split())
    assert (None if found is None else (found[0].rank, found[0].node, found[1])) == expected


class Signals:
    """The ranks of a step, as the watchdog reaches them: the signals it sent."""

    def __init__(self):
        self.sent: list[int] = []

    def signal(self, signum):
        self.sent.append(signum)

    def end(self):
        self.sent.append(signal.SIGKILL)


@pytest.fixture
def run_dir(tmp_path, monkeypatch, isolated_env):
    """A run of two training nodes and one spare, whose start 0 of job 7 runs on n1 and n2."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    registry.write(run_dir, RunRecord(run_id="r", state="RUNNING", nodes=2, requeue_max=3, crash_retries=1,
                                      job_id="7", starts=[StartRecord(job_id="7", restart=0, state="RUNNING")]))
    monkeypatch.setattr(jobend, "partition_nodes", lambda partition: (None, "no sinfo here"))
    monkeypatch.setenv("GLAUNCH_JOB_ID", "7")
    monkeypatch.setenv("GLAUNCH_RESTART", "0")
    return run_dir


def watch(run_dir, setting="exclude"):
    limits = Limits(stall_s=600, first_step_s=1800, slow_node=setting)
    w = Watch(run_dir, "7", 0, limits=limits, world_size=4, started=T0, clock=lambda: T0 + 90)
    w.bounds = bounds_in_force({}, limits)
    w.slow.named = {3: slow(3, "n2")}
    return w


def test_the_watchdog_records_the_swap_then_asks_every_rank_to_save_and_stop_once(run_dir):
    w, ranks = watch(run_dir), Signals()
    due = w.swap_due(["n1", "n2", "n3"], ["n1", "n2"])
    assert due is not None and (due[0].node, due[1]) == ("n2", "n3")
    w.ask_swap(*due, ranks)
    assert ranks.sent == [STOP_SIGNAL] == [signal.SIGUSR2]
    entry = registry.read(run_dir).start("7", 0)
    assert entry.get("watchdog")["slow"][0]["node"] == "n2"
    assert swap_asked(entry) == {"node": "n2", "rank": 3, "spare": "n3", "asked_at": iso(T0 + 90)}
    assert w.swap_due(["n1", "n2", "n3"], ["n1", "n2"]) is None          # once a start


@pytest.mark.parametrize("setting, allocation", [("report", "n1,n2,n3"), ("exclude", "n1,n2")])
def test_no_swap_when_slow_nodes_are_only_reported_or_no_spare_is_there(run_dir, setting, allocation):
    assert watch(run_dir, setting).swap_due(allocation.split(","), ["n1", "n2"]) is None


def _end(run_dir, capsys, status=0, stopped=True):
    if stopped:
        (run_dir / "stop.json").write_text(json.dumps({"restart": 0, "step": 40}))
    code = jobend.main([str(run_dir), "--status", str(status), "--allocation", "n1,n2,n3", "--step-nodes", "n1,n2"])
    return code, capsys.readouterr().out.strip()


def test_a_stop_for_a_slow_node_goes_on_with_the_spare_and_is_no_crash(run_dir, capsys):
    watch(run_dir).ask_swap(slow(3, "n2"), "n3", Signals())
    assert _end(run_dir, capsys) == (0, "restart n1,n3")
    record = registry.read(run_dir)
    first = record.start("7", 0)
    assert (first.state, first.reason, first.bad_node, first.left_out, first.stopped_at) == (
        "RESTARTED", SLOW_NODE, "n2", "n2", 40)
    assert first.exclusion == "n2 (slow) left out of the next step in the allocation; n3 took its place"
    assert record.crash_count(job_id="7") == 0 and record.state == "RUNNING"


def test_ranks_that_crash_instead_of_stopping_are_a_crash(run_dir, capsys, monkeypatch):
    monkeypatch.setattr(jobend, "exclude_bad_nodes_setting", lambda run_dir: (True, ""))
    watch(run_dir).ask_swap(slow(3, "n2"), "n3", Signals())
    (run_dir / "crash.json").write_text(json.dumps({"restart": 0, "task": 0, "node": "n1", "error": "x"}))
    assert _end(run_dir, capsys, status=1, stopped=False) == (0, "restart n2,n3")
    first = registry.read(run_dir).start("7", 0)
    assert (first.reason, first.bad_node, first.left_out) == ("crash", "n1", "n1")


@pytest.mark.parametrize("stopped, preempted, expected", [
    (True, False, SLOW_NODE),
    (True, True, "preemption"),        # Slurm's preemption came first: it requeues as ever
])
def test_a_stop_is_for_the_slow_node_only_when_the_watchdog_asked_for_it(stopped, preempted, expected):
    common = dict(step_status=0, finished=False, timed_out=False, restart=0, requeue_max=3, crashes=0,
                  crash_retries=0)
    assert decide(stopped=stopped, preempted=preempted, swapping=True, **common).reason == expected
    assert decide(stopped=stopped, preempted=preempted, **common).reason in ("timeout", "preemption")
    assert decide(stopped=stopped, preempted=preempted, swapping=True, **common).requeue
