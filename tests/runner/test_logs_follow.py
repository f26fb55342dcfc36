"""Following a log as it changes under the reader: truncated in place (O_TRUNC, `: > file`),
replaced by a new file or by something that is not a regular file (a FIFO), and a last
line still being written. The reader goes on from the new content with a one-line notice,
as tail -F does, and never blocks."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from launcher import api
from launcher.rundir import registry
from launcher.rundir.layout import RunDir
from launcher.runner.direct import DIRECT
from launcher.runner.logs import LogFollower, RankLogs

HANG_S = 20         # a blocked open or read of a FIFO would never end; these tests take well under a second


@pytest.fixture(autouse=True)
def never_blocks() -> Iterator[None]:
    def hung(signum, frame):
        raise TimeoutError(f"the reader did not return within {HANG_S} s: it blocks")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(HANG_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def follower(path: Path) -> tuple[LogFollower, list[str], list[str]]:
    text: list[str] = []
    notices: list[str] = []
    return LogFollower(path, text.append, notices.append), text, notices


def truncate_with_o_trunc(path: Path, data: bytes) -> None:
    """A writer reopening its log the way `>` or open(..., "w") does."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def test_a_log_truncated_with_o_trunc_is_read_from_its_new_start(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"first line\nsecond line\n")
    reader, text, notices = follower(path)
    reader.poll()
    truncate_with_o_trunc(path, b"after\n")
    reader.poll()
    assert "".join(text) == "first line\nsecond line\nafter\n"
    assert len(notices) == 1 and "truncated" in notices[0]
    reader.poll()
    assert "".join(text) == "first line\nsecond line\nafter\n" and len(notices) == 1


def test_a_log_emptied_then_written_again_is_followed(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"old\n")
    reader, text, notices = follower(path)
    reader.poll()
    path.write_bytes(b"")                  # `: > file`
    reader.poll()
    assert len(notices) == 1 and "truncated" in notices[0]
    with open(path, "ab") as f:
        f.write(b"new\n")
    reader.poll()
    assert "".join(text) == "old\nnew\n" and len(notices) == 1


def test_a_log_replaced_by_a_longer_file_is_read_from_the_start(tmp_path):
    """Its size alone would not tell: the new file is longer than what was read."""
    path = tmp_path / "log"
    path.write_bytes(b"old\n")
    reader, text, notices = follower(path)
    reader.poll()
    fresh = tmp_path / "log.new"
    fresh.write_bytes(b"a new file, longer than the old one\n")
    os.replace(fresh, path)
    reader.poll()
    assert "".join(text) == "old\na new file, longer than the old one\n"
    assert len(notices) == 1 and "replaced" in notices[0]


def test_a_line_cut_by_truncation_ends_before_the_notice(tmp_path):
    """What was read of an unfinished line is handed on as a line of its own, never glued
    to the new content; half a character is not carried over either."""
    path = tmp_path / "log"
    path.write_bytes(b"whole\nhalf a line \xc3")
    reader, text, notices = follower(path)
    reader.poll()
    truncate_with_o_trunc(path, b"new\n")
    reader.poll()
    assert "".join(text) == "whole\nhalf a line \ufffd\nnew\n" and len(notices) == 1


def test_a_log_replaced_by_a_fifo_is_never_waited_on(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"before\n")
    reader, text, notices = follower(path)
    reader.poll()
    path.unlink()
    os.mkfifo(path)
    writer = os.open(path, os.O_RDWR)      # a FIFO with a writer that never writes: a read would wait
    try:
        reader.poll()
        reader.poll()
    finally:
        os.close(writer)
    assert "".join(text) == "before\n"
    assert len(notices) == 1 and "not a regular file" in notices[0]
    path.unlink()
    path.write_bytes(b"regular again\n")
    reader.poll()
    assert "".join(text) == "before\nregular again\n"
    assert len(notices) == 2 and "replaced" in notices[1]


def test_a_log_that_starts_as_a_fifo_is_never_waited_on(tmp_path):
    path = tmp_path / "log"
    os.mkfifo(path)
    reader, text, notices = follower(path)
    reader.poll()
    assert text == [] and len(notices) == 1


def test_without_a_notice_callback_the_follower_still_reads_the_new_content(tmp_path):
    """How `api.wait` and the console follow rank 0's log: no notice, the same reading."""
    path = tmp_path / "log"
    path.write_bytes(b"one\ntwo\n")
    text: list[str] = []
    reader = LogFollower(path, text.append)
    reader.poll()
    truncate_with_o_trunc(path, b"3\n")
    reader.poll()
    assert "".join(text) == "one\ntwo\n3\n"


# --- per-rank logs, as `glaunch logs` shows them ---------------------------------------------


