"""Goodput: how much of a run's wall time went into training that was kept, where the
rest went, and the settings that would waste less. Pure functions of run.json's records
(what jobend and the local scheduler recorded of each start: layout.TELEMETRY_FIELDS)
and of the ledger of peer recoveries (the one file read here: ``read_peer_ledger``);
any field may be missing or damaged, and then what needs it is None.

Per start (``per_start``):
- ``resume``: 0 for a start of the submitted job, N for one of the job resume N started;
- ``queue_wait_s``: submitted (the first start), the resume asked for (a resumed job's
  first start: run.json ``resumes[].at``) or the previous start's end -> started;
- ``startup_s``: started -> its first step done (the job's set-up, the ranks' imports and
  rendezvous, the resume, the first step);
- ``resume_load_s``: within that, the checkpoint chosen (resume.json) -> the first step,
  less one usual step;
- ``stop_s``: the stop asked for -> its checkpoint saved; ``teardown_s``: then (or the last
  step, without a stop) -> the start's end;
- ``steps_done``, ``steps_kept`` and ``lost_steps``: steps done in the start, those the
  run kept (up to the step the next start resumed from; all, for the start that
  completed), and the difference (done but never saved);
- ``productive_s``: kept steps x the start's median step time.

Run (``goodput``): ``ettr`` = sum of productive_s / wall time from the first start to
the last end (or now), less ``idle_s``: the time a run spent ended before a `glaunch
resume` took it up again (from its job's last end to the resume); ``lost_steps``;
``restart_overhead_s`` = queue wait and start-up of every start after the first (a
resumed job's first start queues from its resume), plus stop and teardown of every
interrupted start;
``spare_node_hours``: the node-hours the allocation's spare nodes (resources.spare_nodes)
stood idle, a cost of restarting inside the allocation (recorded at each start's end);
``restarts_in_allocation``: starts that went on in a new job step of the same allocation
instead of through the queue, ``spare_swaps`` of them with a spare in place of a node;
``interruptions`` and ``mean_time_between_interruptions_s`` (a start's begin -> its stop
request, or its end); the same for those that came without warning (crash, hang, node
failure: ``unwarned_interruptions``, ``mean_time_between_unwarned_s``).

Peer recoveries (``recovery.peer``; ``peer_recoveries``, None for a run that never had
one): a road of its own, inside a start, no restart and no checkpoint read. From the
ledger the ranks append to (layout.PEER_RECOVERY_FILE, launcher.runtime.peer), each
line checked as an untrusted record (``peer_entry``; a line that is not one is counted in
``damaged_lines``, never shown): ``recoveries``, ``lost_steps`` (the steps done again,
at most one each), ``to_next_step_s`` (the failure -> the end of the next step) and
``recovery_s`` (the failure -> the state received), each as median and max, and the
newest entries. Their lost steps count in the run's ``lost_steps`` and ``lost_s`` too.

Suggestions (``suggest``):
- ``checkpoint.every_steps`` by Young and Daly: the checkpoint interval that minimises the
  expected waste is sqrt(2 * save time * mean time between failures) (J. W. Young,
  "A first order approximation to the optimum checkpoint interval", CACM 17(9), 1974;
  J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart
  dumps", FGCS 22(3), 2006), here in steps of the median step time. Their failures come
  without warning: the unwarned interruptions when there were any, else all of them;
- ``requeue.signal_lead_s``: the warning must leave time to finish the step in hand
  (p90 step time) and save (the longest save seen, doubled for a slower filesystem day)
  with LEAD_MARGIN_S to spare; rounded up to 5 s.
"""

from __future__ import annotations

import itertools
import math
import os
from typing import Any, Mapping, Sequence

from launcher.rundir.files import (
    MAX_RECORD_ITEMS,
    MAX_RECORD_NUMBER,
    MAX_RECORD_TEXT,
    check_bounds,
    open_regular,
    parse_json_object,
)
from launcher.rundir.layout import RunDir
from launcher.rundir.startsummary import epoch
from launcher.rundir.records import (GOES_ON, REQUEUED_BY_HAND, SLOW_NODE, TERMINATED, RunRecord, StartRecord, State,
                                     is_job_id, is_terminal)

