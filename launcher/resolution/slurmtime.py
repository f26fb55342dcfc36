"""Slurm's time formats <-> seconds. Pure."""

from __future__ import annotations

import re

_FORMATS = (
    # days-hours[:minutes[:seconds]]
    (re.compile(r"(\d+)-(\d+)(?::(\d+))?(?::(\d+))?"), ("d", "h", "m", "s")),
    # hours:minutes:seconds
    (re.compile(r"(\d+):(\d+):(\d+)"), ("h", "m", "s")),
    # minutes:seconds
    (re.compile(r"(\d+):(\d+)"), ("m", "s")),
    # minutes
    (re.compile(r"(\d+)"), ("m",)),
)
_UNIT = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse(text: str | int) -> int:
    """Seconds in a Slurm time string: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.

    Raises ValueError with a message meant for the user.
    """
    value = str(text).strip()
    for pattern, units in _FORMATS:
        match = pattern.fullmatch(value)
        if match:
            seconds = sum(int(g) * _UNIT[u] for g, u in zip(match.groups(), units) if g is not None)
            if seconds <= 0:
                raise ValueError(f"{value!r} is not a positive duration")
            return seconds
    raise ValueError(f"{value!r} is not a time (use HH:MM:SS, D-HH:MM:SS or minutes)")


def format(seconds: int) -> str:
    """The canonical spelling: HH:MM:SS, or D-HH:MM:SS from one day on."""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock
