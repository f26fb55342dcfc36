"""What each rank measures of its start: its peak memory, and its node's GPUs.

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

How a start's files reach run.json (folded by the job controller at the start's end):
:mod:`launcher.rundir.startsummary`.

Standard library only: it runs on every rank.
"""

from __future__ import annotations

import argparse
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
from launcher.rundir.files import open_regular
from launcher.rundir.layout import RunDir
from launcher.rundir.rankcontext import RankContext, log, node_name, seconds_from_env

GB = 1e9                   # the planner's gigabyte
DEFAULT_GPU_SAMPLE_S = 5.0
GPU_QUERY = "index,uuid,utilization.gpu,utilization.memory,memory.used,memory.total"
GPU_HEADER = "time,index,uuid,utilization_gpu_pct,utilization_memory_pct,memory_used_mib,memory_total_mib"
GPU_FAILURES = 5           # consecutive failed nvidia-smi calls before the sampler gives up

_sampler: subprocess.Popen | None = None


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