# Reasons a start ended without finishing, after which the run may go on.
INTERRUPTED = frozenset({"timeout", "preemption", REQUEUED_BY_HAND, SLOW_NODE, TERMINATED, "crash", "hang",
                         "node failure", "node_fail"})
# A graceful stop: the ranks had time to save.
STOPPED = frozenset({"timeout", "preemption", REQUEUED_BY_HAND, SLOW_NODE, TERMINATED})
SAVE_MARGIN = 2.0
LEAD_MARGIN_S = 10.0
LEAD_ROUND_S = 5
MAX_SIGNAL_LEAD_S = 65535              # Slurm's --signal warns at most this long before the limit
MAX_SUGGESTED_STEPS = 2**63            # the most steps an experiment's integer keys hold
# The most of the peer recovery ledger read: a line is a few hundred bytes, so thousands of
# recoveries; past it the rest is not read, and ``truncated`` says so.
PEER_LEDGER_READ = 4 << 20
PEER_LINE_BYTES = 64 * 1024            # a line glaunch writes is far shorter: longer is damaged
PEER_ENTRIES_SHOWN = 20                # the newest entries `status --json` lists
PEER_TEXT = 300                        # the most of a ledger's text (an error, a node) kept


# --- reading fields that may hold anything ----------------------------------------------------


def as_mapping(value: Any) -> dict[str, Any]:
    """`value` when it is a JSON object, else {} (records may hold anything)."""
    return value if isinstance(value, dict) else {}


