"""The console's lines from a run directory as `glaunch submit --wait` sees a Slurm run
go by: run.json records a requeued start only when it ends, and the next start only when
that one ends, so the event waits for the next start's resume.json. Hand-written files;
no scheduler."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.rundir import registry
from launcher.views.console import Console, fit, status_line
from launcher.rundir.layout import RunDir, heartbeat_bytes
from launcher.rundir.records import RunRecord
from launcher.rundir.startsummary import first_failure


def make_run(tmp_path: Path) -> RunDir:
    run_dir = RunDir(tmp_path / "run")
    run_dir.log_dir.mkdir(parents=True)
    registry.write(run_dir.path, RunRecord.from_dict({
        "run_id": "r", "state": "RUNNING", "requeue_max": 3, "job_id": "77",
        "starts": [{"job_id": "77", "restart": 0, "state": "RUNNING", "started": "2025-03-01T10:00:00+00:00"}]}))
    return run_dir


def beat(run_dir: RunDir, restart: int, step: int, total: int = 200) -> None:
    run_dir.heartbeat_dir.mkdir(exist_ok=True)
    run_dir.heartbeat(0).write_bytes(heartbeat_bytes({"rank": 0, "restart": restart, "step": step, "total": total,
                                                      "time": 1e12, "step_s": 0.5}))


def test_requeue_event_waits_for_the_resume(tmp_path):
    run_dir = make_run(tmp_path)
    shown: list[str] = []
    console = Console(run_dir.path, shown.append, live=False, clock=lambda: 1e12)
    log = run_dir.task_log("77", 0)
    log.write_text("submitit INFO (2025-03-01 10:00:00,000) - Starting with JobEnvironment\nstep 10/200\nste")
    beat(run_dir, 0, 120)
    console.observe(registry.read(run_dir.path))
    console.pump()
    assert "step 10/200\n" in shown and not any("submitit" in s for s in shown)
    assert "[glaunch] RUNNING | step 120/200 | 2 steps/s | ETA 40.0 s\n" in shown

    with registry.updating(run_dir.path) as record:       # jobend: start 0 ended, requeue
        record.record_start("77", 0, state="REQUEUED", reason="preemption", stopped_at=120, last_step=121)
        record.state = "REQUEUED"
    console.observe(registry.read(run_dir.path))
    console.pump()
    assert not any("preempted" in s for s in shown)        # start 1 has not said where it resumed
    (run_dir.path / "resume.json").write_text(json.dumps({"restart": 1, "job_id": "77", "step": 120}))
    console.pump()
    assert "[glaunch] start 0: preempted at step 120 -> requeued -> resumed from 120\n" in shown
    beat(run_dir, 1, 130)
    with registry.updating(run_dir.path) as record:
        record.state = "RUNNING"
    console.observe(registry.read(run_dir.path))
    console.pump()
    assert "[glaunch] RUNNING | start 1 | step 130/200 | 2 steps/s | ETA 35.0 s\n" in shown

    with registry.updating(run_dir.path) as record:
        record.record_start("77", 1, state="FAILED", reason="crash", detail="exit status 1", resumed_from=120)
        record.state, record.reason, record.detail = "FAILED", "crash", "exit status 1; task 3 on n2: OOM"
    (run_dir.path / "crash.json").write_text(json.dumps({"restart": 1, "task": 3, "node": "n2",
                                                         "error": "RuntimeError: CUDA out of memory"}))
    run_dir.task_log("77", 3, "err").write_text("Traceback (most recent call last):\nRuntimeError: CUDA out of memory\n")
    console.finish(registry.read(run_dir.path))
    text = "".join(shown)
    assert text.count("preempted at step 120") == 1
    assert "ste\n" in text                                  # the last partial line of the log
    assert "[glaunch] run r FAILED after 2 start(s)" in text
    assert "[glaunch] reason: crash; exit status 1; task 3 on n2: OOM\n" in text
    assert "[glaunch] first failing rank: 3 on n2: RuntimeError: CUDA out of memory; its log: " in text
    assert "    RuntimeError: CUDA out of memory\n" in text


def test_requeue_without_a_resume_is_said_at_the_end(tmp_path):
    run_dir = make_run(tmp_path)
    shown: list[str] = []
    console = Console(run_dir.path, shown.append, live=False)
    with registry.updating(run_dir.path) as record:
        record.record_start("77", 0, state="REQUEUED", reason="timeout", stopped_at=50, stop_checkpoint=None)
        record.record_start("77", 1, state="TIMEOUT", reason="timeout", first_step=1, last_step=50)
        record.state = "TIMEOUT"
    console.finish(registry.read(run_dir.path))
    text = "".join(shown)
    assert "[glaunch] start 0: time limit at step 50 -> requeued -> began again from step 0 (no checkpoint)" in text
    assert "[glaunch] warning: no checkpoint: start 0 stopped at step 50 without a checkpoint" in text


def test_live_status_is_redrawn_in_place_and_fitted_to_the_width(tmp_path, monkeypatch):
    run_dir = make_run(tmp_path)
    run_dir.checkpoint_dir.mkdir()
    (run_dir.checkpoint_dir / "latest").write_text("step-00000004\n")
    full = "[glaunch] RUNNING | step 5/200 | 2 steps/s | ETA 1m37s | checkpoint 4"
    beat(run_dir, 0, 5)
    assert status_line(run_dir, registry.read(run_dir.path), 1e12, run_dir.checkpoint_dir) == full
    monkeypatch.setenv("COLUMNS", "46")
    out: list[str] = []
    console = Console(run_dir.path, out.append, live=True, clock=lambda: 1e12)
    console.observe(registry.read(run_dir.path))
    console.pump()
    console.pump()                                          # unchanged: not drawn again
    # 45 columns: the checkpoint, then the ETA left out whole (never cut mid-word).
    assert out == ["\r\x1b[K[glaunch] RUNNING | step 5/200 | 2 steps/s"]
    console.log("hello\n")
    assert out[-1] == "\r\x1b[Khello\n[glaunch] RUNNING | step 5/200 | 2 steps/s"
    record = registry.read(run_dir.path)
    fitted = {w: status_line(run_dir, record, 1e12, run_dir.checkpoint_dir, width=w) for w in (20, 30, 58, 69)}
    assert fitted == {20: "[glaunch] RUNNING", 30: "[glaunch] RUNNING | step 5/200",
                      58: "[glaunch] RUNNING | step 5/200 | 2 steps/s | ETA 1m37s", 69: full}


def test_a_state_wider_than_the_terminal_is_cut_after_a_whole_word():
    assert fit([("state", "[glaunch] OUT_OF_MEMORY"), ("step", "step 5")], 20) == [("state", "[glaunch]")]


def test_status_of_a_running_start(tmp_path):
    """status while a start runs: rank 0's progress, ranks silent for much longer than they
    write, and goodput so far from the heartbeats (the start records its own only at its end)."""
    from launcher.views.status_text import format_status
    from launcher.runner.status import summarize

    run_dir = make_run(tmp_path)
    now = 1_741_000_000.0
    with registry.updating(run_dir.path) as record:
        record.record_start("77", 0, started="2025-03-03T11:05:40+00:00")      # now - 60 s
    run_dir.heartbeat_dir.mkdir()
    for rank, step, age in ((0, 100, 0.5), (1, 99, 4.0), (2, 20, 50.0)):
        run_dir.heartbeat(rank).write_bytes(heartbeat_bytes({
            "rank": rank, "node": f"n{rank}", "restart": 0, "job_id": "77", "step": step, "total": 400,
            "time": now - age, "first_step": 1, "first_time": now - 50, "step_s": 0.5, "interval_s": 5.0,
            "state": "running"}))
    summary = summarize(run_dir.path, registry.read(run_dir.path), now=now)
    live = summary["progress"]
    assert (live["step"], live["total"], live["ranks"], live["eta_s"]) == (100, 400, 3, 150.0)
    assert [s["rank"] for s in live["silent"]] == [2]                  # 50 s > max(30 s, 3 x 5 s)
    good = summary["goodput"]
    assert good["starts"][0]["startup_s"] == 10.0 and good["wall_s"] == 60.0
    assert good["ettr"] == round(100 * 0.5 / 60, 4)
    text = format_status(summary)
    assert "progress: step 100/400, 2 steps/s, ETA 2m30s, last step 0.5 s ago" in text      # --wait's ETA too
    assert "1 rank(s) silent: rank 2 (n2) at step 20 for 50.0 s" in text


def test_a_resumed_run_s_console_follows_its_new_job_and_says_it_resumed(tmp_path):
    run_dir = RunDir(tmp_path / "run")
    run_dir.log_dir.mkdir(parents=True)
    registry.write(run_dir.path, RunRecord.from_dict({
        "run_id": "r", "state": "RUNNING", "requeue_max": 3, "job_id": "90",
        "starts": [
            {"job_id": "77", "restart": 0, "state": "REQUEUED", "reason": "timeout", "stopped_at": 60},
            {"job_id": "77", "restart": 1, "state": "TIMEOUT", "reason": "timeout", "resumed_from": 60,
             "stopped_at": 120, "started": "2025-03-01T10:00:00+00:00"},
            {"job_id": "90", "restart": 0, "state": "RUNNING", "started": "2025-03-02T10:00:00+00:00"}],
        "resumes": [{"number": 1, "at": "2025-03-02T09:59:00+00:00", "overrides": [], "first_start": 2,
                     "ended": {"state": "TIMEOUT"}}]}))
    run_dir.task_log("77", 0).write_text("the earlier job's log\n")
    run_dir.task_log("77", 1).write_text("the earlier job's log\n")
    run_dir.task_log("90", 0).write_text("step 130/200\n")
    shown: list[str] = []
    console = Console(run_dir.path, shown.append, live=False, clock=lambda: 1e12)
    console.observe(registry.read(run_dir.path))
    console.pump()
    assert not any("[glaunch] resumed" in s for s in shown)          # the new start has not said where from
    (run_dir.path / "resume.json").write_text(json.dumps({"restart": 0, "job_id": "90", "step": 120}))
    beat(run_dir, 0, 130)
    console.pump()
    events = [s for s in shown if s.startswith("[glaunch] ") and "|" not in s]
    assert events == ["[glaunch] resumed (resume 1) from step 120\n"]
    assert "[glaunch] RUNNING | resume 1 | starting\n" in shown
    assert (status_line(run_dir, registry.read(run_dir.path), 1e12, run_dir.checkpoint_dir)
            == "[glaunch] RUNNING | resume 1 | step 130/200 | 2 steps/s | ETA 35.0 s")
    with registry.updating(run_dir.path) as record:
        record.record_start("90", 0, state="COMPLETED", resumed_from=120, last_step=200)
        record.state = "COMPLETED"
    console.finish(registry.read(run_dir.path))
    text = "".join(shown)
    assert "step 130/200\n" in text and "the earlier job's log" not in text
    assert "start 0: time limit" not in text                          # the earlier job's requeue
    assert "[glaunch] run r COMPLETED at step 200 after 1 start(s) of resume 1 in " in text


def test_submitit_s_error_line_is_not_shown(tmp_path):
    run_dir = make_run(tmp_path)
    shown: list[str] = []
    console = Console(run_dir.path, shown.append, live=False)
    console.log("submitit ERROR (2025-03-01 10:00:03,000) - Submitted job triggered an exception\n"
                "submitit ERROR (2025-03-01 10:00:03,000) - something else\n")
    assert shown == ["submitit ERROR (2025-03-01 10:00:03,000) - something else\n"]
    with registry.updating(run_dir.path) as record:
        record.record_start("77", 0, state="FAILED", reason="crash", detail="exit status 1")
        record.state, record.reason = "FAILED", "crash"
    (run_dir.path / "crash.json").write_text(json.dumps({"restart": 0, "task": 0, "error": "ValueError: x"}))
    run_dir.task_log("77", 0, "err").write_text(
        "Traceback (most recent call last):\nValueError: x\n"
        "submitit ERROR (2025-03-01 10:00:03,000) - Submitted job triggered an exception\n")
    console.finish(registry.read(run_dir.path))
    text = "".join(shown)
    assert "    ValueError: x\n" in text and "triggered an exception" not in text


def test_a_torchrun_run_shows_global_rank_0_and_names_the_failing_node(tmp_path):
    """Under torchrun a task log is a node's (its agent and workers): the console follows
    the node that runs global rank 0, and a failing task is named by node and ranks."""
    from test_task_placement import recorded_run

    run_dir = RunDir(recorded_run(tmp_path))
    registry.write(run_dir.path, RunRecord.from_dict({
        "run_id": "r", "state": "RUNNING", "requeue_max": 3, "job_id": "3047",
        "starts": [{"job_id": "3047", "restart": 0, "state": "RUNNING", "started": "2025-03-01T10:00:00+00:00"}]}))
    shown: list[str] = []
    console = Console(run_dir.path, shown.append, live=False, clock=lambda: 1e12)
    console.observe(registry.read(run_dir.path))
    console.pump()
    assert "step 10/40 loss 0.6333\n" in "".join(shown)
    with registry.updating(run_dir.path) as record:
        record.record_start("3047", 0, state="FAILED", reason="crash", detail="exit status 1")
        record.state, record.reason = "FAILED", "crash"
    (run_dir.path / "crash.json").write_text(json.dumps({"restart": 0, "task": 1, "node": "node2",
                                                         "error": "RuntimeError: boom"}))
    console.finish(registry.read(run_dir.path))
    text = "".join(shown)
    followed = text.split("[glaunch] run r FAILED")[0]
    assert "done: step 40 param_sha256 " in followed and "joined gloo" not in followed   # rank 0's stdout only
    assert "[glaunch] first failing node: node1 r2-3 on node2: RuntimeError: boom; its log: " in text
    assert f"its log: {run_dir.task_log('3047', 1, 'err')}\n" in text


def test_a_script_without_the_runtime_is_said_to_resume_where_its_log_went_on(tmp_path):
    """entrypoint.progress: the script resumes by itself (no resume.json); where the next
    start's log lines began is where it went on, not "step 0" (nor "resumed from": a log
    that says every tenth step says where it went on to within ten)."""
    import dataclasses

    from launcher.rundir.taskspec import TaskSpec, write_task_spec

    run_dir = make_run(tmp_path)
    spec = TaskSpec(launcher="torchrun", script="/x/train.py", module=None, args=(), nodes=1, ranks_per_node=2,
                    world_size=2, run_dir=str(run_dir.path), run_id="r", requeue_max=3, crash_retries=0,
                    exclude_bad_nodes=True, watchdog_stall_s=0.0, watchdog_first_step_s=0.0)
    write_task_spec(run_dir.path, dataclasses.replace(spec, progress_pattern=r"^iter (\d+):"))
    shown: list[str] = []
    console = Console(run_dir.path, shown.append, live=False, clock=lambda: 1e12)
    with registry.updating(run_dir.path) as record:
        record.record_start("77", 0, state="REQUEUED", reason="preemption", first_step=0, last_step=37)
        record.state = "REQUEUED"
    run_dir.heartbeat_dir.mkdir(exist_ok=True)
    run_dir.heartbeat(0).write_bytes(heartbeat_bytes({"rank": 0, "restart": 1, "step": 34, "first_step": 30,
                                                      "source": "log", "time": 1e12}))
    console.observe(registry.read(run_dir.path))
    console.pump()
    assert "[glaunch] start 0: preempted at step 37 -> requeued -> went on at step 30 (its log)\n" in shown
    with registry.updating(run_dir.path) as record:
        record.record_start("77", 1, state="COMPLETED", first_step=30, last_step=60)
        record.state = "COMPLETED"
    later: list[str] = []
    Console(run_dir.path, later.append, live=False).finish(registry.read(run_dir.path))
    assert "[glaunch] start 0: preempted at step 37 -> requeued -> went on at step 30 (its log)\n" in later


def test_a_script_that_neither_uses_the_runtime_nor_logs_its_steps_is_not_said_to_begin_again(tmp_path):
    """A plain script that resumes from its own checkpoint: glaunch sees neither it nor
    its steps, and says so, not "began again from step 0 (no checkpoint)"."""
    run_dir = make_run(tmp_path)
    unwatched = {"state": "not watched", "why": "no rank uses glaunch's runtime", "slow": []}
    with registry.updating(run_dir.path) as record:
        record.record_start("77", 0, state="REQUEUED", reason="timeout", watchdog=unwatched)
        record.record_start("77", 1, state="COMPLETED", watchdog=unwatched)
        record.state = "COMPLETED"
    shown: list[str] = []
    Console(run_dir.path, shown.append, live=False).finish(registry.read(run_dir.path))
    text = "".join(shown)
    assert ("[glaunch] start 0: time limit -> requeued -> went on as its script does (glaunch sees no checkpoint "
            "of its own)\n") in text, text
    assert "began again from step 0" not in text


def test_a_plain_console_says_the_first_step_at_once_then_at_most_every_interval(tmp_path):
    """In a pipe or a file, `RUNNING | starting` is followed by the first step as soon as it
    is known (a run stepping, not starting), not PLAIN_STATUS_S later; the steps after it at
    most every PLAIN_STATUS_S."""
    from launcher.views.console import PLAIN_STATUS_S

    run_dir = make_run(tmp_path)
    now = [1e12]
    shown: list[str] = []
    console = Console(run_dir.path, shown.append, live=False, clock=lambda: now[0])

    def beat_now(step: int) -> None:
        run_dir.heartbeat_dir.mkdir(exist_ok=True)
        run_dir.heartbeat(0).write_bytes(heartbeat_bytes({"rank": 0, "restart": 0, "step": step, "total": 200,
                                                          "time": now[0], "step_s": 0.5}))

    console.observe(registry.read(run_dir.path))
    console.pump()
    assert shown == ["[glaunch] RUNNING | starting\n"]
    now[0] += 5
    beat_now(3)
    console.pump()
    assert shown[-1] == "[glaunch] RUNNING | step 3/200 | 2 steps/s | ETA 1m38s\n"
    now[0] += 5
    beat_now(9)
    console.pump()
    assert len(shown) == 2                                # the same phase, within the interval
    now[0] += PLAIN_STATUS_S
    beat_now(20)
    console.pump()
    assert len(shown) == 3 and shown[-1].startswith("[glaunch] RUNNING | step 20/200 |")
    now[0] += 61                                          # no step since: a stall
    console.pump()
    assert len(shown) == 4 and "no step for 1m01s" in shown[-1]


def test_a_lost_rank_that_could_not_be_started_again_is_the_first_failure_not_the_ranks_stopped_after(tmp_path):
    """recovery.peer: rank 3's process was lost and srun refused its new step, so the job
    controller ended the step; rank 2, stopped by that, wrote crash.json (KeyboardInterrupt).
    The end names rank 3 and srun's line; a note of another start or job names nothing."""
    run_dir = make_run(tmp_path)
    why = "srun: error: Unable to create step for job 77: Requested node configuration is not available"
    run_dir.crash_file.write_text(json.dumps({"restart": 0, "task": 2, "node": "n2", "error": "KeyboardInterrupt"}))
    for other in ({"job_id": "78", "restart": 0}, {"job_id": "77", "restart": 1}):
        run_dir.peer_not_started_file.write_text(json.dumps({**other, "rank": 3, "node": "n2", "error": why}))
        assert first_failure(run_dir, registry.read(run_dir.path)) == (2, "n2", "KeyboardInterrupt")
    run_dir.peer_not_started_file.write_text(json.dumps({"job_id": "77", "restart": 0, "rank": 3, "node": "n2",
                                                         "error": why}))
    assert first_failure(run_dir, registry.read(run_dir.path)) == (
        3, "n2", f"its process was lost and could not be started again: {why}")
