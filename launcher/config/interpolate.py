"""`${...}` in configuration values: OmegaConf interpolation (`${resources.nodes}`,
`${oc.env:HOME}`), the `\\${...}` escape, and, in environment values, the shell's own
`${NAME}` and `$$`.

`scan` reads a value without OmegaConf: most values hold no interpolation and are
final as they are. Only a value that does is handed to OmegaConf, imported then.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import fields, is_dataclass
from typing import Any, Callable

from launcher.config.sourcemap import ConfigKeyError
from launcher.rundir import runvalues

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
HINT = " (a literal shell variable is written $NAME, ${NAME} in env values, or \\${NAME})"


class Interpolation:
    """A value holding at least one interpolation, spelled for OmegaConf. It stands in
    the converted config until resolved; `store` then puts the result where it belongs."""

    __slots__ = ("_stores", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._stores: list[Callable[[Any], None]] = []

    def __repr__(self) -> str:
        return f"Interpolation({self.text!r})"

    def attach(self, store: Callable[[Any], None]) -> None:
        self._stores.append(store)

    def store(self, value: Any) -> None:
        for store in self._stores:
            store(value)


def scan(text: str, shell_values: bool, run_values: bool = False) -> str | Interpolation:
    """`text` as the user meant it: the final string when nothing in it interpolates,
    else an Interpolation. Raises ValueError for an unclosed `${`.

    `\\${` is a literal `${` (an even run of backslashes before `${` is half as many
    backslashes and an interpolation, as in OmegaConf). With `shell_values` (env values,
    which the job's shell expands), `$$` and `${NAME}` stay as written for the shell;
    dotted and resolver forms (`${a.b}`, `${oc.env:X}`) still interpolate. With
    `run_values` (entrypoint args and env values), `${run:NAME}` stays as written: each
    start fills it in on the node (launcher.rundir.runvalues); elsewhere it is refused."""
    pieces: list[tuple[bool, str]] = []      # (is an interpolation, text)
    literal: list[str] = []
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char == "\\":
            j = i
            while j < n and text[j] == "\\":
                j += 1
            if text.startswith("${", j):
                literal.append("\\" * ((j - i) // 2))
                if (j - i) % 2:
                    literal.append("${")
                    i = j + 2
                else:
                    i = j
                continue
            literal.append(text[i:j])
            i = j
            continue
        if char == "$":
            if shell_values and text.startswith("$$", i):
                literal.append("$$")
                i += 2
                continue
            if text.startswith("${", i):
                end = closing_brace(text, i + 2)
                if end is None:
                    raise ValueError(f"unclosed '${{' in {text!r}")
                body = text[i + 2:end - 1]
                if (shell_values and re.fullmatch(_IDENT, body)) or run_value(body, run_values):
                    literal.append(text[i:end])
                else:
                    pieces.append((False, "".join(literal)))
                    literal = []
                    pieces.append((True, text[i:end]))
                i = end
                continue
        literal.append(char)
        i += 1
    pieces.append((False, "".join(literal)))
    if not any(is_interpolation for is_interpolation, _ in pieces):
        return pieces[0][1]
    out = []
    for index, (is_interpolation, piece) in enumerate(pieces):
        if is_interpolation:
            out.append(piece)
        else:
            before_interpolation = index + 1 < len(pieces)
            out.append(omegaconf_literal(piece, before_interpolation))
    return Interpolation("".join(out))


RUN_VALUES_WHERE = "entrypoint.args, entrypoint.resume_args and env values"


def run_value(body: str, allowed: bool) -> bool:
    """Whether `${body}` is a run-scoped value to keep as written; ValueError for one that
    names no such value or stands where none is filled in."""
    if not body.startswith(runvalues.PREFIX):
        return False
    if not allowed:
        raise ValueError(f"${{{body}}} is filled in on the node at each start: only in {RUN_VALUES_WHERE}")
    problem = runvalues.name_problem(body[len(runvalues.PREFIX):])
    if problem:
        raise ValueError(problem)
    return True


def omegaconf_literal(text: str, before_interpolation: bool = False) -> str:
    """`text` spelled so that OmegaConf reads it back unchanged."""
    out = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", text)
    if before_interpolation:
        out = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, out)
    return out


def closing_brace(text: str, start: int) -> int | None:
    """Index just past the `}` closing a `${` whose body starts at `start`."""
    depth, i, n = 1, start, len(text)
    while i < n:
        char = text[i]
        if char in "'\"":
            close = text.find(char, i + 1)
            while close != -1 and text[close - 1] == "\\":
                close = text.find(char, close + 1)
            if close == -1:
                return None
            i = close + 1
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


class Pending:
    """An interpolated value to fill in once the whole config is known."""

    __slots__ = ("finish", "interpolation", "key", "path")

    def __init__(self, path: tuple[str | int, ...], key: str, interpolation: Interpolation,
                 finish: Callable[[Any], Any]) -> None:
        self.path = path                    # keys and list indices from the root
        self.key = key                      # dotted, for errors
        self.interpolation = interpolation
        self.finish = finish                # resolved value -> the field's value (raises ConfigKeyError)


def resolve(root: Any, pending: list[Pending]) -> None:
    """Resolve every pending interpolation against the converted config `root` (its
    defaults included) and store the results."""
    # OmegaConf is imported only here and below: it is heavy, and most configs never need it.
    from omegaconf import DictConfig, ListConfig, OmegaConf

    with warnings.catch_warnings():
        # Resolvers such as oc.deprecated warn on stderr, which is the error channel here.
        warnings.simplefilter("ignore")
        try:
            cfg = OmegaConf.create(_plain(root))
        except Exception as exc:  # OmegaConf's errors share no base class with ours
            raise _unparsable(pending, exc) from None
        for item in pending:
            try:
                node = cfg
                for part in item.path[:-1]:
                    node = node[part]
                value = node[item.path[-1]]
                if isinstance(value, (DictConfig, ListConfig)):
                    value = OmegaConf.to_container(value, resolve=True)
            except RecursionError:
                raise ConfigKeyError(item.key, "interpolations nest too deeply (or refer to each other)") from None
            except Exception as exc:  # a resolver may raise anything: the input is the user's
                raise ConfigKeyError(item.key, _resolution_problem(exc)) from None
            item.interpolation.store(item.finish(value))


def _unparsable(pending: list[Pending], exc: Exception) -> ConfigKeyError:
    """The config as a whole did not parse: name the value whose interpolation is not
    OmegaConf's grammar (`${}`, `${a b}`)."""
    from omegaconf import OmegaConf

    for item in pending:
        try:
            OmegaConf.create({"value": item.interpolation.text})
        except Exception as own:  # any failure of this one value is the answer
            return ConfigKeyError(item.key, f"{item.interpolation.text!r} is not an interpolation "
                                  f"({_first_line(own)}){HINT}")
    return ConfigKeyError("", f"cannot interpolate: {_first_line(exc)}")


def _resolution_problem(exc: Exception) -> str:
    from omegaconf.errors import InterpolationKeyError, UnsupportedInterpolationType

    message = _first_line(exc)
    if message == "Recursive interpolation detected":
        return "the interpolation refers to itself (directly or through other values)"
    if isinstance(exc, (InterpolationKeyError, UnsupportedInterpolationType)):
        return message + HINT
    return message


def _first_line(exc: BaseException) -> str:
    message = getattr(exc, "msg", None) or str(exc) or type(exc).__name__
    return str(message).split("\n")[0].strip()


def _plain(value: Any) -> Any:
    """The converted config as OmegaConf input: interpolations in OmegaConf's syntax,
    every other string escaped so that it stays literal."""
    if isinstance(value, Interpolation):
        return value.text
    if isinstance(value, str):
        return omegaconf_literal(value)
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value
