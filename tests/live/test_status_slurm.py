"""What a user sees of a run on the local Slurm cluster: `glaunch status` (text and --json)
of a run preempted twice, which resumes bitwise (per-start peak memory and step time against
the planner's estimate, goodput, the suggested settings), and the console of `glaunch submit --wait` on a
terminal through a preemption and through a failure.

GLAUNCH_RECORD_CONSOLE=1 writes what the tests saw to tests/recorded_console/slurm_*.txt."""

from __future__ import annotations

import json
import os
import re
import textwrap
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from conftest import requires_slurm
from launcher.rundir.layout import RunDir, read_heartbeat
from slurmkit import (ONE_RANK_PER_NODE, REPO, SITE, final_sacct_state, glaunch, job_id_of, preempt, read_json, release_requeue_hold,
                      sacct_rows, squeue_state, the_run_dir, wait_until)
from test_console import as_seen, in_pty
from test_console import glaunch as glaunch_argv
from test_slurm_requeue import assert_resumed_without_loss, baseline_hash

pytestmark = [requires_slurm, pytest.mark.slurm, pytest.mark.slow]

RECORDINGS = REPO / "tests" / "recorded_console"
RECORD = os.environ.get("GLAUNCH_RECORD_CONSOLE") == "1"
# The example's MLP: Linear(16, 32) + Linear(32, 1).
MODEL_PARAMS = 16 * 32 + 32 + 32 + 1
STEP_S = 0.1
# Enough steps that the second preemption lands before the run ends, however late it is noticed.
STEPS = 400


def _record(name: str, text: str) -> None:
    if RECORD:
        RECORDINGS.mkdir(exist_ok=True)
        (RECORDINGS / name).write_text(text)


def _on_terminal(argv: list[str], env: dict, cwd: Path, timeout: float) -> tuple[threading.Thread, dict]:
    """`argv` on a pty in a thread (the test acts on the job meanwhile); the dict gets
    `raw` and `status` once it ends."""
    seen: dict = {}

    def follow():
        seen["raw"], seen["status"] = in_pty(argv, env, cwd, timeout)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    return thread, seen


def _rank0_beat(run_dir: Path) -> dict:
    return read_heartbeat(RunDir(run_dir).heartbeat(0)) or {}


def _preempt_and_follow(runs: Path, thread: threading.Thread, times: int, min_progress: int,
                        timeout: float) -> tuple[Path, str]:
    """Each time the current start has trained `min_progress` steps, preempt it (a job on the
    `urgent` partition) and wait for the requeue to be recorded; then release requeue holds
    until the followed submit ends."""
    run_dir = the_run_dir(runs)
    job_id = job_id_of(run_dir)
    for n in range(times):
        def progressed(n=n):
            release_requeue_hold(job_id)
            beat = _rank0_beat(run_dir)
            record = read_json(run_dir / "run.json")
            base = record["starts"][n - 1]["stopped_at"] if n else 0
            return (squeue_state(job_id) == "RUNNING" and beat.get("restart") == n
                    and (beat.get("step") or 0) >= (base or 0) + min_progress)

        wait_until(progressed, 480, f"progress of start {n}", interval=0.5)
        preempt()
        wait_until(lambda n=n: any(s["restart"] == n and s["state"] == "REQUEUED"
                                   for s in read_json(run_dir / "run.json")["starts"]),
                   300, f"preemption {n + 1} to requeue the job")
    deadline = time.monotonic() + timeout
    while thread.is_alive() and time.monotonic() < deadline:
        release_requeue_hold(job_id)
        thread.join(2)
    assert not thread.is_alive(), f"glaunch submit --wait did not end within {timeout}s"
    return run_dir, job_id


def _submit_argv(exp: str, runs: Path, *overrides: str, site: str = SITE) -> list[str]:
    return glaunch_argv("submit", "--wait", exp, "--site", site, "--runs-dir", str(runs), *overrides)


def console_events(raw: str) -> list[str]:
    """The requeue event lines the console printed."""
    return re.findall(r"\[glaunch\] start \d+: [^\r\n]*", raw)


