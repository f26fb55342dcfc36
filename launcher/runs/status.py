"""A run's status as the user sees it: run.json with the scheduler's view folded in
(by the scheduler), the result, what the ranks measured (progress, memory against the
planner's estimate, GPU samples), goodput and the settings it suggests, and the text
`glaunch status` / `glaunch list` print."""

from __future__ import annotations

import datetime as dt
import os
import re
import time
from pathlib import Path
from typing import Any, Mapping

from ..errors import GlaunchError
from . import goodput, registry
from .files import load_json_object, read_text
from .goodput import number, step_of
from .layout import IN_FLIGHT, SWEEP_FILE, RunDir, RunRecord, read_heartbeat

# The most of a GPU samples file status reads (its end: the newest samples).
GPU_SAMPLES_READ = 1 << 20

# Records may hold anything a hand or a rank wrote: text printed from them never carries
# control characters to the terminal (an escape sequence could rewrite what was shown).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(value: Any, *, lines: bool = False) -> str:
    """`value` as text safe for a terminal; with `lines`, its line breaks are kept."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))
    return text if lines else text.replace("\n", "\\n")


def summarize(run_dir: Path, record: RunRecord, now: float | None = None) -> dict[str, Any]:
    """What `glaunch status --json` prints."""
    now = time.time() if now is None else now
    result, result_problem = _result(run_dir)
    resolved = resolved_values(run_dir)
    experiment = _mapping(resolved.get("experiment"))
    settings = {"checkpoint.every_steps": _dig(experiment, "checkpoint", "every_steps"),
                "requeue.signal_lead_s": _dig(experiment, "requeue", "signal_lead_s")}
    live = progress(run_dir, record, now) if record.state in IN_FLIGHT else None
    report = goodput.summarize(_with_progress(record, live), now, settings)
    summary = {
        "run_id": record.run_id, "run_dir": str(run_dir), "site": record.site,
        "state": record.state, "job_id": record.job_id,
        "restarts": max(len(record.starts) - 1, 0), "starts": [s.to_dict() for s in record.starts],
        "accounting": record.extra.get("accounting"), "reason": record.reason, "detail": record.detail,
        "result": result,
        "progress": live,
        "memory": memory_report(run_dir, record, resolved),
        "gpu": gpu_report(run_dir),
        "provenance": _mapping(record.extra.get("provenance")) or None,
        "sweep": _mapping(record.extra.get("sweep")) or None,
        "after": record.extra.get("after") if isinstance(record.extra.get("after"), list) else None,
        **report,
    }
    if result_problem:
        summary["result_error"] = result_problem
    return summary


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _dig(data: Any, *keys: str) -> Any:
    for key in keys:
        data = data.get(key) if isinstance(data, Mapping) else None
    return data


def resolved_values(run_dir: Path) -> dict[str, Any]:
    """resolved.yaml as plain values; {} when it is missing or unreadable."""
    import yaml

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
    return {"step": rank0["step"], "total": step_of(rank0.get("total")), "step_s": number(rank0.get("step_s")),
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
        return "zero3"        # FSDP's full sharding keeps what ZeRO-3 keeps per GPU
    stage = derived.get("zero_stage")
    if strategy != "deepspeed" or stage not in (0, 1, 2, 3):
        return None
    if stage == 0:
        return "ddp"
    offload = _dig(experiment, "strategy", "offload_optimizer") not in (None, "none")
    return f"zero{stage}_offload" if offload and stage in (2, 3) else f"zero{stage}"


def planned_memory(run_dir: Path, resolved: Mapping[str, Any]) -> dict[str, Any] | None:
    """The planner's per-GPU estimate for the strategy the run used: what `auto` recorded
    when it chose, else the planner run on resolved.yaml when the model's size is known
    (model.params; counting model.factory would import torch here)."""
    derived, experiment = _mapping(resolved.get("derived")), _mapping(resolved.get("experiment"))
    choice = derived.get("strategy_choice")
    if isinstance(choice, dict) and number(choice.get("per_gpu_gb")):
        return {"strategy": choice.get("chosen"), "estimate_gb": number(choice.get("per_gpu_gb")),
                "from": "strategy auto"}
    if number(_dig(experiment, "model", "params")) is None:
        return None
    name = planner_strategy(derived, experiment)
    if name is None:
        return None
    from ..config import schema
    from ..config.load import LoadedExperiment, LoadedSite
    from ..config.provenance import Provenance
    from ..config.typed import typed_config
    from ..config.yamlfile import read_yaml
    from ..resolution.strategy import plan_for

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
    from .files import open_regular

    fd = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        f.seek(-GPU_SAMPLES_READ, os.SEEK_END)
        return f.read(GPU_SAMPLES_READ).decode("utf-8", errors="replace").partition("\n")[2]


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


def duration(seconds: Any) -> str:
    """4.1 s, 3m10s, 2h05m."""
    value = number(seconds)
    if value is None:
        return "?"
    if value < 60:
        return f"{value:.1f} s"
    if value < 3600:
        return f"{int(value // 60)}m{int(value % 60):02d}s"
    return f"{int(value // 3600)}h{int(value % 3600 // 60):02d}m"


def _gb(value: Any) -> str:
    amount = number(value)
    return "?" if amount is None else f"{amount:.3g} GB"


def _measured(start: Mapping[str, Any]) -> str:
    """What a start's ranks measured, for its status line."""
    parts = []
    if number(start.get("peak_memory_gb")) is not None:
        memory = start.get("memory")
        kind = memory.get("kind") if isinstance(memory, dict) else None
        parts.append(f"peak {_gb(start['peak_memory_gb'])}" + (" (host RSS)" if kind == "host_rss" else ""))
    times = start.get("step_time_s")
    if isinstance(times, dict) and number(times.get("median")) is not None:
        parts.append(f"step {number(times['median']):.3g} s"
                     + (f" (p90 {number(times['p90']):.3g} s)" if number(times.get("p90")) is not None else ""))
    last = step_of(start.get("last_step"))
    if last is not None:
        parts.append(f"last step {last}")
    return ("  " + ", ".join(parts)) if parts else ""


