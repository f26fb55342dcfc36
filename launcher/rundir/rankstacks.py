"""Every rank's Python stack when its start hangs: the signal that asks for it, and what
the watchdog (launcher.jobcontrol.watchdog) does to collect it.

A rank registers faulthandler for DUMP_SIGNAL at its start (launcher.runtime.stackdump,
armed by the task): the signal then writes every thread's stack into the rank's own file
(RunDir.stack_dump), from C, even while the interpreter is stuck in a collective or a
sleep. The watchdog sends the signal to every rank (on Slurm through ``scancel
--signal``, which reaches every node) and copies what each rank wrote to
``logs/stack-JOB_RESTART_RANK.txt`` (:func:`write_stacks`), each dump read bounded; for a
rank on its own host it uses ``py-spy dump`` instead when py-spy is on PATH (native
frames too).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Protocol

from launcher.processes import run_command
from launcher.rundir.files import atomic_write_text, open_regular
from launcher.rundir.layout import RunDir

# SIGWINCH asks for a stack: nothing in a batch job uses it (no terminal), and a process
# that did not register it ignores it, so it can go to every process of a job step. SIGUSR1
# is Lightning's requeue signal, SIGUSR2 and SIGTERM are glaunch's stop signals.
DUMP_SIGNAL = signal.SIGWINCH
DUMP_WAIT_S = 10.0          # for every rank's faulthandler to write its stack


class Ranks(Protocol):
    """How the watchdog reaches the ranks of a step."""

    def signal(self, signum: int) -> None: ...

    def end(self) -> None: ...


def write_stacks(run_dir: Path, job_id: str, restart: int, records: Mapping[int, Mapping[str, Any]],
                 ranks: Ranks, *, wait_s: float = DUMP_WAIT_S) -> list[str]:
    """Every rank's stack into logs/stack-JOB_RESTART_RANK.txt: py-spy for ranks on this
    host when it is on PATH, faulthandler (DUMP_SIGNAL) for the others. Returns the files
    written, relative to the run directory."""
    rd = RunDir(run_dir)
    here, pyspy = socket.gethostname(), shutil.which("py-spy")
    done: dict[int, str] = {}
    for rank, record in sorted(records.items()):
        pid = record.get("pid")
        if pyspy and record.get("host") == here and isinstance(pid, int) and pid > 1:
            text = run_command([pyspy, "dump", "--pid", str(pid)], say=log)
            if text:
                done[rank] = _write_stack(rd, job_id, restart, rank, record, "py-spy dump", text)
    pending = {rank: _size(rd.stack_dump(rank)) for rank in records if rank not in done}
    if pending:
        ranks.signal(DUMP_SIGNAL)
        deadline, sizes = time.monotonic() + wait_s, dict(pending)
        while time.monotonic() < deadline:
            time.sleep(0.5)
            now_sizes = {rank: _size(rd.stack_dump(rank)) for rank in pending}
            # Written and no longer growing: faulthandler has finished.
            if all(now_sizes[r] > pending[r] and now_sizes[r] == sizes[r] for r in pending):
                break
            sizes = now_sizes
        for rank, offset in pending.items():
            try:
                with os.fdopen(open_regular(rd.stack_dump(rank)), "rb") as f:
                    f.seek(offset)
                    text = f.read(4 << 20).decode("utf-8", "replace")
            except OSError:
                text = ""
            if text.strip():
                done[rank] = _write_stack(rd, job_id, restart, rank, records[rank], "faulthandler", text)
    return [done[rank] for rank in sorted(done)]


def _write_stack(rd: RunDir, job_id: str, restart: int, rank: int, record: Mapping[str, Any], how: str,
                 text: str) -> str:
    path = rd.stack_file(job_id, restart, rank)
    head = (f"# rank {rank} on {record.get('node')} (pid {record.get('pid')}), last step {record.get('step')}, "
            f"state {record.get('state')}: {how}\n")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, head + text)
    except OSError as exc:
        log(f"stack of rank {rank} not written to {path}: {exc.strerror or exc}")
    return os.path.relpath(path, rd.path)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def log(message: str) -> None:
    """One line on stderr, as the watchdog says it."""
    print(f"glaunch: watchdog: {message}", file=sys.stderr, flush=True)
