"""Run-scoped values: `${run:dir}`, `${run:id}`, `${run:checkpoint_dir}` and `${run:restart}`
in `entrypoint.args`, `entrypoint.resume_args` and `env` values.

They are not known, or not final, when the run is submitted: the run directory of a
remote run is the cluster's, and the start number grows with every restart, requeue,
resubmission and `glaunch resume`. So the configuration keeps them as written (see
launcher.config.interpolate.scan), task.json carries them as text, and each start fills
them in on the node from what that start's environment says (`GLAUNCH_RUN_DIR`,
`GLAUNCH_RUN_ID`, `GLAUNCH_CHECKPOINT_DIR`, `GLAUNCH_RESTART`; env.sh and the job set
them) before the entry point runs. Filling in is plain text replacement: the value never
passes through a shell, so a run directory with spaces or quotes is one word of argv.

Both sides use this module: the submit side to check the names, the job side to fill
them in. Standard library only.
"""

from __future__ import annotations

import re
from typing import Mapping, MutableMapping, Sequence

from launcher.rundir import envnames

# Each run-scoped value and the variable of a start's environment that holds it.
SOURCES: dict[str, str] = {
    "dir": envnames.RUN_DIR,
    "id": envnames.RUN_ID,
    "checkpoint_dir": envnames.CHECKPOINT_DIR,
    "restart": envnames.RESTART,
}
NAMES = tuple(SOURCES)
# `${run:NAME}` as written; NAME is checked against NAMES where the configuration is read.
REFERENCE = re.compile(r"\$\{run:([^}]*)\}")
PREFIX = "run:"


def name_problem(name: str) -> str | None:
    """Why `${run:NAME}` names no run-scoped value, or None."""
    if name in SOURCES:
        return None
    return f"${{run:{name}}} is not a run-scoped value (known: {', '.join(NAMES)})"


def mentions(text: str) -> bool:
    """Whether `text` holds a `${run:...}` reference."""
    return REFERENCE.search(text) is not None


def start_values(environ: Mapping[str, str]) -> dict[str, str]:
    """The values for one start, from its environment. The restart number defaults to 0
    (the first start); the others, when unset, are left as written."""
    values = {name: environ[variable] for name, variable in SOURCES.items() if variable in environ}
    values.setdefault("restart", "0")
    return values


def fill(text: str, values: Mapping[str, str]) -> str:
    """`text` with each `${run:NAME}` replaced by its value; a name without one stays as written."""
    return REFERENCE.sub(lambda m: values.get(m.group(1), m.group(0)), text)


def start_args(args: Sequence[str], resume_args: Sequence[str], values: Mapping[str, str],
               follows_earlier_start: bool) -> list[str]:
    """The entry point's arguments for one start: `args`, then `resume_args` when an earlier
    start of the run came before it, each with its run-scoped values filled in."""
    words = list(args) + (list(resume_args) if follows_earlier_start else [])
    return [fill(word, values) for word in words]


def fill_environment(environ: MutableMapping[str, str], names: Sequence[str]) -> None:
    """Fill in the run-scoped values of the variables `names` (the experiment's and the
    site's env keys whose values mention one), in place, from `environ` itself."""
    values = start_values(environ)
    for name in names:
        if name in environ:
            environ[name] = fill(environ[name], values)
