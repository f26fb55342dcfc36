"""Lightning's own save at the time limit's warning, moved to a step boundary, for a plain
Lightning script run by glaunch.

Lightning's SLURM auto-requeue saves a checkpoint inside its signal handler (SIGUSR1 by
default), and the save ends in a barrier of every rank. Python runs a handler wherever the
rank happens to be when the signal comes: a rank warned in its forward pass enters that
barrier while a peer waits in the step's gradient all-reduce, the two collectives do not
match, and the ranks wait on each other until the time limit ends the step, with nothing
saved.

Lightning adds the callbacks that installed packages offer through the entry point group
``lightning.pytorch.callbacks_factory`` (``pytorch_lightning.callbacks_factory`` for the
standalone package) to every Trainer. glaunch offers :class:`StepBoundaryWarning` there: in
``on_train_start`` it takes over the handler Lightning registered for its requeue signal, so
that the signal is only noted; after each training batch the ranks agree (an all-reduce of
one flag) whether any of them was warned, and then every rank runs Lightning's handler at
that same boundary. It does nothing outside a glaunch run (no ``GLAUNCH_RUN_DIR``), nor
where Lightning registered no requeue handler: a script with glaunch's own callback turns
Lightning's auto-requeue off and takes the warning itself.
"""

from __future__ import annotations

import importlib
import os
import signal
from typing import Any

from launcher.rundir import envnames


def lightning_callbacks() -> list[Any]:
    """The entry point for ``lightning.pytorch``."""
    return _offered("lightning.pytorch")


def pytorch_lightning_callbacks() -> list[Any]:
    """The entry point for the standalone ``pytorch_lightning``."""
    return _offered("pytorch_lightning")


def _offered(package: str) -> list[Any]:
    """The callback, built on `package`'s Callback, in a glaunch run; nothing elsewhere."""
    if not os.environ.get(envnames.RUN_DIR):
        return []
    return [_step_boundary_warning(importlib.import_module(package).Callback)()]


def requeue_signal(trainer: Any) -> int | None:
    """The signal Lightning's SLURM auto-requeue saves on, where it is on; else None."""
    environment = getattr(trainer.strategy, "cluster_environment", None)
    if not getattr(environment, "auto_requeue", False):
        return None
    signum = getattr(environment, "requeue_signal", None)
    return int(signum) if signum is not None else None


def _step_boundary_warning(base: type) -> type:
    class StepBoundaryWarning(base):
        """Lightning's requeue handler, run by every rank after the same training batch."""

        def __init__(self) -> None:
            super().__init__()
            self.signum: int | None = None
            self.lightning_handler: Any = None
            self.warned = False

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            signum = requeue_signal(trainer)
            handler = signal.getsignal(signum) if signum is not None else None
            if signum is None or not callable(handler) or handler == self.note:
                return
            self.signum, self.lightning_handler = signum, handler
            signal.signal(signum, self.note)

        def note(self, signum: int, frame: Any) -> None:
            self.warned = True

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if self.lightning_handler is None:
                return
            if trainer.strategy.reduce_boolean_decision(self.warned, all=False):
                self.warned = False
                self.lightning_handler(self.signum, None)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            if self.signum is not None and signal.getsignal(self.signum) == self.note:
                signal.signal(self.signum, self.lightning_handler)
            self.signum, self.lightning_handler = None, None

    return StepBoundaryWarning
