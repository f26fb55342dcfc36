"""Graceful stop requests: a signal sets a flag, ranks agree at a step boundary.

The handler does nothing but record the signal and when it came (no I/O, no
collectives: it may run in the middle of an all_reduce; :mod:`.stopflag` keeps what it
records). :func:`should_stop` is a collective that every rank calls at the same step
boundary; it returns True on every rank, at the same step, as soon as any rank was
signalled. It is also the loop's heartbeat (:mod:`.heartbeats`): before the collective, so a rank that never reaches it
is the one whose heartbeat stops.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Any, Callable

from launcher.rundir.rankcontext import bare_signal_name, context, log
from launcher.runtime import heartbeats, stopflag
from launcher.runtime.distributed import all_reduce_max

_agreed_signum: int | None = None   # largest signal number any rank reported at the last should_stop
_previous: dict[int, Any] = {}


def _resolve(name: str) -> signal.Signals:
    try:
        return signal.Signals["SIG" + bare_signal_name(name)]
    except KeyError:
        raise ValueError(f"unknown signal name {name!r} in GLAUNCH_STOP_SIGNALS") from None


def install_stop_handler(signals: list[str] | tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Install the stop handler for ``signals`` (default: GLAUNCH_STOP_SIGNALS, else USR2,TERM).

    Replaces whatever handler was there before (submitit's USR2 handler, Lightning's
    SIGTERM handler): ours wins, the old ones are kept only for :func:`uninstall_stop_handler`.
    Must run in the main thread; elsewhere it logs a warning and installs nothing.
    Returns the names of the signals now handled (e.g. ``("SIGUSR2", "SIGTERM")``).

    The script's call also tells the watchdog that this rank reports its steps (the flag is
    read only by :func:`should_stop`, the loop's heartbeat): :func:`heartbeats.announce`.
    """
    heartbeats.announce()
    return take_stop_signals(signals)


def take_stop_signals(signals: list[str] | tuple[str, ...] | None = None,
                      handler: Callable[[int, FrameType | None], None] = stopflag.handler) -> tuple[str, ...]:
    """:func:`install_stop_handler` without the announcement: the task's own call, before
    the script runs, says nothing of the script (`handler`: the task's, :func:`early_stop`)."""
    names = tuple(signals) if signals is not None else context().stop_signals
    sigs = [_resolve(n) for n in names]
    if threading.current_thread() is not threading.main_thread():
        log("stop handler not installed: not in the main thread")
        return ()
    for sig in sigs:
        old = signal.signal(sig, handler)
        if old is not stopflag.handler and old is not early_stop:
            _previous.setdefault(int(sig), old)
    return tuple(s.name for s in sigs)


def early_stop(signum: int, frame: FrameType | None) -> None:
    """The stop handler a rank holds before its script takes up the runtime: a stop request
    (the flag should_stop reads), but SIGTERM to a rank whose script has not announced itself
    (:func:`heartbeats.announce`: an unchanged script, or one still before its first step)
    ends it, as SIGTERM ends a script under srun alone: a cancel, a preemption or the time
    limit ends it at once, not at Slurm's SIGKILL KillWait later. (A script's own SIGTERM
    handler, installed as it starts, replaces this one.)"""
    if signum == signal.SIGTERM and not heartbeats.announced():
        end_as_without_handler(signum)
        return
    stopflag.handler(signum, frame)


def end_as_without_handler(signum: int) -> None:
    """This process ended by `signum` as it would be with no handler of ours: the default
    action put back, and the signal sent to it again."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def uninstall_stop_handler() -> None:
    """Put back the handlers that :func:`install_stop_handler` replaced."""
    for signum, old in list(_previous.items()):
        signal.signal(signum, old if old is not None else signal.SIG_DFL)
        del _previous[signum]


def request_stop(signum: int | None = None) -> None:
    """Ask for a stop from code (same effect as receiving a stop signal on this rank)."""
    stopflag.handler(signum if signum is not None else 0, None)


def reset_stop() -> None:
    """Forget any stop request (after a stop was handled, or between tests)."""
    global _agreed_signum
    stopflag.clear()
    _agreed_signum = None


def stop_requested() -> bool:
    """This rank's own flag, no communication. Use :func:`should_stop` to decide."""
    return stopflag.raised()


def should_stop(step: int | None = None, total: int | None = None) -> bool:
    """Collective: True on every rank once any rank was asked to stop.

    Call it on every rank at the same step boundary (an all_reduce(MAX) of the flags;
    without torch.distributed it is just the local flag), once per step: it records the
    step this rank finished (`step` of `total`; without `step` the calls are counted).
    """
    global _agreed_signum
    heartbeats.heartbeat(step, total)
    flag, signum = all_reduce_max([1 if stopflag.raised() else 0, stopflag.first_signal() or 0])
    heartbeats.note_synced()
    if flag:
        _agreed_signum = signum or _agreed_signum
        heartbeats.note_stop_decided()
    return bool(flag)


def received_signal() -> str | None:
    """Name of the first stop signal this rank received (``'SIGUSR2'``), or None."""
    return stopflag.signal_name(stopflag.first_signal())


def stop_signal() -> str | None:
    """The signal behind the stop all ranks agreed on at the last :func:`should_stop`.

    Every rank gets the same answer (the largest signal number any rank saw), so rank 0
    can record why the run stopped even when only another rank was signalled. Falls back
    to this rank's own signal; None for a stop requested from code.
    """
    return stopflag.signal_name(_agreed_signum) or stopflag.signal_name(stopflag.first_signal())
