"""Load: YAML files + schema + overrides -> typed, validated config objects.

Reads files (and only reads); everything after this step is pure. Every error names
the file, the line where known, and the dotted key.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import yaml

from . import schema
from .deepspeed_config import deep_merge
from .errors import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig
    from omegaconf.errors import OmegaConfBaseException

NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]+")
OVERRIDES = "command line"


# --- where each value came from ------------------------------------------------------


@dataclass(frozen=True)
class Origin:
    file: str
    line: int | None = None


@dataclass
class Provenance:
    """Dotted key -> the file (and line) that set it last."""

    origins: dict[str, Origin] = field(default_factory=dict)
    default_file: str = "(default)"

    def of(self, key: str, *, exact: bool = False) -> Origin:
        """Where `key` was set; unless `exact`, a key no file set is blamed on the nearest
        enclosing key that was (the right place to point an error at)."""
        if exact:
            return self.origins.get(key, Origin(self.default_file))
        probe = key
        while probe:
            if probe in self.origins:
                return self.origins[probe]
            probe = probe.rpartition(".")[0]
        return Origin(self.default_file)

    def error(self, key: str, message: str) -> ConfigError:
        origin = self.of(key)
        return ConfigError(message, file=origin.file, key=key, line=origin.line)


# --- YAML ---------------------------------------------------------------------------


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


def _leaf_keys(data: Mapping, prefix: str = "") -> list[str]:
    keys = []
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        keys.append(dotted)
        if isinstance(value, Mapping):
            keys.extend(_leaf_keys(value, dotted + "."))
    return keys


# --- schema merge ---------------------------------------------------------------------


def _omegaconf_error(exc: OmegaConfBaseException, where: Provenance | YamlDoc | Origin) -> ConfigError:
    key = getattr(exc, "full_key", None) or None
    message = (getattr(exc, "msg", None) or str(exc)).split("\n")[0].strip()
    if isinstance(where, Provenance):
        if key:
            return where.error(key, message)
        return ConfigError(message, file=where.default_file)
    origin = where.origin(key) if isinstance(where, YamlDoc) and key else (
        where if isinstance(where, Origin) else Origin(where.path))
    return ConfigError(message, file=origin.file, key=key, line=origin.line)


def _merge(base: DictConfig, data: Mapping, where: YamlDoc | Origin) -> DictConfig:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.merge(base, data)
    except OmegaConfBaseException as exc:
        raise _omegaconf_error(exc, where) from None


# Importing OmegaConf (its interpolation grammar) and merging through it costs more than
# everything else a dry run does. Plain input -- no `${`, no `???`, every value already of
# its field's type -- gets the same objects from `_plain_object`; everything else, errors
# included, goes through OmegaConf, which alone decides and words them.
# tests/test_load_paths.py runs every test input through both paths.
PLAIN_PATH = True


def _typed_config(schema_class: type, data: Mapping, provenance: Provenance,
                  choices: Mapping[str, tuple[str, ...]]) -> Any:
    """Merged plain data -> the schema's dataclass instance, validated."""
    _check_shapes(schema_class, data, provenance)
    if PLAIN_PATH:
        try:
            obj = _plain_object(schema_class, data)
        except _NeedsOmegaConf:
            pass
        else:
            _check_plain_choices(obj, choices, provenance)
            return obj
    return _typed_config_omegaconf(schema_class, data, provenance, choices)


def _typed_config_omegaconf(schema_class: type, data: Mapping, provenance: Provenance,
                            choices: Mapping[str, tuple[str, ...]]) -> Any:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = OmegaConf.merge(OmegaConf.structured(schema_class), data)
    except OmegaConfBaseException as exc:
        raise _omegaconf_error(exc, provenance) from None
    cfg = _resolve_interpolations(cfg, provenance)
    _check_choices(cfg, choices, provenance)
    return _to_object(cfg, provenance)


class _NeedsOmegaConf(Exception):
    """The plain path does not decide this input."""


_FROM_FIELDS = object()          # default: the field's dataclass built from its own defaults


@lru_cache(maxsize=None)
def _field_specs(schema_class: type) -> dict[str, tuple[bool, Any, Any]]:
    """Field name -> (None allowed, type hint without Optional, default or dataclasses.MISSING)."""
    hints = _type_hints(schema_class)
    specs = {}
    for f in dataclasses.fields(schema_class):
        optional, target = _unwrap_optional(hints[f.name])
        if f.default_factory is dataclasses.MISSING:
            default = f.default
        elif f.default_factory is target and dataclasses.is_dataclass(target):
            default = _FROM_FIELDS
        else:
            default = f.default_factory()
        specs[f.name] = (optional, target, default)
    return specs


