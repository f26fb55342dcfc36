"""A stop signal that reaches a node's torchrun agent before its workers exist (the time
limit's warning or a preemption while torch is still being imported on a loaded node): the
warning is kept for the workers to come, who start with the stop asked; SIGTERM ends the
agent at once. Before, submitit's handler (or the default action) ended the agent, and the
start was read as a crash."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from launcher.runtime.worker import stop_before_start

AGENT = """
import os, signal, time
from launcher.runtime import task

for signum in (signal.SIGUSR2, signal.SIGUSR1, signal.SIGTERM):
    signal.signal(signum, task._stop_before_workers)
os.kill(os.getpid(), signal.SIGUSR2)
os.kill(os.getpid(), signal.SIGUSR2)
os.kill(os.getpid(), signal.SIGUSR1)
print("noted", [int(s) for s in task.STOPS_RECEIVED], [int(s) for s in task.UNPASSED], flush=True)
# Once torchrun runs, a warning reaches the workers it starts later through their environment.
task._forward_to_children(signal.SIGUSR2, None)
print(os.environ.get("GLAUNCH_STOPPED_BEFORE_WORKERS"), flush=True)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(5)
print("outlived SIGTERM", flush=True)
"""


def test_the_agent_keeps_a_warning_for_its_workers_and_ends_on_sigterm():
    done = subprocess.run([sys.executable, "-c", AGENT], capture_output=True, text=True, timeout=60)
    assert done.stdout == f"noted [{int(signal.SIGUSR2)}] [{int(signal.SIGUSR1)}]\nUSR2\n", done.stdout + done.stderr
    assert done.returncode == -signal.SIGTERM


@pytest.mark.parametrize("name, taken, stop", [
    ("USR2", ("SIGUSR2",), signal.SIGUSR2), ("USR2", ("SIGUSR1", "SIGUSR2"), signal.SIGUSR2),
    ("", ("SIGUSR2",), None),                    # none came
    ("USR2", (), None),                          # this worker takes no stop signal (not the main thread)
    ("USR1", ("SIGUSR2",), None),                # one the worker leaves to the script (Lightning's USR1)
    ("TERM", ("SIGUSR2",), None), ("NOSUCH", ("NOSUCH",), None), ("USR2;rm", ("SIGUSR2",), None),
])
def test_a_worker_starts_with_the_stop_its_agent_took_before_it_existed(name, taken, stop):
    assert stop_before_start(name, taken) == stop
