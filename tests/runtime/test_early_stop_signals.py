"""The stop signals a rank takes before its script runs: all of GLAUNCH_STOP_SIGNALS but
Lightning's SIGUSR1, the time limit's warning for a plain Lightning script, whose
SLURMEnvironment registers its save-and-requeue handler only where SIGUSR1 has none."""

from __future__ import annotations

import signal

import pytest

from launcher.runtime.stop import take_stop_signals
from launcher.runtime.task import early_stop_signals


@pytest.mark.parametrize("signals, taken", [
    (("USR1", "USR2", "TERM"), ("USR2", "TERM")),     # a plain Lightning script's plan
    (("SIGUSR1", "TERM"), ("TERM",)),
    (("USR2", "TERM"), ("USR2", "TERM")),             # every other plan
    ((), ()),
])
def test_a_rank_leaves_lightning_s_warning_signal_to_lightning(signals, taken):
    assert early_stop_signals(signals) == taken


def test_sigusr1_has_no_handler_when_the_script_starts():
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)}
    try:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        take_stop_signals(early_stop_signals(("USR1", "USR2", "TERM")))
        # Lightning's SignalConnector sees SIGUSR1 free and registers its own handler.
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
        assert callable(signal.getsignal(signal.SIGUSR2))
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
