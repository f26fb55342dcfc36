"""A run's status as the user sees it: run.json with the scheduler's view folded in
(by the scheduler), the result, and the text `glaunch status` / `glaunch list` print."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from . import registry
from .files import read_json
from .layout import RunDir, RunRecord


def summarize(run_dir: Path, record: RunRecord) -> dict[str, Any]:
    """What `glaunch status --json` prints."""
    return {
        "run_id": record.run_id, "run_dir": str(run_dir), "site": record.site,
        "state": record.state, "job_id": record.job_id,
        "restarts": max(len(record.starts) - 1, 0), "starts": [s.to_dict() for s in record.starts],
        "accounting": record.extra.get("accounting"), "reason": record.reason, "detail": record.detail,
        "result": read_json(RunDir(run_dir).result_file),
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


def recent(limit: int) -> list[dict[str, Any]]:
    """The newest `limit` runs of the index; a run whose record cannot be read is skipped."""
    seen, rows = set(), []
    for entry in reversed(registry.indexed_runs()):
        run_dir = Path(entry["run_dir"])
        if run_dir in seen or not RunDir(run_dir).run_file.exists():
            continue
        seen.add(run_dir)
        try:
            record = registry.read(run_dir)
        except Exception:
            continue
        rows.append({"run_id": record.run_id, "state": record.state, "site": record.site,
                     "nodes": record.nodes, "created": record.created,
                     "age": _age(record.created), "run_dir": str(run_dir)})
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
