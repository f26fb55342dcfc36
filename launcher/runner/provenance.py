"""Where a run came from, for run.json's `provenance`: the code (git commit, branch, dirty
flag and the hash of its diff, kept as code.patch; the snapshot), the site profile's files
(each one's hash as read, and its git commit and state), the Python and package versions,
glaunch's version, the user and host that submitted it, and the scheduler's version.
Package versions are read from their metadata: nothing is imported."""

from __future__ import annotations

import getpass
import os
import platform
import re
import sys
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, Iterable

from launcher import __version__
from launcher.processes import fs_text
from launcher.runner.gitview import GitCall, inside, line_of

if TYPE_CHECKING:
    from launcher.config.sites import ProfileFile
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


# Ignored files too: a profile git ignores is one no commit holds.
PROFILE_STATUS = ("status", "--porcelain=v2", "--branch", "-z", "--untracked-files=all", "--ignored=matching")


def profile_files(files: Iterable[ProfileFile]) -> list[dict[str, Any]]:
    """run.json's `provenance.profiles`: each file of the site profile (base first) with
    the SHA-256 of its bytes as read and, where it sits in a git work tree, {root, commit,
    tracked, modified} (modified: it differs from the commit, or the commit lacks it).
    Two bounded git calls per folder, all started at once; git missing or hanging, or a
    folder outside any work tree, reads as `git: null`."""
    files = list(files)
    with ExitStack() as started:
        calls = {}
        for folder in sorted({os.path.dirname(f.path) for f in files}):
            names = [os.path.basename(f.path) for f in files if os.path.dirname(f.path) == folder]
            calls[folder] = (started.enter_context(GitCall(folder, "rev-parse", "--show-toplevel")),
                             started.enter_context(GitCall(folder, *PROFILE_STATUS, "--", *names, binary=True)))
        states = {folder: _folder_state(*pair) for folder, pair in calls.items()}
    return [{"path": f.path, "sha256": f.sha256, "git": _file_state(f.path, states[os.path.dirname(f.path)])}
            for f in files]


def _folder_state(top: GitCall, status: GitCall) -> tuple[str, str | None, dict[str, str]] | None:
    """(work tree root, commit, {path from the root: status kind}) of the files asked
    about; None outside a work tree or without an answer from git."""
    root, proc = line_of(top.result()), status.result()
    if root is None or proc is None or proc.returncode != 0:
        return None
    commit = None
    kinds: dict[str, str] = {}
    fields = iter(fs_text(proc.stdout).split("\0"))
    for entry in fields:
        if entry.startswith("# branch.oid "):
            commit = entry[len("# branch.oid "):] if entry != "# branch.oid (initial)" else None
        elif entry[:2] in ("1 ", "2 ", "u "):
            # The path is the last space-separated field: 8 of them before it in a `1` line, 9 in a `2`, 10 in a `u`.
            kinds[entry.split(" ", {"1": 8, "2": 9, "u": 10}[entry[0]])[-1]] = "modified"
            if entry[0] == "2":
                next(fields, None)          # a rename's original path
        elif entry[:2] in ("? ", "! "):
            kinds[entry[2:]] = "untracked"
    return root, commit, kinds


def _file_state(path: str, state: tuple[str, str | None, dict[str, str]] | None) -> dict[str, Any] | None:
    if state is None:
        return None
    root, commit, kinds = state
    # The folder, not the file, is followed through links: a linked profile is the link's entry.
    folder = inside(os.path.dirname(path), root)
    if folder is None:
        return None
    relative = os.path.normpath(os.path.join(folder, os.path.basename(path)))
    kind = kinds.get(relative)
    return {"root": root, "commit": commit, "tracked": kind != "untracked" and commit is not None,
            "modified": kind is not None or commit is None}
