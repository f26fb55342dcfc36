"""Load an experiment: its YAML file and the command line's KEY=VALUE overrides ->
the typed, validated Experiment, with where each value came from.

Reads files (and only reads); everything after this step is pure."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from . import schema
from .merge import deep_merge
from .provenance import OVERRIDES, Origin, Provenance
from .schema import NAME_PATTERN
from .sites import LoadedSite, find_site, load_site, site_search_path
from .typed import check_env_name, typed_config
from .yamlfile import leaf_keys, read_yaml, yaml_scalar

__all__ = ["LoadedExperiment", "LoadedSite", "Origin", "Provenance", "find_site", "load_experiment",
           "load_site", "parse_overrides", "site_search_path"]


def parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    parsed = []
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_-]+)*", key):
            raise ConfigError(f"override {item!r} is not KEY=VALUE (e.g. resources.nodes=4)",
                              file=OVERRIDES, key=key or item)
        try:
            value_obj = yaml_scalar(value) if value.strip() else ""
        except yaml.YAMLError:
            value_obj = value
        parsed.append((key, value_obj))
    return parsed


def _overrides_dict(parsed: list[tuple[str, Any]]) -> dict:
    root: dict = {}
    for key, value in parsed:
        node = root
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError("set both as a value and as a section", file=OVERRIDES, key=key)
            node = child
        node[parts[-1]] = value
    return root


@dataclass(frozen=True)
class LoadedExperiment:
    config: schema.Experiment
    path: Path
    provenance: Provenance


def load_experiment(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = ()) -> LoadedExperiment:
    doc = read_yaml(path)
    provenance = Provenance(default_file=doc.path)
    for key in leaf_keys(doc.data):
        provenance.origins[key] = doc.origin(key)
    parsed = parse_overrides(list(overrides))
    data = doc.data
    for key, value in parsed:
        provenance.origins[key] = Origin(OVERRIDES)
        data = deep_merge(data, _overrides_dict([(key, value)]))
    # One schema merge of the merged data, not one per layer: the provenance already says
    # which file (or override) each key came from.
    exp: schema.Experiment = typed_config(schema.Experiment, data, provenance, schema.EXPERIMENT_CHOICES)
    _check_experiment(exp, provenance)
    return LoadedExperiment(exp, Path(path), provenance)


def _check_experiment(exp: schema.Experiment, prov: Provenance) -> None:
    if not NAME_PATTERN.fullmatch(exp.name):
        raise prov.error("name", f"{exp.name!r} must match [A-Za-z0-9._-]+")
    ep = exp.entrypoint
    if bool(ep.script) == bool(ep.module):
        raise prov.error("entrypoint", "give exactly one of entrypoint.script or entrypoint.module")
    if ep.module is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", ep.module):
        raise prov.error("entrypoint.module", f"{ep.module!r} is not a Python module name")
    for key, value in exp.env.items():
        check_env_name(key, f"env.{key}", prov)
    if exp.site is not None and not exp.site:
        raise prov.error("site", "must not be empty")