def _memory_line(memory: Mapping[str, Any]) -> str:
    kind = memory.get("kind")
    what = {"cuda": "per GPU (CUDA peak allocated)", "host_rss": "per rank (host RSS: no GPU used)"}.get(str(kind), "")
    line = f"  memory: peak {_gb(memory.get('peak_gb'))} {what}".rstrip()
    planned = memory.get("planned")
    if isinstance(planned, dict):
        name = printable(planned.get("strategy"))
        if number(planned.get("estimate_gb")) is not None:
            line += f"; planner's estimate for {name}: {_gb(planned['estimate_gb'])}"
            if number(memory.get("ratio")) is not None:
                line += f" (peak/estimate {number(memory['ratio']):.2f})"
            elif kind != "cuda":
                line += " (per GPU: not comparable with a host's memory)"
        elif planned.get("error"):
            line += f"; no planner estimate: {printable(planned['error'])}"
    return line


def _goodput_lines(report: Mapping[str, Any]) -> list[str]:
    good = report.get("goodput")
    if not isinstance(good, dict) or not good.get("starts"):
        return []
    ettr = number(good.get("ettr"))
    head = f"  goodput: ETTR {ettr:.2f}" if ettr is not None else "  goodput: ETTR ?"
    if number(good.get("productive_s")) is not None and number(good.get("wall_s")) is not None:
        head += f" ({duration(good['productive_s'])} of training kept in {duration(good['wall_s'])})"
    head += f"; lost steps {good.get('lost_steps')}"
    if number(good.get("lost_s")):
        head += f" ({duration(good['lost_s'])})"
    if number(good.get("restart_overhead_s")) is not None:
        head += f"; restart overhead {duration(good['restart_overhead_s'])}"
    interruptions = good.get("interruptions") or 0
    head += f" over {interruptions} interruption(s)"
    if number(good.get("mean_time_between_interruptions_s")):
        head += f", one every {duration(good['mean_time_between_interruptions_s'])}"
    lines = [head]
    names = (("queue_wait_s", "queue"), ("startup_s", "start-up"), ("resume_load_s", "resume load"),
             ("stop_s", "stop"), ("teardown_s", "teardown"))
    for row in good["starts"]:
        parts = [f"{label} {duration(row[key])}" for key, label in names if number(row.get(key)) is not None]
        if row.get("lost_steps"):
            parts.append(f"{row['lost_steps']} step(s) lost")
        if parts:
            lines.append(f"    start {row['restart']}: " + ", ".join(parts))
    return lines


def _suggestion_lines(suggestions: Any) -> list[str]:
    lines = []
    for key, item in (suggestions or {}).items():
        if not isinstance(item, dict):
            continue
        now = item.get("current")
        lines.append(f"  suggest: {key}={printable(item.get('value'))}"
                     + (f" (now {printable(now)})" if now is not None else "") + f": {printable(item.get('why'))}")
    return lines


