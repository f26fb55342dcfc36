"""Load an experiment: its YAML file and the command line's KEY=VALUE overrides ->
the typed, validated Experiment, with where each value came from.

Reads files (and only reads); everything after this step is pure."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.errors import ConfigError
from launcher.config import schema
from launcher.config.merge import merge_layer, merge_layers
from launcher.config.sourcemap import OVERRIDES, ConfigKeyError, Origin, Provenance, locating
from launcher.config.schema import MAX_RUN_NAME, NAME_PATTERN, NAME_RULE, env_name_problem
from launcher.config.typed import typed_config
from launcher.config.yamlfile import override_value, read_yaml
from launcher.rundir.records import RUN_ID


_OVERRIDE_KEY = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_-]+)*"


def parse_overrides(overrides: Sequence[str]) -> list[tuple[str, Any]]:
    """KEY=VALUE words -> (dotted key, raw value); see yamlfile.override_value."""
    if isinstance(overrides, (str, bytes)):
        raise ConfigError(f"overrides must be a list of KEY=VALUE strings, got the single string {overrides!r}",
                          file=OVERRIDES)
    parsed = []
    for item in overrides:
        if not isinstance(item, str):
            raise ConfigError(f"override {item!r} is not KEY=VALUE text (e.g. 'resources.nodes=4'), "
                              f"it is {type(item).__name__}", file=OVERRIDES)
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or not re.fullmatch(_OVERRIDE_KEY, key):
            raise ConfigError(f"override {item!r} is not KEY=VALUE (e.g. resources.nodes=4)",
                              file=OVERRIDES, key=key or item)
        parsed.append((key, override_value(value)))
    return parsed


def _nested(key: str, value: Any) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for part in reversed(key.split(".")):
        nested = {part: value}
        value = nested
    return nested


@dataclass(frozen=True)
class LoadedExperiment:
    config: schema.Experiment
    path: Path
    provenance: Provenance            # where each key was set: the file, or the command line

    @property
    def folder(self) -> str:
        """The folder of the file the experiment was read from, where model.factory's
        module is looked for first."""
        return os.path.dirname(os.path.abspath(self.provenance.default_file))


def _check_take_over(exp: schema.Experiment) -> None:
    """checkpoint.take_over names a run, and the directory it takes over."""
    run = exp.checkpoint.take_over
    if run is None:
        return
    if not RUN_ID.fullmatch(run):
        raise ConfigKeyError("checkpoint.take_over", f"{run[:60]!r} is not a run id (glaunch list shows them)")
    if not exp.checkpoint.dir:
        raise ConfigKeyError("checkpoint.take_over", f"takes over run {run}'s checkpoint directory: name it in "
                             "checkpoint.dir too")


def load_experiment(path: str | os.PathLike[str], overrides: list[str] | tuple[str, ...] = ()) -> LoadedExperiment:
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"the experiment must be a YAML file's path, got {type(path).__name__} {path!r}")
    doc = read_yaml(path)
    return experiment_from_data(doc.data, doc.origin, file=doc.path, path=path, overrides=overrides)


def experiment_from_data(data: Mapping[str, Any], origin_of: Callable[[str], Origin], *, file: str,
                         path: str | os.PathLike[str], overrides: list[str] | tuple[str, ...] = ()) -> LoadedExperiment:
    """An experiment from YAML data already read (an experiment file's, or the experiment
    section of a run's resolved.yaml), the command line's KEY=VALUE overrides on top,
    typed and checked as :func:`load_experiment` does.

    `origin_of`: where each key of `data` was written; `file`: the file an error without
    a key of its own names; `path`: the experiment file (relative paths in it, such as
    entrypoint.script, are taken from its folder).
    """
    site_keys = sorted({"scheduler", "partitions", "extends"} & set(data))
    if site_keys and "entrypoint" not in data:
        raise ConfigError(f"this is a site profile ({', '.join(site_keys)}), not an experiment: give it with --site",
                          file=file, key=site_keys[0], line=origin_of(site_keys[0]).line)
    provenance = Provenance(default_file=file)
    merged = merge_layer({}, data, provenance, origin_of)
    command_line = Origin(OVERRIDES)
    merged = merge_layers(merged, [_nested(key, value) for key, value in parse_overrides(overrides)], provenance,
                          lambda _key: command_line)
    exp: schema.Experiment = typed_config(schema.Experiment, merged, provenance, schema.EXPERIMENT_CHOICES)
    with locating(provenance):
        _check_experiment(exp)
    return LoadedExperiment(exp, Path(path), provenance)


def _check_experiment(exp: schema.Experiment) -> None:
    if not NAME_PATTERN.fullmatch(exp.name):
        raise ConfigKeyError("name", f"{exp.name!r}: a run name is {NAME_RULE}")
    if len(exp.name) > MAX_RUN_NAME:
        raise ConfigKeyError("name", f"{exp.name[:20]}... is {len(exp.name)} characters long; a run name has at "
                             f"most {MAX_RUN_NAME} (it becomes part of directory names)")
    ep = exp.entrypoint
    if bool(ep.script) == bool(ep.module):
        raise ConfigKeyError("entrypoint", "give exactly one of entrypoint.script or entrypoint.module")
    if ep.module is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", ep.module):
        raise ConfigKeyError("entrypoint.module", f"{ep.module!r} is not a Python module name")
    for key in exp.env:
        problem = env_name_problem(key)
        if problem:
            raise ConfigKeyError(f"env.{key}", problem)
    if exp.site is not None and not exp.site:
        raise ConfigKeyError("site", "must not be empty")
    _check_take_over(exp)
    # Empty is no choice: often a shell variable that was not set (checkpoint.dir=$CKPT).
    for key, value in (("resources.partition", exp.resources.partition), ("checkpoint.dir", exp.checkpoint.dir),
                       ("strategy.nvme_path", exp.strategy.nvme_path), ("model.factory", exp.model.factory)):
        if value is not None and not value.strip():
            raise ConfigKeyError(key, f"is {'empty' if not value else 'blank'}: leave it out (or null) for the "
                                 "default")