def _unwrap_optional(hint: Any) -> tuple[bool, Any]:
    if typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(args) < len(typing.get_args(hint)):
            return True, args[0]
    return hint is Any, hint


def _plain_object(schema_class: type, data: Any) -> Any:
    if type(data) is not dict:
        raise _NeedsOmegaConf
    specs = _field_specs(schema_class)
    if any(key not in specs for key in data):
        raise _NeedsOmegaConf        # unknown key
    values = {}
    for name, (optional, target, default) in specs.items():
        if name in data:
            if isinstance(default, dict) and default:
                raise _NeedsOmegaConf    # OmegaConf would merge into the default's keys
            values[name] = _plain_value(optional, target, data[name])
        elif default is _FROM_FIELDS:
            values[name] = _plain_object(target, {})
        elif default is dataclasses.MISSING:
            raise _NeedsOmegaConf
        else:
            values[name] = _plain_value(optional, target, default)
    return schema_class(**values)


def _plain_value(optional: bool, target: Any, value: Any) -> Any:
    """`value` as OmegaConf would hold it in a field of type `target`; only the
    conversions that cannot fail are made here."""
    if value is None:
        if optional:
            return None
        raise _NeedsOmegaConf
    kind = type(value)
    if target is str:
        if kind is str:
            return _plain_str(value)
        if kind in (int, float, bool):
            return str(value)
    elif target is int:
        if kind is int:
            return value
    elif target is float:
        if kind in (int, float):
            try:
                return float(value)
            except OverflowError:
                raise _NeedsOmegaConf from None
    elif target is bool:
        if kind is bool:
            return value
    elif target is Any:
        return _plain_any(value)
    elif dataclasses.is_dataclass(target):
        return _plain_object(target, value)
    else:
        origin, args = typing.get_origin(target), typing.get_args(target)
        item_optional, item_type = _unwrap_optional(args[-1]) if args else (True, Any)
        if origin is dict and kind is dict and (not args or args[0] is str):
            return {_plain_key(k): _plain_value(item_optional, item_type, v) for k, v in value.items()}
        if origin is list and kind is list:
            return [_plain_value(item_optional, item_type, v) for v in value]
    raise _NeedsOmegaConf


def _plain_any(value: Any) -> Any:
    kind = type(value)
    if value is None or kind in (int, float, bool):
        return value
    if kind is str:
        return _plain_str(value)
    if kind is dict:
        return {_plain_key(k): _plain_any(v) for k, v in value.items()}
    if kind is list:
        return [_plain_any(v) for v in value]
    raise _NeedsOmegaConf


def _plain_str(value: str) -> str:
    if "${" in value or "???" in value:   # interpolation, escape, or a missing value
        raise _NeedsOmegaConf
    return value


def _plain_key(key: Any) -> str:
    if type(key) is not str:
        raise _NeedsOmegaConf
    return _plain_str(key)


def _check_plain_choices(obj: Any, choices: Mapping[str, tuple[str, ...]], provenance: Provenance) -> None:
    for key, allowed in choices.items():
        value = obj
        for part in key.split("."):
            value = getattr(value, part)
            if value is None:
                break
        if value is not None and value not in allowed:
            raise provenance.error(key, f"{value!r} is not one of: {', '.join(allowed)}")


@lru_cache(maxsize=None)
def _type_hints(schema_class: type) -> dict[str, Any]:
    return typing.get_type_hints(schema_class)


