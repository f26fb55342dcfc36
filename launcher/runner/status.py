"""A run's status as the user sees it: run.json with the scheduler's view folded in
(by the scheduler), the result, what the ranks measured (progress, memory against the
planner's estimate, GPU samples), goodput and the settings it suggests, a hang and the
nodes the job is kept off. The text `glaunch status` prints is launcher.views.status_text's."""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path
from typing import Any, Mapping

import yaml

from launcher.config import slurmtime
from launcher.errors import GlaunchError
from launcher.rundir.files import load_bounded_object, load_json_object, open_regular, read_text
from launcher.rundir.layout import REMOTE_FILE, RunDir, read_heartbeat
from launcher.rundir.records import IN_FLIGHT, RunRecord
from launcher.runner import goodput
from launcher.runner.goodput import as_mapping, number, step_of
from launcher.runner.node_versions import version_warnings

# The most of a GPU samples file status reads (its end: the newest samples).
GPU_SAMPLES_READ = 1 << 20


def summarize(run_dir: Path, record: RunRecord, now: float | None = None) -> dict[str, Any]:
    """What `glaunch status --json` prints."""
    now = time.time() if now is None else now
    result, result_problem = _result(run_dir)
    resolved = resolved_values(run_dir)
    experiment = as_mapping(resolved.get("experiment"))
    settings = {"checkpoint.every_steps": _dig(experiment, "checkpoint", "every_steps"),
                "requeue.signal_lead_s": _dig(experiment, "requeue", "signal_lead_s")}
    live = progress(run_dir, record, now) if record.state in IN_FLIGHT else None
    report = goodput.summarize(_with_progress(record, live), now, settings, run_dir=run_dir)
    report["goodput"]["projection"] = projection(resolved, report["goodput"])
    summary = {
        "run_id": record.run_id, "run_dir": str(run_dir), "site": record.site, "created": record.created,
        "state": record.state, "job_id": record.job_id,
        "restarts": restarts(record), "starts": [_start_row(s) for s in record.starts],
        "resumes": resume_report(record),
        "accounting": record.extra.get("accounting"), "reason": record.reason, "detail": record.detail,
        "result": result,
        "progress": live,
        "memory": memory_report(run_dir, record, resolved),
        "gpu": gpu_report(run_dir),
        "provenance": as_mapping(record.extra.get("provenance")) or None,
        "sweep": as_mapping(record.extra.get("sweep")) or None,
        "after": record.extra.get("after") if isinstance(record.extra.get("after"), list) else None,
        "excluded_nodes": list(record.excluded_nodes),
        **report,
    }
    summary["warnings"] = [*(report.get("warnings") or []), *version_warnings(record)]
    if result_problem:
        summary["result_error"] = result_problem
    cluster = cluster_of(run_dir, record)
    if cluster is not None:
        summary["cluster"] = cluster
    return summary


def projection(resolved: Mapping[str, Any], measured: Mapping[str, Any]) -> dict[str, Any] | None:
    """Goodput projected at the run's size from the costs it measured (defaults for the
    rest) and the site's failure rate; None without the run's size in resolved.yaml."""
    derived, experiment = as_mapping(resolved.get("derived")), as_mapping(resolved.get("experiment"))
    nodes, gpus = step_of(derived.get("nodes")), step_of(derived.get("gpus_per_node"))
    if not nodes or gpus is None:
        return None
    try:
        allocation = slurmtime.parse(derived.get("time") or "")
    except ValueError:
        allocation = None
    rate = number(_dig(resolved, "site", "goodput", "failures_per_node_hour")) or None
    every = step_of(_dig(experiment, "checkpoint", "every_steps")) or None
    from launcher.resolution import goodput_projection     # `status` of a run that ran only: not `list`

    costs = goodput_projection.costs_with_defaults(goodput.projection_costs(measured), every)
    # With recovery.peer on, the peer road is shown before any recovery measured its cost.
    peer = goodput_projection.DEFAULT_PEER_SHARE if _dig(experiment, "recovery", "peer") is True else None
    return goodput_projection.project(rate, costs, [(nodes, gpus)], allocation or goodput_projection.HOUR,
                                      None if rate is None else "site goodput.failures_per_node_hour",
                                      peer_share=peer).to_json()


