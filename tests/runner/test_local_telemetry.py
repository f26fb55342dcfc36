"""What a real local run records of each start (peak memory, step times, saves, first and
last step), what `status` makes of it, the planner's estimate beside a GPU peak, and the
warning at submit for a run that may be requeued but sets nothing about checkpoints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from launcher import api
from launcher.rundir import registry
from launcher.views.status_text import format_status

REPO = Path(__file__).resolve().parents[2]


def glaunch(*args, env, cwd=REPO, timeout=300):
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_local_run_records_telemetry(tmp_path, isolated_env):
    runs = tmp_path / "runs"
    proc = glaunch("submit", "examples/torch_ddp.yaml", "--runs-dir", str(runs),
                   "entrypoint.args=[--steps,30,--seconds-per-step,0.05]", env=isolated_env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (run_dir,) = runs.iterdir()
    (start,) = json.loads((run_dir / "run.json").read_text())["starts"]
    assert 0.05 < start["peak_memory_gb"] < 8
    assert start["memory"]["kind"] == "host_rss"
    assert [r["rank"] for r in start["memory"]["ranks"]] == [0, 1]
    assert all(r["peak_gb"] > 0.05 for r in start["memory"]["ranks"])
    times = start["step_time_s"]
    assert 0.05 <= times["median"] <= times["p90"] < 2.0
    assert (start["first_step"], start["last_step"]) == (1, 30)
    assert start["save_s"]["count"] >= 2               # checkpoints at steps 10 and 20 (and 30)
    assert start["first_step_at"] >= start["started"]
    assert sorted(p.name for p in (run_dir / "heartbeats").iterdir()) == ["rank-00000.json", "rank-00001.json"]

    status = glaunch("status", str(run_dir), "--json", env=isolated_env)
    summary = json.loads(status.stdout)
    assert summary["starts"][0]["peak_memory_gb"] == start["peak_memory_gb"]
    assert summary["starts"][0]["step_time_s"] == times
    good = summary["goodput"]
    assert 0 < good["ettr"] < 1 and good["lost_steps"] == 0 and good["interruptions"] == 0
    assert good["starts"][0]["startup_s"] > 0
    assert summary["memory"]["kind"] == "host_rss" and "planned" not in summary["memory"]   # no model.params
    text = glaunch("status", str(run_dir), env=isolated_env).stdout
    assert "memory: peak" in text and "goodput: ETTR" in text and "step 0.0" in text


def test_status_sets_a_gpu_peak_against_the_planner(tmp_path, isolated_env):
    """A rendered run on a GPU site with model.params; its start's record then says what a
    GPU run would (the CUDA peak): status shows the planner's estimate for the strategy
    the run used, and the ratio."""
    run = api.submit("examples/deepspeed_zero2.yaml", site="juwels-booster", dry_run=True,
                     runs_dir=str(tmp_path / "runs"), overrides=["model.params=1.3e9"])
    with registry.updating(run.run_dir) as record:
        record.record_start("4711", 0, state="COMPLETED", peak_memory_gb=9.5,
                            memory={"kind": "cuda", "ranks": [{"rank": 0, "peak_gb": 9.5}]})
    summary = api.status(run.run_dir)
    plan = api.plan("examples/deepspeed_zero2.yaml", site="juwels-booster",
                    overrides=["model.params=1.3e9"])
    expected = round(plan.row("zero2").total_gb, 3)
    assert summary["memory"]["planned"] == {"strategy": "zero2", "estimate_gb": expected, "from": "planner"}
    assert summary["memory"]["ratio"] == round(9.5 / expected, 3)
    assert f"planner's estimate for zero2: {expected:.3g} GB (peak/estimate {9.5 / expected:.2f})" \
        in format_status(summary)


def test_submit_warns_when_a_requeued_run_sets_no_checkpoints(tmp_path, isolated_env):
    (tmp_path / "train.py").write_text("print('hi')\n")
    bare = tmp_path / "bare.yaml"
    bare.write_text("name: bare\nentrypoint: {script: train.py}\n")
    saving = tmp_path / "saving.yaml"
    saving.write_text("name: saving\nentrypoint: {script: train.py}\ncheckpoint: {every_steps: 100}\n")
    runs = str(tmp_path / "runs")
    warned = glaunch("submit", str(bare), "--dry-run", "--runs-dir", runs, env=isolated_env, cwd=tmp_path)
    assert warned.returncode == 0, warned.stderr
    (line,) = [x for x in warned.stderr.splitlines() if "warning" in x]
    assert line.startswith("glaunch: warning: ") and "requeue.max=3" in line and "step 0" in line
    for args in ((str(saving),), (str(bare), "requeue.max=0")):
        quiet = glaunch("submit", *args, "--dry-run", "--runs-dir", runs, env=isolated_env, cwd=tmp_path)
        assert quiet.returncode == 0 and "warning" not in quiet.stderr, quiet.stderr
