"""The stop signals a rank takes before its script runs: all of GLAUNCH_STOP_SIGNALS but
Lightning's SIGUSR1, the time limit's warning for a plain Lightning script, whose
SLURMEnvironment registers its save-and-requeue handler only where SIGUSR1 has none."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.runtime.stop import take_stop_signals
from launcher.runtime.task import early_stop_signals

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("signals, taken", [
    (("USR1", "USR2", "TERM"), ("USR2",)),            # a plain Lightning script's plan: SIGTERM is Lightning's
    (("SIGUSR1", "SIGTERM"), ()),
    (("USR2", "TERM"), ("USR2", "TERM")),             # every other plan
    ((), ()),
])
def test_a_rank_leaves_lightning_s_signals_to_lightning(signals, taken):
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


EARLY = """
import os, signal, sys, time
from launcher.runtime import heartbeats, stopflag
from launcher.runtime.stop import early_stop, take_stop_signals
take_stop_signals(("USR2", "TERM"), early_stop)
if sys.argv[1] == "announced":
    heartbeats.announce()
os.kill(os.getpid(), signal.SIGUSR2)          # the time limit's warning: a stop request, never an end
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.5)
print("alive", stopflag.raised(), flush=True)
"""


@pytest.mark.parametrize("announced, ends", [(False, True), (True, False)])
def test_sigterm_ends_a_rank_whose_script_never_took_up_the_runtime(announced, ends):
    """Before its script announces itself a rank's SIGTERM ends it, as under srun alone
    (a cancel, a preemption or the time limit, at once rather than at Slurm's SIGKILL); once
    it announced, SIGTERM is the stop request its loop's should_stop reads."""
    proc = subprocess.run([sys.executable, "-c", EARLY, "announced" if announced else "plain"],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)))
    if ends:
        assert proc.returncode == -signal.SIGTERM and "alive" not in proc.stdout, (proc.returncode, proc.stderr)
    else:
        assert proc.returncode == 0 and proc.stdout.strip() == "alive True", (proc.stdout, proc.stderr)
