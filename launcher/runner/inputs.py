"""How the API's list parameters are read (overrides, sweeps, --after runs)."""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping, Sequence

from launcher.errors import ConfigError


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
