"""Layering of configuration data: later mappings win, key by key, at any depth; lists
and scalars are replaced whole."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from launcher.config.provenance import Origin, Provenance


def deep_merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(dict(base))
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def merge_layer(base: dict[str, Any], layer: Mapping[str, Any], provenance: Provenance,
                origin_of: Callable[[str], Origin], prefix: str = "") -> dict[str, Any]:
    """`layer` over `base` (raw YAML data), recording in the source map `provenance` where
    every key `layer` sets came from. Neither input is changed: merged mappings are new dicts, anything else is
    shared (raw values are never modified after parsing)."""
    merged = dict(base)
    for key, value in layer.items():
        dotted = f"{prefix}.{key}" if prefix else key
        old = merged.get(key)
        provenance.set(dotted, origin_of(dotted))
        if isinstance(value, dict) and isinstance(old, dict):
            merged[key] = merge_layer(old, value, provenance, origin_of, dotted)
            continue
        if key in merged:
            provenance.forget_below(dotted)
        merged[key] = value
        _record(value, dotted, provenance, origin_of)
    return merged


def _record(value: Any, prefix: str, provenance: Provenance, origin_of: Callable[[str], Origin]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            dotted = f"{prefix}.{key}"
            provenance.set(dotted, origin_of(dotted))
            _record(item, dotted, provenance, origin_of)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            dotted = f"{prefix}[{index}]"
            provenance.set(dotted, origin_of(dotted))
            _record(item, dotted, provenance, origin_of)
