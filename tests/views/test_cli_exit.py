"""How the `glaunch` process ends (launcher.cli.run, the console script and `python -m
launcher.cli`): the exit code main() chose, output flushed, exit handlers run, and no
traceback when stdout is closed or its reader went away."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def shell(command: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), GLAUNCH_STATE_DIR=str(tmp_path / "state"),
               XDG_CACHE_HOME=str(tmp_path / "cache"), GLAUNCH=f"{sys.executable} -m launcher.cli")
    return subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_exit_codes_and_output_come_through(tmp_path):
    ok = shell(f"$GLAUNCH submit examples/torch_ddp.yaml --dry-run --json --runs-dir {tmp_path}/runs", tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.rstrip().endswith("}") and '"run_id"' in ok.stdout     # the whole JSON, flushed
    bad = shell("$GLAUNCH status no-such-run", tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("glaunch: error: ") and bad.stderr.count("\n") == 1
    usage = shell("$GLAUNCH submit", tmp_path)
    assert usage.returncode == 2 and "Traceback" not in usage.stderr


def test_closed_stdout_is_no_traceback(tmp_path):
    proc = shell("$GLAUNCH --version >&-", tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_a_reader_that_went_away_is_no_traceback(tmp_path):
    # stdout is a pipe whose reading end is closed before glaunch starts.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "launcher.cli", "--help"], cwd=REPO, stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
    finally:
        os.close(write_end)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr


def test_a_full_disk_is_one_line(tmp_path):
    if not os.path.exists("/dev/full"):
        return
    proc = shell("$GLAUNCH --version >/dev/full", tmp_path)
    assert proc.returncode == 1
    assert proc.stderr == "glaunch: error: cannot write the output: No space left on device\n", proc.stderr
