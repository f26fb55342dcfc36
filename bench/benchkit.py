"""What the Slurm benchmarks share: Slurm's commands with a timeout, an empty queue to
start from, sacct's rows as dicts, Slurm's timestamps as epoch seconds."""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
import sys
import time

COMMAND_TIMEOUT_S = 60


class BenchError(RuntimeError):
    """The bench cannot go on; the message says why."""


def run_cmd(args: list[str], **kw) -> subprocess.CompletedProcess:
    kw.setdefault("timeout", COMMAND_TIMEOUT_S)
    return subprocess.run(args, capture_output=True, text=True, **kw)


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
