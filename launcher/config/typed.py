"""Merged plain data -> the schema's dataclasses, validated; every error names the file,
line and dotted key."""

from __future__ import annotations

import dataclasses
import re
import typing
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Mapping

from ..errors import ConfigError
from .provenance import Origin, Provenance
from .yamlfile import YamlDoc

if TYPE_CHECKING:
    from omegaconf import DictConfig
    from omegaconf.errors import OmegaConfBaseException


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


def typed_config(schema_class: type, data: Mapping, provenance: Provenance,
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


def check_env_name(name: str, key: str, prov: Provenance) -> None:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise prov.error(key, f"{name!r} is not a valid environment variable name")
