"""What each torchrun worker runs (``python -m launcher.runtime.worker ARGS...``: torchrun
``--module``, from launcher.runtime.task): the run's entry point, as ``python`` would run it,
with ARGS as its arguments, once the worker has taken the time limit's warning and armed its
stack dump.

- It takes the time limit's warning (the stop signals less those that end a process:
  :func:`worker_stop_signals`): a warning that comes before the script installs glaunch's
  handler still counts, and a script without glaunch's runtime is not ended by the warning
  the node's agent passes on to its workers (the signal's default action would end it, and
  the start with it, as a crash). A script with the runtime installs its own handler over
  this one; one with its own handler for the signal replaces it. SIGTERM keeps its default:
  a script without the runtime ends on it as under torchrun alone, and a preemption ends
  the start as stopped.
- It arms the rank's stack dump (launcher.runtime.stackdump), so the watchdog gets the
  stacks of a script that never imports glaunch.

The entry point is read from the run's task.json (the run directory in GLAUNCH_RUN_DIR, as the
agent's environment gives it). Imports no torch.
"""

from __future__ import annotations

import os
import signal
import sys

from launcher.rundir.rankcontext import RuntimeConfigError, bare_signal_name, context
from launcher.rundir.taskspec import TaskSpecError, read_task_spec
from launcher.runtime import stackdump
from launcher.rundir import envnames
from launcher.runtime.stop import request_stop, take_stop_signals
from launcher.runtime.task import early_stop_signals, run_as_main


# Signals a worker leaves to their default action (or the script's own handler).
ENDING_SIGNALS = frozenset({"TERM", "INT", "HUP", "QUIT"})


def worker_stop_signals(signals: tuple[str, ...]) -> tuple[str, ...]:
    """Pure: the stop signals a worker takes before its script runs: a rank's
    (task.early_stop_signals) less those that end a process."""
    return tuple(name for name in early_stop_signals(signals)
                 if bare_signal_name(name) not in ENDING_SIGNALS)


def stop_before_start(name: str, taken: tuple[str, ...]) -> int | None:
    """Pure: the signal number of the stop the node's agent took before this worker existed
    (`name`, e.g. "USR2"), where it is one of the stop signals this worker takes; else None."""
    if not name or name not in {bare_signal_name(n) for n in taken}:
        return None
    try:
        return int(signal.Signals[f"SIG{name}"])
    except KeyError:
        return None


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    try:
        ctx = context()
        spec = read_task_spec(ctx.run_dir)
    except (TaskSpecError, RuntimeConfigError) as exc:
        sys.exit(f"glaunch: this worker does not start: {exc}")
    taken = take_stop_signals(worker_stop_signals(ctx.stop_signals))
    early = stop_before_start(os.environ.get(envnames.STOPPED_BEFORE_WORKERS, ""), taken)
    if early is not None:
        request_stop(early)
    stackdump.arm_stack_dump(ctx.run_dir, ctx.rank)
    if spec.module is None and not sys.flags.safe_path and sys.path[:1] == [os.getcwd()]:
        # `python -m` put the working directory first; `python SCRIPT` puts only the
        # script's folder there (run_as_main does).
        del sys.path[0]
    run_as_main(spec, args)


if __name__ == "__main__":
    main()
