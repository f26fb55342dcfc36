"""git's view of a work tree, for the code snapshot and run.json's provenance: where the
tree is (`locate`), its commit, branch, changes and untracked files (`git_state`, one
`git status`), and the patch that takes the commit to the tree (`patch`). Every git call
is bounded by a timeout; git missing or hanging reads as "no git".

A work tree is data, never a program. A repository's own config can name commands for git
to run: the fsmonitor hook (asked by every command that reads the index), hooks (the index
written), an external diff, textconv, clean/smudge/process filters (a file's bytes read
for a diff or a status), a pager, and ssh, askpass, a credential helper or a proxy (a
partial clone fetching a missing object). Every call goes through `GitCall`, which runs
git with all of them switched off:

- settings on git's command line (`-c`), which wins over every config file and what they
  include: no fsmonitor, hooks from /dev/null, no external diff, no pager, no credential
  helper or askpass;
- `--no-ext-diff --no-textconv` on every command that prints a diff;
- filters are named, not switched off as a whole: each filter the repository's own config
  defines (its `.git/config`, its worktree config, what they include) is emptied through
  GIT_CONFIG_COUNT (any name, even one holding '=') on the commands that read a file's
  bytes. The filters of the user's own config (~/.gitconfig, the system's: git-lfs) are
  kept, as git would use them;
- GIT_ALLOW_PROTOCOL empty: no transport at all, so no ssh, proxy or helper starts;
- no pager, no prompt, no optional lock (no index written, so no post-index-change hook).

The user's global and system config stay read (GIT_CONFIG_GLOBAL and GIT_CONFIG_NOSYSTEM
are left alone): they are the user's and the administrator's, not the repository's, and
hold what a shared tree needs (safe.directory for a tree another user owns, git-lfs's
filter). The commands they name are switched off all the same, but for their filters.
"""

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

# git's options before the command: config that names a command to run, switched off.
NEUTRAL = ("--no-pager", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "-c", "diff.external=",
           "-c", "core.pager=cat", "-c", "credential.helper=", "-c", "core.askpass=",
           "-c", "core.untrackedCache=false", "-c", "submodule.recurse=false")
# Commands that print a diff: never through an external program or a textconv filter.
PRINTS_DIFF = frozenset({"diff", "diff-index", "diff-files", "diff-tree", "show", "log", "format-patch"})
# Commands that would run git in each submodule, where the submodule's own config (its
# filters) holds: submodules are looked at one by one instead (`git_state` of each).
ENTERS_SUBMODULES = frozenset({"status", "diff", "diff-index", "diff-files"})
# Commands that read a work tree file's bytes, through its filter: those of the repository
# are emptied first. The rest (rev-parse, ls-files, check-ignore) never read one.
READS_FILES = frozenset({"status", "diff", "diff-index", "diff-files", "add", "hash-object"})
# Variables of the calling environment git would obey over its config.
UNSET = ("GIT_EXTERNAL_DIFF", "GIT_DIFF_OPTS", "GIT_CONFIG_COUNT")


