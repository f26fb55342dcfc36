"""Random sequences of submit, cancel, resume, status, kill -9 of `glaunch submit` and kill
-9 of the job, against the local scheduler: whatever happens, once every process has gone
each run is in a state the commands act on (ended: `resume` accepts it and `cancel` has
nothing to do), its record reads back with every start closed, and the checkpoints it
recorded are still there.

GLAUNCH_FUZZ_SEQUENCES (default 4) and GLAUNCH_FUZZ_SEED choose how many sequences and
which; the summary line gives the counts."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from launcher import api
from launcher.rundir import registry
from launcher.rundir.layout import RunDir
from launcher.rundir.lifecycle import ENDS
from launcher.runtime.checkpoint.selection import latest_complete
from launcher.schedulers.local import job_lock_held

REPO = Path(__file__).resolve().parents[2]
SEQUENCES = int(os.environ.get("GLAUNCH_FUZZ_SEQUENCES", "4"))
SEED = int(os.environ.get("GLAUNCH_FUZZ_SEED", "20261204"))
SETTLE_S = 120.0
ACTIONS = ("cancel", "kill_submit", "kill_job", "resume", "status", "pause", "pause")


def glaunch(env, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "launcher.cli", *args], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def job_pid(run_dir: Path) -> int | None:
    try:
        starts = registry.read(run_dir).starts
    except Exception:
        return None
    pid = starts[-1].get("pid") if starts else None
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 1 else None


def first_run_dir(runs: Path, timeout: float = 60.0) -> Path | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [p for p in runs.glob("*") if (p / "run.json").exists()]
        if found:
            return found[0]
        time.sleep(0.1)
    return None


class Sequence:
    """One run driven by random commands; what was done is counted in `done`."""

    def __init__(self, rng: random.Random, runs: Path, env, done: Counter) -> None:
        self.rng, self.runs, self.env, self.done = rng, runs, env, done
        self.procs: list[subprocess.Popen] = []
        self.run_dir: Path | None = None

    def submit(self) -> None:
        steps = self.rng.choice((20, 40, 80))
        self.procs.append(glaunch(self.env, "submit", "examples/torch_ddp.yaml", "--runs-dir", str(self.runs),
                                  f"entrypoint.args=[--steps,{steps},--seconds-per-step,0.05]",
                                  "checkpoint.every_steps=5"))
        self.done["submit"] += 1
        self.run_dir = first_run_dir(self.runs)
        assert self.run_dir is not None, "the submission wrote no run directory"

    def act(self, action: str) -> None:
        assert self.run_dir is not None
        self.done[action] += 1
        if action == "cancel":
            api.cancel(str(self.run_dir))
        elif action == "status":
            api.status(str(self.run_dir))
        elif action == "resume":
            self.procs.append(glaunch(self.env, "resume", str(self.run_dir)))
        elif action == "kill_submit":
            for proc in self.procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)       # glaunch only: the job has a session of its own
        elif action == "kill_job":
            pid = job_pid(self.run_dir)
            if pid is not None and job_lock_held(RunDir(self.run_dir)):
                kill_tree(pid)
        time.sleep(self.rng.uniform(0.2, 2.5) if action == "pause" else 0.1)

    def settle(self) -> None:
        """Every glaunch process and job of the run gone (killed after SETTLE_S: a defect)."""
        deadline = time.monotonic() + SETTLE_S
        for proc in self.procs:
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                pytest.fail(f"glaunch {proc.args[3]} still running after {SETTLE_S:.0f} s")
        while self.run_dir is not None and job_lock_held(RunDir(self.run_dir)):
            if time.monotonic() > deadline:
                pid = job_pid(self.run_dir)
                if pid:
                    kill_tree(pid)
                pytest.fail(f"the job of {self.run_dir.name} still runs after {SETTLE_S:.0f} s")
            time.sleep(0.2)


def kill_tree(pid: int) -> None:
    from launcher.schedulers.local import kill_job

    kill_job(pid)


def check_ended_and_whole(run_dir: Path) -> str:
    """The run's state once nothing runs: ended, acted on by the commands, nothing lost."""
    state = api.status(str(run_dir))["state"]
    record = registry.read(run_dir)
    assert state in ENDS and record.state == state, f"{run_dir.name} left {state} (record {record.state})"
    assert all(s.ended for s in record.starts), f"{run_dir.name}: a start never closed: {record.starts[-1]}"
    assert "nothing to cancel" in api.cancel(str(run_dir))
    api.resume(str(run_dir), dry_run=True)      # resume applies: raises if it does not
    if state == "COMPLETED":
        assert RunDir(run_dir).result_file.exists()
    saved = [s.stopped_at for s in record.starts if s.stopped_at is not None]
    if saved:
        assert latest_complete(str(RunDir(run_dir).path / "checkpoints")) is not None, \
            f"{run_dir.name}: a stop saved step {saved[-1]} but no complete checkpoint is left"
    return state


def test_random_command_sequences_leave_no_run_stuck(tmp_path, isolated_env):
    rng = random.Random(SEED)
    done: Counter = Counter()
    ends: Counter = Counter()
    for number in range(SEQUENCES):
        runs = tmp_path / f"seq-{number}"
        sequence = Sequence(rng, runs, isolated_env, done)
        try:
            sequence.submit()
            time.sleep(rng.uniform(0.5, 4.0))
            for _ in range(rng.randint(2, 5)):
                sequence.act(rng.choice(ACTIONS))
        finally:
            sequence.settle()
        assert sequence.run_dir is not None
        ends[check_ended_and_whole(sequence.run_dir)] += 1
    kills = done["kill_submit"] + done["kill_job"]
    print(f"\nstate fuzz: {SEQUENCES} sequences (seed {SEED}), {sum(done.values())} commands, {kills} kills "
          f"({dict(done)}); ends {dict(ends)}; stuck 0")
