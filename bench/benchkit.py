"""What the Slurm benchmarks share: Slurm's commands with a timeout, a local cluster's
environment and a run's record, an empty queue to start from, sacct's rows as dicts,
Slurm's timestamps as epoch seconds."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

COMMAND_TIMEOUT_S = 60
REPO = Path(__file__).resolve().parent.parent


class BenchError(RuntimeError):
    """The bench cannot go on; the message says why."""


def run_cmd(args: list[str], **kw) -> subprocess.CompletedProcess:
    kw.setdefault("timeout", COMMAND_TIMEOUT_S)
    return subprocess.run(args, capture_output=True, text=True, **kw)


def cluster_env(cluster: str, state: Path) -> dict[str, str]:
    """The environment of a glaunch command on local cluster `cluster` (main, defaults),
    with its own state dir. This checkout's glaunch, whatever else is installed: the job
    runs the same code."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, SLURM_CONF=f"/etc/glaunch-slurm/{cluster}/slurm.conf", GLAUNCH_STATE_DIR=str(state),
                PYTHONPATH=path)


def read_record(run_dir: Path) -> dict:
    """A run's run.json; {} while it cannot be read (being written, or not there yet)."""
    try:
        return json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}


def submit_json(args: list[str], env: dict[str, str], cwd: Path, what: str) -> tuple[Path, str]:
    """`glaunch submit ... --json` (args after `submit`): the run's directory and job id."""
    proc = run_cmd([sys.executable, "-m", "launcher.cli", "submit", *args, "--json"], env=env, cwd=cwd)
    if proc.returncode != 0:
        raise BenchError(f"{what}: glaunch submit failed ({proc.returncode}): {proc.stderr.strip()}")
    info = json.loads(proc.stdout)
    return Path(info["run_dir"]), str(info["job_id"])


def glaunch_command() -> list[str]:
    script = shutil.which("glaunch")
    return [script] if script else [sys.executable, "-m", "launcher.cli"]


def epoch(stamp: str | None) -> float | None:
    """Slurm's ISO timestamp as epoch seconds; None for Unknown/None/N/A."""
    if not stamp or stamp in ("Unknown", "None", "N/A"):
        return None
    return dt.datetime.fromisoformat(stamp).timestamp()


def squeue_has(job_id: str, env: dict[str, str] | None = None) -> bool:
    return bool(run_cmd(["squeue", "-h", "-j", job_id, "-o", "%i"], env=env).stdout.strip())


def cluster_quiet() -> bool:
    """No job queued or running, and every node idle (a finished job's node may still be completing)."""
    if run_cmd(["squeue", "-h"]).stdout.strip():
        return False
    return all(s == "idle" for s in run_cmd(["sinfo", "-h", "-N", "-o", "%t"]).stdout.split())


def wait_queue_empty(limit_s: float) -> None:
    deadline = time.time() + limit_s
    while not cluster_quiet():
        if time.time() > deadline:
            raise BenchError(f"the queue was not empty for {limit_s:.0f} s; giving up")
        time.sleep(1)


def sacct_rows(job_id: str, fields: tuple[str, ...], *, starts: bool = False) -> list[dict[str, str]]:
    """sacct's rows of the job's allocation (one per start with `starts`), keyed by the
    lower-cased field names, plus the raw line."""
    args = ["sacct", "-n", "-P", "-X", "-j", job_id, "-o", ",".join(fields)]
    if starts:
        args.insert(4, "-D")
    rows = []
    for line in run_cmd(args).stdout.strip().splitlines():
        values = line.split("|")
        if len(values) >= len(fields):
            rows.append(dict(zip((f.lower() for f in fields), values), raw=line))
    return rows
