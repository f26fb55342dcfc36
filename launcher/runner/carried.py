"""The part of glaunch the nodes run, carried in every run directory (DESIGN.md "Remote
submission": the nodes need only Python and torch).

A job imports glaunch's floor, its training library (launcher.runtime), its job controller
(launcher.jobcontrol: the job's steps, their ends, the watchdog) and the local driver
(launcher.localrun: the stand-in for srun) and submitit's task loader with its
pickler. Those packages' .py files are copied, as installed here, into the run's `lib/`,
and env.sh puts that folder first on PYTHONPATH: the nodes' interpreter needs torch only,
and a training script's `import launcher.runtime` gets the same version as the job side
that runs it (the submitter's). typing_extensions, which submitit imports too, is not
carried: torch depends on it, so every interpreter with torch has it.

Only .py files travel (no bytecode: the nodes' Python may be another version), and no
package's own tests. Beside them, the metadata of a distribution named glaunch that holds
only the entry points Lightning looks up (launcher.runtime.lightning_warning): a node
without glaunch installed offers them too, and one with it installed offers them once
(importlib.metadata takes the first distribution of a name on the path: the lib's).
"""

from __future__ import annotations

import importlib.util
import shutil
from functools import lru_cache
from pathlib import Path

from launcher import __version__
from launcher.errors import RunError

# (top-level package, the parts of it carried; () is all of it). glaunch's parts are the
# layers the job side stands on: the floor, the training library, the job controller and
# the local driver (tests/test_layers.py).
CARRIED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("launcher", ("__init__.py", "errors.py", "processes.py", "shell.py", "storeprocess.py", "rundir", "runtime",
                  "jobcontrol", "localrun")),
    ("submitit", ()),
    ("cloudpickle", ()),
)


# The entry points of glaunch's distribution (pyproject.toml) that the job side needs.
ENTRY_POINTS = (
    ("lightning.pytorch.callbacks_factory", "glaunch", "launcher.runtime.lightning_warning:lightning_callbacks"),
    ("pytorch_lightning.callbacks_factory", "glaunch",
     "launcher.runtime.lightning_warning:pytorch_lightning_callbacks"),
)


def carried_metadata() -> tuple[tuple[str, bytes], ...]:
    """(path under lib/, content) of the distribution metadata carried."""
    folder = f"glaunch-{__version__}.dist-info"
    entry_points = "".join(f"[{group}]\n{name} = {value}\n\n" for group, name, value in ENTRY_POINTS)
    return ((f"{folder}/METADATA", f"Metadata-Version: 2.1\nName: glaunch\nVersion: {__version__}\n".encode()),
            (f"{folder}/entry_points.txt", entry_points.encode()))


def package_dir(name: str) -> Path:
    """Where the installed package `name` is, found without importing it (the CLI does not
    pay for submitit's imports)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise RunError(f"cannot carry the package {name!r} to the nodes: it is not installed with glaunch here")
    return Path(locations[0])


def _is_test(path: Path) -> bool:
    return path.name.startswith("test_") or path.name == "conftest.py"


def _python_files(root: Path, parts: tuple[str, ...]) -> list[Path]:
    found: list[Path] = []
    for part in parts or ("",):
        path = root / part
        if path.is_file():
            found.append(path)
        else:
            found += sorted(p for p in path.rglob("*.py") if p.is_file() and not _is_test(p))
    return found


@lru_cache(maxsize=1)
def carried_files() -> tuple[tuple[Path, str], ...]:
    """(installed file, its path under lib/) of every file carried."""
    files: list[tuple[Path, str]] = []
    for name, parts in CARRIED:
        root = package_dir(name)
        found = _python_files(root, parts)
        if not found:       # installed in a form with no files to copy (a zip)
            raise RunError(f"cannot carry the package {name!r} to the nodes: no .py files in {root}")
        files += [(path, f"{name}/{path.relative_to(root).as_posix()}") for path in found]
    return tuple(files)


def write_lib(lib_dir: Path) -> None:
    """`lib_dir`, new, holding every carried file (OSError or RunError when it cannot)."""
    lib_dir.mkdir()
    made = {lib_dir}
    for source, relative in carried_files():
        target = lib_dir / relative
        if target.parent not in made:
            target.parent.mkdir(parents=True, exist_ok=True)
            made.add(target.parent)
        shutil.copyfile(source, target)
    for relative, content in carried_metadata():
        target = lib_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
