"""git cannot hold `glaunch submit` past its bound, nor crash it with bytes that are not
UTF-8: a git whose child (a hook, an ssh, a credential helper) keeps its output open is
"no git" at the timeout, and that child ends with it; a work tree or file names in
latin-1 are read as the paths they are."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from proctools import gone
from launcher import api
from launcher.runner import gitview, snapshot

REPO = Path(__file__).resolve().parents[2]
NEVER_S = 30                # how long the stand-in git's child lives: a call that waits for it fails
LATIN1_NAME = os.fsdecode(b"caf\xe9")       # a name whose bytes are not UTF-8


@pytest.fixture
def fake_git(tmp_path, monkeypatch):
    """fake_git(script): a stand-in `git` first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def make(script: str) -> None:
        (bin_dir / "git").write_text(f"#!/bin/sh\n{script}\n")
        (bin_dir / "git").chmod(0o755)

    return make


@pytest.fixture
def holding_git(fake_git, tmp_path, monkeypatch):
    """A git that starts a child holding its stdout and answers nothing; the child's pids
    go to tmp_path/pids, one a line."""
    pids = tmp_path / "pids"
    fake_git(f'sleep {NEVER_S} &\necho $! >> {pids}\necho "partial answer"\nwait')
    monkeypatch.setattr(gitview, "GIT_TIMEOUT_S", 0.5)
    return pids


def _pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def test_a_git_whose_child_holds_its_output_is_no_git_at_the_timeout(holding_git, tmp_path):
    started = time.monotonic()
    assert gitview.git(tmp_path, "rev-parse", "--show-toplevel") is None
    assert time.monotonic() - started < NEVER_S / 3
    (pid,) = _pids(holding_git)
    assert gone(pid)


def test_a_git_call_never_read_is_ended_with_its_child(holding_git, tmp_path):
    started = time.monotonic()
    with gitview.GitCall(tmp_path, "status"):
        while not _pids(holding_git) and time.monotonic() - started < 10:
            time.sleep(0.05)
    assert time.monotonic() - started < NEVER_S / 3
    # Two gits at most: the one asking which filters the repository names, then status.
    pids = _pids(holding_git)
    assert 1 <= len(pids) <= 2 and all(gone(pid) for pid in pids)


def _experiment(folder: Path) -> Path:
    folder.mkdir(parents=True)
    shutil.copy(REPO / "examples" / "torch_ddp.py", folder / "torch_ddp.py")
    shutil.copy(REPO / "examples" / "torch_ddp.yaml", folder / "exp.yaml")
    return folder / "exp.yaml"


def test_submit_with_a_hanging_git_ends_within_the_bound(holding_git, tmp_path, isolated_env):
    experiment = _experiment(tmp_path / "proj")
    started = time.monotonic()
    run = api.submit(str(experiment), site="local-slurm", dry_run=True, runs_dir=str(tmp_path / "runs"))
    assert time.monotonic() - started < NEVER_S / 2
    assert run.job_id is None and _pids(holding_git)
    assert all(gone(pid) for pid in _pids(holding_git))


def test_a_git_printing_latin1_is_read_as_the_bytes_it_printed(fake_git, tmp_path):
    fake_git(r"printf '/tmp/caf\351\n'")
    assert gitview.git_text(tmp_path, "rev-parse", "--show-toplevel") == os.fsdecode(b"/tmp/caf\xe9")
    proc = gitview.git(tmp_path, "log", "-1")
    assert proc is not None and os.fsencode(proc.stdout) == b"/tmp/caf\xe9\n"


def test_a_git_printing_nul_bytes_is_no_answer_not_a_crash(fake_git, tmp_path, isolated_env):
    """A NUL where a path should be (no path holds one) and bytes that are not UTF-8 where
    a commit should be: a dry run still writes its bundle."""
    fake_git(r"printf '/tmp/a\000b\n# branch.oid \000\377\376\n'")
    assert gitview.git_text(tmp_path, "rev-parse", "--show-toplevel") is None
    experiment = _experiment(tmp_path / "proj")
    run = api.submit(str(experiment), site="local-slurm", dry_run=True, runs_dir=str(tmp_path / "runs"))
    assert (Path(run.run_dir) / "run.json").is_file()


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True,
                   env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                            GIT_COMMITTER_EMAIL="t@t"))


@pytest.fixture
def latin1_tree(tmp_path) -> Path:
    """A git work tree in a folder whose name is latin-1, with a committed and an untracked
    file named in latin-1 too."""
    root = tmp_path / LATIN1_NAME
    root.mkdir()
    (root / f"{LATIN1_NAME}.txt").write_text("committed\n")
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "first")
    (root / f"{LATIN1_NAME}-new.txt").write_text("untracked\n")
    return root


def test_a_work_tree_at_a_latin1_path_is_located(latin1_tree):
    root = latin1_tree
    code = gitview.locate(str(root), str(root))
    assert code.git and code.path == str(root) and code.entry_dir == "."
    state = snapshot.git_state(str(root))
    assert state.branch == "main" and state.untracked == (f"{LATIN1_NAME}-new.txt",)
    assert b"+untracked\n" in snapshot.patch(str(root), state.untracked)

