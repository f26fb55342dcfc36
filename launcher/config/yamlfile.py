"""Reading YAML configuration files safely, keeping every scalar as it was written.

A scalar stays a `Scalar`: its text and whether it was plain (unquoted). Nothing is
typed here; the schema's field type decides what a scalar becomes (launcher.config.typed),
so `0123`, `on` or `1e3` reach a string field as written.

A configuration file is small and trusted by no one: only regular files up to
MAX_FILE_BYTES are read, aliases may expand to at most MAX_ALIAS_VALUES values,
nesting is bounded, duplicate keys and recursive aliases are errors. Composition is a
loop over the parser's events, so no input ends in RecursionError.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any

import yaml
from yaml.events import (AliasEvent, DocumentStartEvent, MappingEndEvent, MappingStartEvent, ScalarEvent,
                         SequenceEndEvent, SequenceStartEvent, StreamEndEvent)

from launcher.errors import ConfigError
from launcher.config.interpolate import closing_brace
from launcher.config.sourcemap import OVERRIDES, Origin, parent_key

MAX_FILE_BYTES = 1 << 20          # 1 MiB
MAX_ALIAS_VALUES = 10_000         # values reached through aliases, all uses counted
MAX_DEPTH = 64                    # nested mappings and lists

_Parser = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_STRING_TAGS = (None, "!", "tag:yaml.org,2002:str")
_MAP_TAGS = (None, "!", "tag:yaml.org,2002:map")
_SEQ_TAGS = (None, "!", "tag:yaml.org,2002:seq")


class Scalar:
    """One scalar as written: `text`, and `plain` unless it was quoted, a block scalar
    (`|`, `>`) or tagged `!!str`."""

    __slots__ = ("plain", "text")

    def __init__(self, text: str, plain: bool = True) -> None:
        self.text = text
        self.plain = plain

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Scalar) and (self.text, self.plain) == (other.text, other.plain)

    def __hash__(self) -> int:
        return hash((self.text, self.plain))

    def __repr__(self) -> str:
        return f"Scalar({self.text!r}{'' if self.plain else ', quoted'})"

    def __deepcopy__(self, memo: dict[int, Any]) -> Scalar:
        return self           # immutable in practice: nothing assigns to it after parsing


class Unread(Scalar):
    """An override's text that opens a flow list or mapping YAML could not read: kept as
    text, with YAML's `problem`, for the message of a key that wanted the list or mapping."""

    __slots__ = ("problem",)

    def __init__(self, text: str, problem: str) -> None:
        super().__init__(text)
        self.problem = problem


class YamlDoc:
    """One parsed file: its raw data and the line of every key."""

    __slots__ = ("data", "lines", "path")

    def __init__(self, path: str, data: dict[str, Any], lines: dict[str, int]) -> None:
        self.path = path
        self.data = data
        self.lines = lines          # dotted key (list items as key[i]) -> line of the key

    def origin(self, key: str) -> Origin:
        """Where `key` was written; a key reached through an alias or a merge has no line
        of its own, and is given its nearest written ancestor's."""
        probe = key
        while probe:
            if probe in self.lines:
                return Origin(self.path, self.lines[probe])
            probe = parent_key(probe)
        return Origin(self.path)


def read_yaml(path: str | os.PathLike[str]) -> YamlDoc:
    name = str(path)
    text = _read_text(name)
    data, lines = parse(text, name, lines=True)
    if data is None or data == Scalar(""):        # nothing, or only `---`
        raise ConfigError("the file is empty", file=name)
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping of keys", file=name)
    return YamlDoc(name, data, lines)


def _read_text(name: str) -> str:
    # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it.
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(name, flags)
    except FileNotFoundError:
        raise ConfigError("no such file", file=name) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, not a YAML file", file=name) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read: {getattr(exc, 'strerror', None) or exc}", file=name) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise ConfigError("is a directory, not a YAML file", file=name)
        if not stat.S_ISREG(mode):
            raise ConfigError("is not a regular file (a FIFO, device or socket cannot be a config file)", file=name)
        chunks, size = [], 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(fd, MAX_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", file=name) from None
    finally:
        os.close(fd)
    if size > MAX_FILE_BYTES:
        raise ConfigError(f"is larger than {MAX_FILE_BYTES // (1 << 20)} MiB, the most a config file may be",
                          file=name)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"is not UTF-8 text (byte {exc.start})", file=name) from None


def parse(text: str, name: str, *, lines: bool = False) -> tuple[Any, dict[str, int]]:
    """One YAML document -> (dict | list | Scalar | None, {dotted key: line}).
    Errors are ConfigErrors naming `name`."""
    if not text.isascii() and re.search(_SURROGATE, text):
        raise ConfigError("is not valid Unicode text (it holds a lone surrogate)", file=name)
    loader = _Parser(text)
    try:
        return _Composer(loader, name, lines).document()
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1 if isinstance(exc.position, int) else None
        raise ConfigError(f"invalid YAML: character U+{exc.character:04X} cannot appear in a YAML file"
                          if isinstance(exc.character, int) else f"invalid YAML: {exc.reason}",
                          file=name, line=line) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"invalid YAML: {problem.splitlines()[0] if problem else 'unreadable'}", file=name,
                          line=mark.line + 1 if mark else None) from None
    finally:
        loader.dispose()


