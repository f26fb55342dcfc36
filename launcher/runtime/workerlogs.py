"""Under torchrun, each worker's output is copied into its node's task log as it grows.

The node's agent has torchrun write every worker's stdout and stderr to files of their own
(launch.worker_log_args), so that `glaunch logs --rank N` shows rank N alone. What read a
node's task log before (the console, `entrypoint.progress`, `logs`, the SSH mirror) must
still find its workers' lines there: this copies them, whole lines at a time and as
written, to the agent's own stdout and stderr, which are the node's task log. torchrun's
own `--tee` would do the same with ``[default0]:`` before every line, which a progress
pattern anchored at the start of a line would then never match.

Standard library only: it runs in the agent's process on the node.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import BinaryIO, Callable

from launcher.rundir.files import open_regular
from launcher.rundir.layout import RunDir

POLL_S = 0.2
READ_PER_POLL = 1 << 20         # bytes of one file per poll: a flood is caught up over polls
MAX_PARTIAL = 1 << 16           # an unfinished line longer than this is handed on as it is


class WorkerLogCopier:
    """Follows every worker log under one agent's --log-dir; `poll` copies what each
    gained, in whole lines, to `out` (stdout.log) or `err` (stderr.log)."""

    def __init__(self, log_dir: Path, out: BinaryIO, err: BinaryIO) -> None:
        self.log_dir, self.out, self.err = log_dir, out, err
        self.offsets: dict[Path, int] = {}
        self.partial: dict[Path, bytes] = {}

    def poll(self) -> None:
        for path in sorted(self.log_dir.glob("*/attempt_*/*/std*.log")):
            if path.name in ("stdout.log", "stderr.log"):
                self._copy(path, self.out if path.name == "stdout.log" else self.err)

    def finish(self) -> None:
        """Copy the rest, unfinished last lines included."""
        self.poll()
        for path, rest in self.partial.items():
            if rest:
                self._write(self.out if path.name == "stdout.log" else self.err, rest + b"\n")
        self.partial.clear()

    def _copy(self, path: Path, sink: BinaryIO) -> None:
        try:
            fd = open_regular(path)
        except OSError:
            return
        with os.fdopen(fd, "rb") as f:
            f.seek(self.offsets.get(path, 0))
            data = f.read(READ_PER_POLL)
        if not data:
            return
        self.offsets[path] = self.offsets.get(path, 0) + len(data)
        whole, newline, rest = (self.partial.get(path, b"") + data).rpartition(b"\n")
        if len(rest) > MAX_PARTIAL:
            whole, newline, rest = whole + newline + rest, b"\n", b""
        self.partial[path] = rest
        if newline:
            self._write(sink, whole + newline)

    @staticmethod
    def _write(sink: BinaryIO, data: bytes) -> None:
        try:
            sink.write(data)
            sink.flush()
        except (OSError, ValueError):
            pass


def copying(run_dir: str, job_id: str, restart: int, node: int,
            out: BinaryIO, err: BinaryIO) -> tuple[WorkerLogCopier, Callable[[], None]]:
    """Start copying one agent's worker logs in a daemon thread; returns the copier and
    `stop`, which ends the thread and copies what is left."""
    copier = WorkerLogCopier(RunDir(run_dir).worker_log_dir(job_id, restart, node), out, err)
    done = threading.Event()

    def loop() -> None:
        while not done.wait(POLL_S):
            copier.poll()

    thread = threading.Thread(target=loop, name="glaunch-worker-logs", daemon=True)
    thread.start()

    def stop() -> None:
        done.set()
        thread.join(timeout=5)
        copier.finish()

    return copier, stop
