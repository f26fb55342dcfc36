"""The templates' language: the part of Jinja's syntax that glaunch's templates/ use, and
nothing more, read by a parser of its own so that rendering a job costs no template
engine's import.

    {{ name }}                   the value of `name`, as str() gives it
    {% if name %}...{% endif %}  the block when `name` is true (blocks nest; no else)
    {% include name %}           the template whose file name `name` holds, same values

Jinja's `trim_blocks` and `lstrip_blocks` hold: a `{% %}` tag drops the newline right after
it, and the blanks before it on its line. A name without a value is an error (Jinja's
StrictUndefined), as is any other syntax: a template is glaunch's own file, so either is a
defect of glaunch, found by its golden tests, never a user's mistake.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping, Union

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
# A block tag alone on its line after blanks loses the blanks (lstrip_blocks); any block
# tag loses the one newline right after it (trim_blocks).
_BLANKS_BEFORE_BLOCK = re.compile(r"^[ \t]+(?=\{%)", re.MULTILINE)
_TOKEN = re.compile(r"\{\{(.*?)\}\}|\{%(.*?)%\}\n?", re.DOTALL)
_VALUE = re.compile(rf"\s*({_NAME})\s*")
_BLOCK = re.compile(rf"\s*(if|endif|include)(?:\s+({_NAME}))?\s*")


class TemplateError(Exception):
    """A template outside the language above, or rendered without a value it names."""


@dataclass(frozen=True)
class _Value:
    name: str


@dataclass(frozen=True)
class _If:
    name: str
    body: tuple[Node, ...]


@dataclass(frozen=True)
class _Include:
    name: str


Node = Union[str, _Value, _If, _Include]


def parse(text: str, source: str) -> tuple[Node, ...]:
    """The template `text` (from the file `source`) as its nodes; TemplateError for a tag
    outside the language, or an `if` left open or closed twice."""
    stack: list[tuple[str, list[Node]]] = [("", [])]
    position = 0
    # Jinja's newline_sequence: a checkout's CRLF never reaches a script bash would misread.
    text = _BLANKS_BEFORE_BLOCK.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    for match in _TOKEN.finditer(text):
        _plain(text[position:match.start()], source)
        stack[-1][1].append(text[position:match.start()])
        position = match.end()
        tag = match.group(0).rstrip("\n")
        if match.group(1) is not None:
            stack[-1][1].append(_Value(_tag(_VALUE, match.group(1), tag, source)[0]))
            continue
        word, name = _tag(_BLOCK, match.group(2), tag, source)
        if word == "if" and name:
            stack.append((name, []))
        elif word == "endif" and not name:
            if len(stack) == 1:
                raise TemplateError(f"{source}: {tag!r} closes no {{% if %}}")
            opened, body = stack.pop()
            stack[-1][1].append(_If(opened, _joined(body)))
        elif word == "include" and name:
            stack[-1][1].append(_Include(name))
        else:
            raise TemplateError(f"{source}: {tag!r} is not a tag of glaunch's templates")
    if len(stack) > 1:
        raise TemplateError(f"{source}: {{% if {stack[-1][0]} %}} has no {{% endif %}}")
    _plain(text[position:], source)
    stack[0][1].append(text[position:])
    return _joined(stack[0][1])


def _plain(text: str, source: str) -> None:
    """TemplateError for text between tags that opens one (`{{`, `{%`, `{#`) it never closes,
    or a comment: Jinja would read it, this language does not."""
    opened = next((mark for mark in ("{{", "{%", "{#") if mark in text), None)
    if opened is not None:
        raise TemplateError(f"{source}: {opened!r} opens no tag of glaunch's templates")


def _tag(pattern: re.Pattern[str], inside: str, tag: str, source: str) -> tuple[str, str | None]:
    """(the tag's word or name, the name a block tag names) of `tag`, whose inside is `inside`."""
    match = pattern.fullmatch(inside)
    if match is None:
        raise TemplateError(f"{source}: {tag!r} is not a tag of glaunch's templates")
    return match.group(1), (match.group(2) if pattern.groups > 1 else None)


def _joined(nodes: list[Node]) -> tuple[Node, ...]:
    return tuple(node for node in nodes if node != "")


def render(nodes: tuple[Node, ...], values: Mapping[str, object], source: str,
           load: Callable[[str], tuple[Node, ...]]) -> str:
    """The text of the parsed template `nodes` with `values`; an include is parsed by `load`
    (a template's file name -> its nodes). TemplateError names the value missing."""
    out: list[str] = []
    for node in nodes:
        if isinstance(node, str):
            out.append(node)
        elif isinstance(node, _If):
            if _value(values, node.name, source):
                out.append(render(node.body, values, source, load))
        elif isinstance(node, _Include):
            included = str(_value(values, node.name, source))
            out.append(render(load(included), values, included, load))
        else:
            out.append(str(_value(values, node.name, source)))
    return "".join(out)


def _value(values: Mapping[str, object], name: str, source: str) -> object:
    try:
        return values[name]
    except KeyError:
        raise TemplateError(f"{source}: no value for {name!r}") from None
