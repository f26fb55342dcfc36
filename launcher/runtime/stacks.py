"""Every rank's Python stack when its start hangs (launcher.jobcontrol.watchdog asks).

A rank registers faulthandler at its start (:func:`arm_stack_dump`, called by the task):
DUMP_SIGNAL then writes every thread's stack into the rank's own file, from C, even while
the interpreter is stuck in a collective or a sleep. The watchdog sends the signal to
every rank (on Slurm through ``scancel --signal``, which reaches every node) and copies
what each rank wrote to ``logs/stack-JOB_RESTART_RANK.txt``; for a rank on its own host
it uses ``py-spy dump`` instead when py-spy is on PATH (native frames too).
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from launcher.processes import run_bounded
from launcher.rundir.files import atomic_write_text, open_regular
from launcher.rundir.layout import RunDir

# SIGWINCH asks for a stack: nothing in a batch job uses it (no terminal), and a process
# that did not register it ignores it, so it can go to every process of a job step. SIGUSR1
# is Lightning's requeue signal, SIGUSR2 and SIGTERM are glaunch's stop signals.
DUMP_SIGNAL = signal.SIGWINCH
DUMP_WAIT_S = 10.0          # for every rank's faulthandler to write its stack
COMMAND_TIMEOUT_S = 30


def arm_stack_dump(run_dir: str | os.PathLike, rank: int) -> bool:
    """On a rank, at its start: DUMP_SIGNAL writes every thread's Python stack into the
    rank's dump file (RunDir.stack_dump), from C, even while the interpreter is stuck in a
    collective or a sleep. A process forked from the rank (a data loader's worker) does
    not write there. False when the file cannot be opened."""
    path = RunDir(run_dir).stack_dump(rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Kept open: faulthandler writes to its descriptor. Regular files only: a FIFO
        # there would hold the rank at its start.
        dump = os.fdopen(open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW), "w",
                         encoding="utf-8")
    except OSError:
        return False
    faulthandler.register(DUMP_SIGNAL, file=dump, all_threads=True, chain=False)
    if _armed.get("file") is None:
        os.register_at_fork(after_in_child=lambda: faulthandler.unregister(DUMP_SIGNAL))
        atexit.register(disarm_stack_dump)
    else:
        _armed["file"].close()
    _armed["file"], _armed["path"] = dump, path
    return True


def disarm_stack_dump() -> None:
    """At the rank's end: the dump file closed, and removed when no stack was written to it
    (a run that never hung leaves no empty stack-dumps/ behind)."""
    dump, path = _armed.pop("file", None), _armed.pop("path", None)
    if dump is None:
        return
    faulthandler.unregister(DUMP_SIGNAL)
    try:
        empty = os.fstat(dump.fileno()).st_size == 0
        dump.close()
        if empty and path is not None:
            path.unlink()
            path.parent.rmdir()          # only while empty: other ranks' dumps stay
    except (OSError, ValueError):
        pass


_armed: dict[str, Any] = {}     # the open dump file, for as long as the process lives


def armed() -> bool:
    """Whether this process registered its stack dump."""
    return _armed.get("file") is not None


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
            text = run_command([pyspy, "dump", "--pid", str(pid)])
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


def run_command(words: list[str], *, timeout_s: float | None = None,
                env: Mapping[str, str] | None = None, say: Callable[[str], None] | None = None) -> str | None:
    """A command's stdout (bytes that are not UTF-8 as U+FFFD: a stack names files and
    strings of any encoding); None (and a line through `say`) when it fails or takes longer
    than `timeout_s` (default COMMAND_TIMEOUT_S, read when called), which ends it with every
    process it started (`say`: default `log`)."""
    say = say or log
    timeout_s = COMMAND_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        proc = run_bounded(words, timeout_s=timeout_s, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        say(f"{words[0]}: {exc}")
        return None
    if proc is None:
        say(f"{' '.join(words[:2])}: no answer within {timeout_s:g} s")
        return None
    if proc.returncode != 0:
        say(f"{' '.join(words[:2])}: exit status {proc.returncode}: {proc.err.strip()[:300]}")
        return None
    return proc.out


def log(message: str) -> None:
    print(f"glaunch: watchdog: {message}", file=sys.stderr, flush=True)
