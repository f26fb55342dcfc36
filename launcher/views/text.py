"""What every printed value goes through: text safe for a terminal, and durations."""

from __future__ import annotations

import re
from typing import Any

from launcher.runner.goodput import number

# Records may hold anything a hand or a rank wrote: text printed from them never carries
# control characters to the terminal (an escape sequence could rewrite what was shown).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(value: Any, *, lines: bool = False) -> str:
    """`value` as text safe for a terminal; with `lines`, its line breaks are kept."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))
    return text if lines else text.replace("\n", "\\n")


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
