"""Reading YAML configuration files: one document, a mapping at the top, the line of
every key, and none of YAML 1.1's surprises (base-60 numbers)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from ..errors import ConfigError
from .provenance import Origin


@dataclass(frozen=True)
class YamlDoc:
    path: str
    data: dict
    lines: dict[str, int]

    def origin(self, key: str) -> Origin:
        return Origin(self.path, self.lines.get(key))


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """SafeLoader without YAML 1.1's base-60 numbers, so `time: 04:00:00` stays a string."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers
            if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?"
               r"|[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)"
               r"|\.[0-9_]+(?:[eE][-+][0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def yaml_scalar(text: str) -> Any:
    """Parse one override value the way a YAML file would."""
    return yaml.load(text, Loader=_Loader)


def read_yaml(path: str | os.PathLike) -> YamlDoc:
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("no such file", file=name) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, not a YAML file", file=name) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", file=name) from None
    try:
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"invalid YAML: {problem}", file=name,
                          line=mark.line + 1 if mark else None) from None
    if data is None:
        raise ConfigError("the file is empty", file=name)
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping of keys", file=name)
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(f"keys must be strings, got {key!r}", file=name)
    return YamlDoc(name, data, _line_map(node))


def _line_map(node: Any, prefix: str = "") -> dict[str, int]:
    lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = f"{prefix}{key_node.value}"
            lines[key] = key_node.start_mark.line + 1
            lines.update(_line_map(value_node, key + "."))
    return lines


def leaf_keys(data: Mapping, prefix: str = "") -> list[str]:
    keys = []
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        keys.append(dotted)
        if isinstance(value, Mapping):
            keys.extend(leaf_keys(value, dotted + "."))
    return keys
