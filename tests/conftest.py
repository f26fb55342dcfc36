import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


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


def slurm_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
    return proc.returncode == 0 and any(state in proc.stdout for state in ("idle", "mixed", "allocated"))


requires_slurm = pytest.mark.skipif(os.environ.get("GLAUNCH_REQUIRE_SLURM") != "1" and not slurm_up(),
                                    reason="local Slurm cluster is not up (scripts/local-slurm up)")
