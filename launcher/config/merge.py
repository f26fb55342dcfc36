"""Layering of configuration data: later mappings win, key by key, at any depth; lists
and scalars are replaced whole."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from launcher.config.sourcemap import Origin, Provenance


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
    return merge_layers(base, (layer,), provenance, origin_of, prefix)


def merge_layers(base: dict[str, Any], layers: Iterable[Mapping[str, Any]], provenance: Provenance,
                 origin_of: Callable[[str], Origin], prefix: str = "") -> dict[str, Any]:
    """Each of `layers` over `base` in turn, as merge_layer one after another would merge
    them, in time linear in their total size: a mapping is copied once, the first time a
    layer merges into it, and is the merge's own from then on (copying each mapping on a
    key's path for every layer is quadratic in thousands of overrides of one mapping, such
    as hparams)."""
    own: dict[int, dict[str, Any]] = {}
    merged = _owned(dict(base), own)
    for layer in layers:
        _merge_into(merged, layer, provenance, origin_of, prefix, own)
    return merged


def _owned(mapping: dict[str, Any], own: dict[int, dict[str, Any]]) -> dict[str, Any]:
    own[id(mapping)] = mapping      # held, so that no other dict ever gets its id
    return mapping


def _merge_into(merged: dict[str, Any], layer: Mapping[str, Any], provenance: Provenance,
                origin_of: Callable[[str], Origin], prefix: str, own: dict[int, dict[str, Any]]) -> None:
    for key, value in layer.items():
        dotted = f"{prefix}.{key}" if prefix else key
        old = merged.get(key)
        provenance.set(dotted, origin_of(dotted))
        if isinstance(value, dict) and isinstance(old, dict):
            mine = merged[key] = old if id(old) in own else _owned(dict(old), own)
            _merge_into(mine, value, provenance, origin_of, dotted, own)
            continue
        if isinstance(old, (dict, list)):       # only a mapping or a list has keys recorded below it
            provenance.forget_below(dotted)
        merged[key] = value
        _record(value, dotted, provenance, origin_of)


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
