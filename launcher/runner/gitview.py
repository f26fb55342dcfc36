"""git's view of a work tree, for the code snapshot and run.json's provenance: where the
tree is (`locate`), its commit, branch, changes and untracked files (`git_state`, one
`git status`), and the patch that takes the commit to the tree (`patch`). Every git call
is bounded by a timeout; git missing or hanging reads as "no git"."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.processes import Started, fs_text
from launcher.resolution.jobplan import CodeRoot

GIT_TIMEOUT_S = 30.0


class GitCall:
    """A git command in `cwd`, started now and read with `result()`: two calls overlap.
    `env`: more variables; `stdin`: its input. Used as a context manager, a call whose
    result is never read is killed on the way out, with every process it started."""

    def __init__(self, cwd: str | os.PathLike, *args: str, binary: bool = False, stdin: bytes | None = None,
                 env: dict[str, str] | None = None) -> None:
        self._binary = binary
        self._args = ["git", "-C", str(cwd), *args]
        self._deadline = time.monotonic() + GIT_TIMEOUT_S
        try:
            # No output limit: a patch or a file list cut short would be wrong, not short.
            self._started: Started | None = Started(
                self._args, input=stdin, max_output=None,
                env=dict(os.environ, GIT_OPTIONAL_LOCKS="0", LC_ALL="C", **(env or {})))
        except OSError:
            self._started = None

    def result(self) -> subprocess.CompletedProcess[Any] | None:
        """What git answered (bytes when `binary`, else text whose undecodable bytes are
        kept as surrogates: git prints paths); None where git is missing, hangs, or `cwd`
        is no folder."""
        started, self._started = self._started, None
        done = started.finish(self._deadline) if started is not None else None
        if done is None:
            return None
        if self._binary:
            return subprocess.CompletedProcess(self._args, done.returncode, done.stdout, done.stderr)
        return subprocess.CompletedProcess(self._args, done.returncode, fs_text(done.stdout), done.err)

    def __enter__(self) -> GitCall:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._started is not None:
            self._started.kill()
            self._started = None


def git(cwd: str | os.PathLike, *args: str, binary: bool = False, stdin: bytes | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[Any] | None:
    """git in `cwd` (`env`: more variables); None where git is missing, hangs, or `cwd` is
    no folder."""
    return GitCall(cwd, *args, binary=binary, stdin=stdin, env=env).result()


def git_text(cwd: str | os.PathLike, *args: str) -> str | None:
    proc = git(cwd, *args)
    if proc is None or proc.returncode != 0:
        return None
    return proc.stdout.rstrip("\n")


def inside(path: str, root: str) -> str | None:
    """`path` relative to `root` when it is `root` or below it, else None (real paths)."""
    path, root = os.path.realpath(path), os.path.realpath(root)
    if path == root or path.startswith(root.rstrip("/") + "/"):
        return os.path.relpath(path, root)
    return None


def locate(anchor: str, workdir: str) -> CodeRoot:
    """The work tree a snapshot of `anchor` (the entry point's folder) copies: the git work
    tree holding it, else the folder itself. Spelled as `anchor` spells it where the two
    agree (a symlinked path stays as the user wrote it)."""
    top = git_text(anchor, "rev-parse", "--show-toplevel") if os.path.isdir(anchor) else None
    if not top:
        return CodeRoot(anchor, False, ".", inside(workdir, anchor))
    entry_dir = inside(anchor, top) or "."
    root = top
    if entry_dir == ".":
        root = anchor if os.path.realpath(anchor) == os.path.realpath(top) else top
    else:
        parts = len(Path(entry_dir).parts)
        spelled = os.path.normpath(os.path.join(anchor, *[".."] * parts))
        if os.path.realpath(spelled) == os.path.realpath(top):
            root = spelled
    return CodeRoot(root, True, entry_dir, inside(workdir, top))


@dataclass(frozen=True)
class GitState:
    commit: str | None
    branch: str | None           # None: a detached HEAD
    changed: bool                # tracked files differ from the commit (staged or not)
    untracked: tuple[str, ...]   # untracked, not ignored files of the copy


STATUS = ("status", "--porcelain=v2", "--branch", "-z", "--untracked-files=all")


def git_state(root: str, copied: set[str] | None = None, *, status: GitCall | None = None) -> GitState:
    """The commit, branch, whether tracked files differ from the commit (staged or not) and
    the untracked, not ignored files (those of `copied`, when given): one `git status`
    (`status`: GitCall(folder of the tree, *STATUS) already started; its paths are the
    tree's, from whichever of its folders it ran)."""
    proc = (status or GitCall(root, *STATUS, binary=True)).result()
    if proc is None or proc.returncode != 0:
        return GitState(None, None, False, ())
    commit = branch = None
    changed = False
    untracked = []
    fields = iter(fs_text(proc.stdout).split("\0"))
    for entry in fields:
        kind = entry[:2]
        if entry.startswith("# branch.oid "):
            commit = entry[len("# branch.oid "):] if entry != "# branch.oid (initial)" else None
        elif entry.startswith("# branch.head "):
            branch = entry[len("# branch.head "):] if entry != "# branch.head (detached)" else None
        elif kind in ("1 ", "2 ", "u "):
            changed = True
            if kind == "2 ":
                next(fields, None)          # a rename's or copy's original path
        elif kind == "? ":
            untracked.append(entry[2:])
    if copied is not None:
        untracked = [name for name in untracked if name in copied]
    return GitState(commit, branch, changed, tuple(sorted(untracked)))


def patch(root: str, untracked: tuple[str, ...]) -> bytes:
    """The work tree's changes against HEAD: tracked files (`git diff --binary HEAD`) and
    each untracked file of the copy as a new file."""
    with GitCall(root, "diff", "--binary", "HEAD", binary=True) as tracked:
        new = _new_files(root, untracked) if untracked else b""
        head = tracked.result()
    return (head.stdout if head is not None and head.returncode == 0 else b"") + new


def _new_files(root: str, names: tuple[str, ...]) -> bytes:
    """`names` as new files, in git's order: in three git calls however many there are,
    through a throw-away index that holds only them (intent to add); where git cannot
    (older than 2.25), one `git diff --no-index` each, which gives the same bytes."""
    with tempfile.TemporaryDirectory(prefix="glaunch-patch-") as scratch:
        env = {"GIT_INDEX_FILE": os.path.join(scratch, "index"), "GIT_LITERAL_PATHSPECS": "1"}
        listed = "\0".join(names).encode("utf-8", "surrogateescape")
        added = git(root, "add", "--intent-to-add", "--pathspec-from-file=-", "--pathspec-file-nul",
                    binary=True, stdin=listed, env=env)
        if added is not None and added.returncode == 0:
            proc = git(root, "diff", "--binary", binary=True, env=env)
            if proc is not None and proc.returncode == 0:
                return proc.stdout
    parts = []
    for name in sorted(names):
        # --no-index exits 1 when the files differ, which they always do here.
        proc = git(root, "diff", "--binary", "--no-index", "--", "/dev/null", name, binary=True)
        if proc is not None and proc.returncode in (0, 1):
            parts.append(proc.stdout)
    return b"".join(parts)
