"""Merged raw data -> the schema's dataclasses: the one set of conversion rules.

A scalar arrives as written (launcher.config.yamlfile.Scalar) and the field's type
decides what it becomes:

- `str`: the text as written (`0123`, `on`, `1e3` stay so). Plain `null`/`~`/empty is
  None where the field is optional, else an error.
- `int`, `float`, `bool`: parsed by YAML 1.2's rules, quoted or not, refusing what
  YAML 1.1 would read otherwise (`010`, `yes`, `on`) and what is no number of that
  kind (`2.5` for an int, `true` for a number); NaN and infinity never pass.
- `Any` (`deepspeed:`, `sbatch:` values): plain scalars typed as YAML 1.2 does, quoted
  ones are strings.

Every error names the dotted key, and `typed_config` gives it the key's file and line.
Values holding `${...}` are resolved afterwards (launcher.config.interpolate), and only
then is OmegaConf imported.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import typing
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from typing import Any

from launcher import shell
from launcher.config import interpolate
from launcher.config.interpolate import Interpolation, Pending
from launcher.config.sourcemap import ConfigKeyError, Provenance, locating
from launcher.config.schema import MISSING
from launcher.config.yamlfile import Scalar, Unread

NULLS = frozenset({"", "~", "null", "Null", "NULL"})
TRUES = frozenset({"true", "True", "TRUE"})
FALSES = frozenset({"false", "False", "FALSE"})
_YAML11_BOOLS = frozenset({"yes", "no", "on", "off", "y", "n"})
# Patterns are compiled on first use (re's cache): most configs hold only plain decimals.
_INT = r"[-+]?[0-9]+(?:_[0-9]+)*"
_INT_PREFIXED = r"[-+]?0(?:x[0-9a-fA-F]+(?:_[0-9a-fA-F]+)*|o[0-7]+(?:_[0-7]+)*)"
_FLOAT = r"[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?"
_NONFINITE = r"(?i)[-+]?\.?(?:inf|infinity|nan)"
# YAML 1.2 core schema, for `Any` fields.
_YAML_INT = r"[-+]?[0-9]+"
_YAML_FLOAT = r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
INT_LIMIT = 2 ** 63                # Slurm and the planner count in 64 bits
MAX_DIGITS = 64


class Kind:
    """What a field holds."""

    __slots__ = ("cls", "item", "name", "optional", "run_values", "shell_values")

    def __init__(self, name: str, optional: bool = False, cls: Any = None, item: Kind | None = None,
                 shell_values: bool = False, run_values: bool = False) -> None:
        self.name = name                  # str | int | float | bool | any | object | dict | list
        self.optional = optional
        self.cls = cls                    # object: the dataclass
        self.item = item                  # dict and list: their values
        self.shell_values = shell_values  # str: an environment value (see interpolate.scan)
        self.run_values = run_values      # str: may hold ${run:...}, filled in at each start


ANY = Kind("any", optional=True)
_DESCRIBE = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
             "object": "a mapping of keys", "dict": "a mapping of keys", "list": "a list", "any": "a value"}


# Keys and list indices from the root to a value.
KeyPath = tuple[str | int, ...]


def typed_config(schema_class: type, data: Mapping[str, Any], provenance: Provenance,
                 choices: Mapping[str, tuple[str, ...]]) -> Any:
    """Merged raw data -> the schema's dataclass instance, validated; `provenance`, the
    data's source map, places an error at its key's file and line."""
    with locating(provenance):
        converter = _Converter()
        obj = converter.object(schema_class, data, "", ())
        if converter.pending:
            interpolate.resolve(obj, converter.pending)
        _check_choices(obj, choices)
    return obj


def describe(raw: Any) -> str:
    if isinstance(raw, dict):
        return "a mapping"
    if isinstance(raw, list):
        return "a list"
    if isinstance(raw, Scalar):
        if raw.plain and raw.text in NULLS:
            return "null"
        return repr(raw.text)
    return repr(raw)


def _flow_hint(raw: Any, opening: str) -> str:
    """What to do about text that opens a flow list or mapping but is none (an override
    such as `args=[--lr,${x]`)."""
    if not (isinstance(raw, Scalar) and raw.plain and raw.text.startswith(opening)):
        return ""
    example = "[--tag, 'a,b', '#1']" if opening == "[" else "{a: 'b, c', d: '#1'}"
    what = f"YAML flow {'list' if opening == '[' else 'mapping'}"
    if isinstance(raw, Unread) and raw.problem.startswith("is not valid Unicode"):
        return f", which is not a {what}: it {raw.problem}"
    if isinstance(raw, Unread) and re.search(r'"[^"]*\\', raw.text):
        return (f", which is not a {what} ({raw.problem}): in double quotes a backslash starts an escape; "
                "an item in single quotes keeps it as written")
    why = f"YAML: {raw.problem}; " if isinstance(raw, Unread) else ""
    return (f", which is not a {what} ({why}an unclosed bracket, brace or quote, or an unclosed '${{'?); "
            f"quote an item that holds , [ ] {{ }} or #: {example}")


class _Converter:
    def __init__(self) -> None:
        self.pending: list[Pending] = []      # in the order found; see `deferred`

    def object(self, cls: type, raw: Any, key: str, path: KeyPath) -> Any:
        if not isinstance(raw, dict):
            raise ConfigKeyError(key or cls.__name__, f"must be a mapping of keys, got {describe(raw)}")
        specs = _fields(cls)
        for name in raw:
            if name not in specs:
                raise ConfigKeyError(_join(key, name), _unknown_key(name, specs))
        values: dict[str, Any] = {}
        late: list[tuple[str, Interpolation]] = []
        for name, (kind, default) in specs.items():
            dotted = _join(key, name)
            if name in raw:
                value = self.value(kind, raw[name], dotted, path + (name,))
                if self.deferred(value):
                    late.append((name, value))
                values[name] = value
            elif default is dataclasses.MISSING:
                raise ConfigKeyError(dotted, "required key is missing")
            elif default is _FROM_FIELDS:
                values[name] = self.object(kind.cls, {}, dotted, path + (name,))
            else:
                values[name] = default() if callable(default) else default
        obj = cls(**values)
        for name, placeholder in late:
            placeholder.attach(functools.partial(setattr, obj, name))
        return obj

    def value(self, kind: Kind, raw: Any, key: str, path: KeyPath) -> Any:
        if isinstance(raw, Scalar) and raw.plain and raw.text in NULLS:
            if kind.optional or kind.name == "any":
                return None
            hint = {"dict": " (write {} for none)", "list": " (write [] for none)",
                    "str": " (quote it for the word: 'null'; '' is an empty string)"}.get(kind.name, "")
            raise ConfigKeyError(key, f"must be {_DESCRIBE[kind.name]}, got null{hint}")
        if kind.name == "object":
            return self.object(kind.cls, raw, key, path)
        if kind.name == "dict":
            if not isinstance(raw, dict):
                raise ConfigKeyError(key, f"must be a mapping of keys, got {describe(raw)}{_flow_hint(raw, '{')}")
            return self.mapping(kind.item or ANY, raw, key, path)
        if kind.name == "list":
            if not isinstance(raw, list):
                raise ConfigKeyError(key, f"must be a list, got {describe(raw)}{_flow_hint(raw, '[')}")
            return self.sequence(kind.item or ANY, raw, key, path)
        if kind.name == "any" and isinstance(raw, dict):
            return self.mapping(ANY, raw, key, path)
        if kind.name == "any" and isinstance(raw, list):
            return self.sequence(ANY, raw, key, path)
        if not isinstance(raw, Scalar):
            raise ConfigKeyError(key, f"must be {_DESCRIBE[kind.name]} (a single value), got {describe(raw)}")
        text = raw.text
        if "${" in text:
            try:
                scanned = interpolate.scan(text, kind.shell_values, kind.run_values)
            except ValueError as exc:
                raise ConfigKeyError(key, str(exc)) from None
            if isinstance(scanned, Interpolation):
                return self._defer(kind, scanned, key, path)
            return self.from_text(kind, scanned, plain=False, key=key)
        return self.from_text(kind, text, raw.plain, key)

    def mapping(self, item_kind: Kind, raw: dict[str, Any], key: str, path: KeyPath) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, item in raw.items():
            dotted = _join(key, name)
            _check_text(dotted, name, "key")
            out[name] = value = self.value(item_kind, item, dotted, path + (name,))
            if self.deferred(value):
                value.attach(functools.partial(out.__setitem__, name))
        return out

    def sequence(self, item_kind: Kind, raw: list[Any], key: str, path: KeyPath) -> list[Any]:
        out: list[Any] = []
        for index, item in enumerate(raw):
            value = self.value(item_kind, item, f"{key}[{index}]", path + (index,))
            if self.deferred(value):
                value.attach(functools.partial(out.__setitem__, index))
            out.append(value)
        return out

    def from_text(self, kind: Kind, text: str, plain: bool, key: str) -> Any:
        """A scalar's text -> the field's value."""
        if kind.name == "str":
            return _check_text(key, text, "value")
        if kind.name == "any":
            return _yaml_value(text, key) if plain else _check_text(key, text, "value")
        if kind.name in ("int", "float", "bool"):
            return _NUMBER_PARSERS[kind.name](text.strip(), key)
        raise ConfigKeyError(key, f"must be {_DESCRIBE[kind.name]}, got {text!r}")

    def _defer(self, kind: Kind, interpolation: Interpolation, key: str, path: KeyPath) -> Interpolation:
        self.pending.append(Pending(path, key, interpolation, lambda v: self.resolved(kind, v, key)))
        return interpolation

    def deferred(self, value: Any) -> bool:
        """Whether `value`, just converted, stands in for an interpolation resolved later."""
        return bool(self.pending) and value is self.pending[-1].interpolation

    def resolved(self, kind: Kind, value: Any, key: str) -> Any:
        """An interpolation's result -> the field's value."""
        if value is None:
            if kind.optional or kind.name == "any":
                return None
            raise ConfigKeyError(key, f"must be {_DESCRIBE[kind.name]}, but the interpolation gives null")
        if isinstance(value, (dict, list)):
            if kind.name == "any":
                _check_finite(key, value)
                return value
            raise ConfigKeyError(key, f"must be {_DESCRIBE[kind.name]}, but the interpolation gives {describe(value)}")
        if isinstance(value, str):
            return self.from_text(kind, value, plain=False, key=key) if kind.name != "any" else value
        if kind.name in ("str", "any"):
            if kind.name == "any":
                _check_finite(key, value)
                return value
            return ("true" if value else "false") if isinstance(value, bool) else str(value)
        text = ("true" if value else "false") if isinstance(value, bool) else repr(value)
        return self.from_text(kind, text, plain=True, key=key)


# --- scalars --------------------------------------------------------------------------


def _check_text(key: str, text: str, what: str) -> str:
    """No rendered file, argv or environment can carry a NUL or a lone surrogate."""
    problem = shell.text_problem(text)
    if problem:
        raise ConfigKeyError(key, f"the {what} {problem}")
    return text


def _yaml_value(text: str, key: str) -> Any:
    """A plain scalar typed by YAML 1.2's core schema."""
    if text in NULLS:
        return None
    if text in TRUES:
        return True
    if text in FALSES:
        return False
    if re.fullmatch(_YAML_INT, text) or re.fullmatch(_INT_PREFIXED, text):
        return _parse_int(text, key, limit=False)
    if re.fullmatch(_YAML_FLOAT, text) or (re.fullmatch(_NONFINITE, text) and text.lstrip("+-").startswith(".")):
        return _parse_float(text, key)
    return _check_text(key, text, "value")


def _parse_int(text: str, key: str, *, limit: bool = True) -> int:
    digits = text.lstrip("+-").replace("_", "")
    if len(digits) > MAX_DIGITS:
        raise ConfigKeyError(key, f"{text[:20]}... has more than {MAX_DIGITS} digits")
    if re.fullmatch(_INT_PREFIXED, text):
        value = int(text.replace("_", ""), 0)
    elif re.fullmatch(_INT, text):
        if len(digits) > 1 and digits.startswith("0"):
            raise ConfigKeyError(key, f"{text} has a leading zero, which YAML 1.1 reads as octal: write "
                                 f"{digits.lstrip('0') or '0'} (0o{digits.lstrip('0') or '0'} for octal; "
                                 "quote it where text is meant)")
        value = int(text.replace("_", ""))
    else:
        raise ConfigKeyError(key, f"must be an integer, got {_shown(text)}")
    if limit and not -INT_LIMIT < value < INT_LIMIT:
        raise ConfigKeyError(key, f"{text} is out of range")
    return value


def _parse_float(text: str, key: str) -> float:
    if re.fullmatch(_NONFINITE, text):
        raise ConfigKeyError(key, f"must be a finite number, got {text}")
    try:
        value = float(_parse_int(text, key, limit=False)) if (
            re.fullmatch(_INT, text) or re.fullmatch(_INT_PREFIXED, text)) else float(text)
    except (ValueError, OverflowError):
        raise ConfigKeyError(key, f"must be a number, got {_shown(text)}") from None
    if not math.isfinite(value):
        raise ConfigKeyError(key, f"{text} is too large (not a finite number)")
    return value


