"""Time limit on the local site: warned, checkpointed, requeued, resumed -- and the final
parameters are bitwise those of an uninterrupted run with the same seed."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STEPS = 120          # 48 s of training at 0.4 s a step: more than one start's 40 s


def submit(runs: Path, env, *overrides):
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", "examples/torch_ddp.yaml",
                           "--runs-dir", str(runs), *overrides], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = runs.iterdir()
    return run_dir, proc.stdout


def test_time_limit_requeues_and_resumes_bitwise(tmp_path, isolated_env):
    # Each start trains for what its minute leaves after start-up (40 s less that); the training
    # takes longer than one start can give, so the first start is cut however fast it starts, and
    # a slow start-up only adds starts. No periodic checkpoint: each start resumes from its stop's.
    base_dir, _ = submit(tmp_path / "base", isolated_env, f"entrypoint.args=[--steps,{STEPS}]")
    cut_dir, out = submit(tmp_path / "cut", isolated_env, "resources.time=1", "requeue.signal_lead_s=20",
                          "requeue.max=20", "checkpoint.every_steps=1000",
                          f"entrypoint.args=[--steps,{STEPS},--seconds-per-step,0.4]")
    record = json.loads((cut_dir / "run.json").read_text())
    states = [(s["state"], s["reason"]) for s in record["starts"]]
    assert states[0] == ("REQUEUED", "timeout"), states
    assert states[-1] == ("COMPLETED", None), states
    assert record["state"] == "COMPLETED"
    assert "stopping at step" in out and "resumed from" in out
    base = json.loads((base_dir / "result.json").read_text())
    cut = json.loads((cut_dir / "result.json").read_text())
    assert cut["final_step"] == base["final_step"] == STEPS
    assert cut["param_sha256"] == base["param_sha256"]
    assert cut["resumed_from"] is not None


def test_requeue_max_bounds_restarts(tmp_path, isolated_env):
    run_dir, _ = submit_expect_failure(tmp_path / "runs", isolated_env, "resources.time=0:12",
                                       "requeue.signal_lead_s=8", "requeue.max=1",
                                       "entrypoint.args=[--steps,400,--seconds-per-step,0.5]")
    record = json.loads((run_dir / "run.json").read_text())
    assert len(record["starts"]) == 2          # the first start and one requeue
    assert record["state"] == "TIMEOUT"


def submit_expect_failure(runs: Path, env, *overrides):
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", "examples/torch_ddp.yaml",
                           "--runs-dir", str(runs), *overrides], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=1200)
    assert proc.returncode != 0
    (run_dir,) = runs.iterdir()
    return run_dir, proc.stdout