class _Open:
    """A mapping or list being composed."""

    __slots__ = ("anchor", "key", "merges", "pending", "seen", "size", "value")

    def __init__(self, value: Any, key: str, anchor: str | None) -> None:
        self.value = value          # the dict or list
        self.key = key              # its dotted key
        self.anchor = anchor
        self.size = 1               # values inside, aliases expanded
        self.pending: tuple[str, int, bool] | None = None   # mapping: (key text, line, is merge key) awaiting a value
        self.seen: dict[str, int] = {}                      # mapping: key -> line
        self.merges: list[dict[str, Any]] = []              # mapping: sources of `<<`


class _Composer:
    def __init__(self, loader: Any, name: str, lines: bool) -> None:
        self.loader = loader
        self.name = name
        self.lines: dict[str, int] | None = {} if lines else None
        self.anchors: dict[str, tuple[Any, int]] = {}
        self.open_anchors: set[str] = set()
        self.alias_values = 0

    def error(self, message: str, line: int | None, key: str | None = None) -> ConfigError:
        return ConfigError(message, file=self.name, key=key or None, line=line)

    def document(self) -> tuple[Any, dict[str, int]]:
        get = self.loader.get_event
        get()                                       # StreamStart
        event = get()
        if isinstance(event, StreamEndEvent):
            return None, {}
        root = self._node_tree()
        get()                                       # DocumentEnd
        event = get()
        if isinstance(event, DocumentStartEvent):
            raise self.error("holds more than one YAML document (---); a config file is one", event.start_mark.line + 1)
        return root, self.lines or {}

    def _node_tree(self) -> Any:
        """The document's root value, composed from the parser's events without recursion:
        `stack` holds the mappings and lists still open, innermost last."""
        stack: list[_Open] = []
        get = self.loader.get_event
        while True:
            event = get()
            line = event.start_mark.line + 1
            kind = type(event)
            if kind is MappingStartEvent or kind is SequenceStartEvent:
                stack.append(self._open(event, kind is MappingStartEvent, line, stack))
                continue
            if kind is ScalarEvent:
                done, size = self._scalar(event, line, stack)
            elif kind is AliasEvent:
                done, size = self._alias(event, line, stack)
            elif kind is MappingEndEvent or kind is SequenceEndEvent:
                done, size = self._close(stack.pop())
            else:                                    # nothing else occurs inside a document
                raise self.error(f"unexpected YAML event {kind.__name__}", line)
            if not stack:
                return done
            self._add(stack[-1], done, size, line)

    def _scalar(self, event: ScalarEvent, line: int, stack: list[_Open]) -> tuple[Scalar, int]:
        if event.tag not in _STRING_TAGS:
            raise self._tag_error(event.tag, line, stack)
        value = Scalar(event.value, plain=not event.style and event.tag is None)
        if event.anchor is not None:
            self.open_anchors.discard(event.anchor)      # redefined: the latest one counts
            self.anchors[event.anchor] = (value, 1)
        return value, 1

    def _alias(self, event: AliasEvent, line: int, stack: list[_Open]) -> tuple[Any, int]:
        name = event.anchor
        if name in self.open_anchors:
            raise self.error(f"recursive alias *{name}: it refers to a value that contains it", line,
                             self._child_key(stack))
        if name not in self.anchors:
            raise self.error(f"alias *{name} refers to no anchor &{name} before it", line, self._child_key(stack))
        value, size = self.anchors[name]
        self.alias_values += size
        if self.alias_values > MAX_ALIAS_VALUES:
            raise self.error(f"aliases expand to more than {MAX_ALIAS_VALUES} values; a few nested aliases "
                             "can stand for billions of values, so this is refused", line, self._child_key(stack))
        return value, size

    def _open(self, event: MappingStartEvent | SequenceStartEvent, mapping: bool, line: int,
              stack: list[_Open]) -> _Open:
        if event.tag not in (_MAP_TAGS if mapping else _SEQ_TAGS):
            raise self._tag_error(event.tag, line, stack)
        if len(stack) >= MAX_DEPTH:
            raise self.error(f"nested deeper than {MAX_DEPTH} levels", line, stack[1].key if len(stack) > 1
                             else None)
        if event.anchor is not None:
            self.open_anchors.add(event.anchor)
        return _Open({} if mapping else [], self._child_key(stack), event.anchor)

    def _close(self, frame: _Open) -> tuple[Any, int]:
        if frame.merges:
            self._apply_merges(frame)
        if frame.anchor is not None:
            self.open_anchors.discard(frame.anchor)
            self.anchors[frame.anchor] = (frame.value, frame.size)
        return frame.value, frame.size

    def _tag_error(self, tag: str, line: int, stack: list[_Open]) -> ConfigError:
        shown = tag.replace("tag:yaml.org,2002:", "!!", 1)
        return self.error(f"the YAML tag {shown} is not supported; write the value without it", line,
                          self._child_key(stack))

    def _child_key(self, stack: list[_Open]) -> str:
        """The dotted key of the value that comes next."""
        if not stack:
            return ""
        top = stack[-1]
        if isinstance(top.value, list):
            return f"{top.key}[{len(top.value)}]"
        if top.pending is None:
            return top.key
        return _join(top.key, top.pending[0])

    def _add(self, frame: _Open, value: Any, size: int, line: int) -> None:
        frame.size += size
        if isinstance(frame.value, list):
            if self.lines is not None:
                self.lines[f"{frame.key}[{len(frame.value)}]"] = line
            frame.value.append(value)
            return
        if frame.pending is None:                  # a key
            if not isinstance(value, Scalar):
                raise self.error("a key must be a single value, not a mapping or a list", line, frame.key)
            frame.pending = (value.text, line, value.plain and value.text == "<<")
            return
        text, key_line, merge = frame.pending
        frame.pending = None
        if merge:
            sources = value if isinstance(value, list) else [value]
            if not all(isinstance(s, dict) for s in sources):
                raise self.error("<< (merge) takes a mapping or a list of mappings", key_line, frame.key)
            frame.merges.extend(sources)
            return
        key = _join(frame.key, text)
        if text in frame.seen:
            raise self.error(f"duplicate key {text!r} (lines {frame.seen[text]} and {key_line}); a key may appear "
                             "once", key_line, key)
        frame.seen[text] = key_line
        if self.lines is not None:
            self.lines[key] = key_line
        frame.value[text] = value

    @staticmethod
    def _apply_merges(frame: _Open) -> None:
        # YAML merge keys: keys written in the mapping win, then earlier sources.
        for source in frame.merges:
            for key, value in source.items():
                frame.value.setdefault(key, value)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


