"""The watchdog's requests on Slurm: the watchdog (maybe inside the job's container, without
Slurm's commands) prints them; job.sbatch reads them outside and runs scancel. The reader is
taken from a rendered job.sbatch and run by real bash, with a stand-in `scancel` on PATH that
records its arguments (no cluster needed: what scancel does is Slurm's)."""

from __future__ import annotations

import io
import os
import re
import subprocess
from pathlib import Path

from launcher.runtime.watchdog import SlurmSteps

GOLDEN = Path(__file__).parent.parent / "golden" / "local-slurm.srun.job.sbatch"


def reader_function() -> str:
    text = GOLDEN.read_text()
    match = re.search(r"^glaunch_watchdog_requests\(\) \{\n.*?^\}\n", text, re.M | re.S)
    assert match, "job.sbatch defines no glaunch_watchdog_requests"
    return match.group(0)


def run_reader(tmp_path: Path, requests: str, scancel_status: int = 0) -> tuple[list[list[str]], str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "scancel").write_text(f'#!/bin/bash\nprintf "%s\\0" "$@" >> {calls}\nprintf "\\n" >> {calls}\n'
                                     f"exit {scancel_status}\n")
    (bin_dir / "scancel").chmod(0o755)
    script = "set -eo pipefail\n" + reader_function() + "glaunch_watchdog_requests\necho reader-done\n"
    proc = subprocess.run(["bash", "-c", script], input=requests, capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="4242"))
    assert proc.returncode == 0, proc.stderr
    recorded = calls.read_text().splitlines() if calls.exists() else []
    return [line.split("\0")[:-1] for line in recorded], proc.stdout, proc.stderr


def test_requests_become_scancel_calls_on_the_job_and_its_steps(tmp_path):
    calls, out, _ = run_reader(tmp_path, "signal 28\nend 0\nend 12\n")
    assert calls == [["--signal=28", "4242"], ["--signal=KILL", "4242.0"], ["--signal=KILL", "4242.12"]]
    assert out.strip() == "reader-done"


def test_hostile_lines_never_reach_scancel_or_execute(tmp_path):
    marker = tmp_path / "pwned"
    hostile = (f"signal 9; touch {marker}\nend $(touch {marker})\nend 3 4\nsignal -KILL\nend ../5\n"
               f"`touch {marker}`\nend\nsignal\n")
    calls, out, err = run_reader(tmp_path, hostile)
    assert calls == [] and not marker.exists()
    # Lines that are not requests stay in the batch log, as written.
    assert f"`touch {marker}`" in out and out.rstrip().endswith("reader-done")


def test_a_failed_scancel_is_said_and_the_reader_goes_on(tmp_path):
    calls, out, err = run_reader(tmp_path, "signal 28\nend 1\n", scancel_status=1)
    assert len(calls) == 2 and "scancel failed (signal 28)" in err and "scancel failed (end 1)" in err
    assert out.strip() == "reader-done"


def test_the_watchdog_asks_for_the_steps_its_ranks_named():
    out = io.StringIO()
    records = {0: {"job_step": "0"}, 1: {"job_step": "0"}, 2: {"job_step": "3"}, 3: {"job_step": None}}
    steps = SlurmSteps("4242", lambda: records, out=out)
    steps.signal(28)
    steps.end()
    assert out.getvalue() == "signal 28\nend 0\nend 3\n"
