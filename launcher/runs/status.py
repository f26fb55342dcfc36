"""A run's status as the user sees it: run.json with the scheduler's view folded in
(by the scheduler), the result, and the text `glaunch status` / `glaunch list` print."""

from __future__ import annotations

import datetime as dt
import os
import re
from pathlib import Path
from typing import Any

from ..errors import GlaunchError
from . import registry
from .files import load_json_object
from .layout import RunDir, RunRecord

# Records may hold anything a hand or a rank wrote: text printed from them never carries
# control characters to the terminal (an escape sequence could rewrite what was shown).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(value: Any) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value)).replace("\n", "\\n")


def summarize(run_dir: Path, record: RunRecord) -> dict[str, Any]:
    """What `glaunch status --json` prints."""
    result, result_problem = _result(run_dir)
    summary = {
        "run_id": record.run_id, "run_dir": str(run_dir), "site": record.site,
        "state": record.state, "job_id": record.job_id,
        "restarts": max(len(record.starts) - 1, 0), "starts": [s.to_dict() for s in record.starts],
        "accounting": record.extra.get("accounting"), "reason": record.reason, "detail": record.detail,
        "result": result,
    }
    if result_problem:
        summary["result_error"] = result_problem
    return summary


def _result(run_dir: Path) -> tuple[dict | None, str | None]:
    """result.json, or what is wrong with it (None when the run has not written one)."""
    path = RunDir(run_dir).result_file
    try:
        return load_json_object(path), None
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path}: cannot be read: {exc.strerror or exc}"
    except ValueError as exc:
        return None, f"{path}: {exc}"


def format_status(summary: dict[str, Any]) -> str:
    p = printable
    lines = [f"run {p(summary['run_id'])}: {p(summary['state'])} (site {p(summary['site'])}, "
             f"job {p(summary['job_id'])}, {summary['restarts']} restart(s))", f"  {p(summary['run_dir'])}"]
    if summary.get("accounting") is False:
        lines.append("  (no Slurm accounting here: states come from squeue only)")
    for start in summary["starts"]:
        lines.append(f"  start {start['restart']}: job {start['job_id']} {p(start['state'])}"
                     + (f" reason={p(start['reason'])}" if start.get("reason") else "")
                     + (f" resumed_from={start['resumed_from']}" if start.get("resumed_from") is not None else "")
                     + (f" stopped_at={start['stopped_at']}" if start.get("stopped_at") is not None else ""))
    if summary.get("reason") or summary.get("detail"):
        lines.append("  reason: " + p("; ".join(x for x in (summary.get("reason"), summary.get("detail")) if x)))
    if summary.get("result"):
        r = summary["result"]
        lines.append(f"  result: step {p(r.get('final_step'))} loss {p(r.get('final_loss'))} "
                     f"world {p(r.get('world_size'))}")
    if summary.get("result_error"):
        lines.append(f"  result: unreadable: {p(summary['result_error'])}")
    return "\n".join(lines)


def recent(limit: int) -> list[dict[str, Any]]:
    """The newest `limit` runs of the index, newest first. A run whose record cannot be read
    is a row with `error` (the file and what is wrong) and does not count towards `limit`;
    bad lines of the index are one such row at the end."""
    index = registry.read_index()
    seen: set[Path] = set()
    rows: list[dict[str, Any]] = []
    good = 0
    for entry in reversed(index.entries):
        if good >= limit:
            break
        run_dir = Path(entry["run_dir"])
        if run_dir in seen or not os.path.lexists(RunDir(run_dir).run_file):
            continue
        seen.add(run_dir)
        try:
            record = registry.read(run_dir)
        except GlaunchError as exc:
            rows.append({"run_id": entry["run_id"], "state": None, "site": None, "nodes": None, "created": None,
                         "age": "?", "run_dir": str(run_dir), "error": str(exc)})
            continue
        rows.append({"run_id": record.run_id, "state": record.state, "site": record.site,
                     "nodes": record.nodes, "created": record.created,
                     "age": _age(record.created), "run_dir": str(run_dir)})
        good += 1
    if index.bad_lines:
        more = len(index.bad_lines) - 1
        rows.append({"run_id": None, "state": None, "site": None, "nodes": None, "created": None, "age": "?",
                     "run_dir": None, "error": f"{index.path}: {len(index.bad_lines)} bad line(s) skipped: "
                     f"line {index.bad_lines[0]}" + (f" (and {more} more)" if more else "")})
    return rows


def _age(created: str | None) -> str:
    try:
        then = dt.datetime.fromisoformat(created or "")
        if then.tzinfo is None:
            then = then.astimezone()
        seconds = (dt.datetime.now(dt.timezone.utc) - then).total_seconds()
    except (ValueError, TypeError, OverflowError):
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def format_list(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no runs yet"
    lines = [f"{'RUN':44s} {'STATE':11s} {'SITE':18s} {'NODES':5s} AGE"]
    for r in rows:
        if r.get("error"):
            lines.append(f"{'bad record' if r.get('run_dir') else 'bad index'}: {printable(r['error'])}")
        else:
            lines.append(f"{printable(r['run_id']):44s} {printable(r['state']):11s} {printable(r['site']):18s} "
                         f"{printable(r['nodes']):5s} {r['age']}")
    return "\n".join(lines)
