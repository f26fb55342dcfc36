"""Helpers for the tests that run on the local Slurm cluster (scripts/local-slurm up)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SITE = "local-slurm"


def glaunch(*args, env, cwd=REPO, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def submit(example: str, runs: Path, env, *overrides, wait: bool = True, site: str = SITE,
           timeout: int = 600) -> tuple[subprocess.CompletedProcess, dict]:
    """`glaunch submit --json` on the cluster; returns the process and its JSON (or {})."""
    args = ["submit", example, "--site", site, "--runs-dir", str(runs), "--json", *overrides]
    if wait:
        args.insert(1, "--wait")
    proc = glaunch(*args, env=env, timeout=timeout)
    try:
        info = json.loads(proc.stdout)
    except ValueError:
        info = {}
    return proc, info


def out(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout


def sacct_rows(job_id: str) -> list[dict[str, str]]:
    """One row per start of the job (requeues included), allocation lines only."""
    text = out("sacct", "-n", "-P", "-D", "-X", "-j", job_id, "-o", "JobID,State,ExitCode,NodeList")
    return [dict(zip(("job_id", "state", "exit_code", "nodes"), line.split("|")))
            for line in text.splitlines() if line.strip()]


def final_sacct_state(job_id: str, timeout: float = 60) -> str:
    """sacct's state of the job's last start, once accounting has it (slurmdbd lags a little)."""
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        rows = sacct_rows(job_id)
        state = rows[-1]["state"].split()[0] if rows else ""
        if state and state not in ("PENDING", "RUNNING", "REQUEUED"):
            return state
        time.sleep(1)
    return state


def squeue_state(job_id: str) -> str:
    return out("squeue", "-h", "-j", job_id, "-o", "%T").strip()


def wait_until(predicate, timeout: float, what: str, interval: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


_pending_since: dict[str, float] = {}
SETTLE_S = 8.0


def release_requeue_hold(job_id: str) -> None:
    """A requeued job waits ~120 s (its BeginTime moves ahead); let it start sooner, but only
    once it has waited SETTLE_S: started while its previous start is still being torn down,
    Slurm kills it at launch ("Job credential revoked") and the run is lost."""
    if squeue_state(job_id) != "PENDING":
        _pending_since.pop(job_id, None)
        return
    since = _pending_since.setdefault(job_id, time.monotonic())
    if time.monotonic() - since >= SETTLE_S:
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], capture_output=True,
                       timeout=30)
        _pending_since.pop(job_id, None)


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain ``text`` (the tasks name their run dir)."""
    found = []
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        try:
            cmdline = (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and "pytest" not in cmdline:
            found.append(f"{proc_dir.name}: {cmdline}")
    return found


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def start_submit(example: str, runs: Path, env, *overrides, site: str = SITE) -> subprocess.Popen:
    """`glaunch submit --wait --json` in the background (the test acts on the job meanwhile)."""
    return subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", "--wait", example, "--site", site,
                             "--runs-dir", str(runs), "--json", *overrides], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def the_run_dir(runs: Path) -> Path:
    return wait_until(lambda: next((p for p in Path(runs).glob("*") if (p / "run.json").exists()), None),
                      60, "the run directory")


def job_id_of(run_dir: Path) -> str:
    return wait_until(lambda: read_json(run_dir / "run.json").get("job_id"), 120, "the job id")


def rank0_steps(run_dir: Path, job_id: str) -> list[int]:
    """Steps rank 0 has logged so far (its log is appended across starts)."""
    log = Path(run_dir) / "logs" / f"{job_id}_0_log.out"
    if not log.exists():
        return []
    return [int(m) for m in re.findall(r"^step (\d+)/", log.read_text(errors="replace"), re.M)]


def finish(proc: subprocess.Popen, job_id: str | None, timeout: float) -> tuple[int, str, str]:
    """Wait for a background submit, releasing requeue holds meanwhile."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
            if job_id:
                subprocess.run(["scancel", job_id], capture_output=True)
            stdout, stderr = proc.communicate()
            raise AssertionError(f"the run did not end within {timeout}s\n{stdout[-2000:]}\n{stderr[-2000:]}")
        if job_id:
            release_requeue_hold(job_id)
        time.sleep(2)
    stdout, stderr = proc.communicate()
    return proc.returncode, stdout, stderr


def preempt(nodes: int = 2, seconds: int = 3) -> str:
    """A high-priority job on the `urgent` partition over the same nodes: Slurm preempts
    (requeues) what runs on `debug`."""
    text = out("sbatch", "--parsable", "-p", "urgent", f"-N{nodes}", "--exclusive", "-t", "2",
               "-o", "/dev/null", "--wrap", f"sleep {seconds}")
    return text.strip().split(";")[0]
