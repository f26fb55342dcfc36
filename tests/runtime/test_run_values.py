"""Run-scoped values (`${run:dir}`, `${run:id}`, `${run:checkpoint_dir}`, `${run:restart}`)
and `entrypoint.resume_args`: kept as written at submit, filled in at each start on the node
from that start's environment; and the step read from rank 0's log (`entrypoint.progress`)."""

import json
import os
import re

import pytest

from launcher.rundir import envnames, runvalues
from launcher.rundir.layout import read_heartbeat
from launcher.runtime import task
from launcher.jobcontrol.logprogress import LogProgress, beat_from_log, step_of

HOSTILE_DIR = "/runs/it's a \"dir\" $(touch x) `y`\n; rm -rf"
START = {envnames.RUN_DIR: HOSTILE_DIR, envnames.RUN_ID: "exp-1", envnames.CHECKPOINT_DIR: "/ck/exp-1",
         envnames.RESTART: "2"}


@pytest.mark.parametrize("text, expected", [
    ("--out_dir=${run:dir}/out", f"--out_dir={HOSTILE_DIR}/out"),
    ("${run:id}-${run:restart}", "exp-1-2"),
    ("--ckpt=${run:checkpoint_dir}", "--ckpt=/ck/exp-1"),
    ("no value here", "no value here"),
    ("$HOME ${HOME} $$", "$HOME ${HOME} $$"),            # the shell's, not ours
    ("${run:unknown}", "${run:unknown}"),                  # refused at submit; left alone if it got here
])
def test_a_start_fills_in_its_values_literally(text, expected):
    assert runvalues.fill(text, runvalues.start_values(START)) == expected


def test_resume_args_follow_args_only_after_an_earlier_start():
    values = runvalues.start_values(START)
    assert runvalues.start_args(["--a=${run:id}"], ["--init_from=resume"], values, False) == ["--a=exp-1"]
    assert runvalues.start_args(["--a"], ["--resume=${run:dir}"], values, True) == ["--a", f"--resume={HOSTILE_DIR}"]


def test_the_restart_is_0_where_the_start_does_not_say():
    assert runvalues.start_values({})["restart"] == "0"


def test_only_the_named_variables_are_filled_in():
    environ = {**START, "OUT": "${run:dir}/o", "OTHER": "${run:dir}"}
    runvalues.fill_environment(environ, ["OUT", "MISSING"])
    assert environ["OUT"] == f"{HOSTILE_DIR}/o" and environ["OTHER"] == "${run:dir}" and "MISSING" not in environ


def write_run(run_dir, starts):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(json.dumps({"run_id": "exp-1", "state": "RUNNING", "starts": starts}))


@pytest.mark.parametrize("restart, starts, follows", [
    ("0", [], False),                                                              # the run's first start
    ("0", [{"job_id": "11", "restart": 0, "state": "RUNNING"}], False),           # itself, recorded
    ("1", [{"job_id": "11", "restart": 0, "state": "REQUEUED"}], True),           # a requeue
    ("0", [{"job_id": "10", "restart": 0, "state": "COMPLETED"}], True),          # glaunch resume: a new job
    ("0", None, False),                                                            # no readable record
], ids=["first", "first-recorded", "requeue", "resume", "no-record"])
def test_a_start_follows_an_earlier_one_after_a_requeue_or_a_resume(tmp_path, restart, starts, follows):
    run_dir = tmp_path / "run"
    if starts is not None:
        write_run(run_dir, starts)
    environ = {envnames.RESTART: restart, envnames.JOB_ID: "11"}
    assert task.follows_earlier_start(str(run_dir), environ) is follows


# --- progress from rank 0's log -----------------------------------------------------------

PATTERN = re.compile(r"^iter (\d+):")


@pytest.mark.parametrize("line, step", [
    ("iter 120: loss 2.3", 120),
    ("iter 0: loss 9", 0),
    ("step 120", None),
    ("iter -3: loss", None),
    ("iter ١٢: loss", None),                  # digits, but not ASCII ones
    ("iter " + "9" * 40 + ": loss", None),    # no step is that large
])
def test_a_line_gives_a_step_only_from_digits(line, step):
    assert step_of(line, PATTERN) == step


def test_the_follower_reads_what_the_log_gained_and_keeps_a_line_cut_in_two(tmp_path):
    log = tmp_path / "rank0.out"
    log.write_bytes(b"iter 99: an earlier start's line, before this start's follower\n")
    follower = LogProgress.following(log, PATTERN.pattern)
    with log.open("ab") as f:
        f.write(b"starting\niter 1: a\niter 2")
    assert follower.poll(now=10.0) == 1
    with log.open("ab") as f:
        f.write(b"0: b\n\xff\xfe garbage\n" + b"x" * 100_000 + b"\niter 21: c\n")
    assert follower.poll(now=11.0) == 21
    assert (follower.first_step, follower.step_time) == (1, 11.0)
    assert follower.poll(now=12.0) == 21        # nothing new


def test_a_poll_that_reads_many_steps_times_them_together_not_the_first_by_the_whole_interval(tmp_path):
    """0.1 s steps read every 5 s: each poll reads 50 lines at one `now`. The steps take
    0.1 s each, not the 5 s between polls (nor 0 s between lines); a restart's lower step
    begins a new count, untimed."""
    log = tmp_path / "rank0.out"
    log.write_bytes(b"")
    follower = LogProgress.following(log, PATTERN.pattern)
    for poll, now in enumerate((5.0, 10.0, 15.0)):
        with log.open("ab") as f:
            f.write(b"".join(f"iter {poll * 50 + n}: x\n".encode() for n in range(1, 51)))
        assert follower.poll(now=now) == poll * 50 + 50
    assert list(follower.step_times) == [0.1, 0.1] and follower.steps_timed == 100
    assert follower.step_p99_s() == 0.1
    with log.open("ab") as f:
        f.write(b"iter 140: y\niter 1: a restart\niter 2: z\n")
    assert follower.poll(now=20.0) == 2
    assert list(follower.step_times) == [0.1, 0.1]
    with log.open("ab") as f:
        f.write(b"iter 12: z\n")
    follower.poll(now=21.0)
    assert list(follower.step_times) == [0.1, 0.1, 0.1]


def test_the_log_s_step_reaches_rank_0_s_heartbeat_unless_the_rank_reports_itself(tmp_path):
    log, beat = tmp_path / "rank0.out", tmp_path / "rank-00000.json"
    follower = LogProgress.following(log, PATTERN.pattern)
    log.write_text("iter 7: x\n")
    follower.poll(now=5.0)
    from launcher.rundir.layout import heartbeat_bytes
    beat.write_bytes(heartbeat_bytes({"rank": 0, "state": "starting", "pid": 42, "node": "n1"}))
    assert beat_from_log(beat, follower, total=100, now=6.0)
    record = read_heartbeat(beat)
    assert (record["step"], record["total"], record["state"], record["source"], record["pid"]) == \
        (7, 100, "running", "log", 42)
    assert record["announced_at"] == 5.0
    beat.write_bytes(heartbeat_bytes({"rank": 0, "state": "running", "step": 3, "announced_at": 1.0}))
    assert not beat_from_log(beat, follower, total=100, now=7.0)
    assert read_heartbeat(beat)["step"] == 3


def test_no_step_seen_writes_nothing(tmp_path):
    follower = LogProgress.following(tmp_path / "missing.out", PATTERN.pattern)
    assert follower.poll() is None
    assert not beat_from_log(tmp_path / "beat.json", follower, None)
    assert not os.path.exists(tmp_path / "beat.json")
