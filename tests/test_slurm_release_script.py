"""scripts/slurm-release (another Slurm release in a sandbox of its own) and
scripts/record-slurm-outputs (the fixtures of tests/recorded/slurm-RELEASE/), without
starting anything: both parse, and a wrong word is refused (exit 2) before any change. The
sandbox itself runs in scripts/test's last stage (tests/live, -m "release_smoke or release_only")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SLURM_RELEASE = REPO / "scripts" / "slurm-release"
RECORD = REPO / "scripts" / "record-slurm-outputs"


def test_the_scripts_parse():
    assert subprocess.run(["bash", "-n", str(SLURM_RELEASE)], timeout=30).returncode == 0
    if shutil.which("shellcheck"):
        check = subprocess.run(["shellcheck", str(SLURM_RELEASE)], capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout
    compiled = subprocess.run([sys.executable, "-m", "py_compile", str(RECORD)], capture_output=True, text=True,
                              timeout=60)
    assert compiled.returncode == 0, compiled.stderr
    assert os.access(SLURM_RELEASE, os.X_OK) and os.access(RECORD, os.X_OK)


@pytest.mark.parametrize("args,said", [
    (["--release", "23.02", "status"], "unknown release '23.02' (24.11, 22.05)"),
    (["start"], "usage: scripts/slurm-release"),
    ([], "usage: scripts/slurm-release"),
])
def test_a_wrong_word_is_refused_before_any_change(args, said):
    proc = subprocess.run([str(SLURM_RELEASE), *args], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr


def test_record_without_a_folder_prints_its_usage():
    proc = subprocess.run([sys.executable, str(RECORD)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "scripts/record-slurm-outputs DIR" in proc.stderr, proc.stderr
