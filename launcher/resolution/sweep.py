"""A sweep: `--sweep KEY=V1,V2,...` (repeatable) -> the cartesian product of the values,
one element per combination, each element the experiment with those values as KEY=VALUE
overrides after the command line's own. Pure.

Values are split at the commas outside brackets and quotes, so a list or a mapping is one
value (`--sweep 'entrypoint.args=[--lr,1e-4],[--lr,3e-4]'`), and each value is then read
exactly as the same KEY=VALUE override would be.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

from launcher.config.load import parse_overrides
from launcher.errors import ConfigError

OPTION = "--sweep"
# Far more than anyone submits at once, and under Slurm's default MaxJobCount (10000).
MAX_ELEMENTS = 5000
# Keys an element may not change: a sweep runs on one site, under one name.
FIXED = {"site": "a sweep runs on one site (give --site)", "name": "the sweep's elements share the experiment's name"}


@dataclass(frozen=True)
class Axis:
    key: str
    values: tuple[str, ...]      # each as written on the command line


@dataclass(frozen=True)
class Element:
    index: int
    params: tuple[tuple[str, str], ...]     # (key, value as written), one per axis

    @property
    def overrides(self) -> tuple[str, ...]:
        return tuple(f"{key}={value}" for key, value in self.params)

    def label(self) -> str:
        return " ".join(f"{key}={value}" for key, value in self.params)


def _error(message: str, item: str) -> ConfigError:
    return ConfigError(message, file="command line", key=f"{OPTION} {item}")


def split_values(text: str) -> list[str]:
    """`a,[b,c],'d,e'` -> ['a', '[b,c]', "'d,e'"]: commas inside brackets, braces or quotes
    do not split. ValueError for unbalanced brackets or an unclosed quote."""
    out: list[str] = []
    current: list[str] = []
    depth, quote = 0, None
    for char in text:
        if quote:
            current.append(char)
            if char == quote:
                quote = None
            continue
        if char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced {char!r}")
        elif char == "," and depth == 0:
            out.append("".join(current))
            current = []
            continue
        current.append(char)
    if quote:
        raise ValueError(f"unclosed {quote}")
    if depth:
        raise ValueError("unclosed bracket")
    out.append("".join(current))
    return out


def parse_axes(items: Sequence[str]) -> list[Axis]:
    """The --sweep options -> axes; ConfigError naming the option for what cannot be one."""
    axes: list[Axis] = []
    for item in items:
        if not isinstance(item, str):
            raise _error(f"{item!r} is not KEY=V1,V2,... text, it is {type(item).__name__}", str(item))
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise _error(f"{item!r} is not KEY=V1,V2,... (e.g. --sweep hparams.lr=1e-4,3e-4)", item)
        try:
            values = split_values(text)
        except ValueError as exc:
            raise _error(f"cannot split {text!r} into values: {exc}", item) from None
        if any(not v.strip() for v in values):
            raise _error(f"{item!r} has an empty value (values are separated by ',')", item)
        root = key.split(".")[0]
        if root in FIXED:
            raise _error(f"{key} cannot be swept: {FIXED[root]}", item)
        if any(a.key == key for a in axes):
            raise _error(f"{key} is swept twice; give all its values in one --sweep", item)
        overlapping = next((a.key for a in axes if key.startswith(a.key + ".") or a.key.startswith(key + ".")), None)
        if overlapping:
            raise _error(f"{key} overlaps {overlapping}, also swept: an element would set one inside the other", item)
        if len(set(values)) != len(values):
            raise _error(f"{item!r} repeats a value", item)
        try:
            parse_overrides([f"{key}={v}" for v in values])      # the key's shape, as for any override
        except ConfigError as exc:
            raise _error(exc.message, item) from None
        axes.append(Axis(key, tuple(values)))
    return axes


def expand(axes: Sequence[Axis]) -> list[Element]:
    """The cartesian product, the first axis varying slowest."""
    count = 1
    for axis in axes:
        count *= len(axis.values)
    if count > MAX_ELEMENTS:
        raise ConfigError(f"{' x '.join(str(len(a.values)) for a in axes)} = {count} elements, more than "
                          f"{MAX_ELEMENTS}: split the sweep", file="command line", key=OPTION)
    combos = itertools.product(*[[(a.key, v) for v in a.values] for a in axes])
    return [Element(i, tuple(combo)) for i, combo in enumerate(combos)]
