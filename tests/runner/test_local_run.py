"""The main job on the local default site, end to end: real processes, gloo, checkpoints."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def glaunch(*args, env, cwd=REPO, timeout=300):
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_local_torch_ddp_trains_two_ranks_and_checkpoints(tmp_path, isolated_env):
    runs = tmp_path / "runs"
    proc = glaunch("submit", "examples/torch_ddp.yaml", "--runs-dir", str(runs), "entrypoint.args=[--steps,20]",
                   env=isolated_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "step 20/20" in proc.stdout          # rank 0's progress is streamed
    (run_dir,) = runs.iterdir()
    result = json.loads((run_dir / "result.json").read_text())
    assert result["world_size"] == 2
    assert result["final_step"] == 20
    assert len(result["param_sha256"]) == 64
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step-"))
    assert checkpoints and checkpoints[-1].endswith("20")
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "COMPLETED"
    assert record["starts"][0]["state"] == "COMPLETED"
    for rank in (0, 1):
        assert list((run_dir / "logs").glob(f"*_{rank}_log.out")), f"no log for rank {rank}"
    # the run is found by id
    status = glaunch("status", record["run_id"], "--json", env=isolated_env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] == "COMPLETED"


def test_local_failure_exits_non_zero(tmp_path, isolated_env):
    script = tmp_path / "boom.py"
    script.write_text("import sys\nprint('about to fail', flush=True)\nsys.exit(3)\n")
    exp = tmp_path / "exp.yaml"
    exp.write_text("name: boom\nentrypoint: {script: boom.py}\nresources: {time: '5'}\nrequeue: {signal_lead_s: 10}\n")
    proc = glaunch("submit", str(exp), "--runs-dir", str(tmp_path / "runs"), env=isolated_env, cwd=tmp_path)
    assert proc.returncode != 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "FAILED"
    assert record["starts"][-1]["reason"] == "crash"


def test_a_sweep_over_hparams_lr_trains_differently_and_says_in_what_precision(tmp_path, isolated_env):
    """The examples read their hparams (hparams.lr is --lr) and say precision: bf16, which the
    CPU trains in fp32, in the log."""
    runs = tmp_path / "runs"
    proc = glaunch("submit", "examples/torch_ddp.yaml", "--runs-dir", str(runs), "entrypoint.args=[--steps,10]",
                   "--sweep", "hparams.lr=0.003,0.01", env=isolated_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "changes nothing the job sees" not in proc.stderr
    (sweep_dir,) = runs.iterdir()
    hashes = {}
    for run_dir in sorted(p for p in sweep_dir.iterdir() if (p / "hparams.json").is_file()):
        lr = json.loads((run_dir / "hparams.json").read_text())["lr"]
        result = json.loads((run_dir / "result.json").read_text())
        hashes[lr] = result["param_sha256"]
        assert result["placement"]["precision"] == "fp32" and result["placement"]["compute_dtype"] == "float32"
        (log,) = (run_dir / "logs").glob("*_0_log.err")
        text = log.read_text()
        assert f"hparams as option defaults: lr={lr}" in text
        assert "on cpu, training in fp32 (bf16 configured; the CPU trains in fp32)" in text
    assert set(hashes) == {0.003, 0.01} and hashes[0.003] != hashes[0.01]


def test_a_rank_killed_by_sigkill_is_a_crash_not_a_cancel(tmp_path, isolated_env):
    """What the kernel's OOM killer does to a rank: nobody asked glaunch to cancel, so the
    start crashed, crash_retries counts it, and the reason names the rank and the signal."""
    script = tmp_path / "oom.py"
    script.write_text("import os, signal, sys, time\n"
                      "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
                      "if os.environ['RANK'] == '1':\n"
                      "    os.kill(os.getpid(), signal.SIGKILL)\n"
                      "time.sleep(60)\n")
    exp = tmp_path / "exp.yaml"
    exp.write_text("name: oom\nentrypoint: {script: oom.py}\nresources: {time: '5'}\n"
                   "requeue: {signal_lead_s: 10, max: 3}\n")
    (tmp_path / "site_configs").mkdir()
    (tmp_path / "site_configs" / "retrying.yaml").write_text("name: retrying\nextends: local\ncrash_retries: 1\n")
    proc = glaunch("submit", str(exp), "--site", "retrying", "--runs-dir", str(tmp_path / "runs"), env=isolated_env,
                   cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "FAILED" and record["reason"] == "crash"
    # Retried once (crash_retries), then failed: each start says which rank and which signal.
    assert [(s["state"], s["reason"]) for s in record["starts"]] == [("REQUEUED", "crash"), ("FAILED", "crash")]
    for start in record["starts"]:
        assert start["detail"].startswith("rank 1 killed by SIGKILL (out of memory?)"), start["detail"]
