"""Where a run came from, for run.json's `provenance`: the code (git commit, branch, dirty
flag and the hash of its diff, kept as code.patch; the snapshot), the Python and package
versions, glaunch's version, the user and host that submitted it, and the scheduler's
version. Package versions are read from their metadata: nothing is imported."""

from __future__ import annotations

import getpass
import os
import platform
import re
import sys
from typing import TYPE_CHECKING, Any, Iterable

from launcher import __version__

if TYPE_CHECKING:
    from launcher.runner.snapshot import Survey, Taken

# The packages whose version decides what a training run computes.
PACKAGES = ("torch", "lightning", "pytorch-lightning", "deepspeed", "numpy", "submitit", "omegaconf")


def package_versions(names: tuple[str, ...] = PACKAGES,
                     path: Iterable[str] | None = None) -> dict[str, str | None]:
    """The version of each package installed, as importlib.metadata.version gives it:
    the first `<name>-<version>.dist-info` or `.egg-info` along `path` (sys.path), its
    metadata's Version (None where it has none). One listing per path entry instead of
    importlib.metadata, whose import and search cost a dry run more than the rest of its
    provenance."""
    wanted = {_normalized(n): n for n in names}
    found: dict[str, str | None] = {}
    for entry in sys.path if path is None else path:
        if not wanted:
            break
        try:
            children = os.listdir(entry or ".")
        except (OSError, TypeError):       # a zip file, a missing folder
            continue
        for child in children:
            low = child.lower()
            if not low.endswith((".dist-info", ".egg-info")):
                continue
            name = wanted.pop(_normalized(low.rpartition(".")[0].partition("-")[0]), None)
            if name is None:
                continue
            try:
                found[name] = _metadata_version(os.path.join(entry or ".", child))
            except OSError:
                pass                      # unreadable metadata: never a reason to stop a submit
    return {name: found[name] for name in names if name in found}


def _normalized(name: str) -> str:
    """A distribution name as importlib.metadata matches it (PEP 503, '-' as '_')."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _metadata_version(info: str) -> str | None:
    """The Version header of a .dist-info/.egg-info (a folder, or an egg-info file); None
    when it has none. OSError when there is no metadata to read."""
    for candidate in (os.path.join(info, "METADATA"), os.path.join(info, "PKG-INFO"), info):
        try:
            with open(candidate, encoding="utf-8") as f:
                for line in f:
                    if not line.strip():
                        return None          # the end of the headers
                    key, sep, value = line.partition(":")
                    if sep and key.lower() == "version":
                        return value.lstrip(" \t").rstrip("\r\n")
                return None
        except (OSError, UnicodeDecodeError):
            continue
    raise OSError(f"no metadata in {info}")


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def collect(found: Survey | None = None, taken: Taken | None = None, *,
            scheduler_version: str | None = None) -> dict[str, Any]:
    """run.json's `provenance`. `found`/`taken`: the code snapshot, when there is one."""
    out: dict[str, Any] = {
        "glaunch": __version__,
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "packages": package_versions(),
        "user": _user(),
        "host": os.uname().nodename,      # gethostname(), without importing socket
        "scheduler_version": scheduler_version,
    }
    if found is not None and found.git is not None:
        git = found.git
        out["git"] = {"root": found.source, "commit": git.commit, "branch": git.branch, "dirty": found.dirty,
                      "untracked": len(git.untracked),
                      "diff_sha256": taken.patch_sha256 if taken is not None else None,
                      "patch": taken.patch if taken is not None else None}
    else:
        out["git"] = None
    if taken is not None:
        out["code"] = {"source": found.source if found is not None else None, "snapshot": taken.dest,
                       "files": taken.files, "bytes": taken.bytes,
                       "excluded": found.excluded if found is not None else 0}
    else:
        out["code"] = None
    return out
