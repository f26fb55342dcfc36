"""Following runs: states from the scheduler folded into run.json, logs, cancel, list."""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from . import runs


# States after which the run will not start again.
TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "OUT_OF_MEMORY", "NODE_FAIL",
                      "BOOT_FAIL", "DEADLINE", "REFUSED", "RENDERED"})
# squeue's states of a job that is still queued or running.
LIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
                  "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"})
# What a start's scheduler state says about why it ended.
SACCT_REASONS = {"TIMEOUT": "timeout", "PREEMPTED": "preemption", "NODE_FAIL": "node failure",
                 "FAILED": "crash", "OUT_OF_MEMORY": "crash", "CANCELLED": "cancelled"}


def refresh(run_dir: Path) -> dict[str, Any]:
    """Ask the scheduler about the run's job and fold the answer into run.json.

    The job's own record of each start (launcher.runtime.jobend) wins over the
    scheduler's; sacct fills in starts the job could not record (killed at the time
    limit, node failure) and squeue says what is live now.
    """
    record = runs.read(run_dir)
    if record.get("scheduler") == "slurm" and record.get("job_id") and shutil.which("squeue"):
        from . import slurm

        job_id = record["job_id"]
        live = slurm.squeue_state(job_id)
        history = slurm.sacct_records(job_id)
        with runs.updating(run_dir) as rec:
            rec["accounting"] = history is not None
            if history:
                rec["scheduler_history"] = history
                merge_history(rec, history)
            rec["state"] = current_state(rec.get("state"), live, history)
            record = rec
    return summarize(run_dir, record)


def current_state(recorded: str | None, live: str | None, history: list[dict] | None) -> str:
    """The run's state now: the job's own terminal record, else squeue, else sacct."""
    if recorded in TERMINAL and recorded != "RENDERED":
        return recorded
    if live in LIVE:
        return live
    if history:
        return history[-1]["state"].split()[0]
    if live:
        return live
    return "UNKNOWN" if recorded in (None, "SUBMITTING", "PENDING", "RUNNING", "REQUEUED") else recorded


def merge_history(record: dict[str, Any], history: list[dict]) -> None:
    """sacct lists one row per start (with -D): fill in what the starts' records lack."""
    starts = record.setdefault("starts", [])
    for restart, row in enumerate(history):
        entry = next((s for s in starts if s.get("restart") == restart), None)
        if entry is None:
            entry = runs.start_record(row["job_id"], restart, submitted=None)
            starts.append(entry)
        state = row["state"].split()[0]
        for key, value in (("started", row["start"]), ("ended", row["end"]), ("nodes", row["nodes"])):
            if not entry.get(key) and value not in ("", "Unknown", "None"):
                entry[key] = value
        if entry.get("state") in (None, "PENDING", "RUNNING") or entry.get("ended") is None:
            entry["state"] = state
            if entry.get("reason") is None:
                entry["reason"] = SACCT_REASONS.get(state)
        entry["scheduler_state"] = state
    starts.sort(key=lambda s: s.get("restart", 0))