def safe_env(env: dict[str, str] | None = None, filters: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment every git call runs in: this one, less what makes git run a command
    of the caller's choosing, with no transport, pager or prompt; `filters`: the names of
    the filters to empty; `env`: more variables."""
    out = {k: v for k, v in os.environ.items() if k not in UNSET and not k.startswith(("GIT_CONFIG_KEY_",
                                                                                         "GIT_CONFIG_VALUE_"))}
    out.update(GIT_OPTIONAL_LOCKS="0", GIT_TERMINAL_PROMPT="0", GIT_PAGER="cat", PAGER="cat", GIT_ALLOW_PROTOCOL="",
               GIT_ASKPASS="", SSH_ASKPASS="", LC_ALL="C")
    pairs = [(f"filter.{name}.{var}", "false" if var == "required" else "")
             for name in filters for var in ("clean", "smudge", "process", "required")]
    if pairs:
        out["GIT_CONFIG_COUNT"] = str(len(pairs))
        for i, (key, value) in enumerate(pairs):
            out[f"GIT_CONFIG_KEY_{i}"], out[f"GIT_CONFIG_VALUE_{i}"] = key, value
    out.update(env or {})
    return out


def repository_filters(cwd: str | os.PathLike, deadline: float) -> tuple[str, ...] | None:
    """The names of the filters the repository at `cwd` defines in its own config (and what
    that includes); () outside a repository; None when git does not answer by `deadline`
    (a time.monotonic() value) or cannot read the config: then nothing that reads a file
    runs. Reading config runs nothing. A git without --show-scope (older than 2.26): every
    filter named anywhere."""
    for scoped in (True, False):
        words = ["git", "-C", str(cwd), *NEUTRAL, "config", "-z", *(["--show-scope"] if scoped else []),
                 "--name-only", "--get-regexp", r"^filter\."]
        try:
            done = Started(words, max_output=None, env=safe_env()).finish(deadline)
        except OSError:
            return None
        if done is None:
            return None
        if done.returncode == 129 and scoped:
            continue                    # an option this git does not know
        if done.returncode == 1 or (done.returncode == 128 and b"not a git repository" in done.stderr):
            return ()                   # no filter; no repository (the command itself will say)
        if done.returncode != 0:
            return None
        fields = [f for f in fs_text(done.stdout).split("\0") if f]
        keys = [key for scope, key in zip(fields[::2], fields[1::2]) if scope in ("local", "worktree")] \
            if scoped else fields
        return tuple(sorted({key[len("filter."):key.rindex(".")] for key in keys if key.count(".") >= 2}))
    return None


class GitCall:
    """A git command in `cwd`, started now and read with `result()`: two calls overlap.
    `env`: more variables; `stdin`: its input. Used as a context manager, a call whose
    result is never read is killed on the way out, with every process it started."""

    def __init__(self, cwd: str | os.PathLike, *args: str, binary: bool = False, stdin: bytes | None = None,
                 env: dict[str, str] | None = None, filters: tuple[str, ...] | None = None) -> None:
        self._binary = binary
        command, *rest = args or ("",)
        if command in PRINTS_DIFF:
            rest = ["--no-ext-diff", "--no-textconv", *rest]
        if command in ENTERS_SUBMODULES:
            rest = ["--ignore-submodules=dirty", *rest]
        self._args = ["git", "-C", str(cwd), *NEUTRAL, *([command, *rest] if args else [])]
        self._deadline = time.monotonic() + GIT_TIMEOUT_S
        self._started: Started | None = None
        if filters is None and command in READS_FILES:
            filters = repository_filters(cwd, self._deadline)
            if filters is None:
                return
        try:
            # No output limit: a patch or a file list cut short would be wrong, not short.
            self._started = Started(self._args, input=stdin, max_output=None, env=safe_env(env, filters or ()))
        except OSError:
            pass

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
        env: dict[str, str] | None = None, filters: tuple[str, ...] | None = None
        ) -> subprocess.CompletedProcess[Any] | None:
    """git in `cwd` (`env`: more variables; `filters`: those of repository_filters, when
    already asked); None where git is missing, hangs, or `cwd` is no folder."""
    return GitCall(cwd, *args, binary=binary, stdin=stdin, env=env, filters=filters).result()


def git_text(cwd: str | os.PathLike, *args: str) -> str | None:
    return line_of(git(cwd, *args))


def line_of(proc: subprocess.CompletedProcess[Any] | None) -> str | None:
    """git's one-line text answer (a path, a name); None where it has none, or prints a
    NUL, which no path or name holds."""
    if proc is None or proc.returncode != 0 or "\0" in proc.stdout:
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


def patch(root: str, untracked: tuple[str, ...], *, filters: tuple[str, ...] | None = None) -> bytes:
    """The work tree's changes against HEAD: tracked files (`git diff --binary HEAD`) and
    each untracked file of the copy as a new file. Plumbing (`diff-index`, `diff-files`):
    the patch is the same whatever the repository's config says of colours or prefixes.
    `filters`: those of repository_filters(root), when already asked."""
    if filters is None:
        filters = repository_filters(root, time.monotonic() + GIT_TIMEOUT_S)
    if filters is None:
        return b""
    with GitCall(root, "diff-index", "-p", "--binary", "HEAD", binary=True, filters=filters) as tracked:
        new = _new_files(root, untracked, filters) if untracked else b""
        head = tracked.result()
    return (head.stdout if head is not None and head.returncode == 0 else b"") + new


def _new_files(root: str, names: tuple[str, ...], filters: tuple[str, ...]) -> bytes:
    """`names` as new files, in git's order: in three git calls however many there are,
    through a throw-away index that holds only them (intent to add); where git cannot
    (older than 2.25), one `git diff --no-index` each, which gives the same bytes."""
    with tempfile.TemporaryDirectory(prefix="glaunch-patch-") as scratch:
        env = {"GIT_INDEX_FILE": os.path.join(scratch, "index"), "GIT_LITERAL_PATHSPECS": "1"}
        listed = "\0".join(names).encode("utf-8", "surrogateescape")
        added = git(root, "add", "--intent-to-add", "--pathspec-from-file=-", "--pathspec-file-nul",
                    binary=True, stdin=listed, env=env, filters=filters)
        if added is not None and added.returncode == 0:
            proc = git(root, "diff-files", "-p", "--binary", binary=True, env=env, filters=filters)
            if proc is not None and proc.returncode == 0:
                return proc.stdout
    parts = []
    for name in sorted(names):
        # --no-index exits 1 when the files differ, which they always do here.
        proc = git(root, "diff", "--binary", "--no-color", "--src-prefix=a/", "--dst-prefix=b/", "--no-index", "--",
                   "/dev/null", name, binary=True, filters=filters)
        if proc is not None and proc.returncode in (0, 1):
            parts.append(proc.stdout)
    return b"".join(parts)
