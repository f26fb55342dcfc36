"""A repository is data, never a program: what its own config names for git to run (the
fsmonitor hook, hooks, an external diff, clean/smudge/process filters, textconv, a pager,
ssh, askpass, a credential helper, a proxy, and the same pulled in by include.path and
includeIf) never runs during the code snapshot or the profile's provenance, dry run or not;
the commit, the dirty flag and the patch are still right, and bytes that are not UTF-8 or
are NUL in names and contents are read as they are."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import api
from launcher.resolution.jobplan import CodeSnapshot
from launcher.runner import gitview, snapshot

REPO = Path(__file__).resolve().parents[2]
LATIN1_NAME = os.fsdecode(b"caf\xe9.py")            # a file name whose bytes are not UTF-8
HOOKS = ("post-index-change", "pre-commit", "post-checkout", "pre-auto-gc", "reference-transaction",
         "fsmonitor-watchman", "pre-push")


def _git(cwd: Path, *args: str) -> str:
    """git as the test's author runs it in a tree it trusts, never in the hostile one."""
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, timeout=30,
                          env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                                   GIT_COMMITTER_EMAIL="t@t")).stdout.decode().strip()


def _hostile_config(run: str, hooks: Path, included: Path, conditional: Path) -> str:
    return f"""[core]
\tfsmonitor = {run} fsmonitor
\thooksPath = {hooks}
\tpager = {run} pager
\tsshCommand = {run} ssh
\taskpass = {run} askpass
\tgitProxy = {run} gitproxy
[pager]
\tstatus = {run} pager-status
\tdiff = {run} pager-diff
[diff]
\texternal = {run} external
[diff "evil"]
\ttextconv = {run} textconv
\tcommand = {run} diff-command
[filter "evil"]
\tclean = {run} clean
\tsmudge = {run} smudge
\trequired = true
[filter "odd=name.x"]
\tclean = {run} odd-clean
\tprocess = {run} odd-process
[credential]
\thelper = !{run} credential
[protocol]
\tallow = always
[color]
\tui = always
[diff]
\tnoprefix = true
\tmnemonicPrefix = true
[include]
\tpath = {included}
[includeIf "gitdir:/"]
\tpath = {conditional}
"""


@pytest.fixture
def hostile(tmp_path) -> tuple[Path, Path]:
    """(a git work tree whose config names a command for everything above, the folder where
    each command leaves a file named after itself when it runs). The tree holds the example
    DDP experiment and a site profile; it is dirty: a tracked file changed, one with NUL
    bytes changed, one only touched, untracked files (one named in latin-1)."""
    markers = tmp_path / "markers"
    markers.mkdir()
    run = tmp_path / "ran"
    run.write_text(f'#!/bin/sh\ntouch "{markers}/$1"\nshift\n'
                   'if [ -n "$1" ] && [ -f "$1" ]; then cat "$1"; else cat; fi\n')
    run.chmod(0o755)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for name in HOOKS:
        (hooks / name).write_text(f'#!/bin/sh\ntouch "{markers}/hook-{name}"\n')
        (hooks / name).chmod(0o755)
    root = tmp_path / "proj"
    root.mkdir()
    shutil.copy(REPO / "examples" / "torch_ddp.py", root / "torch_ddp.py")
    shutil.copy(REPO / "examples" / "torch_ddp.yaml", root / "exp.yaml")
    (root / "site.yaml").write_text("name: hostile-site\nextends: local-slurm\n")
    (root / ".gitattributes").write_text("* filter=evil diff=evil\n*.bin filter=odd=name.x\n")
    (root / "weights.bin").write_bytes(b"\0\x01\x02\xff\0tail\n")
    (root / "notes.txt").write_text("notes\n")
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "first")
    for name in HOOKS:
        shutil.copy(hooks / name, root / ".git" / "hooks" / name)
    included, conditional = tmp_path / "included", tmp_path / "conditional"
    included.write_text(f"[filter \"inc\"]\n\tclean = {run} included-clean\n[diff]\n\texternal = {run} included\n")
    conditional.write_text(f"[core]\n\tfsmonitor = {run} conditional-fsmonitor\n")
    with open(root / ".git" / "config", "a") as f:
        f.write(_hostile_config(str(run), hooks, included, conditional))
    (root / "torch_ddp.py").write_text((root / "torch_ddp.py").read_text() + "# changed\n")
    (root / "weights.bin").write_bytes(b"\0\x01\x02\xff\0changed\n")
    os.utime(root / "notes.txt", (1, 1))            # stat-dirty, same bytes: only its content says
    (root / os.fsencode(LATIN1_NAME).decode("utf-8", "surrogateescape")).write_text("X = 1\n")
    (root / "new.bin").write_bytes(b"\0new\0")
    return root, markers


def _check_snapshot(run_dir: Path, root: Path) -> None:
    """The provenance names the commit, says dirty, hashes the patch, and the commit plus
    the patch is the snapshot, file for file."""
    origin = json.loads((run_dir / "run.json").read_text())["provenance"]
    head = _git(root, "rev-parse", "HEAD")
    assert origin["git"]["commit"] == head and origin["git"]["branch"] == "main"
    assert origin["git"]["dirty"] is True and origin["git"]["untracked"] == 2
    data = (run_dir / "code.patch").read_bytes()
    assert origin["git"]["diff_sha256"] == hashlib.sha256(data).hexdigest()
    assert b"notes.txt" not in data                # touched, not changed
    clone = run_dir.parent.parent / "clone"
    _git(run_dir.parent.parent, "clone", "-q", str(root), str(clone))
    _git(clone, "checkout", "-q", head)
    _git(clone, "apply", "--binary", str(run_dir / "code.patch"))
    copied = {p.relative_to(run_dir / "code"): p.read_bytes() for p in (run_dir / "code").rglob("*") if p.is_file()}
    assert copied == {name: (clone / name).read_bytes() for name in copied}
    assert copied[Path("weights.bin")] == b"\0\x01\x02\xff\0changed\n"
    assert copied[Path(LATIN1_NAME)] == b"X = 1\n"
    (profile,) = [p for p in origin["profiles"] if p["path"].endswith("site.yaml")]
    assert profile["git"] == {"root": str(root), "commit": head, "tracked": True, "modified": False}


def test_a_dry_run_from_the_command_line_runs_nothing_the_repository_names(hostile, tmp_path, isolated_env):
    root, markers = hostile
    runs = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", str(root / "exp.yaml"), "--site",
                           str(root / "site.yaml"), "--dry-run", "--runs-dir", str(runs)], cwd=root,
                          env=isolated_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(os.listdir(markers)) == []
    (run_dir,) = runs.iterdir()
    _check_snapshot(run_dir, root)


def test_a_dry_run_through_the_api_runs_nothing_the_repository_names(hostile, tmp_path, isolated_env):
    root, markers = hostile
    run = api.submit(str(root / "exp.yaml"), site=str(root / "site.yaml"), dry_run=True,
                     runs_dir=str(tmp_path / "runs"))
    assert sorted(os.listdir(markers)) == []
    _check_snapshot(Path(run.run_dir), root)


@pytest.mark.parametrize("args", [
    ("rev-parse", "--show-toplevel"), ("status", "--porcelain=v2", "-z"), ("ls-files", "-z", "--others"),
    ("diff", "--binary", "HEAD"), ("diff-index", "-p", "HEAD"), ("diff-files", "-p"),
    ("show", "HEAD:weights.bin"), ("log", "-1", "-p"), ("fetch", "origin"),
])
def test_no_git_command_runs_what_the_repository_names(hostile, args):
    root, markers = hostile
    _git(root, "remote", "add", "origin", f"ext::{root.parent / 'ran'} fetched %S")
    proc = gitview.git(root, *args, binary=True)
    assert proc is not None
    assert sorted(os.listdir(markers)) == []



def test_a_submodule_is_looked_at_with_its_own_config_switched_off(hostile, tmp_path):
    """git status would run in each submodule under the submodule's own config: its
    filters never run, and an edit inside it still makes the tree dirty."""
    root, markers = hostile
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "lib.py").write_text("Y = 1\n")
    (sub / ".gitattributes").write_text("* filter=subevil\n")
    _git(sub, "init", "-q", "-b", "main")
    _git(sub, "add", "-A")
    _git(sub, "commit", "-q", "-m", "sub")
    top = tmp_path / "top"
    top.mkdir()
    (top / "train.py").write_text("print(1)\n")
    _git(top, "init", "-q", "-b", "main")
    _git(top, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(sub), "sub")
    _git(top, "add", "-A")
    _git(top, "commit", "-q", "-m", "top")
    _git(top / "sub", "config", "filter.subevil.clean", f"{tmp_path / 'ran'} sub-clean")
    _git(top / "sub", "config", "core.fsmonitor", f"{tmp_path / 'ran'} sub-fsmonitor")
    code = CodeSnapshot(source=str(top), git=True, dest=str(tmp_path / "dest"), script=str(top / "train.py"),
                        exclude=(), max_bytes=10 ** 8, skip=(), import_path=None)
    assert not snapshot.survey(code).dirty and not snapshot.tree_state(str(top)).dirty
    (top / "sub" / "lib.py").write_text("Y = 2\n")
    found = snapshot.survey(code)
    assert found.dirty and "sub/lib.py" in {name for name, _ in found.files}
    assert snapshot.tree_state(str(top)).dirty           # a run without a snapshot says so too
    assert sorted(os.listdir(markers)) == []


def test_a_partial_clone_never_fetches_a_missing_object(hostile, tmp_path):
    """A partial clone fetches an object it lacks when a diff needs it: through the ssh,
    proxy or helper its config names. No transport starts; the object is missing."""
    _, markers = hostile
    source, part = tmp_path / "source", tmp_path / "part"
    source.mkdir()
    (source / "exp.yaml").write_text("name: x\n")
    _git(source, "init", "-q", "-b", "main")
    _git(source, "add", "-A")
    _git(source, "commit", "-q", "-m", "first")
    _git(source, "config", "uploadpack.allowFilter", "true")
    _git(tmp_path, "clone", "-q", "--no-local", "--filter=blob:none", "--no-checkout", f"file://{source}", str(part))
    ran = tmp_path / "ran"
    _git(part, "remote", "set-url", "origin", "ssh://glaunch.invalid/repo")
    _git(part, "config", "core.sshCommand", f"{ran} ssh")
    _git(part, "config", "core.gitProxy", f"{ran} proxy")
    proc = gitview.git(part, "show", "HEAD:exp.yaml")
    assert proc is not None and proc.returncode != 0
    assert sorted(os.listdir(markers)) == []
