"""Telemetry of a start: what each rank writes, how it is folded into run.json's start
entry, and the GPU sampler (absent without nvidia-smi)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.rundir.layout import RunDir, heartbeat_bytes, read_heartbeat
from launcher.rundir import startsummary
from launcher.rundir.records import RunRecord
from launcher.runtime import heartbeats, telemetry

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh():
    heartbeats.reset()
    yield
    heartbeats.reset()


def rank_file(run_dir: Path, rank: int, **fields) -> None:
    data = {"rank": rank, "node": f"n{rank // 2}", "job_id": "9", "restart": 1, "reason": "stop",
            "memory": {"kind": "host_rss", "peak_gb": 1.0 + rank, "host_rss_gb": 1.0 + rank},
            "step_time_s": {"median": 0.5 + rank / 10, "p90": 0.6 + rank / 10, "count": 40},
            "save_s": [1.0, 2.0 + rank], "first_step": 11, "first_time": 1000.0 + rank, "last_step": 50,
            "last_time": 1020.0, "stop": {"requested": 1021.0 + rank, "decided": 1022.0, "saved": 1024.0 + rank}}
    data.update(fields)
    path = RunDir(run_dir).telemetry("9", 1, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_a_start_s_last_step_is_at_least_its_newest_checkpoint(tmp_path):
    """A rank that hung (or was killed) at step 8 last wrote its beat at step 4, then saved
    step 5 (the beat written as the save ended): the start reached step 5 at least, which
    the next start resumes from, never "hung at step 4 -> resumed from 5"."""
    hb = RunDir(tmp_path).heartbeat(0)
    hb.parent.mkdir()
    hb.write_bytes(heartbeat_bytes({"rank": 0, "job_id": "9", "restart": 1, "step": 4, "time": 1000.0,
                                    "checkpoint_step": 5, "save_ended": 1000.6}))
    out = startsummary.start_summary(tmp_path, "9", 1)
    assert out["last_step"] == 5 and out["last_step_at"] == startsummary.iso(1000.6)


def test_start_summary_folds_every_rank(tmp_path):
    for rank in range(4):
        rank_file(tmp_path, rank)
    rank_file(tmp_path, 7, restart=0, memory={"kind": "cuda", "peak_gb": 99.0})      # another start's
    hb = RunDir(tmp_path).heartbeat(2)
    hb.parent.mkdir()
    hb.write_bytes(heartbeat_bytes({"rank": 2, "job_id": "9", "restart": 1, "step": 52, "time": 1030.0,
                                    "first_step": 11, "first_time": 999.5}))
    (tmp_path / "stop.json").write_text(json.dumps({"restart": 1, "step": 52, "checkpoint": "/c/step-52"}))
    (tmp_path / "resume.json").write_text(json.dumps({"restart": 1, "step": 10, "time": 990.0}))
    out = startsummary.start_summary(tmp_path, "9", 1)
    assert out["peak_memory_gb"] == 4.0
    assert out["memory"]["kind"] == "host_rss" and [r["rank"] for r in out["memory"]["ranks"]] == [0, 1, 2, 3]
    assert out["step_time_s"] == {"median": 0.65, "p90": 0.9}
    assert out["save_s"] == {"median": 1.5, "max": 5.0, "count": 2}     # of 1,1,1,1,2,3,4,5
    assert out["first_step"] == 11 and out["last_step"] == 52      # the heartbeat is further than the files
    assert out["first_step_at"] == startsummary.iso(999.5) and out["last_step_at"] == startsummary.iso(1030.0)
    assert out["stop_requested_at"] == startsummary.iso(1021.0) and out["stop_saved_at"] == startsummary.iso(1027.0)
    assert out["stop_checkpoint"] == "/c/step-52" and out["resume_at"] == startsummary.iso(990.0)
    record = RunRecord(run_id="r")
    entry = record.record_start("9", 1, **out)                       # every field is one a start keeps
    assert all(entry.get(key) == value for key, value in out.items())


def test_start_summary_of_damaged_files(tmp_path):
    rank_file(tmp_path, 0, memory={"kind": "cuda", "peak_gb": "huge"}, step_time_s=[1], save_s={"a": 1},
              first_time="then", last_step=True, stop=None)
    (RunDir(tmp_path).telemetry("9", 1, 1)).write_text("{not json")
    out = startsummary.start_summary(tmp_path, "9", 1)
    assert "peak_memory_gb" not in out and "step_time_s" not in out and "save_s" not in out
    record = RunRecord(run_id="r")
    record.record_start("9", 1, **out, peak_memory_gb=-3, step_time_s={"median": "x"})
    assert record.starts[0].get("peak_memory_gb") is None and record.starts[0].get("step_time_s") is None


def test_a_rank_writes_its_telemetry(tmp_path, monkeypatch):
    monkeypatch.setenv("GLAUNCH_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("GLAUNCH_JOB_ID", "31")
    monkeypatch.setenv("GLAUNCH_RESTART", "2")
    monkeypatch.setenv("GLAUNCH_GPU_SAMPLE_S", "0")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    for step in range(5, 9):
        heartbeats.heartbeat(step, 100)
        time.sleep(0.01)
    heartbeats.note_stop_decided()
    record = heartbeats.write_telemetry("stop", stop_requested=time.time())
    written = json.loads(RunDir(tmp_path).telemetry("31", 2, 0).read_text())
    assert written == json.loads(json.dumps(record))
    assert written["memory"]["kind"] == "host_rss" and written["memory"]["peak_gb"] > 0.01
    assert written["step_time_s"]["count"] == 3 and written["step_time_s"]["median"] >= 0.01
    assert (written["first_step"], written["last_step"], written["total"]) == (5, 8, 100)
    assert len(written["save_s"]) == 1                 # the stop's own save
    assert startsummary.start_summary(tmp_path, "31", 2)["last_step"] == 8


def test_host_peak_is_this_process():
    # In a fresh process: a test worker's own peak may already be above what is allocated here.
    code = ("from launcher.runtime import telemetry\n"
            "before = telemetry.host_peak_bytes()\n"
            "block = bytearray(200 * 1024 * 1024)\n"
            "block[::4096] = b'x' * len(block[::4096])      # touched: resident\n"
            "print(telemetry.host_peak_bytes() - before)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) >= 150 * 1024 * 1024


def _run_rank(tmp_path: Path, path_env: str) -> subprocess.CompletedProcess:
    # Three beats, and then, where there is an nvidia-smi, on (to 30 s) until the sampler has
    # written a sample: on a loaded machine its interpreter may take longer to start than
    # three beats do.
    code = ("import os, pathlib, shutil, time\nfrom launcher.runtime import heartbeats\n"
            "for s in range(1, 4):\n    heartbeats.heartbeat(s)\n    time.sleep(0.4)\n"
            "logs = pathlib.Path(os.environ['GLAUNCH_RUN_DIR'], 'logs')\n"
            "rows = lambda: sum(len(p.read_text().splitlines()) for p in logs.glob('*_gpu_*.csv'))\n"
            "end = time.monotonic() + 30\n"
            "while shutil.which('nvidia-smi') and rows() < 3 and time.monotonic() < end:\n    time.sleep(0.1)\n")
    env = dict(os.environ, GLAUNCH_RUN_DIR=str(tmp_path), GLAUNCH_JOB_ID="12", GLAUNCH_GPU_SAMPLE_S="0.5",
               PATH=path_env, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_no_nvidia_smi_no_samples_no_error(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    proc = _run_rank(tmp_path, str(bin_dir))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert not list(tmp_path.glob("logs/*gpu*"))
    assert json.loads(RunDir(tmp_path).telemetry("12", 0, 0).read_text())["reason"] == "exit"   # atexit
    # The exit handler's last beat says the process exited (and when): a step that outlives
    # every rank's exit has lost a slurmstepd (launcher.jobcontrol.watchdog.step_outlives_ranks).
    beat = read_heartbeat(RunDir(tmp_path).heartbeat(0))
    assert beat is not None and beat["step"] == 3 and 0 < time.time() - beat["exited"] < 60


def test_gpu_samples_from_a_stand_in_nvidia_smi(tmp_path):
    """A bash script standing in for nvidia-smi (no GPU here): the sampler's rows, and it
    ends with the rank."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/bash\necho '0, GPU-aaa, 87, 40, 61234, 81559'\necho '1, GPU-bbb, 91, 45, 60000, 81559'\n")
    fake.chmod(0o755)
    proc = _run_rank(tmp_path, f"{bin_dir}:/usr/bin:/bin")
    assert proc.returncode == 0, proc.stderr
    (samples,) = (tmp_path / "logs").glob("12_gpu_*.csv")
    lines = samples.read_text().splitlines()
    assert lines[0] == telemetry.GPU_HEADER
    assert len(lines) >= 3 and lines[1].split(",")[1:] == ["0", "GPU-aaa", "87", "40", "61234", "81559"]
    time.sleep(1.5)
    assert samples.read_text().splitlines() == lines   # the sampler ended with its rank

    from launcher.runner.status import gpu_report

    (row,) = gpu_report(tmp_path)
    assert row["utilization_mean_pct"] == 89 and row["memory_used_max_mib"] == 61234


