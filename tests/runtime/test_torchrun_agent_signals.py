"""A stop signal that reaches a node's torchrun agent before its workers exist (the time
limit's warning or a preemption while torch is still being imported on a loaded node): the
warning is kept for the workers to come, who start with the stop asked; SIGTERM ends the
agent at once. Before, submitit's handler (or the default action) ended the agent, and the
start was read as a crash."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

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


# A task that handles the warning in Python, done; with "ignore", as the task leaves it.
FINISHED = """
import signal, sys
from launcher.runtime import task
signal.signal(signal.SIGUSR2, lambda *_: None)
if sys.argv[1] == "ignore":
    task.ignore_warnings_from_now()
print("done", flush=True)
"""


def exit_under_warnings(mode: str) -> int:
    """The task's exit status while the time limit's warning keeps coming as it shuts down."""
    task = subprocess.Popen([sys.executable, "-c", FINISHED, mode], stdout=subprocess.PIPE, text=True)
    assert task.stdout is not None and task.stdout.readline() == "done\n"
    deadline = time.monotonic() + 30
    while task.poll() is None and time.monotonic() < deadline:
        try:
            os.kill(task.pid, signal.SIGUSR2)
        except ProcessLookupError:
            break
        time.sleep(0.0002)
    return task.wait(timeout=30)


def test_a_warning_while_a_finished_task_shuts_down_does_not_end_it_as_a_crash():
    """Python puts back each handled signal's default action as it shuts down: a warning then
    ended a torchrun agent whose workers had completed (CI: "a rank killed by SIGUSR2")."""
    assert -signal.SIGUSR2 in [exit_under_warnings("plain") for _ in range(3)]
    assert [exit_under_warnings("ignore") for _ in range(3)] == [0, 0, 0]