def _plain_decimal(text: str) -> bool:
    """Digits only, no leading zero, well inside 64 bits: the common case, decided without a regex."""
    return text.isdigit() and text.isascii() and len(text) < 19 and (text[0] != "0" or len(text) == 1)


def _int_field(text: str, key: str) -> int:
    if _plain_decimal(text):
        return int(text)
    if re.fullmatch(_INT, text) or re.fullmatch(_INT_PREFIXED, text):
        return _parse_int(text, key)
    if re.fullmatch(_FLOAT, text) or re.fullmatch(_NONFINITE, text):
        raise ConfigKeyError(key, f"must be a whole number, got {text}{_written_whole(text)}")
    raise ConfigKeyError(key, f"must be an integer, got {_shown(text)}")


def _written_whole(text: str) -> str:
    """For a whole number written as a float (1e3, 2.0): how to write it as one. Decided
    exactly (1.00000000000000001 is no whole number, though its float is)."""
    import decimal          # an error's wording only: not on every load's path

    try:
        value = decimal.Decimal(text.replace("_", ""))
    except (decimal.InvalidOperation, ValueError):
        return ""
    if value.is_finite() and value == value.to_integral_value() and abs(value) < 10 ** 18:
        return f" (written as a float; write {int(value)})"
    return ""


