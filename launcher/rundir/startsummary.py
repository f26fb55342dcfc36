"""A start's fields in run.json, folded from what its ranks measured and left in the run
directory, each file read back checked.

The ranks write ``telemetry/JOB_RESTART_RANK.json`` at the end of a start
(launcher.runtime.heartbeats.write_telemetry; what each measures:
launcher.runtime.telemetry), their heartbeats, ``versions/`` (launcher.runtime.versions),
stop.json and resume.json. :func:`start_summary` folds them into the fields of the start's
entry in run.json (layout.TELEMETRY_FIELDS): the job controller does it at a start's end, on
Slurm and on this machine. Times in run.json are :func:`iso`; medians and percentiles are
:func:`quantile`, the ranks' own included.

Standard library only: it runs on every rank and on the batch host.
"""

from __future__ import annotations

import datetime as dt
import math
import os
from typing import Any

from launcher.rundir.files import read_json
from launcher.rundir.layout import RunDir, read_heartbeat
from launcher.rundir.records import RunRecord, is_node_name


def epoch(value: Any) -> float | None:
    """An ISO 8601 time (a naive one is local time) as epoch seconds, else None."""
    if not isinstance(value, str):
        return None
    try:
        when = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        if when.tzinfo is None:
            when = when.astimezone()        # past the platform's local times for year 1 or 9999
        return when.timestamp()
    except (ValueError, OverflowError, OSError):
        return None


def iso(epoch: float | None) -> str | None:
    """An epoch time as run.json writes times (ISO 8601, local offset), to the millisecond."""
    if epoch is None:
        return None
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).astimezone().isoformat(timespec="milliseconds")


def quantile(ordered: list[float], q: float) -> float:
    """The q-quantile of sorted values, interpolated between the nearest ranks."""
    if len(ordered) == 1:
        return ordered[0]
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# Larger is no measurement (a time past the year 5000, a size in exabytes): the ranks'
# files are read back, and may have been damaged or edited.
_LARGEST = 1e11


