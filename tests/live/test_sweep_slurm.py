"""Sweeps on the real local Slurm cluster: a 2 x 2 sweep of examples/torch_ddp as one job
array of four tasks, two at a time, every element COMPLETED with its result; one element
preempted by an `urgent` job requeues alone, is requeued by hand in its next start, and
resumes bitwise while the other runs; an element's parameters equal those of the same
configuration submitted alone; a sweep cancelled as a whole."""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest

from conftest import requires_slurm
from slurmkit import (REPO, SITE, final_sacct_state, glaunch, out, preempt, rank0_steps, read_json,
                      release_requeue_hold, sacct_rows, squeue_state, submit, wait_until)

pytestmark = [requires_slurm, pytest.mark.slurm, pytest.mark.slow]

EXPERIMENT = f"""\
name: grid
entrypoint:
  script: {REPO / "examples" / "torch_ddp.py"}
  args: [--steps, "${{hparams.steps}}", --lr, "${{hparams.lr}}", --seconds-per-step, "${{hparams.pace}}",
         --log-every, "1"]
hparams: {{lr: 0.01, steps: 100, pace: 0.15}}
resources: {{nodes: 1, time: "15"}}
checkpoint: {{every_steps: 1000}}
requeue: {{max: 3, signal_lead_s: 30}}
"""


def element_records(sweep_dir, record):
    return [read_json(sweep_dir / e["run_id"] / "run.json") for e in record["elements"]]


