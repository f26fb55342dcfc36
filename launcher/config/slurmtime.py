"""Slurm's time formats <-> seconds. Pure."""

from __future__ import annotations

import re

_N = r"([0-9]{1,8})"          # ASCII digits only; eight are more than any limit Slurm keeps
_FORMATS = (
    # days-hours[:minutes[:seconds]]
    (re.compile(rf"{_N}-{_N}(?::{_N})?(?::{_N})?"), ("d", "h", "m", "s")),
    # hours:minutes:seconds
    (re.compile(rf"{_N}:{_N}:{_N}"), ("h", "m", "s")),
    # minutes:seconds
    (re.compile(rf"{_N}:{_N}"), ("m", "s")),
    # minutes
    (re.compile(_N), ("m",)),
)
_UNIT = {"d": 86400, "h": 3600, "m": 60, "s": 1}
# The largest value of each field, where it is not the format's leading one.
_LIMIT = {"h": 23, "m": 59, "s": 59}
_NAMES = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}
# Slurm counts a limit in minutes in a C int: above this it overflows (about 4,000 years).
MAX_MINUTES = 2 ** 31 - 2


def parse(text: str | int) -> int:
    """Seconds in a Slurm time string: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.

    A field after the first is bounded by the next larger unit (`01:61:00` is no time;
    `90` minutes and `48:00:00` are). Raises ValueError with a message meant for the user.
    """
    value = str(text).strip()
    for pattern, units in _FORMATS:
        match = pattern.fullmatch(value)
        if match:
            fields = [(int(g), u) for g, u in zip(match.groups(), units) if g is not None]
            for number, unit in fields[1:]:
                if number > _LIMIT[unit]:
                    raise ValueError(f"{value!r} is not a time: {_NAMES[unit]} must be at most {_LIMIT[unit]} "
                                     "(use HH:MM:SS, D-HH:MM:SS or minutes)")
            seconds = sum(number * _UNIT[unit] for number, unit in fields)
            if seconds <= 0:
                raise ValueError(f"{value!r} is not a positive duration")
            if seconds // 60 > MAX_MINUTES:
                raise ValueError(f"{value!r} is longer than any time limit Slurm can hold ({MAX_MINUTES} minutes)")
            return seconds
    raise ValueError(f"{value!r} is not a time (use HH:MM:SS, D-HH:MM:SS or minutes)")


def format(seconds: int) -> str:
    """The canonical spelling: HH:MM:SS, or D-HH:MM:SS from one day on."""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock
