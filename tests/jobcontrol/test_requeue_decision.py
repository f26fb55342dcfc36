"""The end of a start, decided without a cluster: jobend.decide's table, and the small
files (stop.json, resume.json, crash.json) that the ranks and the task leave for it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from launcher.rundir.layout import RunDir
from launcher.jobcontrol.jobend import (Killed, Outcome, decide, first_signalled_task, killed_by, killed_in_step,
                                     resumed_in, signal_of, stopped_in, with_crash_note)

# What is known when a start's step ended; each row of the table changes some of it.
BASE: dict[str, Any] = dict(step_status=0, finished=False, stopped=False, preempted=False, timed_out=False, restart=0,
            requeue_max=3, crashes=0, crash_retries=0, cancelled=False, hung=False)

TABLE = [
    # --- the run is done: result.json wins over whatever ended the step
    ("finished", {"finished": True},
     Outcome("COMPLETED", None, False, 0)),
    ("finished, then killed at the time limit", {"finished": True, "timed_out": True, "step_status": 137},
     Outcome("COMPLETED", None, False, 0)),
    ("finished, then preempted at requeue.max", {"finished": True, "preempted": True, "restart": 3},
     Outcome("COMPLETED", None, False, 0)),
    ("finished, then cancelled", {"finished": True, "cancelled": True, "step_status": 143},
     Outcome("COMPLETED", None, False, 0)),
    # --- cancelled: never requeued, whatever else happened
    ("cancelled", {"cancelled": True, "step_status": 143},
     Outcome("CANCELLED", "cancelled", False, 1)),
    ("cancelled while stopping for the time limit", {"cancelled": True, "stopped": True},
     Outcome("CANCELLED", "cancelled", False, 1)),
    ("cancelled with crash retries left", {"cancelled": True, "step_status": 1, "crash_retries": 2},
     Outcome("CANCELLED", "cancelled", False, 1)),
    # --- stopped gracefully / preempted / timed out: requeued below requeue.max
    ("stopped, first start", {"stopped": True},
     Outcome("REQUEUED", "timeout", True, 0)),
    ("timed out, one below requeue.max", {"timed_out": True, "step_status": 143, "restart": 2},
     Outcome("REQUEUED", "timeout", True, 0)),
    ("a script without the runtime, timed out with crash retries left",
     {"timed_out": True, "step_status": 143, "crash_retries": 2, "runtime": False},
     Outcome("REQUEUED", "timeout", True, 0)),
    ("preempted, first start", {"preempted": True, "step_status": 143},
     Outcome("REQUEUED", "preemption", True, 0)),
    ("stopped because preempted", {"stopped": True, "preempted": True},
     Outcome("REQUEUED", "preemption", True, 0)),
    ("stopped with a non-zero step status", {"stopped": True, "step_status": 1, "crash_retries": 2},
     Outcome("REQUEUED", "timeout", True, 0)),
    # --- the signal the ranks stopped on: the time limit's warning, or a SIGTERM the limit explains,
    # is a timeout; a SIGTERM that nothing Slurm said explains (an administrator's, a node's
    # shutdown) is its own reason
    ("stopped on the limit's warning", {"stopped": True, "stop_signal": "SIGUSR2"},
     Outcome("REQUEUED", "timeout", True, 0)),
    ("stopped on the SIGTERM of the time limit", {"stopped": True, "stop_signal": "SIGTERM", "timed_out": True,
                                                   "step_status": 143},
     Outcome("REQUEUED", "timeout", True, 0)),
    ("stopped on a SIGTERM nothing explains", {"stopped": True, "stop_signal": "SIGTERM"},
     Outcome("REQUEUED", "terminated", True, 0)),
    ("stopped on a SIGTERM of a preemption", {"stopped": True, "stop_signal": "SIGTERM", "preempted": True},
     Outcome("REQUEUED", "preemption", True, 0)),
    ("stopped on a SIGTERM nothing explains, at requeue.max", {"stopped": True, "stop_signal": "SIGTERM",
                                                                "restart": 3},
     Outcome("FAILED", "terminated", False, 1, "requeue.max (3) reached")),
    ("a stop asked from code", {"stopped": True, "stop_signal": None},
     Outcome("REQUEUED", "timeout", True, 0)),
    # --- ... and at requeue.max the run ends in the scheduler's terms
    ("stopped at requeue.max", {"stopped": True, "restart": 3},
     Outcome("TIMEOUT", "timeout", False, 1, "requeue.max (3) reached")),
    ("timed out at requeue.max", {"timed_out": True, "step_status": 143, "restart": 3},
     Outcome("TIMEOUT", "timeout", False, 1, "requeue.max (3) reached")),
    ("preempted at requeue.max", {"preempted": True, "restart": 3},
     Outcome("PREEMPTED", "preemption", False, 1, "requeue.max (3) reached")),
    ("timed out, requeue.max 0", {"timed_out": True, "step_status": 143, "requeue_max": 0},
     Outcome("TIMEOUT", "timeout", False, 1, "requeue.max (0) reached")),
    # --- a clean exit that wrote no result: nothing to resume for
    ("a script without the runtime that ended by itself as the limit came", {"timed_out": True, "runtime": False},
     Outcome("COMPLETED", None, False, 0)),
    ("clean exit without result.json", {},
     Outcome("COMPLETED", None, False, 0, "the entry point wrote no result.json")),
    ("clean exit without result.json, crash retries left", {"crash_retries": 2, "restart": 1},
     Outcome("COMPLETED", None, False, 0, "the entry point wrote no result.json")),
    # --- crashes: retried while crash_retries and requeue.max both allow
    ("crash, retries left", {"step_status": 1, "crash_retries": 2},
     Outcome("REQUEUED", "crash", True, 0, "exit status 1; retry 1 of 2")),
    ("crash, last retry", {"step_status": 1, "crash_retries": 2, "crashes": 1, "restart": 1},
     Outcome("REQUEUED", "crash", True, 0, "exit status 1; retry 2 of 2")),
    ("crash, retries used up", {"step_status": 1, "crash_retries": 2, "crashes": 2, "restart": 2},
     Outcome("FAILED", "crash", False, 1, "exit status 1; crash_retries (2) used up")),
    ("crash, retries left but requeue.max reached", {"step_status": 1, "crash_retries": 2, "restart": 3},
     Outcome("FAILED", "crash", False, 1, "exit status 1; requeue.max (3) reached")),
    ("crash, retries used up and requeue.max reached",
     {"step_status": 1, "crash_retries": 2, "crashes": 2, "restart": 3},
     Outcome("FAILED", "crash", False, 1, "exit status 1; crash_retries (2) used up")),
    ("crash, no retries configured", {"step_status": 1},
     Outcome("FAILED", "crash", False, 1, "exit status 1")),
    ("crash killed by SIGKILL keeps its status", {"step_status": 137},
     Outcome("FAILED", "crash", False, 137, "exit status 137")),
    ("crash with status 255", {"step_status": 255},
     Outcome("FAILED", "crash", False, 255, "exit status 255")),
    ("crash with a status no process can exit with", {"step_status": 256},
     Outcome("FAILED", "crash", False, 1, "exit status 256")),
    ("crash with a negative status", {"step_status": -9},
     Outcome("FAILED", "crash", False, 1, "exit status -9")),
    # --- a task killed by a signal nobody asked for (the OOM killer's SIGKILL): a crash, retried
    ("rank killed by SIGKILL", {"step_status": 137, "killed": Killed(9, 1)},
     Outcome("FAILED", "crash", False, 137, "rank 1 killed by SIGKILL (out of memory?)")),
    ("rank killed by SIGKILL, retries left", {"step_status": 137, "killed": Killed(9, 1), "crash_retries": 1},
     Outcome("REQUEUED", "crash", True, 0, "rank 1 killed by SIGKILL (out of memory?); retry 1 of 1")),
    ("a rank killed by SIGSEGV, which one not known", {"step_status": 139, "killed": Killed(11)},
     Outcome("FAILED", "crash", False, 139, "a rank killed by SIGSEGV")),
    ("killed, but a cancel was asked", {"step_status": 137, "killed": Killed(9, 1), "cancelled": True},
     Outcome("CANCELLED", "cancelled", False, 1)),
    ("killed by SIGTERM after a cancel", {"step_status": 143, "killed": Killed(15, 0), "cancelled": True},
     Outcome("CANCELLED", "cancelled", False, 1)),
    ("killed while the watchdog ended a hang", {"hung": True, "step_status": 137, "killed": Killed(9, 0)},
     Outcome("FAILED", "hang", False, 137, "the watchdog ended the step")),
    ("killed while preempted", {"preempted": True, "step_status": 137, "killed": Killed(9, 0)},
     Outcome("REQUEUED", "preemption", True, 0)),
    # --- a hang (the watchdog ended the step): retried like a crash, counted with crashes
    ("hang, retries left", {"hung": True, "step_status": 137, "crash_retries": 2},
     Outcome("REQUEUED", "hang", True, 0, "the watchdog ended the step; retry 1 of 2")),
    ("hang after a crash, last retry", {"hung": True, "step_status": 137, "crash_retries": 2, "crashes": 1},
     Outcome("REQUEUED", "hang", True, 0, "the watchdog ended the step; retry 2 of 2")),
    ("hang, retries used up", {"hung": True, "step_status": 137, "crash_retries": 1, "crashes": 1},
     Outcome("FAILED", "hang", False, 137, "the watchdog ended the step; crash_retries (1) used up")),
    ("hang, no retries configured", {"hung": True, "step_status": 0},
     Outcome("FAILED", "hang", False, 1, "the watchdog ended the step")),
    ("hang, but the run had finished", {"hung": True, "finished": True},
     Outcome("COMPLETED", None, False, 0)),
    ("hang while stopping for the time limit", {"hung": True, "stopped": True, "step_status": 137},
     Outcome("REQUEUED", "timeout", True, 0)),
]


@pytest.mark.parametrize("changes, expected", [row[1:] for row in TABLE], ids=[row[0] for row in TABLE])
def test_decide(changes, expected):
    assert decide(**{**BASE, **changes}) == expected


@pytest.mark.parametrize("restart, requeue", [(0, True), (2, True), (3, False), (4, False)])
@pytest.mark.parametrize("ending", ["stopped", "preempted", "timed_out"])
def test_requeue_stops_exactly_at_requeue_max(ending, restart, requeue):
    outcome = decide(**{**BASE, ending: True, "restart": restart, "step_status": 143})
    assert outcome.requeue is requeue
    assert outcome.exit_code == (0 if requeue else 1)
    assert (outcome.state == "REQUEUED") is requeue


@pytest.mark.parametrize("status, rank, expected", [
    (137, 1, Killed(9, 1)),          # srun and localrun: 128 + the signal
    (137, None, Killed(9)),
    (143, 0, Killed(15, 0)),
    (-9, None, Killed(9)),           # the process itself, as Python's returncode says it
    (0, None, None), (1, None, None), (128, None, None), (255, None, None), (-300, None, None),
])
def test_the_signal_a_step_status_names(status, rank, expected):
    assert killed_by(status, rank) == expected


def test_the_kill_is_said_with_the_rank_and_the_signal():
    assert str(Killed(9, 3)) == "rank 3 killed by SIGKILL (out of memory?)"
    assert str(Killed(6)) == "a rank killed by SIGABRT"
    assert str(Killed(40, 0)) == "rank 0 killed by signal 40"


# Batch logs of the local Slurm cluster (Slurm 24.11): rank 1 of 2 killed itself with SIGKILL.
KILLED_LOG = """srun: error: node1: task 1: Killed
srun: launch/slurm: _step_signal: Terminating StepId=77.0
srun: error: node1: task 0: Killed
srun: Force Terminated StepId=77.0
"""
EARLIER = "srun: error: node2: task 3: Killed\nglaunch: start 0 of job 77 ended: REQUEUED (crash)\n"


@pytest.mark.parametrize("log, task", [
    (KILLED_LOG, 1),
    (EARLIER + KILLED_LOG, 1),                                         # a requeued job's log: this start's part
    (EARLIER, None),                                                   # the earlier start's, not this one's
    ("srun: error: node1: task 0: Exited with exit code 3\n" + KILLED_LOG, 1),
    ("srun: error: node2: tasks 2-3: Segmentation fault\n", 2),
    ("srun: error: node1: task 1: Exited with exit code 1\n", None),
    ("srun: error: node1: task x: Killed\n", None),
    ("", None),
], ids=["killed", "after an earlier start", "earlier start only", "after an exit", "range", "exited", "junk", "empty"])
def test_the_task_srun_says_a_signal_ended_first(log, task):
    assert first_signalled_task(log) == task


def test_a_slurm_start_names_the_rank_from_srun(tmp_path, monkeypatch):
    from launcher.jobcontrol import jobend

    monkeypatch.setattr(jobend, "read_task_spec", lambda run_dir: type("Spec", (), {"launcher": "srun"})())
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "77_batch.log").write_text("x" * 100_000 + "\n" + KILLED_LOG)
    log = jobend.batch_log_tail(tmp_path / "logs" / "77_batch.log")
    assert killed_in_step(tmp_path, "77", 137, log) == Killed(9, 1)
    no_log = jobend.batch_log_tail(tmp_path / "logs" / "78_batch.log")
    assert no_log == "" and killed_in_step(tmp_path, "78", 137, no_log) == Killed(9)
    assert killed_in_step(tmp_path, "77", 1, log) is None
    monkeypatch.setattr(jobend, "read_task_spec", lambda run_dir: type("Spec", (), {"launcher": "torchrun"})())
    assert killed_in_step(tmp_path, "77", 137, log) == Killed(9)             # srun's tasks are nodes there


def test_the_first_task_s_signal_is_srun_s_word_for_it_not_the_step_s_status(tmp_path, monkeypatch):
    """Slurm 22.05, rank 1 SIGKILLed: srun then ends rank 0 with SIGTERM, and its status
    is 143, the last task's. Rank 1 was killed by SIGKILL, as srun says of it."""
    from launcher.jobcontrol import jobend

    monkeypatch.setattr(jobend, "read_task_spec", lambda run_dir: type("Spec", (), {"launcher": "srun"})())
    log = ("glaunch: start 0 of job 77 begins\nsrun: error: node1: task 1: Killed\n"
           "srun: launch/slurm: _step_signal: Terminating StepId=77.0\nsrun: error: node1: task 0: Terminated\n"
           "srun: Force Terminated StepId=77.0\n")
    assert killed_in_step(tmp_path, "77", 143, log) == Killed(9, 1)
    assert str(killed_in_step(tmp_path, "77", 143, log)) == "rank 1 killed by SIGKILL (out of memory?)"


# --- the files a start leaves -------------------------------------------------------------


def write(run_dir, name, data):
    path = getattr(RunDir(run_dir), name)
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")


CRASH = {"restart": 1, "task": 3, "node": "node2", "error": "RuntimeError: CUDA error: an illegal memory access"}
WHERE = "task 3 on node2: RuntimeError: CUDA error: an illegal memory access"


def test_crash_note_names_the_task_that_failed_first(tmp_path):
    write(tmp_path, "crash_file", CRASH)
    outcome = decide(**{**BASE, "step_status": 1, "crash_retries": 2, "restart": 1})
    noted = with_crash_note(outcome, tmp_path, 1, "77")
    assert noted == Outcome("REQUEUED", "crash", True, 0, f"exit status 1; retry 1 of 2; {WHERE}")


def test_crash_note_without_a_detail_is_the_note(tmp_path):
    write(tmp_path, "crash_file", CRASH)
    assert with_crash_note(Outcome("FAILED", "crash", False, 1), tmp_path, 1, "77").detail == WHERE


@pytest.mark.parametrize("outcome, restart, crash_file", [
    (Outcome("FAILED", "crash", False, 1, "exit status 1"), 2, CRASH),          # an earlier start's note
    (Outcome("REQUEUED", "timeout", True, 0), 1, CRASH),                        # not a crash
    (Outcome("CANCELLED", "cancelled", False, 1), 1, CRASH),
    (Outcome("FAILED", "crash", False, 1, "exit status 1"), 1, None),           # no crash.json
    (Outcome("FAILED", "crash", False, 1, "exit status 1"), 1, "{half a wri"),  # torn write
    (Outcome("FAILED", "crash", False, 1, "exit status 1"), 1, "[1, 2]"),       # not an object
], ids=["other restart", "timeout", "cancelled", "missing", "torn", "not an object"])
def test_crash_note_leaves_other_outcomes_alone(tmp_path, outcome, restart, crash_file):
    if crash_file is not None:
        write(tmp_path, "crash_file", crash_file)
    assert with_crash_note(outcome, tmp_path, restart, "77") == outcome


def test_stopped_in_is_this_starts_stop_file(tmp_path):
    assert stopped_in(tmp_path, 2) is None
    write(tmp_path, "stop_file", {"restart": 2, "step": 40, "reason": "SIGUSR1"})
    assert stopped_in(tmp_path, 2) == {"restart": 2, "step": 40, "reason": "SIGUSR1"}
    assert stopped_in(tmp_path, 1) is None
    assert stopped_in(tmp_path, 3) is None
    write(tmp_path, "stop_file", "{\"restart\": 2,")
    assert stopped_in(tmp_path, 2) is None


def test_resumed_in_is_the_step_this_start_loaded(tmp_path):
    assert resumed_in(tmp_path, 1) is None
    write(tmp_path, "resume_file", {"restart": 1, "step": 30})
    assert resumed_in(tmp_path, 1) == 30
    assert resumed_in(tmp_path, 0) is None
    assert resumed_in(tmp_path, 2) is None
    write(tmp_path, "resume_file", {"restart": 2})
    assert resumed_in(tmp_path, 2) is None
    write(tmp_path, "resume_file", "not json")
    assert resumed_in(tmp_path, 1) is None


def test_a_hang_is_described_from_hang_json_of_its_own_start(tmp_path):
    hung = decide(**{**BASE, "hung": True, "step_status": 137, "crash_retries": 1})
    (tmp_path / "hang.json").write_text(json.dumps({"restart": 1, "detail": "no rank finished a step for 60 s"}))
    assert with_crash_note(hung, tmp_path, 0, "77").detail == "the watchdog ended the step; retry 1 of 1"
    (tmp_path / "hang.json").write_text(json.dumps({"restart": 0, "detail": "no rank finished a step for 60 s"}))
    assert with_crash_note(hung, tmp_path, 0, "77").detail == (
        "the watchdog ended the step; retry 1 of 1; no rank finished a step for 60 s")


@pytest.mark.parametrize("stop, name", [
    ({"step": 4, "signal": "SIGTERM"}, "SIGTERM"),
    ({"step": 4, "signal": "SIGUSR2"}, "SIGUSR2"),
    ({"step": 4, "signal": None}, None),                 # a stop asked from code
    ({"step": 4}, None),
    (None, None),
    # What the ranks wrote is read, never trusted: only a signal's name passes.
    ({"step": 4, "signal": "SIGTERM; rm -rf /"}, None),
    ({"step": 4, "signal": 15}, None),
    ({"step": 4, "signal": "sigterm"}, None),
    ({"step": 4, "signal": "SIG" + "X" * 40}, None),
])
def test_the_signal_a_stop_record_names(stop, name):
    assert signal_of(stop) == name
