"""What each rank measured in one start, and how it reaches run.json.

- Each rank writes ``telemetry/JOB_RESTART_RANK.json`` at the end of its start (a stop:
  :func:`launcher.runtime.write_stop`; the end of training: ``write_result``; otherwise at
  exit, best effort; :func:`launcher.runtime.heartbeats.write_telemetry`): peak memory
  (:func:`peak_memory`: CUDA's peak allocated and reserved when this process uses CUDA,
  else the process's peak resident set), the step times and checkpoint save times its
  heartbeats measured, and when a stop was asked for, agreed and saved.
- The local rank 0 of each node samples ``nvidia-smi`` every ``GLAUNCH_GPU_SAMPLE_S``
  seconds (default 5; 0: never) into ``logs/JOB_gpu_NODE.csv`` from its first heartbeat on,
  from a small process of its own (a thread in the training process would be forked along
  with data-loader workers). Without nvidia-smi nothing is started and nothing written.
- :func:`start_summary` folds every rank's files into the fields of the start's entry in
  run.json (layout.TELEMETRY_FIELDS): jobend does it on Slurm, the local scheduler's loop
  on this machine.

Standard library only: it runs on every rank and on the batch host.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from launcher.processes import run_bounded
from launcher.rundir import envnames
from launcher.rundir.files import open_regular, read_json
from launcher.rundir.layout import RunDir, read_heartbeat
from launcher.rundir.records import is_node_name
from launcher.runtime.rankcontext import RankContext, log, node_name, seconds_from_env

GB = 1e9                   # the planner's gigabyte
DEFAULT_GPU_SAMPLE_S = 5.0
GPU_QUERY = "index,uuid,utilization.gpu,utilization.memory,memory.used,memory.total"
GPU_HEADER = "time,index,uuid,utilization_gpu_pct,utilization_memory_pct,memory_used_mib,memory_total_mib"
GPU_FAILURES = 5           # consecutive failed nvidia-smi calls before the sampler gives up

_sampler: subprocess.Popen | None = None


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


# --- memory ---------------------------------------------------------------------------------


def host_peak_bytes() -> int | None:
    """This process's peak resident set: /proc/self/status VmHWM (this process image's own),
    else getrusage. getrusage's maxrss survives exec on Linux: a rank started by a large
    parent (a torchrun agent, a test runner) would report the parent's peak."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if peak > 0:
            return int(peak) if sys.platform == "darwin" else int(peak) * 1024   # bytes on macOS, KiB on Linux
    except (ImportError, OSError, ValueError):
        pass
    return None


def peak_memory() -> dict[str, Any]:
    """{"kind": "cuda" | "host_rss", "peak_gb", ...}: CUDA's peak when this process has used
    CUDA (torch already imported and CUDA initialised: nothing is imported or initialised
    here), else the host's peak resident set."""
    host = host_peak_bytes()
    out: dict[str, Any] = {"host_rss_gb": None if host is None else round(host / GB, 4)}
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_initialized():
            device = cuda.current_device()
            out.update(kind="cuda", device=f"cuda:{device}",
                       peak_gb=round(cuda.max_memory_allocated(device) / GB, 4),
                       reserved_gb=round(cuda.max_memory_reserved(device) / GB, 4))
            return out
    except Exception as exc:  # a CUDA error at exit must not turn a finished run into a crash
        log(f"CUDA memory statistics unavailable: {type(exc).__name__}: {exc}")
    out.update(kind="host_rss", peak_gb=out["host_rss_gb"])
    return out


# --- GPU samples ------------------------------------------------------------------------------


def gpu_sample_interval() -> float:
    return seconds_from_env(envnames.GPU_SAMPLE_S, DEFAULT_GPU_SAMPLE_S)


def start_gpu_sampler(ctx: RankContext) -> subprocess.Popen | None:
    """The node's GPU sampler, when there is nvidia-smi and sampling is on; else None. It
    runs in a session of its own, so that stop_gpu_sampler ends it with its group."""
    global _sampler
    every = gpu_sample_interval()
    smi = shutil.which("nvidia-smi")
    if smi is None or every <= 0 or _sampler is not None:
        return None
    out = RunDir(ctx.run_dir).gpu_samples(ctx.job_id or "none", node_name())
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p))
    try:
        _sampler = subprocess.Popen(
            [sys.executable, "-m", "launcher.runtime.telemetry", "--out", str(out), "--every", str(every),
             "--parent", str(os.getpid()), "--nvidia-smi", smi],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
            start_new_session=True)
    except OSError as exc:
        log(f"GPU sampler not started: {exc.strerror or exc}")
        return None
    return _sampler


def stop_gpu_sampler() -> None:
    """SIGTERM to the sampler's group (it then ends the nvidia-smi it waits on, which runs
    in a group of its own), SIGKILL to the group after 5 s."""
    global _sampler
    if _sampler is not None and _sampler.poll() is None:
        _signal_group(_sampler.pid, signal.SIGTERM)
        try:
            _sampler.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _signal_group(_sampler.pid, signal.SIGKILL)
    _sampler = None


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # SystemExit unwinds through run_bounded, which kills the nvidia-smi in flight.
    raise SystemExit(0)


def _append(path: Path) -> IO[str]:
    """`path` opened to append to, created if missing: a regular file only (a FIFO there
    would hold the sampler)."""
    return os.fdopen(open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW), "a",
                     encoding="utf-8")


def sample_gpus(out: Path, every: float, parent: int, smi: str) -> int:
    """Append one CSV row per GPU every `every` seconds while `parent` lives."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists():
        with _append(out) as f:
            f.write(GPU_HEADER + "\n")
    failures = 0
    while os.getppid() == parent:
        began_at = time.time()
        try:
            # A hung GPU can hang nvidia-smi: the bound ends it, with whatever it started.
            proc = run_bounded([smi, f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"],
                               timeout_s=max(every, 5.0))
        except (OSError, subprocess.SubprocessError):
            proc = None
        if proc is not None and proc.returncode == 0:
            failures = 0
            stamp = f"{began_at:.3f}"
            rows = [f"{stamp},{','.join(x.strip() for x in line.split(','))}"
                    for line in proc.out.splitlines() if line.strip()]
            with _append(out) as f:
                f.write("".join(row + "\n" for row in rows))
        else:
            failures += 1
            if failures >= GPU_FAILURES:
                return 1
        time.sleep(max(0.0, every - (time.time() - began_at)))
    return 0


# --- collection, after the start -------------------------------------------------------------


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


def _own(records: list[dict | None], job_id: str, restart: int) -> list[dict]:
    """The records of this start."""
    return [r for r in records
            if r is not None and type(r.get("restart")) is int and r.get("restart") == restart
            and str(r.get("job_id")) == str(job_id)]


def _progress(records: list[dict], time_key: str, step_key: str) -> list[tuple[float, int]]:
    return [(t, s) for x in records
            if (t := _number(x.get(time_key))) is not None
            and type(s := x.get(step_key)) is int and 0 <= s < 2**63]


def start_summary(run_dir: str | os.PathLike, job_id: str, restart: int) -> dict[str, Any]:
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
    lasts = _progress(beats, "time", "step") + _progress(ranks, "last_time", "last_step")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.runtime.telemetry",
                                     description="Sample this node's GPUs into a CSV file while a process lives.")
    parser.add_argument("--out", required=True)
    parser.add_argument("--every", type=float, default=DEFAULT_GPU_SAMPLE_S)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--nvidia-smi", default="nvidia-smi")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    return sample_gpus(Path(args.out), max(args.every, 0.5), args.parent, args.nvidia_smi)


if __name__ == "__main__":
    sys.exit(main())