def _interval_bound(start: dict) -> float:
    """The most a start's median step time can be, from the steps it made and when: at
    least half of its timed steps take the median or more, and they all lie between its
    first and last step (x 1.5 for the steps each rank times alone, + rounding). Bound
    by the run's own progress, not by this machine's speed."""
    try:
        span = (datetime.fromisoformat(start["last_step_at"])
                - datetime.fromisoformat(start["first_step_at"])).total_seconds()
        steps = min(start["last_step"] - start["first_step"], start.get("steps_timed") or 0)
    except (KeyError, TypeError, ValueError):
        return float("inf")        # what it lacks is reported on its own
    return 1.5 * 2 * span / steps + 0.01 if steps > 0 else float("inf")


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# --- status of a run preempted twice ------------------------------------------------------------


def test_status_of_a_run_preempted_twice(tmp_path, tmp_path_factory, isolated_env):
    """Also the cluster's test of resuming bitwise after two preemptions: one run serves
    both, to keep the cluster's tests short."""
    expected = baseline_hash("examples/torch_ddp.yaml", STEPS, tmp_path_factory, isolated_env)
    runs = tmp_path / "runs"
    thread, seen = _on_terminal(_submit_argv(
        "examples/torch_ddp.yaml", runs, "resources.nodes=2", ONE_RANK_PER_NODE, "resources.time=10",
        f"model.params={MODEL_PARAMS}",
        "checkpoint.every_steps=1000", "requeue.max=5",
        f"entrypoint.args=[--steps,{STEPS},--seconds-per-step,{STEP_S}]"), isolated_env, REPO, timeout=840)
    run_dir, job_id = _preempt_and_follow(runs, thread, times=2, min_progress=10, timeout=800)
    assert seen["status"] == 0, seen["raw"][-3000:]
    run_id = run_dir.name
    record = read_json(run_dir / "run.json")
    assert_resumed_without_loss(record, "preemption", min_requeues=2)
    assert len(record["starts"]) == 3
    assert read_json(run_dir / "result.json")["param_sha256"] == expected
    assert final_sacct_state(job_id) == "COMPLETED"
    assert [r["state"] for r in sacct_rows(job_id)] == ["REQUEUED", "REQUEUED", "COMPLETED"]

    text_proc = glaunch("status", run_id, env=isolated_env, timeout=120)
    json_proc = glaunch("status", run_id, "--json", env=isolated_env, timeout=120)
    assert text_proc.returncode == 0 and json_proc.returncode == 0, text_proc.stderr + json_proc.stderr
    text, status = text_proc.stdout, json.loads(json_proc.stdout)
    shown_runs = str(runs)
    _record("slurm_status_preempted_twice.txt",
            "# glaunch submit --wait examples/torch_ddp.yaml --site local-slurm resources.nodes=2 \\\n"
            f"#     {ONE_RANK_PER_NODE} resources.time=10 \\\n"
            f"#     model.params={MODEL_PARAMS} checkpoint.every_steps=1000 requeue.max=5 \\\n"
            f"#     'entrypoint.args=[--steps,{STEPS},--seconds-per-step,{STEP_S}]'\n"
            "# preempted twice by a job on the `urgent` partition; then:\n"
            f"# $ glaunch status {run_id}\n"
            + text.replace(shown_runs, "runs")
            + f"\n# $ glaunch status {run_id} --json\n" + json_proc.stdout.replace(shown_runs, "runs"))

    missing = []
    # Three starts: two preempted (each resumed where it stopped), then completed.
    starts = status["starts"]
    assert [s["state"] for s in starts] == ["REQUEUED", "REQUEUED", "COMPLETED"], starts
    assert [s["reason"] for s in starts[:2]] == ["preemption", "preemption"], starts
    assert status["state"] == "COMPLETED" and status["restarts"] == 2 and status["job_id"] == job_id
    for before, after in zip(starts, starts[1:]):
        assert after["resumed_from"] == before["stopped_at"] and before["stopped_at"] > 0, (before, after)

    # Per start: what its ranks measured.
    for start in starts:
        peak = _number(start.get("peak_memory_gb"))
        median = _number((start.get("step_time_s") or {}).get("median"))
        if peak is None or peak <= 0:
            missing.append(f"start {start['restart']}: peak_memory_gb {start.get('peak_memory_gb')!r}")
        if median is None or median <= 0:
            missing.append(f"start {start['restart']}: step_time_s {start.get('step_time_s')!r}")
        elif not STEP_S <= median <= _interval_bound(start):
            missing.append(f"start {start['restart']}: step time {median} s, not the time between its steps "
                           f"(the script sleeps {STEP_S} s a step; bound {_interval_bound(start)} s)")

    # The planner's estimate, since model.params is known.
    memory = status.get("memory") or {}
    planned = memory.get("planned") or {}
    if not (_number(memory.get("peak_gb")) or 0) > 0:
        missing.append(f"memory.peak_gb: {memory!r}")
    if planned.get("strategy") != "ddp" or not (_number(planned.get("estimate_gb")) or 0) > 0:
        missing.append(f"memory.planned (the planner's estimate for ddp): {planned!r}")

    # Goodput: totals, and per start queue wait, start-up, resume load, stop and teardown.
    good = status.get("goodput") or {}
    ettr = _number(good.get("ettr"))
    if ettr is None or not 0 < ettr <= 1:
        missing.append(f"goodput.ettr {good.get('ettr')!r} not in (0, 1]")
    if good.get("lost_steps") != 0:           # each preemption saved at its stop
        missing.append(f"goodput.lost_steps {good.get('lost_steps')!r}, expected 0")
    if not (_number(good.get("restart_overhead_s")) or 0) > 0:
        missing.append(f"goodput.restart_overhead_s {good.get('restart_overhead_s')!r}")
    if good.get("interruptions") != 2:
        missing.append(f"goodput.interruptions {good.get('interruptions')!r}, expected 2")
    rows = good.get("starts") or []
    if len(rows) != 3:
        missing.append(f"goodput.starts: {len(rows)} rows, expected 3")
    for row in rows:
        wanted = ["queue_wait_s", "startup_s"]
        wanted += ["resume_load_s"] if row["restart"] > 0 else []
        wanted += ["stop_s", "teardown_s"] if row["restart"] < 2 else []
        for key in wanted:
            if _number(row.get(key)) is None:
                missing.append(f"goodput.starts[{row['restart']}].{key}: {row.get(key)!r}")

    # The suggestions, with the settings they would change.
    suggest = status.get("suggest") or {}
    for key, current in (("checkpoint.every_steps", 1000), ("requeue.signal_lead_s", 30)):
        item = suggest.get(key)
        if not isinstance(item, dict) or not isinstance(item.get("value"), int) or item["value"] < 1:
            missing.append(f"suggest[{key}]: {item!r}")
        elif item.get("current") != current or not item.get("why"):
            missing.append(f"suggest[{key}] current/why: {item!r}")

    # The text says the same.
    expected_text = [
        rf"run {re.escape(run_id)}: COMPLETED \(site local-slurm, job {job_id}, 2 restart\(s\)\)",
        *(rf"start {n}: job {job_id} REQUEUED reason=preemption .*stopped_at=\d+  peak [\d.]+ GB \(host RSS\), "
          rf"step [\d.]+ s" for n in (0, 1)),
        rf"start 2: job {job_id} COMPLETED resumed_from=\d+ .*peak [\d.]+ GB \(host RSS\), step [\d.]+ s",
        r"memory: peak [\d.]+ GB per rank \(host RSS: no GPU used\); planner's estimate for ddp: [\d.]+ GB",
        r"goodput: ETTR (0\.\d\d|1\.00) \(.* of training kept in .*\); lost steps 0; restart overhead .* "
        r"over 2 interruption\(s\)",
        r"start 0: queue [^,]+, start-up [^,]+, stop [^,]+, teardown ",
        r"start 1: queue [^,]+, start-up [^,]+, resume load [^,]+, stop [^,]+, teardown ",
        r"start 2: queue [^,]+, start-up [^,]+, resume load ",
        r"suggest: checkpoint\.every_steps=\d+ \(now 1000\): Young-Daly",
        r"suggest: requeue\.signal_lead_s=\d+ \(now 30\): ",
    ]
    missing += [f"status text: no line matching {pattern!r}" for pattern in expected_text
                if not re.search(pattern, text)]
    assert not missing, "glaunch status lacks:\n  " + "\n  ".join(missing) + "\n" + text

    # The console (one run serves both, to keep the cluster's tests short): each preemption said
    # once with where the next start resumed, the live status line, rank 0's log of every start,
    # the outcome and goodput lines, and none of submitit's own lines.
    raw = seen["raw"]
    _record("slurm_preemption.txt",
            "# glaunch submit --wait examples/torch_ddp.yaml --site local-slurm (as above), on a terminal\n"
            "# (a pty), preempted twice by a job on the `urgent` partition;\n"
            "# '~ ' marks each redraw of the status line in place.\n"
            + as_seen(raw.replace(shown_runs, "runs")))
    assert console_events(raw) == [
        f"[glaunch] start {s['restart']}: preempted at step {s['stopped_at']} -> requeued -> "
        f"resumed from {s['stopped_at']}" for s in starts[:2]]
    assert re.search(rf"\r\x1b\[K\[glaunch\] RUNNING \| start 2 \| step \d+/{STEPS}", raw), raw[-3000:]
    assert f"step 10/{STEPS} loss" in raw and f"step {STEPS}/{STEPS} loss" in raw
    assert f"[glaunch] run {run_id} COMPLETED at step {STEPS} after 3 start(s)" in raw
    assert "[glaunch] goodput: ETTR " in raw
    assert "submitit INFO" not in raw and "submitit ERROR" not in raw and "Bypassing signal" not in raw


