"""Training scripts nobody here wrote (tests/thirdparty: the PyTorch DDP tutorial's multinode
script, nanoGPT's train.py, Lightning's bug-report model), brought as a user would bring
them, on the `defaults` cluster: 2 nodes on the CPU over gloo. Each run gets its
own outputs through ${run:dir}; progress comes from their own log lines
(entrypoint.progress) to the console. The DDP tutorial's script, which knows nothing of
time limits, meets its job's: glaunch carries the run on in a new job (requeue.mode
resubmit), whose start loads the script's own snapshot; under torchrun `logs --rank N`
shows rank N alone. (nanoGPT preempted and the plain Lightning script at its time limit:
tests/live/test_thirdparty_nanogpt_lightning_slurm.py.)
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from conftest import requires_slurm_defaults
from launcher.rundir.layout import read_heartbeat
from slurmkit import DEFAULTS, REPO, finish, glaunch, job_id_of, out, read_json, wait_until, with_cluster

pytestmark = [pytest.mark.slurm, pytest.mark.slow, requires_slurm_defaults]

SITE = "local-slurm-defaults"
THIRDPARTY = REPO / "tests" / "thirdparty"


def project(tmp_path: Path, name: str, exp: str) -> Path:
    """The vendored script's folder as a user's project, with its experiment file."""
    folder = tmp_path / "project"
    shutil.copytree(THIRDPARTY / name, folder)
    (folder / "exp.yaml").write_text(exp)
    return folder


class ConsoleInFiles(subprocess.Popen):
    """A process whose stdout and stderr go to files (a console of thousands of lines would
    fill a pipe that nobody reads while the test waits, and stop glaunch); `communicate`
    returns their text, as slurmkit.finish expects of a process with pipes."""

    def __init__(self, argv: list[str], folder: Path, env, name: str) -> None:
        self.out_path, self.err_path = folder.parent / f"{name}.out", folder.parent / f"{name}.err"
        with open(self.out_path, "w") as stdout, open(self.err_path, "w") as stderr:
            super().__init__(argv, cwd=folder, env=env, stdout=stdout, stderr=stderr, text=True)

    def communicate(self, input=None, timeout=None):
        self.wait(timeout)
        return self.out_path.read_text(errors="replace"), self.err_path.read_text(errors="replace")


def start_console(folder: Path, env, *overrides: str) -> subprocess.Popen:
    """`glaunch submit --wait` from the project's folder, its console in console.out beside it."""
    return ConsoleInFiles([sys.executable, "-m", "launcher.cli", "submit", "--wait", "exp.yaml", "--site", SITE,
                           "--runs-dir", "runs", *overrides], folder, env, "console")


def new_run_dir(runs: Path, known: set[Path]) -> Path:
    return wait_until(lambda: next((p for p in runs.glob("*") if (p / "run.json").exists() and p not in known), None),
                      300, "the run directory")


def rank0_step(run_dir: Path) -> int:
    """Rank 0's step in its heartbeat (from its log lines: entrypoint.progress), -1 before one."""
    beat = read_heartbeat(run_dir / "heartbeats" / "rank-00000.json") or {}
    step = beat.get("step")
    return step if isinstance(step, int) else -1


def next_job(run_dir: Path, job_id: str) -> str | None:
    """The job that carries the run on after `job_id` (run.json's), once there is one."""
    current = read_json(run_dir / "run.json").get("job_id")
    return current if current not in (None, job_id) else None


def still_running(proc: subprocess.Popen, what: Callable[[], object]) -> Callable[[], object]:
    """`what()`, failing at once when the run ended before it came true."""
    def check():
        if proc.poll() is not None:
            stdout, stderr = proc.communicate()
            raise AssertionError(f"the run ended before the test could act\n{stdout[-3000:]}\n{stderr[-3000:]}")
        return what()
    return check


def wait_for(proc: subprocess.Popen, job_id: str, timeout: float) -> tuple[int, str, str]:
    return finish(proc, job_id, timeout, cluster=DEFAULTS)


def rank_logs(run_dir: Path, env, rank: int) -> list[str]:
    proc = glaunch("logs", str(run_dir), "--rank", str(rank), env=env, cluster=DEFAULTS, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


# --- the PyTorch DDP tutorial's multinode.py, under torchrun ------------------------------------------

DDP_TUTORIAL = r"""name: ddp-tutorial
entrypoint:
  script: multinode.py
  args: ["110", "5", "--snapshot_path=${run:dir}/snapshot.pt"]
  progress: {pattern: '^\[GPU0\] Epoch (\d+) ', total: 109}
launcher: torchrun
resources: {nodes: 2, gpus_per_node: 1, time: "1"}
requeue: {max: 3, signal_lead_s: 10}
"""


def test_ddp_tutorial_under_torchrun(tmp_path, isolated_env):
    env = with_cluster(isolated_env, DEFAULTS)
    folder = project(tmp_path, "ddp_tutorial", DDP_TUTORIAL)
    runs = folder / "runs"
    proc = start_console(folder, env)
    first = new_run_dir(runs, set())
    job = job_id_of(first)
    # Its 1-minute limit ends the first start (60 to 90 s in, by slurmctld's 30 s checks; the
    # script's 110 epochs take at least 110 s, each 16 steps and a 1 s sleep, and it snapshots
    # every 5). The warning ahead
    # of it does not end the script; the limit does. The controller records a timeout and
    # submits the next job, whose limit is raised here so that it finishes the run.
    successor = wait_until(still_running(proc, lambda: next_job(first, job)), 300, "the run's next job")
    out("scontrol", "update", f"JobId={successor}", "TimeLimit=10", cluster=DEFAULTS)
    code, console, err = wait_for(proc, successor, 900)
    assert code == 0, console[-3000:] + err[-3000:]
    record = read_json(first / "run.json")
    assert record["state"] == "COMPLETED", record
    assert [(s["job_id"], s["state"], s["reason"]) for s in record["starts"]] == [
        (job, "REQUEUED", "timeout"), (successor, "COMPLETED", None)], record["starts"]
    # The next start resumed from the newest snapshot the first one saved (how many epochs
    # that is depends on the machine's load: on a busy one, only epoch 0's).
    resumed = re.search(r"Resuming training from snapshot at Epoch (\d+)", console)
    assert resumed, console[-3000:]
    saved = [int(n) for n in re.findall(r"Epoch (\d+) \| Training snapshot saved", console[:resumed.start()])]
    assert saved and int(resumed.group(1)) == max(saved), (saved, console[-3000:])
    # Progress from its own lines on the console, no traceback of torchrun's for the requeue.
    assert re.search(r"\[glaunch\] RUNNING \| (start 1 \| )?step \d+/109", console), console[-3000:]
    assert "ChildFailedError" not in console and "Traceback" not in console
    # One rank's log is that rank's lines alone.
    lines = rank_logs(first, env, 1)
    assert lines and all(line.startswith(("[r1]", "[r1!]")) for line in lines), lines[:5]
    assert any("[GPU1] Epoch" in line for line in lines) and not any("[GPU0]" in line for line in lines)

    # A second run from the same folder has a snapshot of its own: it starts at epoch 0.
    second_proc = start_console(folder, env, "entrypoint.args=[3,5,--snapshot_path=${run:dir}/snapshot.pt]")
    second = new_run_dir(runs, {first})
    code, console, err = wait_for(second_proc, job_id_of(second), 600)
    assert code == 0, console[-3000:] + err[-3000:]
    assert "Loading snapshot" not in console and "[GPU0] Epoch 0 " in console
    assert (second / "snapshot.pt").is_file() and not (folder / "snapshot.pt").exists()
