"""The code snapshot (`code.snapshot`): at submit, the entry point's code is copied into
the run directory (`code/`; a sweep's elements share one copy) and every start runs from
there, so an edit made while the job waits in the queue, or between two requeues, never
reaches it.

What is copied: the git work tree holding the entry point, as git sees it (tracked files,
and untracked files that no ignore rule covers); without git, the entry point's folder
(all of it but `__pycache__`). Never the runs directory or the checkpoint directory, nor
any other run directory found in the tree. `code.exclude` (globs) leaves more out,
`code.max_mb` bounds the copy: over it, nothing is written and the error names the
largest files.

A copy that would leave out what every start runs (the entry script; the files the entry
module resolves to inside the copy) is refused before anything is written, naming the
code.exclude pattern or the git ignore rule (file and line) that leaves it out.

A dirty work tree is recorded as `code.patch` next to the copy: `git diff --binary HEAD`
and every untracked file of the copy as a new file, so commit + patch give back what ran.

Reads the disk and runs git (launcher.runner.gitview, bounded by a timeout); the decisions
(`matches`, `over_bound`, `missing`) are pure.
"""

from __future__ import annotations

import dataclasses
import errno
import fnmatch
import hashlib
import os
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from launcher.errors import ConfigError
from launcher.resolution.jobplan import CodeSnapshot
from launcher.runner.gitview import (
    GIT_TIMEOUT_S,
    STATUS,
    GitCall,
    GitState,
    git,
    git_state,
    git_text,
    inside,
    locate,
    patch,
    repository_filters,
)

# How many of the largest files an error over code.max_mb names.
LARGEST_SHOWN = 5
NEVER_COPIED = ("__pycache__",)


# --- what is copied -------------------------------------------------------------------------


@dataclass(frozen=True)
class Survey:
    """What a snapshot copies: every file (relative path, bytes), and git's view."""

    source: str
    files: tuple[tuple[str, int], ...]
    git: GitState | None
    excluded: int = 0            # files left out by code.exclude
    # The filters the repository's own config defines (gitview.repository_filters), asked
    # once for git status and kept for the patch of a dirty tree; None: not asked.
    filters: tuple[str, ...] | None = None
    total: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "total", sum(size for _, size in self.files))

    @property
    def dirty(self) -> bool:
        return self.git is not None and (self.git.changed or bool(self.git.untracked))


def matches(relative: str, patterns: tuple[str, ...]) -> bool:
    """Whether a path (relative to the copied folder) is left out by one of `patterns`: a
    glob without '/' matches any file or folder name on the path, one with '/' the path
    from the top (or a folder above the file). Pure."""
    parts = relative.split("/")
    for raw in patterns:
        pattern = raw.strip().rstrip("/")
        if not pattern:
            continue
        if "/" in pattern:
            pattern = pattern.lstrip("/")
            if any(fnmatch.fnmatchcase("/".join(parts[:n]), pattern) for n in range(1, len(parts) + 1)):
                return True
        elif any(fnmatch.fnmatchcase(part, pattern) for part in parts):
            return True
    return False


def _skipped(code: CodeSnapshot) -> tuple[str, ...]:
    """The directories never copied (runs root, checkpoints, the snapshot itself), relative
    to the source, where they are inside it."""
    out = []
    for path in (*code.skip, code.dest):
        rel = inside(path, code.source)
        if rel == ".":
            continue        # the whole tree would go: the runs directory's own check refuses this
        if rel is not None:
            out.append(rel)
    return tuple(out)


def _under(relative: str, folders: tuple[str, ...]) -> bool:
    return any(relative == f or relative.startswith(f + "/") for f in folders)


# A run directory (run.json beside job.sbatch) or a sweep's (sweep.json): glaunch's output,
# never code, wherever --runs-dir put it.
_RUN_MARKERS = (("run.json", "job.sbatch"), ("sweep.json",))


def _run_folders(root: Path, names: list[str]) -> tuple[str, ...]:
    folders = {os.path.dirname(n) for n in names}
    return tuple(f for f in folders if f and any(all(os.path.isfile(os.path.join(root, f, m)) for m in markers)
                                                 for markers in _RUN_MARKERS))


# Tracked and untracked-not-ignored files: what a snapshot in git copies.
LIST_FILES = ("ls-files", "-z", "--cached", "--others", "--exclude-standard")


def _git_files(root: str, sizes: dict[str, int], prefix: str = "", submodules: list[str] | None = None,
               listed: GitCall | None = None) -> list[str]:
    """Tracked and untracked-not-ignored files under `root`, submodules' included (each
    one's folder goes into `submodules`); the size of each one found on disk goes into
    `sizes` (one lstat per file). `listed`: GitCall(root, *LIST_FILES) already started."""
    proc = (listed or GitCall(root, *LIST_FILES, binary=True)).result()
    if proc is None or proc.returncode != 0:
        raise ConfigError(f"git cannot list the files of {root}: "
                          f"{(proc.stderr.decode(errors='replace').strip() if proc else 'git did not answer')}",
                          key="code.snapshot")
    out: list[str] = []
    for name in dict.fromkeys(proc.stdout.decode("utf-8", "surrogateescape").split("\0")):
        if not name:
            continue
        path = os.path.join(root, name)
        try:
            info = os.lstat(path)
        except OSError:
            out.append(prefix + name)       # deleted in the work tree: left out by the survey
            continue
        if stat.S_ISDIR(info.st_mode):      # a submodule
            if submodules is not None:
                submodules.append(path)
            out += _git_files(path, sizes, f"{prefix}{name}/", submodules)
        elif _is_code(info.st_mode):
            out.append(prefix + name)
            sizes[prefix + name] = info.st_size
    return out


def _is_code(mode: int) -> bool:
    """A regular file or a symlink. A named pipe, socket or device in the tree is not code
    (git cannot track one): the snapshot leaves it out."""
    return stat.S_ISREG(mode) or stat.S_ISLNK(mode)


def _walk_files(root: Path) -> list[str]:
    out = []
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        dirs[:] = sorted(d for d in dirs if d not in NEVER_COPIED)
        for name in list(dirs):
            if os.path.islink(os.path.join(folder, name)):
                dirs.remove(name)
                files.append(name)        # a symlinked folder is copied as the link
        out += [os.path.normpath(os.path.join(rel, name)) for name in sorted(files)]
    return out


def survey(code: CodeSnapshot) -> Survey:
    """The files a snapshot of `code.source` copies, and git's view of the tree.
    ConfigError when the folder is not there."""
    root = Path(code.source)
    if not root.is_dir():
        raise ConfigError(f"cannot snapshot {code.source}: not a folder on this machine (a script inside a "
                          "container image cannot be copied: set code.snapshot: false)", key="code.snapshot")
    if not code.git:
        files, excluded = _chosen(code, _walk_files(root), {})
        return Survey(code.source, files, None, excluded)
    # ls-files reads no file through a filter: it runs while the repository's filters are
    # asked for, and git status, which needs them, while the files are looked at.
    with GitCall(code.source, *LIST_FILES, binary=True) as listed:
        filters = repository_filters(code.source, time.monotonic() + GIT_TIMEOUT_S)
        with GitCall(code.source, *STATUS, binary=True, filters=filters) as status:
            sizes: dict[str, int] = {}
            submodules: list[str] = []
            names = _git_files(code.source, sizes, submodules=submodules, listed=listed)
            files, excluded = _chosen(code, names, sizes)
            git = git_state(code.source, {n for n, _ in files}, status=status)
    if not git.changed and any(_submodule_changed(path) for path in submodules):
        git = dataclasses.replace(git, changed=True)
    return Survey(code.source, files, git, excluded, filters)


def _submodule_changed(path: str, *, nested: bool = False) -> bool:
    """Whether a submodule's work tree differs from its own commit (`nested`: or that of a
    submodule inside it): asked of each alone, since git status never enters a submodule,
    where the submodule's own filters would run. One not checked out has nothing in the
    tree."""
    if not os.path.lexists(os.path.join(path, ".git")):
        return False
    state = git_state(path)
    if state.changed or state.untracked:
        return True
    return nested and any(_submodule_changed(sub, nested=True) for sub in _gitlinks(path))


def _gitlinks(root: str) -> list[str]:
    """The folders of the submodules of the work tree at `root` (none without .gitmodules)."""
    if not os.path.lexists(os.path.join(root, ".gitmodules")):
        return []
    proc = git(root, "ls-files", "-z", "--stage", binary=True)
    if proc is None or proc.returncode != 0:
        return []
    out = []
    for entry in proc.stdout.decode("utf-8", "surrogateescape").split("\0"):
        meta, _, name = entry.partition("\t")
        if meta.startswith("160000 "):
            out.append(os.path.join(root, name))
    return out


def _chosen(code: CodeSnapshot, names: list[str], sizes: dict[str, int]) -> tuple[tuple[tuple[str, int], ...], int]:
    """(the files copied with their sizes, how many code.exclude left out) of `names`;
    `sizes`: those already looked at."""
    skipped = _skipped(code) + _run_folders(Path(code.source), names)
    files, excluded = [], 0
    for name in names:
        if _under(name, skipped) or any(p in NEVER_COPIED for p in name.split("/")):
            continue
        if matches(name, code.exclude):
            excluded += 1
            continue
        size = sizes.get(name)
        if size is None:
            try:
                info = os.lstat(os.path.join(code.source, name))
            except OSError:
                continue          # listed, then deleted in the work tree
            if not _is_code(info.st_mode):
                continue
            size = info.st_size
        files.append((name, size))
    return tuple(files), excluded


def tree_state(anchor: str) -> Survey | None:
    """git's view of the work tree holding `anchor`, copying nothing (a run without a
    snapshot, for its provenance); None outside git. git status runs while the tree is
    located."""
    if not os.path.isdir(anchor):
        return None
    with GitCall(anchor, *STATUS, binary=True) as status:
        root = locate(anchor, anchor)
        if not root.git:
            return None
        state = git_state(root.path, status=status)
    if not state.changed and any(_submodule_changed(sub, nested=True) for sub in _gitlinks(root.path)):
        state = dataclasses.replace(state, changed=True)
    return Survey(root.path, (), state)


def over_bound(found: Survey, max_bytes: int) -> str | None:
    """Why the copy is too large, naming its largest files; None when it fits. Pure."""
    if found.total <= max_bytes:
        return None
    largest = sorted(found.files, key=lambda f: (-f[1], f[0]))[:LARGEST_SHOWN]
    shown = ", ".join(f"{name} ({_mb(size)})" for name, size in largest)
    return (f"the code snapshot of {found.source} would be {_mb(found.total)} in {len(found.files)} files, over "
            f"code.max_mb ({_mb(max_bytes)}); the largest: {shown}. Leave data and outputs out with code.exclude "
            "(globs), or raise code.max_mb")


def _mb(size: int) -> str:
    for unit, scale in (("GB", 1024 ** 3), ("MB", 1024 ** 2), ("KB", 1024)):
        if size >= scale or unit == "KB":
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def check(code: CodeSnapshot, experiment_file: str | None) -> Survey:
    """Survey the copy and check it: ConfigError (nothing written) when it would leave out
    a file every start runs, or when it is over its bound."""
    found = survey(code)
    gone = missing(found, needed(code))
    if gone:
        raise left_out(code, gone[0], experiment_file)
    problem = over_bound(found, code.max_bytes)
    if problem:
        raise ConfigError(problem, file=experiment_file, key="code.max_mb")
    return found


# --- what every start runs from the copy ----------------------------------------------------


@dataclass(frozen=True)
class Need:
    """A file of the tree every start runs: its path relative to the copied folder, and
    the experiment's key that names it (with its value)."""

    path: str
    key: str
    value: str

    def what(self) -> str:
        if self.key == "entrypoint.script":
            return "the entry point (entrypoint.script)"
        return f"part of the entry point (entrypoint.module {self.value})"


def needed(code: CodeSnapshot) -> tuple[Need, ...]:
    """The files of `code.source` the job runs: the entry script, or the files the entry
    module resolves to when it resolves inside the copy (import_path goes first on
    sys.path, so a file found there is the one imported). Reads the disk."""
    out: list[Need] = []
    if code.script:
        folder = inside(os.path.dirname(code.script), code.source)
        if folder is not None:
            out.append(Need(os.path.normpath(os.path.join(folder, os.path.basename(code.script))),
                            "entrypoint.script", code.script))
    if code.module and code.import_path:
        workdir = os.path.relpath(code.import_path, code.dest)
        if workdir != ".." and not workdir.startswith("../"):
            out += [Need(path, "entrypoint.module", code.module)
                    for path in module_files(code.source, workdir, code.module)]
    return tuple(out)


def module_files(root: str, workdir: str, module: str) -> list[str]:
    """The files, relative to `root`, that `python -m module` run from `root/workdir` runs:
    each regular package's __init__.py on the way, then the module's .py file or, for a
    package, its __init__.py and __main__.py. Nothing when the module is not found there
    (it is imported from elsewhere). The order of Python's own finder: a package, then a
    module file, then a folder as a namespace package."""
    parts = module.split(".")
    if not all(parts):
        return []
    folder = os.path.normpath(os.path.join(root, workdir))
    found: list[str] = []
    for i, part in enumerate(parts):
        path = os.path.join(folder, part)
        if os.path.isfile(os.path.join(path, "__init__.py")):
            found.append(os.path.join(path, "__init__.py"))
        elif os.path.isfile(path + ".py"):
            if i < len(parts) - 1:
                return []           # a module holds no submodules: the import fails anyway
            found.append(path + ".py")
            break
        elif not os.path.isdir(path):
            return []
        folder = path
    else:
        main = os.path.join(folder, "__main__.py")
        if os.path.isfile(main):
            found.append(main)
    return [os.path.relpath(f, root) for f in found]


def missing(found: Survey, needs: tuple[Need, ...]) -> list[Need]:
    """The needs the copy leaves out. A path under a symlink the copy holds (a linked
    folder is copied as the link) is there. Pure."""
    names = {name for name, _ in found.files}
    return [need for need in needs
            if not any("/".join(need.path.split("/")[:n]) in names for n in range(1, need.path.count("/") + 2))]


def left_out(code: CodeSnapshot, need: Need, experiment_file: str | None) -> ConfigError:
    """Why the copy leaves out `need`, said where the user can change it: the code.exclude
    pattern, the ignore rule (its file and line), or the entry point itself."""
    fix = "or set code.snapshot: false"
    pattern = next((p for p in code.exclude if matches(need.path, (p,))), None)
    if pattern is not None:
        return ConfigError(f"{pattern!r} leaves {need.path}, {need.what()}, out of the code snapshot every start "
                           f"runs from: narrow the pattern, {fix}", file=experiment_file, key="code.exclude")
    source = os.path.join(code.source, need.path)
    if not os.path.lexists(source):
        return ConfigError(f"{need.path}, {need.what()}, is not in {code.source}: the code snapshot cannot copy it",
                           file=experiment_file, key=need.key)
    folder = next((f for f in _skipped(code) if _under(need.path, (f,))), None)
    if folder is not None or any(p in NEVER_COPIED for p in need.path.split("/")):
        where = folder or next(p for p in need.path.split("/") if p in NEVER_COPIED)
        return ConfigError(f"{need.path}, {need.what()}, is under {where}, which the code snapshot never copies "
                           f"(a runs, checkpoint or cache folder): move it, {fix}", file=experiment_file,
                           key=need.key)
    rule = ignored_by(source) if code.git else None
    if rule is not None:
        file, line, text = rule
        return ConfigError(f"git ignores {need.path}, {need.what()}, by the rule {text!r}, and the code snapshot "
                           f"of {code.source} copies only the files git tracks or does not ignore: add it "
                           f"(git add -f), stop ignoring it, {fix}", file=file, line=line)
    kind = "listed by git" if code.git else "copied"
    return ConfigError(f"{need.path}, {need.what()}, is not among the files of {code.source} the code snapshot "
                       f"copies (those {kind}, regular files and symlinks): {fix}", file=experiment_file,
                       key=need.key)


def ignored_by(path: str) -> tuple[str, int, str] | None:
    """(the ignore file, line, rule) by which git ignores `path`; None when none does.
    Asked in the repository that holds the file (a submodule's own rules)."""
    folder = os.path.dirname(path)
    top = git_text(folder, "rev-parse", "--show-toplevel")
    proc = git(folder, "check-ignore", "--verbose", "--no-index", "-z", "--stdin", binary=True,
               stdin=os.path.basename(path).encode("utf-8", "surrogateescape") + b"\0")
    if top is None or proc is None or proc.returncode != 0:
        return None
    fields = proc.stdout.decode("utf-8", "surrogateescape").split("\0")
    if len(fields) < 3 or not fields[0] or fields[2].startswith("!"):
        return None         # a rule that takes a file back: not why it is left out
    try:
        line = int(fields[1])
    except ValueError:
        return None
    # The ignore file is named relative to the top of its work tree (core.excludesFile as set).
    return os.path.join(top, fields[0]), line, fields[2]


# --- taking it ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Taken:
    """A snapshot written: where, and what run.json's provenance says of it."""

    dest: str
    files: int
    bytes: int
    patch: str | None            # the code.patch file, for a dirty tree
    patch_sha256: str | None


class Unreadable(Exception):
    """A file of the tree that cannot be read (not where it is copied to)."""

    def __init__(self, path: str, error: OSError) -> None:
        super().__init__(path)
        self.path, self.error = path, error


def take(code: CodeSnapshot, found: Survey, patch_path: str | os.PathLike,
         experiment_file: str | None = None) -> Taken:
    """Copy the surveyed files into `code.dest` (which must not exist yet) and, for a dirty
    git tree, write the patch. ConfigError naming code.exclude for a file of the tree that
    cannot be read; OSError for a failure to write (the caller removes what was written)."""
    dest = code.dest
    os.mkdir(dest)
    # Each file is opened by its name in an open folder, of the tree and of the copy: the
    # kernel walks a few names per file, not the whole path of a run directory.
    source_dir = os.open(code.source, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    folders = {"": os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)}
    try:
        for name, _ in found.files:
            parent, _, base = name.rpartition("/")
            folder = folders.get(parent)
            if folder is None:
                os.makedirs(os.path.join(dest, parent), exist_ok=True)
                folder = folders[parent] = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC,
                                                   dir_fd=folders[""])
            try:
                copy_file(name, base, source_dir=source_dir, target_dir=folder)
            except Unreadable as exc:
                raise ConfigError(f"the code snapshot cannot read {os.path.join(code.source, exc.path)}: "
                                  f"{exc.error.strerror or exc.error}; leave it out with code.exclude (globs), or "
                                  "set code.snapshot: false", file=experiment_file, key="code.exclude") from None
    finally:
        for fd in (source_dir, *folders.values()):
            os.close(fd)
    patch_file, digest = None, None
    if found.dirty:
        data = patch(code.source, found.git.untracked if found.git else (), filters=found.filters)
        Path(patch_path).write_bytes(data)
        patch_file, digest = str(patch_path), hashlib.sha256(data).hexdigest()
    return Taken(str(dest), len(found.files), found.total, patch_file, digest)


def copy_file(source: str, target: str, *, source_dir: int | None = None, target_dir: int | None = None) -> None:
    """`source` to the new file `target` with its mode and times, a symlink as a symlink
    (shutil.copy2's result, in a third of its system calls: a snapshot copies many small
    files); each relative to its open folder (`source_dir`, `target_dir`) where given. A
    file deleted since the survey is skipped: the copy is of the tree as it is; so is one
    that became a named pipe, socket or device. Unreadable when `source` cannot be opened."""
    try:
        src = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=source_dir)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise Unreadable(source, exc) from None
        os.symlink(os.readlink(source, dir_fd=source_dir), target, dir_fd=target_dir)
        return
    try:
        info = os.fstat(src)
        if not stat.S_ISREG(info.st_mode):
            return
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                      dir_fd=target_dir)
        try:
            _copy_bytes(src, dst, info.st_size)
            os.fchmod(dst, stat.S_IMODE(info.st_mode))
            os.utime(dst, ns=(info.st_atime_ns, info.st_mtime_ns))
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _copy_bytes(src: int, dst: int, size: int) -> None:
    """The `size` bytes of `src` (its size when opened) into `dst`: in the kernel
    (copy_file_range) where it can. Counted, not read to the end: most files of a tree
    take one call, not two (the second only to find the end)."""
    if hasattr(os, "copy_file_range"):
        try:
            left = size
            while left > 0:
                copied = os.copy_file_range(src, dst, min(left, 1 << 30))
                if not copied:
                    break           # shorter than when opened: the copy is of what is there
                left -= copied
            return
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM):
                raise
            os.lseek(src, 0, os.SEEK_SET)
            os.lseek(dst, 0, os.SEEK_SET)
            os.ftruncate(dst, 0)
    with open(src, "rb", closefd=False) as fin, open(dst, "wb", closefd=False) as fout:
        shutil.copyfileobj(fin, fout)


