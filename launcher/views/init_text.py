"""What `glaunch init` prints: the files it wrote and the commands that run them."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from launcher.views.text import printable


def initialized(written: Sequence[Path]) -> str:
    """`written`: the starter's files, all in one folder."""
    folder = written[0].parent
    go = "" if folder == Path(".") else f"cd {printable(shlex.quote(str(folder)))} && "
    names = ", ".join(printable(path.name) for path in written)
    return (f"wrote {names} in {printable(folder)}\n"
            f"run it on this machine:  {go}glaunch submit exp.yaml\n"
            f"or on a Slurm cluster:   {go}glaunch submit exp.yaml --site NAME   (glaunch sites list)")
