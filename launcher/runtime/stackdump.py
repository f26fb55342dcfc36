"""This rank's stack dump: faulthandler registered for DUMP_SIGNAL at the rank's start.

The task arms it before the entry point runs (a torchrun worker, at its first heartbeat):
the signal then writes every thread's Python stack into the rank's dump file
(RunDir.stack_dump), from C, even while the interpreter is stuck in a collective or a sleep.
The watchdog on the batch host sends the signal and collects what each rank wrote
(launcher.rundir.rankstacks).
"""

from __future__ import annotations

import atexit
import faulthandler
import os
from typing import Any

from launcher.rundir.files import open_regular
from launcher.rundir.layout import RunDir
from launcher.rundir.rankstacks import DUMP_SIGNAL


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
