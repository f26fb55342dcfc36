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


def refresh(run_dir: Path) -> dict[str, Any]:
    """Ask the scheduler about the run's job and fold the answer into run.json."""
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
                rec["state"] = live or history[-1]["state"].split()[0]
            elif live:
                rec["state"] = live
            elif rec["state"] in ("PENDING", "RUNNING", "REQUEUED"):
                rec["state"] = "UNKNOWN"
            record = rec
    return summarize(run_dir, record)


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
        "accounting": record.get("accounting"), "reason": record.get("reason"), "result": result,
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
    if summary.get("reason"):
        lines.append(f"  reason: {summary['reason']}")
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
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "RENDERED", "UNKNOWN"):
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