def cluster_of(run_dir: Path, record: RunRecord) -> dict[str, Any] | None:
    """Where a run submitted over SSH lives: the login host and its directory there; None
    for a run whose directory is `run_dir`."""
    path = Path(run_dir) / REMOTE_FILE
    if not path.is_file():
        return None
    try:
        login = load_json_object(path).get("login")
        host = login.get("host") if isinstance(login, dict) else None
    except (OSError, ValueError):
        host = None
    return {"host": host if isinstance(host, str) else None, "run_dir": record.run_dir}


# Keys every start of `status --json` has (null until known): what the ranks measured, and
# where it ran.
START_KEYS = ("nodes", "peak_memory_gb", "step_time_s")


def _start_row(start) -> dict[str, Any]:
    row = start.to_dict()
    for key in START_KEYS:
        row.setdefault(key, None)
    return row


def restarts(record: RunRecord) -> int:
    """Starts after the first of their job (requeues): a resumed job's first start is none."""
    firsts = {0} | {r["first_start"] for r in goodput.resumes(record)}
    return sum(1 for index in range(len(record.starts)) if index not in firsts)


# What a resume entry says of how the run had ended (its scheduler_history stays in run.json).
ENDED_KEYS = ("state", "reason", "detail", "job_id", "nodes", "world_size", "partition")


def resume_report(record: RunRecord) -> list[dict[str, Any]] | None:
    """Each `glaunch resume` of the run: when, the overrides, how the run had ended, the
    new shape, and from which start on (``first_start``, an index into ``starts``) its
    job runs, with the step that job's first start resumed from (None: not yet known, or
    from step 0)."""
    rows = []
    for item in goodput.resumes(record):
        entry, first = item["entry"], item["first_start"]
        ended = as_mapping(entry.get("ended"))
        overrides = entry.get("overrides")
        start = record.starts[first] if first < len(record.starts) else None
        rows.append({"number": item["number"], "at": entry.get("at") if isinstance(entry.get("at"), str) else None,
                     "overrides": [str(o) for o in overrides] if isinstance(overrides, list) else [],
                     "ended": {key: ended.get(key) for key in ENDED_KEYS},
                     "previous_files": entry.get("previous_files"),
                     "nodes": entry.get("nodes"), "world_size": entry.get("world_size"),
                     "partition": entry.get("partition"), "first_start": first,
                     "started": start is not None,
                     "resumed_from": step_of(start.resumed_from) if start is not None else None})
    return rows or None


def _dig(data: Any, *keys: str) -> Any:
    for key in keys:
        data = data.get(key) if isinstance(data, Mapping) else None
    return data


