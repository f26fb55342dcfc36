"""This rank's stop flag: what a stop signal (or ``request_stop``) records, and when.

Set from a signal handler, which may run in the middle of an all_reduce: nothing here
does I/O or communicates, it only assigns. Installing the handler and agreeing on a
stop across the ranks is :mod:`launcher.runtime.stop`; the rank's telemetry at exit
(:mod:`launcher.runtime.heartbeats`) reads when the stop was asked for.
"""

from __future__ import annotations

import signal
import time
from types import FrameType

_flag = False                       # set by the handler (or request_stop) on this rank
_signum: int | None = None          # first signal received on this rank
_requested_at: float | None = None  # when this rank was first asked to stop


def handler(signum: int, frame: FrameType | None) -> None:
    """The signal handler: record the request (the first signal, the first time)."""
    global _flag, _signum, _requested_at
    _flag = True
    if _signum is None:
        _signum = signum
    if _requested_at is None:
        _requested_at = time.time()


def clear() -> None:
    """Forget the request."""
    global _flag, _signum, _requested_at
    _flag = False
    _signum = None
    _requested_at = None


def raised() -> bool:
    """Whether this rank was asked to stop."""
    return _flag


def first_signal() -> int | None:
    """The first signal that asked this rank to stop (0 for a request from code), or None."""
    return _signum


def requested_at() -> float | None:
    """When this rank was first asked to stop (epoch seconds), or None."""
    return _requested_at


def signal_name(signum: int | None) -> str | None:
    """``'SIGUSR2'`` for a signal number; None for none (or 0, a request from code)."""
    if not signum:
        return None
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)