# --- the console of --wait on Slurm ---------------------------------------------------------------


FAILING = textwrap.dedent("""\
    # examples/torch_ddp.py, except that rank 1 raises at step FAIL_STEP of every start.
    import runpy, sys
    from launcher import runtime as rt

    FAIL_STEP = 15
    _should_stop = rt.should_stop

    def should_stop(step=None, total=None):
        if step == FAIL_STEP and rt.context().rank == 1:
            raise RuntimeError(f"boom at step {{step}} on rank 1")
        return _should_stop(step=step, total=total)

    rt.should_stop = should_stop
    sys.argv[0] = {script!r}
    runpy.run_path({script!r}, run_name="__main__")
""")


def test_console_of_a_failure(tmp_path, isolated_env):
    code = tmp_path / "code"
    code.mkdir()
    (code / "failing.py").write_text(FAILING.format(script=str(REPO / "examples" / "torch_ddp.py")))
    exp = code / "failing.yaml"
    exp.write_text("name: failing\nentrypoint: {script: failing.py, args: ['--steps', '100', "
                   f"'--seconds-per-step', '{STEP_S}']}}\nresources: {{nodes: 2, time: '5'}}\n"
                   "checkpoint: {every_steps: 10}\n")
    runs = tmp_path / "runs"
    thread, seen = _on_terminal(_submit_argv(str(exp), runs), isolated_env, REPO, timeout=480)
    run_dir, _ = _preempt_and_follow(runs, thread, times=0, min_progress=0, timeout=460)
    raw, status = seen["raw"], seen["status"]
    _record("slurm_failure.txt",
            "# glaunch submit --wait failing.yaml --site local-slurm  (examples/torch_ddp.py on 2 nodes whose\n"
            "#     rank 1 raises RuntimeError at step 15; crash_retries 0)\n"
            "# on a terminal (a pty); '~ ' marks each redraw of the status line in place.\n"
            + as_seen(raw.replace(str(tmp_path), "/tmp/x")))
    assert status == 1, raw[-3000:]
    record = read_json(run_dir / "run.json")
    (start,) = record["starts"]                  # crash_retries 0: never requeued
    assert record["state"] == start["state"] == "FAILED" and start["reason"] == "crash", record
    assert f"[glaunch] run {record['run_id']} FAILED at step " in raw and "after 1 start(s)" in raw, raw[-3000:]
    assert re.search(r"\[glaunch\] reason: crash; exit status \d+; task 1 on node\d: "
                     r"RuntimeError: boom at step 15 on rank 1", raw), raw[-3000:]
    assert re.search(r"\[glaunch\] first failing rank: 1 on node\d: RuntimeError: boom at step 15 on rank 1; "
                     r"its log: \S+_1_log\.err", raw), raw[-3000:]
    assert "RuntimeError: boom at step 15 on rank 1" in raw.split("first failing rank")[1]   # its log's end
    assert "step 10/100 loss" in raw                                                      # rank 0's log
    assert console_events(raw) == []                                                      # never requeued
    assert "submitit INFO" not in raw and "Bypassing signal" not in raw
