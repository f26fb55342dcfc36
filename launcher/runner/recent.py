"""The rows of `glaunch list`: the newest runs and sweeps of the run index, one row each
(the text is launcher.views.listing's)."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

from launcher.errors import GlaunchError
from launcher.rundir import registry
from launcher.rundir.layout import SWEEP_FILE, RunDir
from launcher.rundir.records import RunRecord
from launcher.runner import sweeps
from launcher.runner.road import check_road


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
        if run_dir in seen:
            continue
        if os.path.isfile(run_dir / SWEEP_FILE):
            seen.add(run_dir)
            rows.append(_sweep_row(entry["run_id"], run_dir))
            good += 1
            continue
        if not os.path.lexists(RunDir(run_dir).run_file):
            continue
        seen.add(run_dir)
        try:
            record = registry.read(run_dir)
            check_road(run_dir, record)
        except GlaunchError as exc:
            rows.append({"run_id": entry["run_id"], "state": None, "site": None, "nodes": None, "created": None,
                         "age": "?", "run_dir": str(run_dir), "error": str(exc)})
            continue
        if isinstance(record.extra.get("sweep"), dict):
            continue            # a sweep's element: its sweep's row stands for it
        rows.append({"run_id": record.run_id, "state": record.state, "site": record.site,
                     "nodes": record.nodes, "spare_nodes": spare_nodes(record), "created": record.created,
                     "age": _age(record.created), "run_dir": str(run_dir)})
        good += 1
    if index.bad_lines:
        more = len(index.bad_lines) - 1
        rows.append({"run_id": None, "state": None, "site": None, "nodes": None, "created": None, "age": "?",
                     "run_dir": None, "error": f"{index.path}: {len(index.bad_lines)} bad line(s) skipped: "
                     f"line {index.bad_lines[0]}" + (f" (and {more} more)" if more else "")})
    return rows


def _sweep_row(sweep_id: str, sweep_dir: Path) -> dict[str, Any]:
    """A sweep as one row of `glaunch list`: its state from its elements' records as they
    are (`glaunch status SWEEP` asks the scheduler)."""
    try:
        sweep = sweeps.read(sweep_dir)
    except GlaunchError as exc:
        return {"run_id": sweep_id, "state": None, "site": None, "nodes": None, "created": None, "age": "?",
                "run_dir": str(sweep_dir), "error": str(exc)}
    states, nodes = [], set()
    for element in sweep.elements:
        try:
            record = registry.read(element.run_dir)
        except GlaunchError:
            states.append("UNKNOWN")
            continue
        states.append(record.state)
        nodes.add((record.nodes, spare_nodes(record)))
    one = next(iter(nodes)) if len(nodes) == 1 else None
    return {"run_id": sweep.sweep_id, "state": sweeps.sweep_state(states) if states else None, "site": sweep.site,
            "nodes": one[0] if one else "mixed", "spare_nodes": one[1] if one else 0, "created": sweep.created,
            "age": _age(sweep.created), "run_dir": str(sweep_dir), "sweep": len(sweep.elements)}


def spare_nodes(record: RunRecord) -> int:
    """Pure: the nodes the run's job holds besides its training nodes (``spare_nodes``): its
    request's nodes (run.json `request`, as queued) past the record's; 0 where not known."""
    request = record.extra.get("request")
    asked = request.get("nodes") if isinstance(request, dict) else None
    if isinstance(asked, int) and not isinstance(asked, bool) and isinstance(record.nodes, int):
        return max(0, asked - record.nodes)
    return 0


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