# --- KEY=VALUE overrides ----------------------------------------------------------

_SURROGATE = "[\ud800-\udfff]"
_SINGLE_QUOTED = r"(?s)'(?:[^']|'')*'"
_DOUBLE_QUOTED = r'(?s)"(?:[^"\\]|\\.)*"'


def override_value(text: str) -> Any:
    """The value of a KEY=VALUE override, as raw data: a YAML flow list or mapping
    (`[a, b]`, `{k: v}`), one quoted scalar, or else the text exactly as given (` #` and
    all: it is a command-line word, not a YAML line). Empty is the empty string."""
    if text == "":
        return Scalar("", plain=False)
    if text[0] in "[{":
        try:
            value, _ = parse(text, OVERRIDES)
        except ConfigError as exc:
            if not exc.message.startswith(("invalid YAML", "is not valid Unicode")):
                raise
            value = _flow_with_interpolations(text)
            if value is None:           # the converter refuses what no value can hold
                return Unread(text, exc.message.removeprefix("invalid YAML: "))
        if isinstance(value, (list, dict)):
            return value
        return Scalar(text)
    if text[0] == "'" and re.fullmatch(_SINGLE_QUOTED, text):
        return Scalar(text[1:-1].replace("''", "'"), plain=False)
    if text[0] == '"' and re.fullmatch(_DOUBLE_QUOTED, text):
        try:
            value, _ = parse(text, OVERRIDES)
        except ConfigError:
            return Scalar(text)
        if isinstance(value, Scalar):
            return value
    return Scalar(text)


# Each `${...}` stands as one private-use character while a flow list or mapping is parsed:
# no one types them, and each stands for its own span wherever an alias repeats it.
_HOLES = re.compile("[\U000F0000-\U000FFFFD]")


def _flow_with_interpolations(text: str) -> Any:
    """`[--lr, ${hparams.lr}]` as YAML reads `[--lr, '${hparams.lr}']`: an interpolation's
    braces are YAML flow indicators, so unquoted in a flow list or mapping it is no YAML.
    Each `${...}` is parsed as a stand-in character, then put back in the scalar that
    holds it (which stays plain: `${a}` and `x${a}` are values as written). None when
    there is none, or the text is still no YAML."""
    spans: list[str] = []
    pieces: list[str] = []
    i = 0
    while (start := text.find("${", i)) != -1:
        end = closing_brace(text, start + 2)
        if end is None:
            return None
        pieces += [text[i:start], chr(0xF0000 + len(spans))]
        spans.append(text[start:end])
        i = end
    if not spans or len(spans) > 0xFFFE or _HOLES.search(text):
        return None
    pieces.append(text[i:])
    try:
        value, _ = parse("".join(pieces), OVERRIDES)
    except ConfigError:
        return None

    def put_back(part: str) -> str:
        return _HOLES.sub(lambda m: spans[ord(m.group()) - 0xF0000], part)

    def fill(node: Any) -> Any:
        if isinstance(node, Scalar):
            return Scalar(put_back(node.text), node.plain)
        if isinstance(node, list):
            return [fill(item) for item in node]
        if isinstance(node, dict):
            return {put_back(k): fill(v) for k, v in node.items()}
        return node

    return fill(value)