# On 22.05 a sweep's array runs through the login node (tests/test_remote_submission.py).
@pytest.mark.release_only
def test_two_by_two_sweep_one_array_one_element_preempted_then_requeued_resumes_bitwise(tmp_path, isolated_env):
    exp = tmp_path / "grid.yaml"
    exp.write_text(EXPERIMENT)
    proc = glaunch("submit", str(exp), "--site", SITE, "--runs-dir", str(tmp_path / "runs"), "--json",
                   "--sweep", "hparams.lr=0.01,0.02", "--sweep", "hparams.steps=80,100", "--max-parallel", "2",
                   env=isolated_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads(proc.stdout)
    sweep_dir = tmp_path / "runs" / info["sweep_id"]
    (array,) = info["arrays"]
    array_id = array["job_id"]
    assert array["elements"] == [0, 1, 2, 3]
    assert "#SBATCH --array=0-3%2" in (sweep_dir / "array-0.sbatch").read_text()
    assert out("scontrol", "write", "batch_script", array_id, "-") == (sweep_dir / "array-0.sbatch").read_text()
    record = read_json(sweep_dir / "sweep.json")
    elements = {e["index"]: e for e in record["elements"]}
    try:
        # Two elements run, one per node; preempt one of them with an urgent job on one node.
        def two_running_with_progress():
            running = [e for e in element_records(sweep_dir, record) if e["state"] == "RUNNING"]
            if len(running) < 2:
                json.loads(glaunch("status", info["sweep_id"], "--json", env=isolated_env).stdout)
                return None
            steps = [len(rank0_steps(sweep_dir / r["run_id"], r["job_id"])) for r in running]
            return running if min(steps) >= 10 else None

        running = wait_until(two_running_with_progress, 600, "two elements to run and make progress")
        preempted_at = time.time()
        urgent = preempt(nodes=1, seconds=5)

        def one_requeued():
            for e in element_records(sweep_dir, record):
                if any(s["state"] == "REQUEUED" for s in e["starts"]):
                    return e
            return None

        victim = wait_until(one_requeued, 300, "the preempted element to requeue")
        others = [r for r in running if r["run_id"] != victim["run_id"]]
        assert len(others) == 1

        # Its second start, once it trains again, requeued by hand (`scontrol requeue`, as a
        # user or an administrator would): slurmstepd says so in the task's own log, after the
        # line glaunch's own requeue of the first start left there.
        logged = len(rank0_steps(sweep_dir / victim["run_id"], victim["job_id"]))

        def training_again():
            release_requeue_hold(victim["job_id"])
            starts = read_json(sweep_dir / victim["run_id"] / "run.json")["starts"]
            return (len(starts) == 2 and starts[-1]["state"] in ("PENDING", "RUNNING")
                    and len(rank0_steps(sweep_dir / victim["run_id"], victim["job_id"])) >= logged + 3)

        wait_until(training_again, 300, "the preempted element to train again", interval=0.3)
        out("scontrol", "requeue", victim["job_id"])

        def all_ended():
            release_requeue_hold(victim["job_id"])
            summary = json.loads(glaunch("status", info["sweep_id"], "--json", env=isolated_env).stdout)
            return summary if all(r["state"] in ("COMPLETED", "FAILED", "CANCELLED") for r in summary["elements"]) \
                else None

        summary = wait_until(all_ended, 1200, "every element to end", interval=3)
    finally:
        glaunch("cancel", info["sweep_id"], env=isolated_env)

    assert summary["state"] == "COMPLETED" and summary["counts"] == {"COMPLETED": 4}
    for row in summary["elements"]:
        assert row["result"]["final_step"] == int(row["params"]["hparams.steps"]), row
        assert row["job_id"] == f"{array_id}_{row['index']}"
    # Slurm's account: four tasks of one array, all COMPLETED; only the victim was requeued. Accounting
    # can still say RUNNING a moment after squeue lost a job: wait for each one's final state.
    for index in range(4):
        final_sacct_state(f"{array_id}_{index}")
    final_sacct_state(urgent)
    rows = sacct_rows(array_id)
    finals = {r["job_id"]: r["state"] for r in rows}
    assert sorted(finals) == [f"{array_id}_{i}" for i in range(4)] and set(finals.values()) == {"COMPLETED"}
    requeued = {r["job_id"] for r in rows if r["state"] == "REQUEUED"}
    assert requeued == {victim["job_id"]}
    # The victim's three starts, and none after the run's end: from Slurm 24.05 on, a job
    # requeued (by glaunch or by hand) after a preemption by requeue would be requeued once
    # more as its last start ended, had glaunch requeued the preempted start itself.
    starts = [r["state"] for r in rows if r["job_id"] == victim["job_id"]]
    assert len(starts) == 3 and starts[0] in ("REQUEUED", "PREEMPTED") and starts[1:] == ["REQUEUED", "COMPLETED"], \
        starts
    assert sacct_rows(urgent)[-1]["state"] == "COMPLETED"

    # The victim: its own requeue, resumed from where it stopped, nothing lost.
    victim = read_json(sweep_dir / victim["run_id"] / "run.json")
    first, by_hand, last = victim["starts"]
    assert first["state"] == "REQUEUED" and first["reason"] == "preemption" and first["stopped_at"] is not None
    assert by_hand["state"] == "REQUEUED" and by_hand["reason"] == "requeued" and by_hand["stopped_at"] is not None
    assert by_hand["resumed_from"] == first["stopped_at"] and last["resumed_from"] == by_hand["stopped_at"]
    assert last["state"] == "COMPLETED"
    # The other element ran through the preemption in one start.
    other = read_json(sweep_dir / others[0]["run_id"] / "run.json")
    assert len(other["starts"]) == 1 and other["starts"][0]["state"] == "COMPLETED"
    assert dt.datetime.fromisoformat(other["starts"][0]["started"]).timestamp() < preempted_at

    # The same configuration submitted alone, never interrupted: the same parameters.
    params = elements[victim["sweep"]["index"]]["params"]
    proc, alone = submit(str(exp), tmp_path / "alone", isolated_env, *(f"{k}={v}" for k, v in params.items()),
                         "hparams.pace=0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = read_json(tmp_path / "alone" / alone["run_id"] / "result.json")["param_sha256"]
    assert read_json(sweep_dir / victim["run_id"] / "result.json")["param_sha256"] == expected

    # The sweep's table and logs.
    text = glaunch("status", info["sweep_id"], env=isolated_env).stdout
    assert "4 element(s): 4 COMPLETED" in text and "hparams.lr" in text and "hparams.steps" in text
    logs = glaunch("logs", info["sweep_id"], "--rank", "0", env=isolated_env).stdout
    assert all(f"[{i}][r0] done: step" in logs for i in range(4))


def test_a_sweep_is_cancelled_as_a_whole(tmp_path, isolated_env):
    site = tmp_path / "site.yaml"
    site.write_text(f"name: later\nextends: {SITE}\nsbatch: {{begin: now+300}}\n")
    proc = glaunch("submit", "examples/torch_ddp.yaml", "--site", str(site), "--runs-dir", str(tmp_path / "runs"),
                   "--json", "--sweep", "entrypoint.args=[--steps,5],[--steps,6],[--steps,7]", env=isolated_env)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    (array,) = info["arrays"]
    try:
        summary = json.loads(glaunch("status", info["sweep_id"], "--json", env=isolated_env).stdout)
        assert [r["state"] for r in summary["elements"]] == ["PENDING"] * 3
    finally:
        cancelled = glaunch("cancel", info["sweep_id"], env=isolated_env)
    assert cancelled.returncode == 0 and f"cancelled job {array['job_id']}" in cancelled.stdout
    wait_until(lambda: squeue_state(f"{array['job_id']}_0") == "", 300, "the array to leave the queue")

    def states():      # accounting has the cancellation a moment later
        summary = json.loads(glaunch("status", info["sweep_id"], "--json", env=isolated_env).stdout)
        return [r["state"] for r in summary["elements"]] == ["CANCELLED"] * 3 and summary

    assert wait_until(states, 300, "every element to be recorded CANCELLED")["state"] == "CANCELLED"