def rank_logs(tmp_path: Path) -> tuple[RankLogs, Path, list[str]]:
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    log = RunDir(run_dir).task_log("1000", 0)
    lines: list[str] = []
    return RankLogs(run_dir, None, lines.append), log, lines


def test_an_unfinished_last_line_is_shown_once_whole(tmp_path):
    reader, log, lines = rank_logs(tmp_path)
    log.write_bytes(b"step 1\nstep 2 lo")
    reader.poll()
    assert lines == ["[r0] step 1"]
    with open(log, "ab") as f:
        f.write(b"ss 0.5\nstep 3")
    reader.poll()
    assert lines == ["[r0] step 1", "[r0] step 2 loss 0.5"]
    reader.flush()
    assert lines == ["[r0] step 1", "[r0] step 2 loss 0.5", "[r0] step 3"]


def test_rank_logs_say_a_truncation_in_one_line_and_go_on(tmp_path):
    reader, log, lines = rank_logs(tmp_path)
    log.write_bytes(b"old 1\nold 2\nunfinished")
    reader.poll()
    truncate_with_o_trunc(log, b"new 1\n")
    reader.poll()
    assert lines[:2] == ["[r0] old 1", "[r0] old 2"] and lines[2] == "[r0] unfinished"
    assert lines[3].startswith("[glaunch] ") and "1000_0_log.out" in lines[3] and "truncated" in lines[3]
    assert lines[4:] == ["[r0] new 1"]


def test_logs_follow_shows_what_is_written_after_a_truncation(tmp_path, isolated_env, monkeypatch):
    """`glaunch logs -f` to the run's end, while its rank 0 log is truncated, gets an
    unfinished line, is replaced by a FIFO and then by a new file."""
    run_dir = tmp_path / "runs" / "r"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({
        "run_id": "r", "site": "local", "scheduler": "local", "dry_run": False, "requeue_max": 0,
        "crash_retries": 0, "state": "RUNNING", "job_id": "1000",
        "starts": [{"job_id": "1000", "restart": 0, "state": "RUNNING"}]}))
    registry.register("r", str(run_dir))
    log = RunDir(run_dir).task_log("1000", 0)
    log.write_bytes(b"one\ntwo\n")

    def replace_by_fifo() -> None:
        log.unlink()
        os.mkfifo(log)

    def replace_by_file() -> None:
        log.unlink()
        log.write_bytes(b"again\n")

    def append(data: bytes) -> Callable[[], None]:
        def write() -> None:
            with open(log, "ab") as f:
                f.write(data)
        return write

    # One change after each poll; the run ends after the last one.
    steps = [lambda: truncate_with_o_trunc(log, b"3\n"), append(b"partial"), append(b" end\n"), replace_by_fifo,
             replace_by_file]

    def scripted(_run_dir: Path) -> SimpleNamespace:
        if steps:
            steps.pop(0)()
            return SimpleNamespace(state="RUNNING")
        return SimpleNamespace(state="COMPLETED")

    monkeypatch.setattr(DIRECT, "refreshed", scripted)
    lines: list[str] = []
    api.logs(str(run_dir), follow=True, echo=lines.append, poll_s=0)
    shown = [line for line in lines if not line.startswith("[glaunch] ")]
    notices = [line for line in lines if line.startswith("[glaunch] ")]
    assert shown == ["[r0] one", "[r0] two", "[r0] 3", "[r0] partial end", "[r0] again"]
    assert len(notices) == 3 and all("1000_0_log.out" in n for n in notices)
    assert "truncated" in notices[0] and "not a regular file" in notices[1] and "replaced" in notices[2]
    assert lines.index(notices[0]) == 2 and lines.index(notices[2]) == len(lines) - 2


def test_logs_with_nothing_to_show_say_so_on_stderr(tmp_path, isolated_env):
    """A run (or a rank) that has written nothing yet: `glaunch logs` says so, exit 0, rather
    than print nothing, which reads as a broken command."""
    import subprocess
    import sys

    run = api.submit(str(Path(__file__).resolve().parents[2] / "examples" / "torch_ddp.yaml"),
                     runs_dir=str(tmp_path / "runs"), dry_run=True)
    for extra, whose in (((), run.run_id), (("--rank", "1"), f"rank 1 of {run.run_id}")):
        proc = subprocess.run([sys.executable, "-m", "launcher.cli", "logs", run.run_id, *extra], capture_output=True,
                              text=True, timeout=120, cwd=Path(__file__).resolve().parents[2], env=isolated_env)
        assert proc.returncode == 0 and proc.stdout == "", proc.stderr
        assert proc.stderr == f"glaunch: no output from {whose} in its logs yet\n"
