"""Where a run came from, for run.json's `provenance`: the code (git commit, branch, dirty
flag and the hash of its diff, kept as code.patch; the snapshot), the Python and package
versions, glaunch's version, the user and host that submitted it, and the scheduler's
version. Package versions are read from their metadata: nothing is imported."""

from __future__ import annotations

import getpass
import platform
import socket
import sys
from importlib import metadata
from typing import Any

from .. import __version__
from .snapshot import Survey, Taken

# The packages whose version decides what a training run computes.
PACKAGES = ("torch", "lightning", "pytorch-lightning", "deepspeed", "numpy", "submitit", "omegaconf")


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except Exception:  # not installed, or broken metadata: never a reason to stop a submit
            continue
    return found


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
        "host": socket.gethostname(),
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