def _check_shapes(schema_class: type, data: Mapping, provenance: Provenance, prefix: str = "") -> None:
    """Sections and lists given as the wrong kind of value: OmegaConf would raise a bare
    TypeError that names no key."""
    hints = _type_hints(schema_class)
    for f in dataclasses.fields(schema_class):
        if f.name not in data or data[f.name] is None:
            continue
        value, key = data[f.name], f"{prefix}{f.name}"
        hint = hints[f.name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        target = args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint
        origin = typing.get_origin(target)
        if dataclasses.is_dataclass(target) or origin in (dict, typing.Dict):
            if not isinstance(value, Mapping):
                raise provenance.error(key, f"must be a mapping of keys, got {type(value).__name__}")
            if dataclasses.is_dataclass(target):
                _check_shapes(target, value, provenance, key + ".")
            else:
                inner = typing.get_args(target)[1] if typing.get_args(target) else None
                if dataclasses.is_dataclass(inner):
                    for name, item in value.items():
                        if not isinstance(item, Mapping):
                            raise provenance.error(f"{key}.{name}", "must be a mapping of keys")
                        _check_shapes(inner, item, provenance, f"{key}.{name}.")
        elif origin in (list, typing.List) and not isinstance(value, list):
            raise provenance.error(key, f"must be a list, got {type(value).__name__}")


def _to_object(cfg: DictConfig, provenance: Provenance) -> Any:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:
        error = _omegaconf_error(exc, provenance)
        if "missing mandatory value" in error.message.lower():
            error.message = "required key is missing"
        raise error from None


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


def _check_choices(cfg: DictConfig, choices: Mapping[str, tuple[str, ...]], provenance: Provenance) -> None:
    from omegaconf import OmegaConf

    for key, allowed in choices.items():
        value = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
        if value is not None and value not in allowed:
            raise provenance.error(key, f"{value!r} is not one of: {', '.join(allowed)}")


def _resolve_interpolations(cfg: DictConfig, provenance: Provenance) -> DictConfig:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as exc:
        error = _omegaconf_error(exc, provenance)
        error.message += " (a literal shell variable is written $NAME, or \\${NAME})"
        raise error from None
    return cfg


# --- experiment -------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadedExperiment:
    config: schema.Experiment
    path: Path
    provenance: Provenance


def load_experiment(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = ()) -> LoadedExperiment:
    doc = read_yaml(path)
    provenance = Provenance(default_file=doc.path)
    for key in _leaf_keys(doc.data):
        provenance.origins[key] = doc.origin(key)
    parsed = parse_overrides(list(overrides))
    data = doc.data
    for key, value in parsed:
        provenance.origins[key] = Origin(OVERRIDES)
        data = deep_merge(data, _overrides_dict([(key, value)]))
    # One schema merge of the merged data, not one per layer: the provenance already says
    # which file (or override) each key came from.
    exp: schema.Experiment = _typed_config(schema.Experiment, data, provenance, schema.EXPERIMENT_CHOICES)
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
        _check_env_name(key, f"env.{key}", prov)
    if exp.site is not None and not exp.site:
        raise prov.error("site", "must not be empty")


def _check_env_name(name: str, key: str, prov: Provenance) -> None:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise prov.error(key, f"{name!r} is not a valid environment variable name")


# --- site profiles -----------------------------------------------------------------------


SHIPPED_SITES = Path(__file__).resolve().parent.parent / "site_configs"


def site_search_path(cwd: Path, environ: Mapping[str, str]) -> list[Path]:
    """Where profile names are looked up, first match wins (DESIGN.md)."""
    dirs = [cwd / "site_configs"]
    dirs += [Path(d) for d in environ.get("GLAUNCH_SITE_PATH", "").split(":") if d]
    home = environ.get("HOME")
    if home:
        dirs.append(Path(home) / ".config" / "glaunch" / "sites")
    dirs.append(_shipped_sites_dir())
    unique: list[Path] = []
    for directory in dirs:
        if not any(_same_dir(directory, seen) for seen in unique):
            unique.append(directory)
    return unique


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return a == b


def _shipped_sites_dir() -> Path:
    if SHIPPED_SITES.is_dir():  # source checkout or editable install
        return SHIPPED_SITES
    from importlib import resources
    return Path(str(resources.files("launcher.site_configs")))


def _looks_like_path(name: str) -> bool:
    return "/" in name or name.endswith((".yaml", ".yml"))


def find_site(name: str, cwd: Path, environ: Mapping[str, str], *, near: Path | None = None,
              referrer: Origin | None = None) -> Path:
    """A profile name or a path -> the file. `near` is searched first (for `extends`)."""
    if _looks_like_path(name):
        path = Path(os.path.expanduser(name))
        path = path if path.is_absolute() else ((near or cwd) / path)
        if path.is_file():
            return path
        where = referrer or Origin(str(path))
        raise ConfigError(f"site profile file {name!r} not found", file=where.file,
                          key="extends" if referrer else None, line=where.line)
    if not NAME_PATTERN.fullmatch(name):
        where = referrer or Origin(OVERRIDES)
        raise ConfigError(f"{name!r} is not a site name or a path", file=where.file, line=where.line)
    dirs = ([near] if near else []) + site_search_path(cwd, environ)
    for directory in dirs:
        for suffix in (".yaml", ".yml"):
            candidate = directory / f"{name}{suffix}"
            if candidate.is_file():
                return candidate
    where = referrer or Origin(OVERRIDES)
    searched = ", ".join(str(d) for d in dirs)
    raise ConfigError(f"unknown site {name!r} (searched: {searched}); `glaunch sites list` shows those found",
                      file=where.file, key="extends" if referrer else "site", line=where.line)


@dataclass(frozen=True)
class LoadedSite:
    config: schema.Site
    path: Path
    chain: tuple[Path, ...]           # base first, the named file last
    provenance: Provenance


def load_site(name_or_path: str, cwd: Path, environ: Mapping[str, str], *,
              referrer: Origin | None = None) -> LoadedSite:
    path = find_site(name_or_path, cwd, environ, referrer=referrer)
    layers: list[YamlDoc] = []
    _collect_layers(path, cwd, environ, stack=[], layers=layers)
    provenance = Provenance(default_file="(default)")
    merged: dict = {}
    for doc in layers:
        data = {k: v for k, v in doc.data.items() if k != "extends"}
        merged = deep_merge(merged, data)
        for key in _leaf_keys(data):
            provenance.origins[key] = doc.origin(key)
    # The profile is named by its own file, not by what it extends.
    merged["name"] = layers[-1].data.get("name", merged.get("name"))
    provenance.origins["name"] = layers[-1].origin("name")
    site: schema.Site = _typed_config(schema.Site, merged, provenance, schema.SITE_CHOICES)
    _check_site(site, provenance)
    return LoadedSite(site, path, tuple(Path(d.path) for d in layers), provenance)


def _collect_layers(path: Path, cwd: Path, environ: Mapping[str, str], stack: list[Path],
                    layers: list[YamlDoc]) -> None:
    resolved = path.resolve()
    if resolved in stack:
        cycle = " -> ".join(str(p) for p in stack[stack.index(resolved):] + [resolved])
        raise ConfigError(f"extends forms a cycle: {cycle}", file=str(path), key="extends")
    doc = read_yaml(path)
    parents = doc.data.get("extends")
    if parents is None:
        parents = []
    elif isinstance(parents, str):
        parents = [parents]
    elif not (isinstance(parents, list) and all(isinstance(p, str) and p for p in parents)):
        raise ConfigError("must be a profile name, a path, or a list of them", file=doc.path,
                          key="extends", line=doc.lines.get("extends"))
    for parent in parents:
        parent_path = find_site(parent, cwd, environ, near=path.parent,
                                referrer=doc.origin("extends"))
        if any(Path(l.path).resolve() == parent_path.resolve() for l in layers):
            continue  # a diamond: the shared base is applied once, first
        _collect_layers(parent_path, cwd, environ, stack + [resolved], layers)
    layers.append(doc)


def _check_site(site: schema.Site, prov: Provenance) -> None:
    if not NAME_PATTERN.fullmatch(site.name):
        raise prov.error("name", f"{site.name!r} must match [A-Za-z0-9._-]+")
    for key in site.env:
        _check_env_name(key, f"env.{key}", prov)
    for pname, part in site.partitions.items():
        if not NAME_PATTERN.fullmatch(pname):
            raise prov.error(f"partitions.{pname}", f"{pname!r} is not a valid partition name")
        if part.gpus_per_node < 0:
            raise prov.error(f"partitions.{pname}.gpus_per_node", "must be 0 or more")
        for field_name in ("cpus_per_node", "max_nodes"):
            value = getattr(part, field_name)
            if value is not None and value < 1:
                raise prov.error(f"partitions.{pname}.{field_name}", "must be 1 or more")
        for field_name in ("gpu_mem_gb", "mem_gb"):
            value = getattr(part, field_name)
            if value is not None and value <= 0:
                raise prov.error(f"partitions.{pname}.{field_name}", "must be more than 0")
    if site.default_partition is not None and site.partitions and site.default_partition not in site.partitions:
        raise prov.error("default_partition",
                         f"{site.default_partition!r} is not among partitions: {', '.join(site.partitions)}")
    for key, value in site.sbatch.items():
        if not re.fullmatch(r"[a-z][a-z0-9-]*", str(key)):
            raise prov.error(f"sbatch.{key}", "an sbatch option name is lower-case letters, digits and '-'")
        if isinstance(value, (dict, list)):
            raise prov.error(f"sbatch.{key}", "a directive's value must be a string, number or true/false")
    if site.crash_retries < 0:
        raise prov.error("crash_retries", "must be 0 or more")
    if not 0 <= site.plan.headroom < 1:
        raise prov.error("plan.headroom", "must be a fraction in [0, 1)")
    if site.plan.overhead_gb < 0:
        raise prov.error("plan.overhead_gb", "must be 0 or more")