def number(value: Any) -> float | None:
    """A finite number of 0 or more, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        return None
    try:
        return float(value)
    except OverflowError:           # an integer no float holds: JSON's numbers have no bound
        return None


def _finite(value: float) -> float | None:
    """`value` when it is finite (a sum or product of measured times may pass the floats), else None."""
    return value if math.isfinite(value) else None


def step_of(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _span(start: float | None, end: float | None) -> float | None:
    """end - start, never below 0 (run.json's own times are whole seconds)."""
    if start is None or end is None:
        return None
    return round(max(0.0, end - start), 3)


def _field(start: StartRecord, key: str, part: str | None = None) -> Any:
    value = start.get(key)
    if part is not None:
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def step_time(start: StartRecord) -> float | None:
    """The start's median step time: measured, else from its first and last step."""
    median = number(_field(start, "step_time_s", "median"))
    if median:
        return median
    first, last = step_of(start.get("first_step")), step_of(start.get("last_step"))
    span = _span(epoch(start.get("first_step_at")), epoch(start.get("last_step_at")))
    if first is not None and last is not None and last > first and span:
        return span / (last - first)
    return None


def _base(start: StartRecord) -> int | None:
    """The step the start began after: the checkpoint it resumed from; else (a script that
    resumes by itself) the step before its first; else None."""
    if step_of(start.resumed_from) is not None:
        return start.resumed_from
    first = step_of(start.get("first_step"))
    return first - 1 if first else None


# --- per start ------------------------------------------------------------------------------


def resumes(record: RunRecord) -> list[dict[str, Any]]:
    """run.json's ``resumes`` entries that can be read: ``number``, ``at`` (epoch seconds
    or None), ``first_start`` (an index into ``starts``, at most their count: the resumed
    job may not have started yet), and the entry as written (``entry``); in order."""
    found = []
    entries = record.extra.get("resumes")
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        first, ordinal = step_of(entry.get("first_start")), step_of(entry.get("number"))
        if first is None or first > len(record.starts) or ordinal is None:
            continue
        found.append({"number": ordinal, "at": epoch(entry.get("at")), "first_start": first, "entry": entry})
    return sorted(found, key=lambda r: (r["first_start"], r["number"]))


def per_start(record: RunRecord, now: float) -> list[dict[str, Any]]:
    starts = record.starts
    resumed = {r["first_start"]: r for r in resumes(record)}
    rows = []
    job = 0
    for index, start in enumerate(starts):
        previous = starts[index - 1] if index else None
        following = starts[index + 1] if index + 1 < len(starts) else None
        queued_from = epoch(start.submitted) if previous is None else epoch(previous.ended)
        if index in resumed:        # the first start of a resumed job: queued from the resume on
            job = resumed[index]["number"]
            queued_from = resumed[index]["at"] if resumed[index]["at"] is not None else epoch(start.submitted)
        rows.append({"resume": job, **_start_row(start, queued_from, following, now)})
    return rows


def _start_row(start: StartRecord, queued_from: float | None, following: StartRecord | None,
               now: float) -> dict[str, Any]:
    started, ended = epoch(start.started), epoch(start.ended)
    first_at, last_at = epoch(start.get("first_step_at")), epoch(start.get("last_step_at"))
    stop_asked, stop_saved = epoch(start.get("stop_requested_at")), epoch(start.get("stop_saved_at"))
    seconds = step_time(start)
    resume_at = epoch(start.get("resume_at"))
    resume_load = number(start.get("resume_load_s"))
    if resume_load is None and resume_at is not None and first_at is not None:
        resume_load = _span(resume_at + (seconds or 0.0), first_at)

    base = _base(start) or 0
    last = step_of(start.get("last_step"))
    if last is None:
        last = step_of(start.stopped_at)
    kept_to = _kept_to(start, following, last)
    done = None if last is None else max(0, last - base)
    kept = None if done is None or kept_to is None else max(0, min(last or 0, kept_to) - base)
    lost = None if done is None or kept is None else done - kept
    wall = _span(started, ended if ended is not None else (now if not is_terminal(start.state) else None))
    spares = start.spare_nodes or 0        # checked when read: a count or None
    return {
        "restart": start.restart, "job_id": start.job_id, "state": start.state, "reason": start.reason,
        "queue_wait_s": _span(queued_from, started),
        "startup_s": _span(started, first_at),
        "resume_load_s": resume_load,
        "stop_s": _span(stop_asked, stop_saved),
        "teardown_s": _span(stop_saved or last_at, ended) if start.reason in INTERRUPTED or stop_saved else None,
        "steps_done": done, "steps_kept": kept, "lost_steps": lost,
        "step_time_s": seconds,
        "productive_s": None if kept is None or seconds is None else _finite(round(kept * seconds, 3)),
        "wall_s": wall,
        "spare_node_hours": round(spares * wall / 3600, 4) if spares and wall is not None else None,
    }


def _kept_to(start: StartRecord, following: StartRecord | None, last: int | None) -> int | None:
    """The step up to which the run kept this start's work; None when it cannot be told."""
    if following is not None:
        base = _base(following)
        if base is not None:
            return base                  # the next start went on from there
        if following.get("first_step") is not None:
            return 0                     # it began from step 0
    if start.state == State.COMPLETED.value:
        return last
    if following is None and not is_terminal(start.state) and start.state not in GOES_ON:
        return last                      # still going: all of it so far
    if step_of(start.stopped_at) is not None and ("stop_checkpoint" not in start.extra
                                                  or start.get("stop_checkpoint")):
        return start.stopped_at          # saved at its stop
    return None


# --- the run --------------------------------------------------------------------------------


def summarize(record: RunRecord, now: float, settings: Mapping[str, Any] | None = None,
              run_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """``goodput`` (totals and ``starts``), ``suggest`` and ``warnings`` of a run; its peer
    recoveries from the ledger in `run_dir` (default: the directory its record names)."""
    rows = per_start(record, now)
    where = run_dir if run_dir is not None else record.run_dir
    peer = peer_road(read_peer_ledger(where) if where else None)
    starts = record.starts
    resumed = resumes(record)
    begun = [t for s in starts if (t := epoch(s.started)) is not None]
    ends = [t for s in starts if (t := epoch(s.ended)) is not None]
    # In flight: its last start runs, or a resume handed it to a job that has not started yet.
    waiting = bool(resumed) and resumed[-1]["first_start"] == len(starts)
    in_flight = (bool(starts) and (waiting or not is_terminal(starts[-1].state))
                 and not is_terminal(record.state))
    wall = idle = None
    if begun:
        end = now if in_flight else (max(ends) if ends else None)
        wall = _span(min(begun), end)
        if wall is not None and resumed:
            idle = _idle(starts, resumed, min(begun), min(begun) + wall)
            wall = round(max(0.0, wall - idle), 3)
    productive = [r["productive_s"] for r in rows if r["productive_s"] is not None]
    lost_s = [x for r in rows if r["lost_steps"] is not None and r["step_time_s"] is not None
              and (x := _finite(r["lost_steps"] * r["step_time_s"])) is not None]
    lost_s += _peer_lost_s(peer, rows)
    lost_steps = lost_total(rows)
    if lost_steps is not None and peer is not None:
        lost_steps += peer["lost_steps"]
    overhead = 0.0
    measured = False
    for index, (start, row) in enumerate(zip(starts, rows)):
        parts = ([row["queue_wait_s"], row["startup_s"]] if index else [])
        if start.reason in INTERRUPTED:
            parts += [row["stop_s"], row["teardown_s"]]
        for part in parts:
            if part is not None:
                overhead += part
                measured = True
    interrupted = [s for s in starts if s.reason in INTERRUPTED and s.ended]
    unwarned = [s for s in interrupted if s.reason not in STOPPED]
    spare = [r["spare_node_hours"] for r in rows if r["spare_node_hours"] is not None]
    goodput = {
        "ettr": _finite(round(sum(productive) / wall, 4)) if productive and wall else None,
        "productive_s": _finite(round(sum(productive), 3)) if productive else None,
        "wall_s": wall,
        "idle_s": idle,
        "lost_steps": lost_steps,
        "lost_s": _finite(round(sum(lost_s), 3)) if lost_s else None,
        "restart_overhead_s": round(overhead, 3) if measured else None,
        "interruptions": len(interrupted),
        "mean_time_between_interruptions_s": _mean_run(interrupted),
        "unwarned_interruptions": len(unwarned),
        "mean_time_between_unwarned_s": _mean_run(unwarned),
        "save_s": _save_times(starts),
        "spare_node_hours": round(sum(spare), 4) if spare else None,
        "restarts_in_allocation": sum(1 for s in starts if s.state == State.RESTARTED.value),
        "spare_swaps": sum(1 for s in starts if s.state == State.RESTARTED.value and s.left_out),
        "peer_recoveries": peer,
        "starts": rows,
    }
    return {"goodput": goodput, "suggest": suggest(starts, goodput, settings or {}),
            "warnings": checkpoint_warnings(record)}


def lost_total(rows: Sequence[Mapping[str, Any]]) -> int | None:
    """Steps the run lost: the sum of what the starts that know it lost; 0 where none knows
    it and none was interrupted (nothing was lost); None where an interrupted start's loss
    is not known and no start's is (a script that reports no steps): not known, never 0."""
    lost = [row["lost_steps"] for row in rows if row["lost_steps"] is not None]
    if lost:
        return sum(lost)
    if any(row["reason"] in INTERRUPTED for row in rows):
        return None
    return 0 if rows else None


# --- peer recoveries ---------------------------------------------------------------------------


def read_peer_ledger(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ledger of peer recoveries in `run_dir`, read bounded: ``entries`` (each line that
    is one, checked by ``peer_entry``), ``damaged_lines`` (those that are not),
    ``truncated`` (past PEER_LEDGER_READ bytes: not read), ``problem`` (why it could not
    be read, else None); None when the run has none. A last line without its newline is
    one being written: not read yet."""
    path = RunDir(run_dir).peer_recovery_file
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return {"entries": [], "damaged_lines": 0, "truncated": False, "problem": f"{path}: {exc.strerror or exc}"}
    with os.fdopen(fd, "rb") as f:
        data = f.read(PEER_LEDGER_READ + 1)
    truncated = len(data) > PEER_LEDGER_READ
    # Whole lines only: one without its newline is being written (or cut at the bound).
    data = data[:PEER_LEDGER_READ].rpartition(b"\n")[0]
    entries, damaged = [], 0
    for line in data.splitlines():
        if not line.strip():
            continue
        entry = _peer_line(line)
        if entry is None:
            damaged += 1
        else:
            entries.append(entry)
    return {"entries": entries, "damaged_lines": damaged, "truncated": truncated, "problem": None}


def _peer_line(line: bytes) -> dict[str, Any] | None:
    if len(line) > PEER_LINE_BYTES:
        return None
    try:
        data = parse_json_object(line.decode("utf-8"))
        check_bounds(data, max_text=MAX_RECORD_TEXT, max_items=MAX_RECORD_ITEMS, max_number=MAX_RECORD_NUMBER)
    except ValueError:               # UnicodeDecodeError too
        return None
    return peer_entry(data)


def peer_entry(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """One ledger line as status shows it, or None when it is not one glaunch writes: a
    step, the step the ranks went on from (not past it) and the steps lost must be counts,
    every rank a count below the world size; times that are not times are None."""
    step, resume_after, lost = step_of(data.get("step")), step_of(data.get("resume_after")), \
        step_of(data.get("lost_steps"))
    world = step_of(data.get("world_size"))
    if step is None or resume_after is None or lost is None or resume_after > step or not world:
        return None
    ranks = {key: data.get(key) for key in ("failed", "receivers")}
    if not all(isinstance(v, list) and all(_rank_in(r, world) for r in v) for v in ranks.values()):
        return None
    source = data.get("source")
    if not _rank_in(source, world):
        return None
    return {"job_id": data.get("job_id") if is_job_id(data.get("job_id")) else None,
            "restart": step_of(data.get("restart")), "world_size": world,
            "node": _text(data.get("node")), "step": step, "failed": ranks["failed"], "source": source,
            "receivers": ranks["receivers"], "resume_after": resume_after, "lost_steps": lost,
            "generation": step_of(data.get("generation")), "error": _text(data.get("error")),
            "failed_at": data["failed_at"] if epoch(data.get("failed_at")) is not None else None,
            "recovery_s": number(data.get("recovery_s")),
            "next_step": step_of(data.get("next_step")),
            "next_step_at": data["next_step_at"] if epoch(data.get("next_step_at")) is not None else None,
            "to_next_step_s": number(data.get("to_next_step_s")),
            "checkpoint_read": data.get("checkpoint_read") is True}


def _rank_in(value: Any, world: int) -> bool:
    rank = step_of(value)
    return rank is not None and rank < world


def _text(value: Any) -> str | None:
    return value[:PEER_TEXT] if isinstance(value, str) else None


def peer_road(ledger: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The peer road's totals from a read ledger (``read_peer_ledger``); None without one."""
    if ledger is None:
        return None
    entries = list(ledger.get("entries") or ())
    return {"recoveries": len(entries), "lost_steps": sum(e["lost_steps"] for e in entries),
            "to_next_step_s": _spread([e["to_next_step_s"] for e in entries]),
            "recovery_s": _spread([e["recovery_s"] for e in entries]),
            "checkpoint_reads": sum(1 for e in entries if e["checkpoint_read"]),
            "damaged_lines": ledger.get("damaged_lines") or 0, "truncated": bool(ledger.get("truncated")),
            "problem": ledger.get("problem"), "entries": entries[-PEER_ENTRIES_SHOWN:]}


def _spread(values: Sequence[float | None]) -> dict[str, float] | None:
    known = sorted(v for v in values if v is not None)
    if not known:
        return None
    return {"median": _rounded(known[len(known) // 2]), "max": _rounded(known[-1])}


def _peer_lost_s(peer: Mapping[str, Any] | None, rows: Sequence[Mapping[str, Any]]) -> list[float]:
    """The seconds of the steps peer recoveries lost, at the step time of the start each
    happened in (where it is known)."""
    if peer is None:
        return []
    step_s = {(row["job_id"], row["restart"]): row["step_time_s"] for row in rows}
    return [x for e in peer["entries"] if e["lost_steps"]
            and (seconds := step_s.get((e["job_id"], e["restart"]))) is not None
            and (x := _finite(e["lost_steps"] * seconds)) is not None]


def _idle(starts: Sequence[StartRecord], resumed: Sequence[Mapping[str, Any]], begin: float, end: float) -> float:
    """Seconds within [begin, end] that the run spent ended before each resume: from the
    last end among the earlier job's starts to the resume."""
    idle = 0.0
    for entry in resumed:
        at = entry["at"]
        earlier = [t for s in starts[:entry["first_start"]] if (t := epoch(s.ended)) is not None]
        if at is not None and earlier:
            idle += max(0.0, min(at, end) - max(max(earlier), begin))
    return round(idle, 3)


def _mean_run(starts: Sequence[StartRecord]) -> float | None:
    """How long the starts ran, on average, before they were interrupted (a stop request
    when there was one, else their end)."""
    spans = [x for s in starts
             if (x := _span(epoch(s.started), epoch(s.get("stop_requested_at")) or epoch(s.ended))) is not None]
    return round(sum(spans) / len(spans), 3) if spans else None


def _save_times(starts: Sequence[StartRecord]) -> dict[str, float] | None:
    medians = [m for s in starts if (m := number(_field(s, "save_s", "median"))) is not None]
    longest = [m for s in starts if (m := number(_field(s, "save_s", "max"))) is not None]
    if not medians and not longest:
        return None
    ordered = sorted(medians or longest)
    return {"median": _rounded(ordered[len(ordered) // 2]), "max": _rounded(max(longest or medians))}


def _rounded(seconds: float) -> float:
    """Seconds to the millisecond, but to 3 significant digits below one: a step faster
    than a millisecond or an asynchronous save's stall is not 0 s (the goodput projection
    divides by them)."""
    return round(seconds, 3) if seconds == 0 or abs(seconds) >= 1e-3 else float(f"{seconds:.3g}")


def suggest(starts: Sequence[StartRecord], goodput: Mapping[str, Any],
            settings: Mapping[str, Any]) -> dict[str, Any]:
    """``checkpoint.every_steps`` and ``requeue.signal_lead_s`` from what the run measured;
    each with the figures it came from, or absent when they were not measured."""
    out: dict[str, Any] = {}
    saves = goodput.get("save_s") or {}
    save, longest = number(saves.get("median")), number(saves.get("max"))
    medians = [t for s in starts if (t := step_time(s)) is not None]
    p90s = [t for s in starts if (t := number(_field(s, "step_time_s", "p90"))) is not None]
    step = sorted(medians)[len(medians) // 2] if medians else None
    # Young and Daly model failures that come without warning: those, when the run saw any;
    # else every interruption (so far all warned stops that could save).
    mtbi = number(goodput.get("mean_time_between_unwarned_s"))
    what = "interruptions without warning"
    if not mtbi:
        mtbi = number(goodput.get("mean_time_between_interruptions_s"))
        what = "interruptions (all warned so far: this bounds the loss if one is not)"
    interval = math.sqrt(2 * max(save, 1e-3) * mtbi) if save is not None and mtbi and step else math.inf
    # Only a count a config can hold is a suggestion (a damaged save or step time gives none).
    if step and interval / step < MAX_SUGGESTED_STEPS:
        out["checkpoint.every_steps"] = {
            "value": max(1, round(interval / step)), "current": settings.get("checkpoint.every_steps"),
            "interval_s": round(interval, 1), "save_s": save, "mtbi_s": mtbi, "step_s": round(step, 4),
            "why": f"Young-Daly: sqrt(2 x {save:.2f} s save x {mtbi:.0f} s between {what}) = "
                   f"{interval:.0f} s = {max(1, round(interval / step))} steps of {step:.3g} s"}
    in_hand = max(p90s) if p90s else (step or 0.0)
    lead_s = math.inf if longest is None else in_hand + SAVE_MARGIN * longest + LEAD_MARGIN_S
    if lead_s <= MAX_SIGNAL_LEAD_S:
        lead = LEAD_ROUND_S * math.ceil(lead_s / LEAD_ROUND_S)
        out["requeue.signal_lead_s"] = {
            "value": int(lead), "current": settings.get("requeue.signal_lead_s"), "save_s": longest,
            "why": f"a step in hand ({in_hand:.2f} s) + {SAVE_MARGIN:g} x the longest save ({longest:.2f} s) + "
                   f"{LEAD_MARGIN_S:g} s"}
    return out


def projection_costs(goodput: Mapping[str, Any]) -> dict[str, float | None]:
    """What the goodput projection (launcher.resolution.goodput_projection) needs, from
    what the run measured, each None when it was not: the median save stall, start-up
    (less the resume load), resume load and step time of its starts, and the median queue
    wait of the starts after the first that went through the queue (requeues, resubmissions
    and resumes); ``restart_s``, the median restart inside the allocation (a RESTARTED
    start's end to the next step's first step); ``peer_s``, the median peer recovery (the
    failure to the end of the next step), only where the run had one."""
    rows = [r for r in goodput.get("starts") or () if isinstance(r, Mapping)]
    after = list(itertools.pairwise(rows))
    queued = [row for previous, row in after if previous.get("state") != State.RESTARTED.value]
    restarted = [row for previous, row in after if previous.get("state") == State.RESTARTED.value]

    def median(values: Sequence[float | None]) -> float | None:
        known = sorted(v for v in values if v is not None)
        return _rounded(known[len(known) // 2]) if known else None

    startups = [None if (s := number(r.get("startup_s"))) is None
                else max(0.0, s - (number(r.get("resume_load_s")) or 0.0)) for r in rows]
    costs = {"save_s": number(as_mapping(goodput.get("save_s")).get("median")),
             "startup_s": median(startups),
             "load_s": median([number(r.get("resume_load_s")) for r in rows]),
             "queue_wait_s": median([number(r.get("queue_wait_s")) for r in queued]),
             "step_s": median([number(r.get("step_time_s")) for r in rows]),
             "restart_s": median([_sum(r.get("queue_wait_s"), r.get("startup_s")) for r in restarted])}
    peer = number(_dig(goodput, "peer_recoveries", "to_next_step_s", "median"))
    if peer is not None:             # only a run that recovered from a peer has it
        costs["peer_s"] = peer
    return costs


def _dig(data: Any, *keys: str) -> Any:
    for key in keys:
        data = data.get(key) if isinstance(data, Mapping) else None
    return data


def _sum(*values: Any) -> float | None:
    """The sum of numbers that are all known; None otherwise."""
    known = [number(v) for v in values]
    return None if any(v is None for v in known) else sum(v for v in known if v is not None)


def checkpoint_warnings(record: RunRecord) -> list[str]:
    """Starts that stopped without saving, and requeued starts that began from step 0:
    a run that may be requeued but never saves loses everything at each requeue."""
    unsaved = [s for s in record.starts
               if s.reason in STOPPED and "stop_checkpoint" in s.extra and not s.get("stop_checkpoint")]
    # A script that ever saved or resumed does checkpoint: a start that began from step 0
    # after one that crashed before its first save is expected, not a missing checkpoint.
    checkpoints = any(step_of(s.resumed_from) is not None or number(_field(s, "save_s", "count"))
                      for s in record.starts)
    from_zero = []
    for previous, start in zip(record.starts, record.starts[1:]):
        if (checkpoints or previous.state not in GOES_ON or step_of(start.resumed_from) is not None
                or not step_of(previous.get("last_step"))):          # it lost no step: nothing was there to save
            continue
        first = step_of(start.get("first_step"))
        if (first is not None and first <= 1) or (first is None and is_terminal(start.state)):
            from_zero.append(start)
    if not unsaved and not from_zero:
        return []
    said = []
    if unsaved:
        said.append(", ".join(f"start {s.restart} stopped at step {s.stopped_at} without a checkpoint"
                              for s in unsaved))
    if from_zero:
        said.append(", ".join(f"start {s.restart} began again from step 0" for s in from_zero))
    return ["no checkpoint: " + "; ".join(said) + ". Each requeue restarts from step 0: save with "
            "rt.save_torch_state and resume with rt.resume_checkpoint (see examples/torch_ddp.py)"]