def _number(value: Any) -> float | None:
    """`value` as a measurement: a finite number from 0 to _LARGEST, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0 <= value <= _LARGEST else None


def _numbers(values: list[Any]) -> list[float]:
    return [n for v in values if (n := _number(v)) is not None]


def _rank_order(entry: dict[str, Any]) -> int:
    rank = entry.get("rank")
    return rank if type(rank) is int else -1


def _median(values: list[float]) -> float | None:
    return quantile(sorted(values), 0.5) if values else None


def _own(records: list[dict[str, Any] | None], job_id: str, restart: int) -> list[dict[str, Any]]:
    """The records of this start."""
    return [r for r in records
            if r is not None and type(r.get("restart")) is int and r.get("restart") == restart
            and str(r.get("job_id")) == str(job_id)]


def _progress(records: list[dict[str, Any]], time_key: str, step_key: str) -> list[tuple[float, int]]:
    return [(t, s) for x in records
            if (t := _number(x.get(time_key))) is not None
            and type(s := x.get(step_key)) is int and 0 <= s < 2**63]


def start_summary(run_dir: str | os.PathLike[str], job_id: str, restart: int) -> dict[str, Any]:
    """The start's run.json fields from what its ranks left (telemetry files, heartbeats,
    stop.json, resume.json); only the fields something was measured for."""
    rd = RunDir(run_dir)
    ranks = _own([read_json(path) for path in rd.telemetry_files(job_id, restart)], job_id, restart)
    beats = _own([read_heartbeat(path) for _, path in rd.heartbeats()], job_id, restart)
    out: dict[str, Any] = {}

    memory = [dict(m, rank=r.get("rank"), node=r.get("node")) for r in ranks if isinstance(m := r.get("memory"), dict)]
    peaks = _numbers([m.get("peak_gb") for m in memory])
    if peaks:
        kinds = {m.get("kind") for m in memory}
        out["peak_memory_gb"] = max(peaks)
        out["memory"] = {"kind": "cuda" if "cuda" in kinds else "host_rss",
                         "ranks": sorted(({k: m.get(k) for k in ("rank", "node", "kind", "peak_gb", "reserved_gb",
                                                                 "host_rss_gb") if m.get(k) is not None}
                                          for m in memory), key=_rank_order)}
    times = [t for r in ranks if isinstance(t := r.get("step_time_s"), dict)]
    medians, p90s = _numbers([t.get("median") for t in times]), _numbers([t.get("p90") for t in times])
    if medians and p90s:
        out["step_time_s"] = {"median": round(_median(medians) or 0.0, 6), "p90": round(max(p90s), 6)}
        counts = [int(c) for c in _numbers([t.get("count") for t in times])]
        if counts:
            out["steps_timed"] = max(counts)
    saves = _numbers([s for r in ranks if isinstance(r.get("save_s"), list) for s in r["save_s"]])
    if saves:
        out["save_s"] = {"median": round(_median(saves) or 0.0, 6), "max": round(max(saves), 6),
                         "count": max(len(r["save_s"]) for r in ranks if isinstance(r.get("save_s"), list))}

    firsts = _progress(beats + ranks, "first_time", "first_step")
    # A checkpoint a rank saved says its step was reached too: where a rank hangs or is
    # killed, its last written beat may lag its steps by up to its interval, but not the save
    # it wrote at once (heartbeats.saving).
    lasts = (_progress(beats, "time", "step") + _progress(beats, "save_ended", "checkpoint_step")
             + _progress(ranks, "last_time", "last_step"))
    if firsts:
        when, first = min(firsts)
        out["first_step"], out["first_step_at"] = first, iso(when)
    if lasts:
        out["last_step"] = max(step for _, step in lasts)
        out["last_step_at"] = iso(max(when for when, _ in lasts))

    imported = node_versions(rd, job_id, restart)
    if imported:
        out["versions"] = imported

    stops = [stop for r in ranks if isinstance(stop := r.get("stop"), dict)]
    requested = _numbers([stop.get("requested") for stop in stops])
    saved = _numbers([stop.get("saved") for stop in stops])
    if requested:
        out["stop_requested_at"] = iso(min(requested))
    if saved:
        out["stop_saved_at"] = iso(max(saved))
    stopped = read_json(rd.stop_file)
    if stopped is not None and stopped.get("restart") == restart:
        checkpoint = stopped.get("checkpoint")
        out["stop_checkpoint"] = checkpoint if isinstance(checkpoint, str) else None
    resume = read_json(rd.resume_file)
    if resume is not None and resume.get("restart") == restart and resume.get("step") is not None:
        # When the checkpoint to resume from was chosen: the record's time, else the file's.
        chosen = _numbers([resume.get("time")])
        try:
            out["resume_at"] = iso(chosen[0] if chosen else os.stat(rd.resume_file).st_mtime)
        except OSError:
            pass
    return out


# What a node may say it imported: the names launcher.runtime.versions writes, bounded.
VERSION_NAMES = frozenset({"python", "torch", "cuda", "nccl", "deepspeed", "lightning", "pytorch-lightning"})
MAX_VERSION = 64


def node_versions(rd: RunDir, job_id: str, restart: int) -> dict[str, dict[str, str]]:
    """node name -> what its ranks imported, from the start's versions files (checked:
    known names, short texts; anything else is left out)."""
    found: dict[str, dict[str, str]] = {}
    for path in rd.versions_files(job_id, restart):
        data = read_json(path)
        node = data.get("node") if isinstance(data, dict) else None
        versions = data.get("versions") if isinstance(data, dict) else None
        if not isinstance(node, str) or not is_node_name(node) or not isinstance(versions, dict):
            continue
        found[node] = {name: value for name, value in versions.items()
                       if name in VERSION_NAMES and isinstance(value, str) and 0 < len(value) <= MAX_VERSION
                       and value.isprintable()}
    return found


def not_started_note(run_dir: RunDir, job_id: str | None, restart: int) -> dict[str, Any] | None:
    """peer-not-started.json, where it is of start `restart` of job `job_id` (a resumed run's
    new job numbers its starts from 0 again): why a lost rank's new process could not be
    started (launcher.jobcontrol.replace); else None."""
    note = read_json(run_dir.peer_not_started_file)
    if note is None or type(note.get("restart")) is not int or note["restart"] != restart \
            or str(note.get("job_id")) != str(job_id):
        return None
    return note


def first_failure(run_dir: RunDir, record: RunRecord) -> tuple[int | None, str | None, str | None]:
    """(task, node, error) of the first task that failed in the last start (a rank under
    srun, a node's agent under torchrun): crash.json, else the local step summary's first
    non-zero exit."""
    if not record.starts:
        return None, None, None
    last = record.starts[-1]
    lost = not_started_note(run_dir, last.job_id, last.restart)
    if lost is not None:
        # A lost rank that could not be started again (recovery.peer) ended the step: the
        # other ranks' crash.json says only how they were stopped.
        rank, node, error = lost.get("rank"), lost.get("node"), lost.get("error")
        return (rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
                node if isinstance(node, str) else None,
                f"its process was lost and could not be started again: {error}" if isinstance(error, str) else None)
    note = read_json(run_dir.crash_file)
    if note is not None and note.get("restart") == last.restart:
        task = note.get("task")
        return (task if isinstance(task, int) and not isinstance(task, bool) else None,
                note.get("node") if isinstance(note.get("node"), str) else None,
                note.get("error") if isinstance(note.get("error"), str) else None)
    summary = read_json(run_dir.step_summary(last.job_id)) or {}
    codes = summary.get("exit_codes")
    if isinstance(codes, list):
        for rank, code in enumerate(codes):
            if isinstance(code, int) and code != 0:
                return rank, None, f"exit status {code}"
    return None, None, None
