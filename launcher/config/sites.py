"""Site profiles: the search path, `extends` chains with provenance, and the checks a
profile must pass before anything uses it."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..errors import ConfigError
from . import schema
from .merge import deep_merge
from .provenance import OVERRIDES, Origin, Provenance
from .schema import NAME_PATTERN
from .typed import check_env_name, typed_config
from .yamlfile import YamlDoc, leaf_keys, read_yaml


SHIPPED_SITES = Path(__file__).resolve().parents[2] / "site_configs"


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
        for key in leaf_keys(data):
            provenance.origins[key] = doc.origin(key)
    # The profile is named by its own file, not by what it extends.
    merged["name"] = layers[-1].data.get("name", merged.get("name"))
    provenance.origins["name"] = layers[-1].origin("name")
    site: schema.Site = typed_config(schema.Site, merged, provenance, schema.SITE_CHOICES)
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
        check_env_name(key, f"env.{key}", prov)
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
