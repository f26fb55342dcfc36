import os
from pathlib import Path

import pytest

from slurmkit import DEFAULTS, MAIN, cluster_env, slurm_up

REPO = Path(__file__).resolve().parent.parent

# Slurm's commands, run here or by glaunch in a subprocess, reach the local cluster `main`
# through SLURM_CONF whatever the host's /etc/slurm holds; `slurm_defaults_env` switches a
# test to the second cluster.
os.environ.update(cluster_env(MAIN))
# Tests give each run an empty HOME; DeepSpeed's CPU ops are compiled once per machine, not
# once per test, when their build cache stays where it is.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))

# scripts/test sets it once the clusters are up: their tests must run, never skip.
REQUIRE_SLURM = os.environ.get("GLAUNCH_REQUIRE_SLURM") == "1"


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite tests/golden/* from the current renderer instead of comparing")


@pytest.fixture
def update_golden(request):
    return request.config.getoption("--update-golden") or os.environ.get("GLAUNCH_UPDATE_GOLDEN") == "1"


@pytest.fixture
def isolated_env(tmp_path, monkeypatch):
    """HOME and the run index in tmp, so tests never touch the real ones."""
    env = dict(os.environ, HOME=str(tmp_path / "home"), GLAUNCH_STATE_DIR=str(tmp_path / "state"))
    (tmp_path / "home").mkdir()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


# What makes a process a rank of a distributed job: a test of one process's runtime unsets it.
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
             "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def single_rank_env(monkeypatch, tmp_path):
    """This process as the only rank of a run in tmp: no rank or GLAUNCH_* variables from
    outside, the run and checkpoint directories under tmp_path."""
    for k in list(os.environ):
        if k in RANK_VARS or k.startswith("GLAUNCH_"):
            monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("GLAUNCH_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("GLAUNCH_CHECKPOINT_DIR", str(tmp_path / "ckpt"))


requires_slurm = pytest.mark.skipif(not REQUIRE_SLURM and not slurm_up(MAIN),
                                    reason="local Slurm cluster is not up (scripts/local-slurm up)")
requires_slurm_defaults = pytest.mark.skipif(
    not REQUIRE_SLURM and not slurm_up(DEFAULTS),
    reason="the second local Slurm cluster is not up (scripts/local-slurm up defaults)")


@pytest.fixture
def slurm_defaults_env(isolated_env, monkeypatch):
    """isolated_env pointed at the second cluster (`defaults`, site local-slurm-defaults):
    SLURM_CONF in the returned environment and in os.environ, so glaunch subprocesses,
    slurmkit's helpers and in-process api calls all reach it. Skips when that cluster is
    not up, fails instead under GLAUNCH_REQUIRE_SLURM=1."""
    if not slurm_up(DEFAULTS):
        message = "the second local Slurm cluster is not up (scripts/local-slurm up defaults)"
        if REQUIRE_SLURM:
            pytest.fail(message)
        pytest.skip(message)
    variables = cluster_env(DEFAULTS)
    for key, value in variables.items():
        monkeypatch.setenv(key, value)
    return dict(isolated_env, **variables)
