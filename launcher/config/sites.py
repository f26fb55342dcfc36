"""Site profiles: the search path, `extends` chains with provenance; loading applies the
profile's own checks (launcher.config.sitechecks)."""

from __future__ import annotations

import hashlib
import importlib.resources
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from launcher.errors import ConfigError
from launcher.config import schema
from launcher.config.merge import merge_layer
from launcher.config.sourcemap import OVERRIDES, Origin, Provenance, locating
from launcher.config.schema import NAME_PATTERN, site_name_problem
from launcher.config.sitechecks import check_site
from launcher.config.typed import NULLS, did_you_mean, typed_config
from launcher.config.yamlfile import Scalar, YamlDoc, _read_text, parse
from launcher.rundir import envnames

MAX_EXTENDS_DEPTH = 32
# Where a folder named by an environment variable was given, for an error about it.
_ENVIRONMENT = Origin("environment")


def _shipped_sites_dir() -> Path:
    """The profiles shipped with glaunch: launcher/site_configs/ where the package is
    installed (pyproject.toml's package-dir puts the checkout's site_configs/ there), else
    the checkout's own (a source tree, an editable install). Only a real folder will do:
    the profiles are read, and named in messages, by path."""
    installed = importlib.resources.files("launcher").joinpath("site_configs")
    if isinstance(installed, Path) and installed.is_dir():
        return Path(os.fspath(installed))
    return Path(__file__).resolve().parents[2] / "site_configs"


SHIPPED_SITES = _shipped_sites_dir()


def inside_folder(path: str | os.PathLike[str], folder: Path) -> bool:
    """Whether `path` (followed through links, `..` taken) would be in `folder` or below."""
    try:
        return os.path.realpath(path).startswith(os.path.join(os.path.realpath(folder), ""))
    except (OSError, ValueError):
        return False


def shipped_profile_advice(path: str | os.PathLike[str]) -> str | None:
    """How to change the profile at `path` when it is one shipped with glaunch (an upgrade
    replaces it, and it often lies inside site-packages): by a copy of the same name that
    shadows it. None for any other file."""
    if not inside_folder(path, SHIPPED_SITES):
        return None
    name = Path(path).stem
    return (f"{name} is a profile shipped with glaunch: copy it to ./site_configs/{name}.yaml or "
            f"~/.config/glaunch/sites/{name}.yaml and change the copy, which shadows it")


def where_to_change(path: str | os.PathLike[str]) -> str:
    """Where a user changes a value of the profile at `path`, as a warning says it: `in
    FILE`, or for a shipped profile in a copy that shadows it."""
    if shipped_profile_advice(path) is None:
        return f"in {os.fspath(path)}"
    name = Path(path).stem
    return (f"in your own copy of {name}, a profile shipped with glaunch (copy it to ./site_configs/{name}.yaml "
            f"or ~/.config/glaunch/sites/{name}.yaml: the copy shadows it)")


def site_search_path(cwd: Path, environ: Mapping[str, str]) -> list[Path]:
    """Where profile names are looked up, first match wins (DESIGN.md). A folder that
    cannot be looked into (a name too long, a symlink loop, no permission) is a
    ConfigError naming the variable that gave it; one that does not exist is skipped."""
    return [d.path for d in _search_dirs(cwd, environ)]


# What put a folder on the search path, as `glaunch sites list` names it.
SOURCE_SITE_CONFIGS = "site_configs"
SOURCE_SITE_PATH = envnames.SITE_PATH
SOURCE_USER = "user"
SOURCE_SHIPPED = "shipped"


class _SearchDir(NamedTuple):
    """A folder of the search path, and what put it there: the key an error about it names,
    where that was given (None: no file, as for the shipped profiles), and its source (one
    of SOURCE_*; '' for a profile's own folder off the search path)."""

    path: Path
    key: str
    where: Origin | None = None
    source: str = ""


def user_sites_dir(environ: Mapping[str, str]) -> Path | None:
    """The folder of the user's own profiles (~/.config/glaunch/sites/); None without HOME."""
    home = environ.get("HOME")
    return Path(home) / ".config" / "glaunch" / "sites" if home else None


def _search_dirs(cwd: Path, environ: Mapping[str, str]) -> list[_SearchDir]:
    dirs = [_SearchDir(cwd / "site_configs", "site_configs", None, SOURCE_SITE_CONFIGS)]
    dirs += [_SearchDir(Path(d), envnames.SITE_PATH, _ENVIRONMENT, SOURCE_SITE_PATH)
             for d in environ.get(envnames.SITE_PATH, "").split(":") if d]
    user = user_sites_dir(environ)
    if user is not None:
        dirs.append(_SearchDir(user, "HOME", _ENVIRONMENT, SOURCE_USER))
    dirs.append(_SearchDir(SHIPPED_SITES, "the shipped profiles", None, SOURCE_SHIPPED))
    unique: list[_SearchDir] = []
    for directory in dirs:
        _is_file(directory.path, directory.key, directory.where, what="site profile folder")
        if not any(_same_dir(directory.path, seen.path) for seen in unique):
            unique.append(directory)
    return unique


def _is_file(path: Path, key: str, where: Origin | None = None, *, what: str = "site profile") -> bool:
    """Whether something is at `path`; failing to look (ENAMETOOLONG, EACCES, ELOOP) is a
    ConfigError naming `key` (and `where` it was written), never a traceback."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except (OSError, ValueError) as exc:
        shown = str(path) if len(str(path)) <= 100 else f"{str(path)[:100]}..."
        raise ConfigError(f"{what} {shown!r}: {getattr(exc, 'strerror', None) or exc}",
                          file=where.file if where else None, key=key, line=where.line if where else None) from None
    return True


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return a == b


def search_folders(cwd: Path, environ: Mapping[str, str]) -> list[dict[str, Any]]:
    """The search path, first match wins: each folder, its source (SOURCE_*) and whether it
    exists."""
    return [{"folder": str(d.path), "source": d.source, "exists": d.path.is_dir()}
            for d in _search_dirs(cwd, environ)]


def found_profiles(cwd: Path, environ: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every profile name on the search path, by name: the file the name finds, its folder
    and that folder's source, and the files of the same name it shadows (further down the
    search path, or a `.yml` beside a `.yaml`), nearest first."""
    found: dict[str, dict[str, Any]] = {}
    for directory in _search_dirs(cwd, environ):
        # In one folder, NAME.yaml is looked up before NAME.yml.
        for path in sorted(_profile_files(directory.path), key=lambda p: (p.stem, p.suffix != ".yaml")):
            entry = {"path": str(path), "folder": str(directory.path), "source": directory.source}
            if path.stem in found:
                found[path.stem]["shadows"].append(entry)
            else:
                found[path.stem] = {"name": path.stem, **entry, "shadows": []}
    return [found[name] for name in sorted(found)]


def _profile_files(folder: Path) -> list[Path]:
    """The profile files in `folder`; none where it is missing, no folder or unreadable."""
    try:
        return [p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and not p.name.startswith(".")]
    except OSError:
        return []


def _looks_like_path(name: str) -> bool:
    return "/" in name or name.endswith((".yaml", ".yml"))


def find_site(name: str | os.PathLike[str], cwd: Path, environ: Mapping[str, str], *,
              extending: Path | None = None, referrer: Origin | None = None, key: str | None = None) -> Path:
    """A profile name or a path -> the file. `extending`: the profile whose `extends` gave
    it (a relative path is taken from its folder; a name is looked up as
    :func:`_extends_dirs` says). `referrer`: where the name was written; `key`: the key (or
    option) that gave it, which an error names (`extends` in a profile, `site` in an
    experiment, `--site` when neither)."""
    key = key or ("extends" if referrer else "--site")
    given = name
    is_path = isinstance(name, os.PathLike)     # a path object is a path, whatever its name looks like
    if is_path:
        name = os.fspath(name)
    if not isinstance(name, str):
        where = referrer or Origin(OVERRIDES)
        raise ConfigError(f"a site is a profile name or a path (text), not {type(given).__name__} ({given!r})",
                          file=where.file, key=key, line=where.line)
    if is_path or _looks_like_path(name):
        path = Path(os.path.expanduser(name))
        path = path if path.is_absolute() else ((extending.parent if extending else cwd) / path)
        if _is_file(path, key, referrer or Origin(OVERRIDES)):     # reading refuses what is not a regular file
            return path
        where = referrer or Origin(str(path))
        raise ConfigError(f"site profile file {name!r} not found", file=where.file,
                          key=key if referrer else None, line=where.line)
    if not NAME_PATTERN.fullmatch(name):
        where = referrer or Origin(OVERRIDES)
        raise ConfigError(f"{name!r} is not a site name or a path", file=where.file, key=key, line=where.line)
    problem = site_name_problem(name)
    if problem:
        where = referrer or Origin(OVERRIDES)
        raise ConfigError(problem, file=where.file, key=key, line=where.line)
    search = _search_dirs(cwd, environ)
    dirs = _extends_dirs(name, extending, search, key, referrer) if extending else search
    for directory in dirs:
        for suffix in (".yaml", ".yml"):
            candidate = directory.path / f"{name}{suffix}"
            if _is_file(candidate, directory.key, directory.where):
                return candidate
    where = referrer or Origin(OVERRIDES)
    searched = ", ".join(str(d.path) for d in dirs)
    if extending is not None and extending.stem == name:
        after = f"after {extending.parent}" if len(dirs) < len(search) else "elsewhere"
        raise ConfigError(f"extends {name!r}, this profile's own name, means the next profile of that name on the "
                          f"search path, and there is none {after} (searched: {searched or 'nothing'}); a profile "
                          "cannot extend itself: that is a cycle", file=where.file, key=key, line=where.line)
    suggestion = did_you_mean(name, {p.stem for d in dirs for p in _profile_files(d.path)})
    raise ConfigError(f"unknown site {name!r} (searched: {searched}); "
                      + (f"{suggestion} " if suggestion else "") + "`glaunch sites list` shows those found",
                      file=where.file, key=key, line=where.line)