def resolved_values(run_dir: Path) -> dict[str, Any]:
    """resolved.yaml as plain values; {} when it is missing or unreadable."""

    try:
        data = yaml.safe_load(read_text(RunDir(run_dir).path / "resolved.yaml"))
    except (OSError, ValueError, yaml.YAMLError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


# --- what the ranks measured -------------------------------------------------------------------


# A heartbeat is silent when it is this much older than its rank's own writing interval.
SILENT_AFTER_INTERVALS = 3
SILENT_MIN_S = 30.0


def progress(run_dir: Path, record: RunRecord, now: float) -> dict[str, Any] | None:
    """The current start's progress from its heartbeats: rank 0's step and step time, and
    the ranks whose last step is long past (SILENT_AFTER_INTERVALS of their writing
    interval, and at least SILENT_MIN_S)."""
    if not record.starts:
        return None
    restart = record.starts[-1].restart
    beats = []
    for rank, path in RunDir(run_dir).heartbeats():
        beat = read_heartbeat(path)
        if beat is not None and beat.get("restart") == restart and step_of(beat.get("step")) is not None:
            beats.append((rank, beat))
    if not beats:
        return None
    rank0 = dict(beats).get(0, beats[0][1])
    when = number(rank0.get("time"))
    silent = []
    for rank, beat in beats:
        reached = number(beat.get("time"))
        limit = max(SILENT_MIN_S, SILENT_AFTER_INTERVALS * (number(beat.get("interval_s")) or 0.0))
        if reached is not None and now - reached > limit and beat.get("state") == "running":
            silent.append({"rank": rank, "step": beat["step"], "for_s": round(now - reached, 1),
                           "node": beat.get("node") if isinstance(beat.get("node"), str) else None})
    total, step_s = step_of(rank0.get("total")), number(rank0.get("step_s"))
    eta_s = round((total - rank0["step"]) * step_s, 1) if total and step_s and total > rank0["step"] else None
    return {"step": rank0["step"], "total": total, "step_s": step_s, "eta_s": eta_s,
            "age_s": None if when is None else round(max(0.0, now - when), 1),
            "first_step": step_of(rank0.get("first_step")), "first_time": number(rank0.get("first_time")),
            "time": when, "checkpoint_step": step_of(rank0.get("checkpoint_step")), "ranks": len(beats),
            "silent": silent}


def _with_progress(record: RunRecord, live: Mapping[str, Any] | None) -> RunRecord:
    """The record with the running start's progress so far where it has none recorded
    yet (a start records what its ranks measured only when it ends)."""
    if not live or not record.starts:
        return record
    copy = RunRecord.from_dict(record.to_dict())
    start = copy.starts[-1]
    values = {"first_step": live.get("first_step"), "first_step_at": iso_time(live.get("first_time")),
              "last_step": live.get("step"), "last_step_at": iso_time(live.get("time")),
              "step_time_s": {"median": live["step_s"]} if live.get("step_s") else None}
    for key, value in values.items():
        if value is not None and start.get(key) is None:
            start.set(key, value)
    return copy


def iso_time(epoch_s: Any) -> str | None:
    value = number(epoch_s)
    if value is None:
        return None
    return dt.datetime.fromtimestamp(value, dt.timezone.utc).astimezone().isoformat(timespec="milliseconds")


# The planner's name of the strategy a run used.
def planner_strategy(derived: Mapping[str, Any], experiment: Mapping[str, Any]) -> str | None:
    strategy = derived.get("strategy")
    if strategy == "ddp":
        return "ddp"
    if strategy == "fsdp":
        return "fsdp"
    stage = derived.get("zero_stage")
    if strategy != "deepspeed" or stage not in (0, 1, 2, 3):
        return None
    if stage == 0:
        return "ddp"
    offload = _dig(experiment, "strategy", "offload_optimizer") not in (None, "none")
    params_offload = _dig(experiment, "strategy", "offload_params") not in (None, "none")
    if stage == 3 and offload != params_offload:
        return None       # the planner's zero3_offload offloads both; no row for one alone
    return f"zero{stage}_offload" if offload and stage in (2, 3) else f"zero{stage}"


def planned_memory(run_dir: Path, resolved: Mapping[str, Any]) -> dict[str, Any] | None:
    """The planner's per-GPU estimate for the strategy the run used: what `auto` recorded
    when it chose, else the planner run on resolved.yaml when the model's size is known
    (model.params; counting model.factory would import torch here)."""
    derived, experiment = as_mapping(resolved.get("derived")), as_mapping(resolved.get("experiment"))
    choice = derived.get("strategy_choice")
    if isinstance(choice, dict) and number(choice.get("per_gpu_gb")):
        return {"strategy": choice.get("chosen"), "estimate_gb": number(choice.get("per_gpu_gb")),
                "from": "strategy auto"}
    if number(_dig(experiment, "model", "params")) is None:
        return None
    name = planner_strategy(derived, experiment)
    if name is None:
        return None

    # The planner on resolved.yaml: what `status` of such a run needs, and nothing else here.
    from launcher.config import schema
    from launcher.config.load import LoadedExperiment
    from launcher.config.sites import LoadedSite
    from launcher.config.sourcemap import Provenance
    from launcher.config.typed import typed_config
    from launcher.config.yamlfile import read_yaml
    from launcher.resolution.strategy import plan_for

    path = RunDir(run_dir).path / "resolved.yaml"
    try:
        doc = read_yaml(path)
        exp_prov, site_prov = Provenance(default_file=str(path)), Provenance(default_file=str(path))
        exp = typed_config(schema.Experiment, doc.data["experiment"], exp_prov, schema.EXPERIMENT_CHOICES)
        site = typed_config(schema.Site, doc.data["site"], site_prov, schema.SITE_CHOICES)
        result = plan_for(LoadedExperiment(exp, path, exp_prov), LoadedSite(site, path, (path,), site_prov))
        row = result.row(name)
    except (GlaunchError, OSError, ValueError, KeyError, TypeError, StopIteration) as exc:
        return {"strategy": name, "estimate_gb": None, "error": str(exc).splitlines()[0] if str(exc) else
                type(exc).__name__}
    return {"strategy": name, "estimate_gb": round(row.total_gb, 3), "from": "planner"}


def memory_report(run_dir: Path, record: RunRecord, resolved: Mapping[str, Any]) -> dict[str, Any] | None:
    """The largest per-rank peak of any start, and the planner's estimate beside it (on a
    GPU; a host's resident set is not what the planner estimates)."""
    peaks = []
    for start in record.starts:
        peak = number(start.get("peak_memory_gb"))
        if peak is not None:
            memory = start.get("memory")
            kind = memory.get("kind") if isinstance(memory, dict) else None
            peaks.append((peak, start.restart, kind if kind in ("cuda", "host_rss") else None))
    if not peaks:
        return None
    peak, restart, kind = max(peaks, key=lambda p: p[0])
    out: dict[str, Any] = {"peak_gb": peak, "kind": kind, "start": restart}
    planned = planned_memory(run_dir, resolved)
    if planned:
        out["planned"] = planned
        estimate = number(planned.get("estimate_gb"))
        if kind == "cuda" and estimate:
            out["ratio"] = round(peak / estimate, 3)
    return out


def gpu_report(run_dir: Path) -> list[dict[str, Any]] | None:
    """Per GPU samples file (one per node and job): how many samples, mean utilisation,
    largest memory used (of the newest MiB of samples)."""
    rows = []
    for path in sorted(RunDir(run_dir).log_dir.glob("*_gpu_*.csv")):
        try:
            size = path.stat().st_size
            text = read_text(path, limit=2 * GPU_SAMPLES_READ) if size <= GPU_SAMPLES_READ else _tail(path)
        except (OSError, ValueError):
            continue
        utils, used, total, samples = [], [], [], 0
        for line in text.splitlines():
            fields = line.split(",")
            if len(fields) != 7 or fields[0] == "time":
                continue
            try:
                utils.append(float(fields[3]))
                used.append(float(fields[5]))
                total.append(float(fields[6]))
            except ValueError:
                continue
            samples += 1
        if samples:
            job, _, node = path.stem.partition("_gpu_")
            rows.append({"file": path.name, "job_id": job, "node": node, "samples": samples,
                         "utilization_mean_pct": round(sum(utils) / len(utils), 1),
                         "memory_used_max_mib": max(used), "memory_total_mib": max(total)})
    return rows or None


def _tail(path: Path) -> str:
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        f.seek(-GPU_SAMPLES_READ, os.SEEK_END)
        return f.read(GPU_SAMPLES_READ).decode("utf-8", errors="replace").partition("\n")[2]


def _result(run_dir: Path) -> tuple[dict | None, str | None]:
    """result.json, or what is wrong with it (None when the run has not written one)."""
    path = RunDir(run_dir).result_file
    try:
        return load_bounded_object(path), None
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path}: cannot be read: {exc.strerror or exc}"
    except ValueError as exc:
        return None, f"{path}: {exc}"
