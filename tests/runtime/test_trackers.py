"""Experiment trackers follow the glaunch run: W&B's run id, resume and directory, and a
TensorBoard log directory in the run directory; skipped cleanly where the package is
missing. Offline only: nothing here reaches a W&B server."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from launcher.runtime import trackers

REPO = Path(__file__).resolve().parents[2]
HAS_WANDB = importlib.util.find_spec("wandb") is not None
HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


@pytest.fixture
def run_env(tmp_path, monkeypatch):
    for key in list(os.environ):
        if key.startswith(("WANDB_", "GLAUNCH_")) or key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("GLAUNCH_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("GLAUNCH_RUN_ID", "gpt-small-20250301-100000-ab12")
    monkeypatch.setenv("GLAUNCH_RESTART", "1")
    (tmp_path / "run").mkdir()
    trackers._said.clear()
    return tmp_path / "run"


def test_tracker_env_follows_the_run(run_env):
    env = trackers.tracker_env()
    assert env == {"WANDB_RUN_ID": "gpt-small-20250301-100000-ab12", "WANDB_RESUME": "allow",
                   "WANDB_DIR": str(run_env / "wandb"), "WANDB_NAME": "gpt-small-20250301-100000-ab12",
                   "GLAUNCH_TENSORBOARD_DIR": str(run_env / "tensorboard")}
    assert all(os.environ[k] == v for k, v in env.items())


def test_values_the_experiment_set_win(run_env, monkeypatch):
    monkeypatch.setenv("WANDB_RUN_ID", "mine")
    monkeypatch.setenv("WANDB_DIR", "/elsewhere")
    env = trackers.tracker_env()
    assert env["WANDB_RUN_ID"] == "mine" and env["WANDB_DIR"] == "/elsewhere" and env["WANDB_RESUME"] == "allow"


def test_long_run_ids_fit_wandb():
    long = "a" * 80 + "-20250301-100000-ab12"
    short = trackers.wandb_id(long)
    assert len(short) == 64 and short.startswith("a" * 55) and short == trackers.wandb_id(long)
    assert trackers.wandb_id(long + "x") != short
    assert trackers.wandb_id("run-1") == "run-1"


@pytest.mark.skipif(HAS_WANDB, reason="wandb is installed here")
def test_without_wandb_init_is_skipped(run_env, capsys):
    assert trackers.wandb_init(project="p") is None
    assert trackers.wandb_init(project="p") is None
    assert capsys.readouterr().err.count("wandb is not installed") == 1
    assert not (run_env / "wandb").exists()


@pytest.mark.skipif(HAS_TENSORBOARD, reason="tensorboard is installed here")
def test_without_tensorboard_writer_is_skipped(run_env, capsys):
    assert trackers.tensorboard_writer() is None
    assert "tensorboard is not installed" in capsys.readouterr().err


def test_wandb_init_arguments(run_env, monkeypatch):
    """A stand-in wandb module (the real one may be absent, and must not reach a server)
    records what glaunch passes to wandb.init."""
    calls = []
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=lambda **kw: calls.append(kw) or "run"))
    assert trackers.wandb_init(project="p", config={"lr": 1}) == "run"
    assert calls == [{"project": "p", "config": {"lr": 1}, "id": "gpt-small-20250301-100000-ab12",
                      "resume": "allow", "dir": str(run_env / "wandb"), "name": "gpt-small-20250301-100000-ab12"}]
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert trackers.wandb_init(project="p") is None and len(calls) == 1      # rank 0 only


def test_tensorboard_purges_past_the_resumed_step(run_env, monkeypatch):
    """A stand-in SummaryWriter records its arguments: after a resume from step 40 the
    writer drops what a previous start logged after step 40."""
    made = []
    module = types.ModuleType("torch.utils.tensorboard")
    module.SummaryWriter = lambda **kw: made.append(kw) or "writer"
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", module)
    assert trackers.tensorboard_writer() == "writer"
    assert made[-1] == {"log_dir": str(run_env / "tensorboard")}
    (run_env / "resume.json").write_text(json.dumps({"restart": 1, "step": 40}))
    trackers.tensorboard_writer(flush_secs=5)
    assert made[-1] == {"log_dir": str(run_env / "tensorboard"), "purge_step": 41, "flush_secs": 5}


@pytest.mark.skipif(not HAS_WANDB, reason="wandb is not installed here")
def test_wandb_offline_run_resumes_across_starts(tmp_path):
    code = ("from launcher.runtime import trackers\n"
            "run = trackers.wandb_init(project='glaunch-test')\n"
            "run.log({'loss': 1.0})\nprint(run.id)\nrun.finish()\n")
    ids = []
    for restart in (0, 1):
        env = dict(os.environ, WANDB_MODE="offline", GLAUNCH_RUN_DIR=str(tmp_path), GLAUNCH_RUN_ID="offline-run",
                   GLAUNCH_RESTART=str(restart), PYTHONPATH=str(REPO))
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        ids.append(proc.stdout.split()[-1])
    assert ids == ["offline-run", "offline-run"]
    assert list((tmp_path / "wandb").rglob("*offline-run*"))