def _extends_dirs(name: str, extending: Path, search: list[_SearchDir], key: str,
                  referrer: Origin | None) -> list[_SearchDir]:
    """Where a name in the `extends` of the profile `extending` is looked up. From a folder
    of the search path: the whole search path, as for `--site`, so a name means the file
    `glaunch sites list` shows for it wherever it is written; its own name means the
    profile it shadows, so only the folders after its own. Off the search path (a profile
    given by its path): its own folder first, then the search path."""
    own = extending.stem == name
    index = next((i for i, d in enumerate(search) if _same_dir(d.path, extending.parent)), None)
    if index is None:
        return ([] if own else [_SearchDir(extending.parent, key, referrer)]) + search
    return search[index + 1:] if own else search


class ProfileFile(NamedTuple):
    """One file a profile was read from, and the SHA-256 of its bytes as they were read."""

    path: str
    sha256: str


@dataclass(frozen=True)
class LoadedSite:
    config: schema.Site
    path: Path
    chain: tuple[Path, ...]           # base first, the named file last
    provenance: Provenance            # where each key was set, along the chain
    files: tuple[ProfileFile, ...] = ()   # each file of the chain as read, base first


def load_site(name_or_path: str | os.PathLike[str], cwd: Path, environ: Mapping[str, str], *,
              referrer: Origin | None = None, key: str | None = None) -> LoadedSite:
    """The profile `name_or_path` names (see find_site for `referrer` and `key`), its
    extends chain merged, typed and checked."""
    path = find_site(name_or_path, cwd, environ, referrer=referrer, key=key)
    layers: list[tuple[YamlDoc, str]] = []
    _collect_layers(path, cwd, environ, stack=[], layers=layers)
    loaded = site_from_layers((({k: v for k, v in doc.data.items() if k != "extends"}, doc.origin)
                               for doc, _ in layers),
                              file=str(path), path=path, chain=tuple(Path(d.path) for d, _ in layers),
                              files=tuple(ProfileFile(d.path, digest) for d, digest in layers))
    return loaded



def site_from_layers(layers: Iterable[tuple[Mapping[str, Any], Callable[[str], Origin]]], *, file: str,
                     path: Path, chain: tuple[Path, ...], files: tuple[ProfileFile, ...] = ()) -> LoadedSite:
    """A profile from YAML data already read, merged over each other (base first), typed
    and checked as :func:`load_site` does. A layer: its data (no ``extends``: the chain is
    already followed) and where each of its keys was written. `file`: the file an error
    without a key of its own names; `path`, `chain` and `files`: as in :class:`LoadedSite`."""
    provenance = Provenance(default_file=file, advice=shipped_profile_advice)
    merged: dict[str, Any] = {}
    for data, origin_of in layers:
        merged = merge_layer(merged, data, provenance, origin_of)
    site: schema.Site = typed_config(schema.Site, merged, provenance, schema.SITE_CHOICES)
    with locating(provenance):
        check_site(site)
    return LoadedSite(site, path, chain, provenance, files)


def _collect_layers(path: Path, cwd: Path, environ: Mapping[str, str], stack: list[Path],
                    layers: list[tuple[YamlDoc, str]]) -> None:
    resolved = path.resolve()
    if resolved in stack:
        cycle = " -> ".join(str(p) for p in stack[stack.index(resolved):] + [resolved])
        raise ConfigError(f"extends forms a cycle: {cycle}", file=str(path), key="extends")
    if len(stack) >= MAX_EXTENDS_DEPTH:
        raise ConfigError(f"extends chain is deeper than {MAX_EXTENDS_DEPTH} profiles", file=str(path),
                          key="extends")
    doc, digest = _read_profile(path)
    for parent in _parents(doc):
        parent_path = find_site(parent, cwd, environ, extending=path, referrer=doc.origin("extends"))
        if any(Path(layer.path).resolve() == parent_path.resolve() for layer, _ in layers):
            continue  # a diamond: the shared base is applied once, first
        _collect_layers(parent_path, cwd, environ, stack + [resolved], layers)
    layers.append((doc, digest))


def _read_profile(path: Path) -> tuple[YamlDoc, str]:
    """The file parsed (as read_yaml does) and the SHA-256 of the very bytes parsed: one
    read, so the hash can never describe another version of the file."""
    name = str(path)
    text = _read_text(name)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()   # strict UTF-8 round-trips byte for byte
    data, lines = parse(text, name, lines=True)
    if data is None or data == Scalar(""):
        raise ConfigError("the file is empty", file=name)
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping of keys", file=name)
    return YamlDoc(name, data, lines), digest


def _parents(doc: YamlDoc) -> list[str]:
    raw = doc.data.get("extends")
    if raw is None or (isinstance(raw, Scalar) and raw.plain and raw.text in NULLS):
        return []
    items = raw if isinstance(raw, list) else [raw]
    if not all(isinstance(p, Scalar) and p.text and "\x00" not in p.text for p in items):
        raise ConfigError("must be a profile name, a path, or a list of them", file=doc.path,
                          key="extends", line=doc.lines.get("extends"))
    return [p.text for p in items]
