"""Keys of the experiment that a submission changes but the job never sees.

The job reads its run bundle: the job script, env.sh, task.json, hparams.json and
ds_config.json (resolved.yaml records the whole experiment; no job reads it). A swept key,
or a KEY=VALUE override, that changes none of those files runs the same job as without it
(a key only `glaunch plan` reads, such as model.params; a script option nobody passes):
submit warns, naming the key. The comparison renders under one run id, so only the key's
own effect differs; rendering is pure, so it costs a resolve per value and nothing else.

Thousands of overrides, each rendered without, would cost thousands of renderings of
thousands of keys; so an override is rendered without only where that could show it
unseen. Which could not is told from the keys alone (`_rendered_without`): hparams and env
names the job receives whatever they are, and overrides a later one replaces whole.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Mapping, Sequence

from launcher.config.load import parse_overrides
from launcher.errors import ConfigError
from launcher.resolution.sweep import Element
from launcher.rundir.layout import RESOLVED_FILE

Files = Mapping[str, str]


def warning(key: str, doing: str = "sweeping") -> str:
    return f"{doing} {key} changes nothing the job sees (not in its args, env or hparams)"


def job_files(files: Files) -> dict[str, str]:
    """The files of a run bundle that the job reads."""
    return {name: text for name, text in files.items() if name != RESOLVED_FILE}


def unseen_axes(axes: Sequence[Any], first: Element, files_of: Callable[[Element], Files]) -> tuple[str, ...]:
    """The swept keys none of whose values change a file the job reads: `first` with only
    that key's value changed renders (`files_of`, under one run id) the same job files."""
    base = job_files(files_of(first))
    unseen = []
    for axis in axes:
        others = [_with_value(first, axis.key, value) for value in axis.values if (axis.key, value) not in first.params]
        if others and all(job_files(files_of(element)) == base for element in others):
            unseen.append(axis.key)
    return tuple(unseen)


def _with_value(element: Element, key: str, value: str) -> Element:
    return Element(element.index, tuple((k, value if k == key else v) for k, v in element.params))


def unseen_overrides(overrides: Sequence[str], files_of: Callable[[Sequence[str]], Files],
                     site_env: Collection[str] = ()) -> tuple[str, ...]:
    """The keys of KEY=VALUE `overrides` that change the experiment (its resolved.yaml) but
    no file the job reads: the bundle rendered (`files_of`, under one run id) without that
    one override reads the same. An override the experiment needs (without it, it does not
    load or resolve) is seen by definition; where the comparison cannot render at all (a
    profile that resolves only on its cluster), nothing is said. `site_env`: the names the
    site's env sets."""
    try:
        parsed = parse_overrides(overrides)
    except ConfigError:
        return ()           # the experiment does not load with them: nothing to compare
    candidates = _rendered_without(parsed, site_env)
    if not candidates:
        return ()
    try:
        base = files_of(overrides)
    except ConfigError:
        return ()
    unseen = []
    for index in candidates:
        try:
            without = files_of([*overrides[:index], *overrides[index + 1:]])
        except ConfigError:
            continue
        if without.get(RESOLVED_FILE) != base.get(RESOLVED_FILE) and job_files(without) == job_files(base):
            unseen.append(overrides[index].partition("=")[0].strip().lstrip("+~"))
    return tuple(unseen)


def _rendered_without(parsed: Sequence[tuple[str, Any]], site_env: Collection[str]) -> list[int]:
    """The indexes of the overrides that may change the experiment and not the job, and
    must be rendered without to tell. Not those that change the job whenever they change
    anything (`_reaches_job`), nor those a later override replaces whole (`_replaced`)."""
    paths = [tuple(key.split(".")) for key, _ in parsed]
    last_at = {path: index for index, path in enumerate(paths)}
    last_within = {path[:depth]: index for index, path in enumerate(paths) for depth in range(1, len(path) + 1)}
    replaced = _replaced(paths, [value for _, value in parsed])
    return [index for index, path in enumerate(paths) if index not in replaced and not _reaches_job(
        path, last_at.get(path[:1], -1) > index or last_within[path] > index, site_env)]


def _reaches_job(path: tuple[str, ...], set_again: bool, site_env: Collection[str]) -> bool:
    """Whether every change an override at `path` makes reaches a job file. hparams.json
    holds the experiment's whole `hparams:`, in order. env.sh exports each name of its
    `env:`, though not in its order (NCCL's apart): left out, an `env.NAME` override that
    no later one sets again (`set_again`: a later override of `env`, or at or below
    env.NAME) leaves NAME out of the job, or at its value and place in the file; unless
    the site's env sets NAME too, which may export the same value."""
    if path[0] == "hparams":
        return True
    return path[0] == "env" and len(path) == 2 and path[1] not in site_env and not set_again


def _replaced(paths: Sequence[tuple[str, ...]], values: Sequence[Any]) -> set[int]:
    """The indexes of the overrides that change nothing at all, because a later one sets a
    value that is not a mapping at their key or above it (`model.params=1 model.params=2`:
    the first): the merge replaces what is there whole. Only where the key the later one
    sets was there already before the earlier one (an override before it set it or a key
    below it, and none in between replaced a key above it), so that leaving the earlier
    one out does not change where that key stands among its neighbours either."""
    last_replacing: dict[tuple[str, ...], int] = {}
    for index, (path, value) in enumerate(zip(paths, values)):
        if not isinstance(value, dict):
            last_replacing[path] = index
    replaced = set()
    set_at: dict[tuple[str, ...], int] = {}       # a path -> the last override at it or below it, so far
    replaced_at: dict[tuple[str, ...], int] = {}  # a path -> the last override replacing its value, so far
    for index, path in enumerate(paths):
        prefixes = [path[:depth] for depth in range(1, len(path) + 1)]
        if any(last_replacing.get(prefix, -1) > index and _there_before(prefix, set_at, replaced_at)
               for prefix in prefixes):
            replaced.add(index)
        for prefix in prefixes:
            set_at[prefix] = index
        if not isinstance(values[index], dict):
            replaced_at[path] = index
    return replaced


def _there_before(path: tuple[str, ...], set_at: Mapping[tuple[str, ...], int],
                  replaced_at: Mapping[tuple[str, ...], int]) -> bool:
    """Whether an override so far set `path` (or a key below it) after the last one that
    replaced a key above it."""
    latest = max((replaced_at.get(path[:depth], -1) for depth in range(1, len(path))), default=-1)
    return set_at.get(path, -1) > latest
