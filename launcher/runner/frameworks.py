"""Which framework's conventions an entry script follows, read from its text at submit.

A Lightning script that does not use glaunch's runtime relies on Lightning's own SLURM
handling: its SLURMEnvironment listens for SIGUSR1, saves an ``hpc_ckpt_N.ckpt`` into the
Trainer's ``default_root_dir``, requeues the job itself (``scontrol requeue``) and, when
the job starts again, resumes from that checkpoint. Such a run's time-limit warning is
SIGUSR1, not glaunch's SIGUSR2 (which would end its ranks unhandled). The requeue is then
Lightning's alone: the job controller finds the job back in the queue, records the start's
end (`requeued`) within KillWait and asks for no second requeue, and the next start counts
it as Slurm's requeue (launcher.jobcontrol.jobstart).

The test is a scan of the script's text, not an import: a line that imports ``lightning``
or ``pytorch_lightning`` and none that imports ``launcher`` (a script using glaunch's
Lightning callback keeps SIGUSR2: the runtime saves and requeues). Only the entry script is
read (a module entry point, or a framework imported by another file of the project, keeps
SIGUSR2). Its first SCAN_LIMIT bytes, as UTF-8 with errors replaced; unreadable: SIGUSR2.
"""

from __future__ import annotations

import re

from launcher.rundir.files import open_regular

SCAN_LIMIT = 1 << 20
DEFAULT_SIGNAL = "USR2"          # glaunch's runtime: a stop request (launcher.runtime.stop)
LIGHTNING_SIGNAL = "USR1"        # Lightning's SLURMEnvironment.requeue_signal default
LIGHTNING_IMPORT = re.compile(r"^[ \t]*(?:import|from)[ \t]+(?:lightning|pytorch_lightning)\b", re.MULTILINE)
LAUNCHER_IMPORT = re.compile(r"^[ \t]*(?:import|from)[ \t]+launcher\b", re.MULTILINE)


def plain_lightning(text: str) -> bool:
    """Pure: the script imports Lightning and not glaunch's runtime."""
    return LIGHTNING_IMPORT.search(text) is not None and LAUNCHER_IMPORT.search(text) is None


def recorded_signal(text: str | None) -> str:
    """The warning signal a run's resolved.yaml recorded (DEFAULT_SIGNAL for none or another)."""
    return LIGHTNING_SIGNAL if text == LIGHTNING_SIGNAL else DEFAULT_SIGNAL


def warning_signal(script: str | None) -> str:
    """The time limit's warning signal for a run of `script` (a path, or None for a module)."""
    text = script_text(script)
    return LIGHTNING_SIGNAL if text is not None and plain_lightning(text) else DEFAULT_SIGNAL


def script_text(script: str | None) -> str | None:
    """The first SCAN_LIMIT bytes of the script as text (errors replaced); None for a module
    entry point or a script that cannot be read."""
    if script is None:
        return None
    try:
        fd = open_regular(script)
    except OSError:
        return None
    with open(fd, "rb") as f:
        return f.read(SCAN_LIMIT).decode("utf-8", errors="replace")