def summarize(run_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
    result = None
    result_path = Path(run_dir) / "result.json"
    if result_path.exists():
        import json
        try:
            result = json.loads(result_path.read_text())
        except ValueError:
            result = None
    return {
        "run_id": record["run_id"], "run_dir": str(run_dir), "site": record.get("site"),
        "state": record.get("state"), "job_id": record.get("job_id"),
        "restarts": max(len(record.get("starts", [])) - 1, 0), "starts": record.get("starts", []),
        "accounting": record.get("accounting"), "reason": record.get("reason"), "detail": record.get("detail"),
        "result": result,
    }


def format_status(summary: dict[str, Any]) -> str:
    lines = [f"run {summary['run_id']}: {summary['state']} (site {summary['site']}, job {summary['job_id']}, "
             f"{summary['restarts']} restart(s))", f"  {summary['run_dir']}"]
    if summary.get("accounting") is False:
        lines.append("  (no Slurm accounting here: states come from squeue only)")
    for start in summary["starts"]:
        lines.append(f"  start {start['restart']}: job {start['job_id']} {start['state']}"
                     + (f" reason={start['reason']}" if start.get("reason") else "")
                     + (f" resumed_from={start['resumed_from']}" if start.get("resumed_from") is not None else "")
                     + (f" stopped_at={start['stopped_at']}" if start.get("stopped_at") is not None else ""))
    if summary.get("reason") or summary.get("detail"):
        lines.append("  reason: " + "; ".join(x for x in (summary.get("reason"), summary.get("detail")) if x))
    if summary.get("result"):
        r = summary["result"]
        lines.append(f"  result: step {r.get('final_step')} loss {r.get('final_loss')} world {r.get('world_size')}")
    return "\n".join(lines)


_LOG = re.compile(r"(?P<job>\d+)_(?P<rank>\d+)_log\.(?P<stream>out|err)$")


def log_files(run_dir: Path, rank: int | None = None) -> list[tuple[int, int, str, Path]]:
    found = []
    for path in (Path(run_dir) / "logs").glob("*_log.*"):
        m = _LOG.match(path.name)
        if m and (rank is None or int(m["rank"]) == rank):
            found.append((int(m["job"]), int(m["rank"]), m["stream"], path))
    return sorted(found)


def print_logs(run_dir: Path, *, rank: int | None, follow: bool, echo: Callable[[str], None]) -> None:
    offsets: dict[Path, int] = {}
    pending: dict[Path, str] = {}
    while True:
        for _, r, stream, path in log_files(run_dir, rank):
            with open(path, "rb") as f:
                f.seek(offsets.get(path, 0))
                data = f.read()
            offsets[path] = offsets.get(path, 0) + len(data)
            text = pending.pop(path, "") + data.decode(errors="replace")
            *complete, rest = text.split("\n")
            if rest:
                pending[path] = rest
            tag = f"[{r}]" if stream == "out" else f"[{r}!]"
            for line in complete:
                echo(f"{tag} {line}")
        if not follow:
            for path, rest in pending.items():
                echo(rest)
            return
        state = refresh(run_dir)["state"]
        if state in TERMINAL or state == "UNKNOWN":
            follow = False
        time.sleep(1)


def cancel(run_dir: Path) -> str:
    record = runs.read(run_dir)
    job_id = record.get("job_id")
    if not job_id:
        return f"run {record['run_id']}: nothing to cancel ({record.get('state')})"
    if record.get("scheduler") == "slurm":
        from . import slurm
        slurm.cancel(job_id)
    else:
        pid = (record.get("starts") or [{}])[-1].get("pid")
        if pid:
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    with runs.updating(run_dir) as rec:
        rec["state"] = "CANCELLED"
        rec["reason"] = "cancelled by user"
    return f"run {record['run_id']}: cancelled job {job_id}"


def recent(limit: int) -> list[dict[str, Any]]:
    seen, rows = set(), []
    for entry in reversed(runs.indexed_runs()):
        run_dir = Path(entry["run_dir"])
        if run_dir in seen or not (run_dir / runs.RUN_FILE).exists():
            continue
        seen.add(run_dir)
        try:
            record = runs.read(run_dir)
        except Exception:
            continue
        rows.append({"run_id": record["run_id"], "state": record.get("state"), "site": record.get("site"),
                     "nodes": record.get("nodes"), "created": record.get("created"),
                     "age": _age(record.get("created")), "run_dir": str(run_dir)})
        if len(rows) >= limit:
            break
    return rows


def _age(created: str | None) -> str:
    if not created:
        return "?"
    seconds = (dt.datetime.now(dt.timezone.utc) - dt.datetime.fromisoformat(created)).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def format_list(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no runs yet"
    lines = [f"{'RUN':44s} {'STATE':11s} {'SITE':18s} {'NODES':5s} AGE"]
    lines += [f"{r['run_id']:44s} {str(r['state']):11s} {str(r['site']):18s} {str(r['nodes']):5s} {r['age']}"
              for r in rows]
    return "\n".join(lines)
