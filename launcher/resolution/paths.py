"""Paths from the configs and the command line: `~` and `$VAR` expanded with the
submitting environment, made absolute, and checked for text that rendered scripts,
#SBATCH lines and the terminal cannot carry. Pure: the environment is passed in.

A path is named in errors by what gave it: a config key (`checkpoint.dir`, the site's
`runs_root`), an option of the command line (`--runs-dir`), or WORKDIR."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import PurePath

from launcher import shell
from launcher.config.sourcemap import ConfigKeyError
from launcher.errors import ConfigError

# `$$` (a literal `$`, as in env values), `${NAME}` or `$NAME`.
_PATH_VAR = re.compile(r"\$\$|\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
# The working directory, which no file or option chose.
WORKDIR = "working directory"
# The path keys of the site profile; the others are the experiment's.
SITE_KEYS = frozenset({"runs_root"})


def expand(value: str, key: str, environ: Mapping[str, str], base: str) -> str:
    """Expand ~ and $VAR with the submitting environment ($$ is a literal $), make absolute.
    A variable that is not set is an error rather than a path with a hole in it. Only `~`
    and `~/...` stand for $HOME: `~user` is refused, not guessed (resolution reads no user
    database)."""
    text, home = str(value), ""
    if text == "~" or text.startswith("~/"):
        home = environ.get("HOME", "")
        if not home:
            raise error(key, "uses ~ but HOME is not set")
        text = text[1:]
    elif text.startswith("~"):
        user = text[1:].split("/", 1)[0]
        raise error(key, f"{text!r}: ~{user} (another user's home) is not expanded; write the full path "
                    "(only ~ and ~/... are, as $HOME)")
    missing = [m.group(1) or m.group(2) for m in _PATH_VAR.finditer(text)
               if m.group(0) != "$$" and (m.group(1) or m.group(2)) not in environ]
    if missing:
        raise error(key, f"${missing[0]} is not set in the environment")
    # One pass: what a variable holds is taken as it is, never expanded again.
    text = home + _PATH_VAR.sub(lambda m: "$" if m.group(0) == "$$" else environ[m.group(1) or m.group(2)], text)
    check_text(text, key)
    path = text if PurePath(text).is_absolute() else os.path.join(base, text)
    return os.path.normpath(path)


def check_text(text: str, key: str) -> None:
    problem = shell.text_problem(text)
    if problem:
        raise error(key, f"the path {problem}")
    hidden = shell.hidden_characters(text)
    if hidden:
        raise error(key, f"{text!r} holds {', '.join(hidden)}: a path glaunch writes into scripts, "
                    "#SBATCH lines and the terminal cannot hold control or invisible characters")


# The kernel's pseudo-file systems: what is written there is a setting of the kernel, a
# device's input, or lost, never a file. /dev/shm is tmpfs, a file system like any other.
PSEUDO_FS_ROOTS = ("/proc", "/sys", "/dev")
_REAL_FS_UNDER_PSEUDO = ("/dev/shm",)


def check_writable_place(path: str, key: str) -> None:
    """Refuse a directory glaunch (or the job) writes into on a pseudo-file system, as
    written or once its symlinks are followed (only those that exist here are)."""
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        real = path
    for candidate in dict.fromkeys((os.path.normpath(path), real)):
        root = pseudo_fs_root(candidate)
        if root is not None:
            via = "" if candidate == os.path.normpath(path) else f" (it resolves to {candidate})"
            raise error(key, f"{path!r}{via} is on the kernel's pseudo-file system {root}, which holds no "
                        "files: give a directory on a real file system")


def pseudo_fs_root(path: str) -> str | None:
    """The pseudo-file system an absolute, normalised `path` is in, or None."""
    if any(inside(path, ok) is not None for ok in _REAL_FS_UNDER_PSEUDO):
        return None
    return next((root for root in PSEUDO_FS_ROOTS if inside(path, root) is not None), None)


def error(key: str, message: str) -> ConfigError:
    """An error about the path `key` names: a config key's (located where resolution
    ends), a command-line option's (`--...`), or the working directory's (no file)."""
    if key.startswith("--"):
        return ConfigError(message, file="command line", key=key)
    if key == WORKDIR:
        return ConfigError(message, key=key)
    return ConfigKeyError(key, message, site=key in SITE_KEYS)


def inside(path: str, root: str) -> str | None:
    """`path` relative to `root` when it is `root` or below it, else None."""
    if path == root or path.startswith(root.rstrip("/") + "/"):
        return os.path.relpath(path, root)
    return None
