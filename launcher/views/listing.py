"""The text of `glaunch list`: the rows launcher.runner.recent makes, one line each."""

from __future__ import annotations

from typing import Any

from launcher.views.text import clipped, printable


def format_list(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no runs yet"
    lines = [f"{'RUN':44s} {'STATE':11s} {'SITE':18s} {'NODES':5s} AGE"]
    for r in clipped(rows):
        if r.get("error"):
            lines.append(f"{'bad record' if r.get('run_dir') else 'bad index'}: {printable(r['error'])}")
        else:
            sweep = f"  (a sweep of {r['sweep']} runs)" if r.get("sweep") else ""
            state = printable(r["state"]) + ("?" if r.get("stale") else "")
            lines.append(f"{printable(r['run_id']):44s} {state:11s} {printable(r['site']):18s} "
                         f"{_nodes(r):5s} {r['age']}{sweep}")
    stale = sorted({printable(r["stale"]) for r in rows if r.get("stale")})
    lines += [f"STATE?: {why}" for why in stale]
    return "\n".join(lines)


def _nodes(row: dict[str, Any]) -> str:
    """The NODES column: the training nodes, and "+S" for the spares the job holds besides."""
    spares = row.get("spare_nodes")
    return _shown(row["nodes"]) + (f"+{spares}" if isinstance(spares, int) and spares > 0 else "")


def _shown(value: Any) -> str:
    """A column's value; "-" where the record has none (a submission that never queued)."""
    return "-" if value is None else printable(value)