def _origin_lines(summary: Mapping[str, Any]) -> list[str]:
    """The code it runs (commit, dirty tree, snapshot), its sweep, the runs it waits for."""
    p = printable
    lines = []
    origin = _mapping(summary.get("provenance"))
    git, code = _mapping(origin.get("git")), _mapping(origin.get("code"))
    if git:
        line = f"  code: commit {p(str(git.get('commit'))[:12])}"
        line += f" ({p(git['branch'])})" if git.get("branch") else ""
        if git.get("dirty") and git.get("patch"):
            line += f", dirty tree: {p(git.get('patch'))} (sha256 {p(str(git.get('diff_sha256'))[:12])})"
        elif git.get("dirty"):
            line += ", dirty tree (no snapshot: it runs from the work tree as it is)"
        else:
            line += ", clean tree"
        lines.append(line)
    if code:
        lines.append(f"  snapshot: {p(code.get('snapshot'))} ({code.get('files')} files from {p(code.get('source'))})")
    sweep = _mapping(summary.get("sweep"))
    if sweep:
        values = " ".join(f"{p(k)}={p(v)}" for k, v in _mapping(sweep.get("params")).items())
        lines.append(f"  sweep {p(sweep.get('id'))}, element {sweep.get('index')}: {values}")
    for item in summary.get("after") or []:
        if isinstance(item, dict):
            jobs = ",".join(map(str, item.get("job_ids") or [])) or "-"
            lines.append(f"  after {p(item.get('ref'))}:{p(item.get('kind'))} (jobs {p(jobs)})")
    return lines


def format_status(summary: dict[str, Any]) -> str:
    p = printable
    lines = [f"run {p(summary['run_id'])}: {p(summary['state'])} (site {p(summary['site'])}, "
             f"job {p(summary['job_id'])}, {summary['restarts']} restart(s))", f"  {p(summary['run_dir'])}"]
    if summary.get("accounting") is False:
        lines.append("  (no Slurm accounting here: states come from squeue only)")
    lines += _origin_lines(summary)
    for start in summary["starts"]:
        lines.append(f"  start {start['restart']}: job {start['job_id']} {p(start['state'])}"
                     + (f" reason={p(start['reason'])}" if start.get("reason") else "")
                     + (f" resumed_from={start['resumed_from']}" if start.get("resumed_from") is not None else "")
                     + (f" stopped_at={start['stopped_at']}" if start.get("stopped_at") is not None else "")
                     + p(_measured(start)))
    if summary.get("reason") or summary.get("detail"):
        lines.append("  reason: " + p("; ".join(x for x in (summary.get("reason"), summary.get("detail")) if x)))
    live = summary.get("progress")
    if isinstance(live, dict):
        total = f"/{live['total']}" if live.get("total") else ""
        line = f"  progress: step {live['step']}{total}"
        if number(live.get("step_s")):
            line += f", {1 / live['step_s']:.3g} steps/s"
        if live.get("age_s") is not None:
            line += f", last step {duration(live['age_s'])} ago"
        silent = live.get("silent") or []
        if silent:
            line += f"; {len(silent)} rank(s) silent: " + ", ".join(
                f"rank {s['rank']} ({p(s.get('node'))}) at step {s['step']} for {duration(s['for_s'])}"
                for s in silent[:8]) + (" ..." if len(silent) > 8 else "")
        lines.append(line)
    if isinstance(summary.get("memory"), dict):
        lines.append(_memory_line(summary["memory"]))
    for gpu in summary.get("gpu") or []:
        lines.append(f"  gpu: node {p(gpu['node'])} (job {p(gpu['job_id'])}): {gpu['samples']} samples, "
                     f"utilisation mean {gpu['utilization_mean_pct']:g}%, memory max "
                     f"{gpu['memory_used_max_mib']:g}/{gpu['memory_total_mib']:g} MiB")
    lines += _goodput_lines(summary)
    lines += _suggestion_lines(summary.get("suggest"))
    for warning in summary.get("warnings") or []:
        lines.append(f"  warning: {p(warning)}")
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
        except GlaunchError as exc:
            rows.append({"run_id": entry["run_id"], "state": None, "site": None, "nodes": None, "created": None,
                         "age": "?", "run_dir": str(run_dir), "error": str(exc)})
            continue
        if isinstance(record.extra.get("sweep"), dict):
            continue            # a sweep's element: its sweep's row stands for it
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


def _sweep_row(sweep_id: str, sweep_dir: Path) -> dict[str, Any]:
    """A sweep as one row of `glaunch list`: its state from its elements' records as they
    are (`glaunch status SWEEP` asks the scheduler)."""
    from . import sweeps

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
        nodes.add(record.nodes)
    return {"run_id": sweep.sweep_id, "state": sweeps.sweep_state(states) if states else None, "site": sweep.site,
            "nodes": next(iter(nodes)) if len(nodes) == 1 else "mixed", "created": sweep.created,
            "age": _age(sweep.created), "run_dir": str(sweep_dir), "sweep": len(sweep.elements)}


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
            sweep = f"  (a sweep of {r['sweep']} runs)" if r.get("sweep") else ""
            lines.append(f"{printable(r['run_id']):44s} {printable(r['state']):11s} {printable(r['site']):18s} "
                         f"{printable(r['nodes']):5s} {r['age']}{sweep}")
    return "\n".join(lines)
