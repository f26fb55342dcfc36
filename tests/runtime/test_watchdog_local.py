"""The hang watchdog on the local scheduler, end to end: one rank of the torch DDP example
sleeps inside its loop on the first start; the watchdog finds the stall from the
heartbeats, writes every rank's stack, ends the step; the start is recorded as a hang,
retried within crash_retries, resumes from its checkpoint and ends bitwise like an
uninterrupted run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STALL_S = 12
HANG_STEP = 14

# The example, with one rank made to hang at HANG_STEP on restart 0 when HANG_RANK is set.
HANGING_SCRIPT = f'''
import os, sys, time
sys.path.insert(0, {str(REPO / "examples")!r})
import torch_ddp
from launcher import runtime as rt

should_stop = rt.should_stop


def hang_here():
    time.sleep(10**6)


def stalling_should_stop(step=None, total=None):
    if (os.environ.get("HANG_RANK") == os.environ.get("RANK") and os.environ.get("GLAUNCH_RESTART") == "0"
            and step == {HANG_STEP}):
        hang_here()
    return should_stop(step=step, total=total)


rt.should_stop = stalling_should_stop
sys.exit(torch_ddp.main())
'''

EXPERIMENT = """
name: hang
entrypoint:
  script: hang_ddp.py
  args: ["--steps", "30", "--seconds-per-step", "0.2"]
launcher: srun
resources: {nodes: 1, time: "00:10:00"}
strategy: {name: ddp}
precision: fp32
batch: {micro_size: 8}
checkpoint: {every_steps: 10, keep: 2}
requeue: {max: 3, signal_lead_s: 30}
"""

SITE = """
name: local-retry
extends: local
crash_retries: 1
"""


def submit(tmp_path: Path, runs: str, env, *overrides) -> tuple[Path, subprocess.CompletedProcess, float]:
    began = time.time()
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", str(tmp_path / "hang.yaml"),
                           "--site", str(tmp_path / "site.yaml"), "--runs-dir", str(tmp_path / runs), *overrides],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    (run_dir,) = (tmp_path / runs).iterdir()
    return run_dir, proc, time.time() - began


def test_a_hung_rank_is_found_dumped_and_the_run_resumes_bitwise(tmp_path, isolated_env):
    (tmp_path / "hang_ddp.py").write_text(HANGING_SCRIPT)
    (tmp_path / "hang.yaml").write_text(EXPERIMENT)
    (tmp_path / "site.yaml").write_text(SITE)
    base_dir, base, _ = submit(tmp_path, "base", isolated_env)
    assert base.returncode == 0, base.stdout[-3000:] + base.stderr[-3000:]

    hung_dir, proc, seconds = submit(tmp_path, "hung", isolated_env, f"watchdog.stall_s={STALL_S}",
                                     "env.HANG_RANK=1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((hung_dir / "run.json").read_text())
    first, last = record["starts"][0], record["starts"][-1]
    assert (first["state"], first["reason"]) == ("REQUEUED", "hang"), first
    assert (last["state"], last["reason"]) == ("COMPLETED", None), last
    assert record["state"] == "COMPLETED" and len(record["starts"]) == 2

    hang = first["hang"]
    assert hang["kind"] == "stall" and hang["bound_s"] == STALL_S
    assert {s["rank"] for s in hang["silent"]} >= {1}
    assert all(s["node"] for s in hang["silent"])
    # Never before the bound, counted from the last step any rank reached; how long after
    # depends on the machine's load, so the upper bound is only the step's time limit.
    last_step_at = max(s["last_step_at"] for s in hang["silent"])
    latency = datetime.fromisoformat(hang["detected_at"]).timestamp() - last_step_at
    assert STALL_S - 1e-3 <= latency < 600, latency          # detected_at is cut to the millisecond

    stacks = {Path(p).name: (hung_dir / p).read_text() for p in hang["stacks"]}
    job = first["job_id"]
    assert set(stacks) == {f"stack-{job}_0_0.txt", f"stack-{job}_0_1.txt"}, stacks.keys()
    assert "hang_here" in stacks[f"stack-{job}_0_1.txt"]
    assert "hang_here" not in stacks[f"stack-{job}_0_0.txt"]
    assert "the watchdog ended the step" in first["detail"] and "retry 1 of 1" in first["detail"]

    base_result = json.loads((base_dir / "result.json").read_text())
    hung_result = json.loads((hung_dir / "result.json").read_text())
    assert hung_result["final_step"] == base_result["final_step"] == 30
    assert hung_result["resumed_from"] == 10
    assert hung_result["param_sha256"] == base_result["param_sha256"]

    status = subprocess.run([sys.executable, "-m", "launcher.cli", "status", str(hung_dir), "--json"], cwd=REPO,
                            env=isolated_env, capture_output=True, text=True, timeout=60)
    shown = json.loads(status.stdout)
    assert shown["starts"][0]["hang"]["stacks"] == hang["stacks"]
    print(f"detection latency {latency:.1f} s (stall_s {STALL_S}); hung run {seconds:.0f} s")
