"""What the bad-input tables (tests/test_bad_input_*.py, one per stage) share.

A `Refused` row is a working directory's files and a command line; a `RefusedCall` row is
a Python API call. Every refusal is checked alike: exit 2 (a ConfigError through the API),
one line on stderr that starts `glaunch: error: ` and holds each expected fragment,
nothing on stdout, no traceback, nothing written, no PWNED* file made by a value that
reached a shell."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from conftest import GOOD_EXPERIMENT, MYSITE_PROFILE
from launcher import cli
from launcher.errors import ConfigError

FIFO = object()          # a named pipe: reading it would block
DIRECTORY = object()
Link = collections.namedtuple("Link", "target")

# The site every row starts from (site_configs/mysite.yaml): two partitions, a day's limit.
SITE = MYSITE_PROFILE
# One GPU partition and no time limit: the rows that check a profile's values one by one.
ONE_PARTITION_SITE = """\
name: mysite
scheduler: slurm
default_partition: gpu
partitions:
  gpu: {gpus_per_node: 4, gpu_mem_gb: 80, cpus_per_node: 32, mem_gb: 256, max_nodes: 8}
"""
# The experiment every row starts from (exp.yaml): valid on SITE, no checkpoint settings, so
# a run that passes every check warns about them.
EXP = """\
name: good
entrypoint: {script: train.py}
resources: {nodes: 2, time: "01:00:00"}
"""
# EXP with requeue.max: 0: no warning, stderr stays empty unless something is wrong.
QUIET_EXP = GOOD_EXPERIMENT


@dataclasses.dataclass
class Refused:
    """`glaunch COMMAND EXPERIMENT [--site SITE] [--dry-run] [--runs-dir runs] ARGS` (`glaunch
    ARGS` when command is None) in a directory of exp.yaml (EXP), site_configs/mysite.yaml
    (SITE) and train.py, replaced or added to by `files` (a name -> text, FIFO, DIRECTORY, a
    Link, or None: no such file). Its error line holds every fragment and none of `not_in`;
    `check`, when given, is one more condition on it."""

    id: str
    files: dict[str, Any]
    args: Sequence[str] = ()
    fragments: Sequence[str] = ()
    not_in: Sequence[str] = ()
    command: str | None = "submit"
    experiment: str = "exp.yaml"
    site: str | None = "mysite"         # None: no --site (the experiment's own site, or none)
    dry_run: bool = True
    unset: Sequence[str] = ()           # variables the command runs without
    check: Callable[[str], bool] | None = None

    def argv(self) -> list[str]:
        if self.command is None:
            return ["glaunch", *self.args]
        argv = ["glaunch", self.command, self.experiment]
        if self.site and "--site" not in self.args:
            argv += ["--site", self.site]
        if self.command == "submit":
            argv += ["--dry-run"] if self.dry_run else []
            argv += [] if "--runs-dir" in self.args else ["--runs-dir", "runs"]
        return argv + list(self.args)


@dataclasses.dataclass
class RefusedCall:
    """A call of the Python API, made in conftest's mysite_workdir, that raises a ConfigError
    with `key` (when given), each fragment in its text, and `check` true of it (when given)."""

    id: str
    call: Callable[[], Any]
    key: str | None = None
    fragments: Sequence[str] = ()
    check: Callable[[ConfigError], bool] | None = None


def table(cases: Sequence[Refused] | Sequence[RefusedCall]):
    """pytest.mark.parametrize over the rows, each named by its id (which must be unique)."""
    ids = [case.id for case in cases]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    assert not duplicates, f"duplicate row ids: {duplicates}"
    return pytest.mark.parametrize("case", cases, ids=ids)


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if not p.is_relative_to(root / "home")}


def write_files(root: Path, files: dict[str, Any]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if text is None:               # the file must not exist
            continue
        if text is FIFO:
            os.mkfifo(path)
        elif text is DIRECTORY:
            path.mkdir()
        elif isinstance(text, Link):
            path.symlink_to(text.target)
        else:
            path.write_text(text, errors="surrogateescape")


HANG_S = 120      # only a blocked read (a FIFO, a device) comes near it, however loaded the machine


def _hung(signum, frame):
    raise TimeoutError(f"the command did not end within {HANG_S} s: it blocks")


@contextlib.contextmanager
def within(seconds: int):
    """Fails the block that runs longer than `seconds`: work that grows with a value's size."""
    def late(signum, frame):
        raise TimeoutError(f"did not end within {seconds} s")

    previous = signal.signal(signal.SIGALRM, late)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_cli(monkeypatch, capsys, argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of the CLI run in-process; a command that blocks fails."""
    monkeypatch.setattr(sys, "argv", argv)
    previous = signal.signal(signal.SIGALRM, _hung)
    signal.alarm(HANG_S)
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    out, err = capsys.readouterr()
    return code, out, err


def refuse(case: Refused, root: Path, monkeypatch, capsys) -> str:
    """Run the row with `root` as the working directory; its error line."""
    monkeypatch.chdir(root)
    monkeypatch.delenv("GLAUNCH_TEST_UNSET", raising=False)
    for name in case.unset:
        monkeypatch.delenv(name, raising=False)
    write_files(root, {"exp.yaml": EXP, "site_configs/mysite.yaml": SITE, "train.py": "print('hi')\n",
                       **case.files})
    before = files_under(root)
    code, out, err = run_cli(monkeypatch, capsys, case.argv())
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    assert out == ""
    assert err.startswith("glaunch: error: ") and err.count("\n") == 1, err
    for fragment in case.fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"
    for fragment in case.not_in:
        assert fragment not in err, f"{fragment!r} in {err!r}"
    assert case.check is None or case.check(err), err
    assert files_under(root) == before, "nothing may be written for bad input"
    assert not list(root.rglob("PWNED*"))
    return err


def refuse_call(case: RefusedCall, root: Path) -> ConfigError:
    before = files_under(root)
    with pytest.raises(ConfigError) as info:
        case.call()
    error = info.value
    assert error.exit_code == 2
    assert case.key is None or error.key == case.key, error
    for fragment in case.fragments:
        assert fragment in str(error), f"{fragment!r} not in {str(error)!r}"
    assert case.check is None or case.check(error), error
    assert files_under(root) == before, "nothing may be written for bad input"
    return error
