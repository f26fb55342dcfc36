"""The text of a sweep: `glaunch status SWEEP` (its summary, launcher.runner.sweeps.summarize)
and `glaunch list SWEEP` (its elements' rows): one line per element with its swept values,
state, step and result, and the count of each state."""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Sequence

from launcher.rundir.records import State
from launcher.views.text import printable


def counts_line(rows: Sequence[Mapping[str, Any]]) -> str:
    """"3 element(s): 2 COMPLETED, 1 FAILED": the states of the elements whose record was read."""
    counts = Counter(str(row["state"]) for row in rows if row.get("state") is not None)
    parts = ", ".join(f"{n} {state}" for state, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{len(rows)} element(s): {parts or 'none readable'}"


def _result_text(result: Mapping[str, Any]) -> str:
    loss = result.get("final_loss")
    shown = (f"loss {loss:.4g}" if isinstance(loss, (int, float)) and not isinstance(loss, bool)
             else f"loss {loss}" if loss in ("NaN", "Infinity", "-Infinity") else "")   # named by json_safe
    if result.get("param_sha256"):
        shown = (shown + " " if shown else "") + f"sha {str(result['param_sha256'])[:12]}"
    return shown


def element_table(rows: Sequence[Mapping[str, Any]], keys: Sequence[Any]) -> list[str]:
    """One line per element: index, its value of each swept key, state, step, result."""
    p = printable
    header = ["#", *[str(k) for k in keys], "STATE", "STEP", "RESULT", "RUN"]
    table = []
    for row in rows:
        shown = _result_text(row.get("result") or {})
        state = row.get("state") or "?"
        if row.get("error"):
            state, shown = "UNREADABLE", row["error"]
        elif row.get("pending_reason") and state == State.PENDING.value:
            state = f"PENDING ({row['pending_reason']})"
        table.append([str(row["index"]), *[p(row["params"].get(k, "")) for k in keys], p(state),
                      "" if row.get("step") is None else str(row["step"]), p(shown), p(row["run_id"])])
    widths = [max(len(r[i]) for r in [header, *table]) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [header, *table]]


def format_elements(rows: Sequence[Mapping[str, Any]]) -> str:
    """`glaunch list SWEEP`: the elements' table and the count of each state."""
    keys = list(dict.fromkeys(key for row in rows for key in row.get("params") or {}))
    return "\n".join([*element_table(rows, keys), counts_line(rows)])


def format_sweep(summary: Mapping[str, Any]) -> str:
    """`glaunch status SWEEP`: its state, directory, arrays, the runs it waits for, the
    elements' table, what went wrong with each, and the count of each state."""
    p = printable
    lines = [f"sweep {p(summary['sweep_id'])}: {p(summary['state'])} (site {p(summary['site'])})",
             f"  {p(summary['sweep_dir'])}"]
    for array in summary.get("arrays") or []:
        if array.get("script"):
            what = f"job {array['job_id']}" if array.get("job_id") else "not submitted"
            lines.append(f"  {array['script']}: {what}, {len(array['elements'])} task(s)"
                         + (f": {p(array['error'])}" if array.get("error") else ""))
    if summary.get("after"):
        lines.append(f"  after: {', '.join(p(a) for a in summary['after'])}")
    keys = [a.get("key") for a in summary.get("axes") or []]
    lines += ["  " + line for line in element_table(summary["elements"], keys)]
    for row in summary["elements"]:
        if row.get("detail") and row.get("state") not in (State.COMPLETED.value, None):
            lines.append(f"  element {row['index']}: {p(row['detail'])}")
    lines.append(counts_line(summary["elements"]))
    return "\n".join(lines)
