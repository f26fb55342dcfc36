"""Keys of the experiment that a submission changes but the job never sees.

The job reads its run bundle: the job script, env.sh, task.json, hparams.json and
ds_config.json (resolved.yaml records the whole experiment; no job reads it). A swept key,
or a KEY=VALUE override, that changes none of those files runs the same job as without it
(a key only `glaunch plan` reads, such as model.params; a script option nobody passes):
submit warns, naming the key. The comparison renders under one run id, so only the key's
own effect differs; rendering is pure, so it costs a resolve per value and nothing else.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

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


def unseen_overrides(overrides: Sequence[str], files_of: Callable[[Sequence[str]], Files]) -> tuple[str, ...]:
    """The keys of KEY=VALUE `overrides` that change the experiment (its resolved.yaml) but
    no file the job reads: the bundle rendered (`files_of`, under one run id) without that
    one override reads the same. An override the experiment needs (without it, it does not
    load or resolve) is seen by definition; where the comparison cannot render at all (a
    profile that resolves only on its cluster), nothing is said."""
    if not overrides:
        return ()
    try:
        base = files_of(overrides)
    except ConfigError:
        return ()
    unseen = []
    for index, override in enumerate(overrides):
        try:
            without = files_of([*overrides[:index], *overrides[index + 1:]])
        except ConfigError:
            continue
        if without.get(RESOLVED_FILE) != base.get(RESOLVED_FILE) and job_files(without) == job_files(base):
            unseen.append(override.partition("=")[0].strip().lstrip("+~"))
    return tuple(unseen)