CHILDREN = """\
import multiprocessing.util, pathlib, sys, time
from launcher.runtime import heartbeats
def upload(path):
    time.sleep(1.5)
    pathlib.Path(path).write_text(repr(time.time()))
if __name__ == "__main__":
    heartbeats.heartbeat(1)
    spawn = multiprocessing.get_context("spawn")
    spawn.Process(target=upload, args=(sys.argv[1],)).start()
    # A Manager left running: multiprocessing's exit shuts its server down before it joins
    # the other children (a join of the server first would wait for ever).
    shared = spawn.Manager().dict(a=1)
"""


def test_a_rank_has_exited_once_its_non_daemonic_children_have(tmp_path):
    # multiprocessing's exit handler ends them after glaunch's (atexit runs the last
    # registered first; multiprocessing.util registers it when imported, and torch imports
    # it first): the rank's `exited` must not come before the child's end, or a step still
    # uploading would read as one that outlived its ranks.
    script = tmp_path / "rank.py"
    script.write_text(CHILDREN)
    env = dict(os.environ, GLAUNCH_RUN_DIR=str(tmp_path), GLAUNCH_JOB_ID="12", GLAUNCH_GPU_SAMPLE_S="0",
               PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "uploaded")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    beat = read_heartbeat(RunDir(tmp_path).heartbeat(0))
    assert beat is not None and beat["exited"] >= float((tmp_path / "uploaded").read_text())