def _float_field(text: str, key: str) -> float:
    if _plain_decimal(text):
        return float(text)
    if re.fullmatch(_NONFINITE, text):
        raise ConfigKeyError(key, f"must be a finite number, got {text} (NaN and infinity are not allowed)")
    if re.fullmatch(_INT, text) or re.fullmatch(_INT_PREFIXED, text) or re.fullmatch(_FLOAT, text):
        return _parse_float(text, key)
    raise ConfigKeyError(key, f"must be a number, got {_shown(text)}")


def _bool_field(text: str, key: str) -> bool:
    if text in TRUES:
        return True
    if text in FALSES:
        return False
    if text.lower() in _YAML11_BOOLS:
        raise ConfigKeyError(key, f"must be true or false, got {text!r} (yes/no/on/off are not booleans here)")
    raise ConfigKeyError(key, f"must be true or false, got {_shown(text)}")


_NUMBER_PARSERS: dict[str, Callable[[str, str], Any]] = {"int": _int_field, "float": _float_field,
                                                          "bool": _bool_field}


def _shown(text: str) -> str:
    if text in TRUES or text in FALSES:
        return f"{text} (a boolean)"
    return repr(text) if len(text) <= 60 else repr(text[:60]) + "..."


def _check_finite(key: str, value: Any) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigKeyError(key, f"must be a finite number, got {value}")
    if isinstance(value, dict):
        for item in value.values():
            _check_finite(key, item)
    elif isinstance(value, list):
        for item in value:
            _check_finite(key, item)


# --- the schema -------------------------------------------------------------------------

_FROM_FIELDS = object()          # default: the field's dataclass built from its own defaults


@cache
def _fields(cls: type) -> dict[str, tuple[Kind, Any]]:
    """Field name -> (its Kind, its default: a value, a factory, _FROM_FIELDS or dataclasses.MISSING)."""
    hints = typing.get_type_hints(cls)
    specs: dict[str, tuple[Kind, Any]] = {}
    for f in dataclasses.fields(cls):
        kind = _kind(hints[f.name], bool(f.metadata.get("shell_values")), bool(f.metadata.get("run_values")))
        if f.default_factory is not dataclasses.MISSING:
            default = _FROM_FIELDS if kind.name == "object" else f.default_factory
        elif f.default is MISSING:
            default = dataclasses.MISSING
        else:
            default = f.default
        specs[f.name] = (kind, default)
    return specs


def _kind(hint: Any, shell_values: bool = False, run_values: bool = False) -> Kind:
    optional = False
    if typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional, hint = True, args[0]
    if hint is Any:
        return ANY
    if dataclasses.is_dataclass(hint):
        return Kind("object", optional, cls=hint)
    origin = typing.get_origin(hint)
    if origin is dict:
        return Kind("dict", optional, item=_kind(typing.get_args(hint)[1], shell_values, run_values))
    if origin is list:
        return Kind("list", optional, item=_kind(typing.get_args(hint)[0], shell_values, run_values))
    names = {str: "str", int: "int", float: "float", bool: "bool"}
    return Kind(names[hint], optional, shell_values=shell_values and hint is str,
                run_values=run_values and hint is str)


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`did you mean 'x'?` naming the one or two of `known` closest to `name` (a typo of
    one of them), else ''."""
    close = difflib.get_close_matches(name, list(known), n=2, cutoff=0.6)
    return f"did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _unknown_key(name: str, specs: Mapping[str, Any]) -> str:
    suggestion = did_you_mean(name, specs)
    shown = "" if name.isidentifier() else f" {name!r}"      # '' or one with spaces would not show
    if suggestion:
        return f"unknown key{shown}; {suggestion}"
    return f"unknown key{shown} (known here: {', '.join(specs)})"


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _check_choices(obj: Any, choices: Mapping[str, tuple[str, ...]]) -> None:
    for key, allowed in choices.items():
        value = obj
        for part in key.split("."):
            value = getattr(value, part)
            if value is None:
                break
        if value is not None and value not in allowed:
            raise ConfigKeyError(key, f"{value!r} is not one of: {', '.join(allowed)}")
