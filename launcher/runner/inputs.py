"""How the API's parameters are read where their type is not the one a caller may mean:
lists (overrides, sweeps, --after runs), runs, ranks and folders."""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping, Sequence

from launcher.errors import ConfigError
from launcher.runner.results import Run, RunRef, Sweep


def items(value: str | os.PathLike | Sequence[str], key: str) -> tuple[Any, ...]:
    """Overrides, sweeps, --after runs as given to the API: one string alone is one item
    (overrides="resources.nodes=4"), not a sequence of its characters. ConfigError naming
    the parameter `key` for what is neither; each item's type is its parser's to check."""
    if isinstance(value, (str, os.PathLike)):     # a run directory (--after) is one item too
        return (value,)
    if isinstance(value, (bytes, bytearray, Mapping)) or not isinstance(value, Iterable):
        raise ConfigError(f"must be a string or a list of strings, got {type(value).__name__} ({value!r:.80})",
                          file="command line", key=key)
    return tuple(value)


def run_ref(value: object, key: str = "run") -> RunRef:
    """A run or sweep as the API names one: its id or directory (a non-empty string or a
    path), or the Run or Sweep a submission returned; ConfigError naming `key` else."""
    if isinstance(value, (Run, Sweep, os.PathLike)) or (isinstance(value, str) and value.strip()):
        return value
    raise ConfigError(f"must be a run or sweep id, its directory, or a Run or Sweep, got "
                      f"{type(value).__name__} ({value!r:.80})", file="command line", key=key)


def rank_of(value: object, key: str = "rank") -> int | None:
    """A rank as the API takes one: None (every rank) or a whole number >= 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"must be a whole number >= 0 (a rank), got {value!r:.80}", file="command line", key=key)
    return value


def folder_of(value: object, key: str = "runs_dir") -> str | None:
    """A folder as the API takes one: None (the default), a string or a path (resolution
    says what is wrong with the folder it names)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        folder = os.fspath(value)
        if isinstance(folder, str):
            return folder
    raise ConfigError(f"must be a folder's path, got {type(value).__name__} ({value!r:.80})",
                      file="command line", key=key)
