"""What every printed value goes through: text safe for a terminal, and durations."""

from __future__ import annotations

import re
from typing import Any, Mapping

from launcher.runner.goodput import number

# Records may hold anything a hand or a rank wrote: text printed from them never carries
# control characters to the terminal (an escape sequence could rewrite what was shown).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(value: Any, *, lines: bool = False) -> str:
    """`value` as text safe for a terminal; with `lines`, its line breaks are kept. A lone
    surrogate (JSON's "\\ud800", an undecodable command-line byte) is shown escaped: no
    stream can encode it."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if lines else text.replace("\n", "\\n")


# The most of one text a view of records shows (`status`, `list`): a record may hold texts
# of up to files.MAX_RECORD_TEXT characters, and nobody reads a screenful of one value.
MAX_SHOWN = 1000


def clipped(value: Any, limit: int = MAX_SHOWN) -> Any:
    """`value` (a summary: dicts, lists, scalars) with each text of more than `limit`
    characters cut there, marked with its length."""
    if isinstance(value, str):
        return value if len(value) <= limit else f"{value[:limit]}... ({len(value)} characters)"
    if isinstance(value, Mapping):
        return {clipped(key, limit): clipped(item, limit) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [clipped(item, limit) for item in value]
    return value


def duration(seconds: Any) -> str:
    """4.1 s, 3m10s, 2h05m."""
    value = number(seconds)
    if value is None:
        return "?"
    if value < 60:
        return f"{value:.1f} s"
    if value < 3600:
        return f"{int(value // 60)}m{int(value % 60):02d}s"
    return f"{int(value // 3600)}h{int(value % 3600 // 60):02d}m"
