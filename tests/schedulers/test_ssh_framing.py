"""A login shell that prints (a banner, a notice, an EXIT trap's goodbye, on stdout and
stderr) never reaches a parser: the framing of every remote command, on recorded hostile
answers and on a stand-in ssh whose shell reads a noisy start-up file, as Debian's bash
reads ~/.bashrc for a command sent by sshd."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import pytest

from launcher.errors import SchedulerError
from launcher.schedulers.ssh import on_login
from launcher.schedulers.ssh.connection import Connection
from launcher.schedulers.ssh.framing import Frame, unframe
from launcher.schedulers.ssh.command import Login

FRAME = Frame("0123456789abcdef0123456789abcdef")
BEGIN = b"<glaunch 0123456789abcdef0123456789abcdef>\n"
END = b"</glaunch 0123456789abcdef0123456789abcdef "


def test_what_the_shell_prints_before_and_after_is_dropped():
    payload = b"\x00\xffbinary </glaunch other 0>\n<glaunch x>\n"
    stream = b"Welcome to the cluster\nquota: 91% used" + BEGIN + payload + END + b"7>\nlogout\n"
    assert unframe(stream, FRAME) == unframe(stream, FRAME).__class__(True, 7, payload)


def test_a_mark_forged_in_the_banner_from_the_command_line_is_not_one():
    # A banner that echoes the command line ($BASH_EXECUTION_STRING) holds the token's halves, never the mark.
    command = FRAME.wrap("cat -- /etc/motd")
    assert BEGIN.decode() not in command and END.decode() not in command
    stream = command.encode() + b"\n" + BEGIN + b"motd\n" + END + b"0>\n"
    assert unframe(stream, FRAME).payload == b"motd\n"


def test_a_stream_cut_short_has_no_status():
    cut = unframe(b"banner\n" + BEGIN + b"half an ans", FRAME)
    assert (cut.began, cut.status, cut.payload) == (True, None, b"half an ans")
    never = unframe(b"banner only\n", FRAME)
    assert (never.began, never.status, never.payload) == (False, None, b"banner only\n")
    mangled = unframe(BEGIN + b"x" + END + b"garbage", FRAME)
    assert (mangled.status, mangled.payload) == (None, b"x")


# A start-up file as clusters have them: a banner and a notice on both streams, the command
# line echoed (with the token's halves in it), and an EXIT trap that says goodbye on both.
NOISY_RC = """\
echo "Welcome to the cluster. Ran: $BASH_EXECUTION_STRING"
echo "notice: your quota is 91% full" >&2
printf 'no newline at the end'
trap 'echo "bye (stdout)"; echo "bye (stderr)" >&2' EXIT
"""


@pytest.fixture
def noisy(tmp_path) -> Connection:
    """A Connection whose 'ssh' runs the remote command here, in a bash that reads NOISY_RC
    first (BASH_ENV: what ~/.bashrc is to bash started by sshd)."""
    rc = tmp_path / "noisy.rc"
    rc.write_text(NOISY_RC)
    fake = tmp_path / "fake-ssh"
    fake.write_text(f'#!/bin/sh\nfor last; do :; done\nBASH_ENV={rc} exec bash -c "$last"\n')
    fake.chmod(0o755)
    return Connection(Login("login1"), state_dir=tmp_path / "state", runner=[str(fake)])


def test_a_noisy_login_shell_gives_each_operation_its_own_answer(noisy, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_bytes(b'{"run_id": "r1"}')
    done = noisy.run(["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert (done.returncode, done.stdout, done.stderr) == (7, b"out\n", b"err\n")
    assert on_login.read_bytes(noisy, str(tmp_path / "run" / "run.json")) == b'{"run_id": "r1"}'
    assert on_login.read_bytes(noisy, str(tmp_path / "run" / "missing.json")) is None
    home, user = on_login.home_and_user(noisy)
    assert home and user and "Welcome" not in home + user
    stream = on_login.pack_files(noisy, str(tmp_path / "run"), ["run.json", "absent.json"])
    with tarfile.open(fileobj=io.BytesIO(stream), mode="r:") as tar:
        assert tar.getnames() == ["run.json"]
    (tmp_path / "run" / "7_0_log.out").write_bytes(b"line 1\nline 2\n")
    assert on_login.log_tails(noisy, str(tmp_path / "run"), {}) == [("7_0_log.out", 0, b"line 1\nline 2\n")]


def test_an_error_message_says_what_the_command_said_not_the_banner(noisy, tmp_path):
    with pytest.raises(SchedulerError) as caught:
        on_login.run_checked(noisy, ["ls", str(tmp_path / "nowhere")], "listing")
    assert "nowhere" in str(caught.value) and "quota" not in str(caught.value) and "bye" not in str(caught.value)


def test_an_answer_cut_short_is_exit_3_not_a_short_answer(tmp_path):
    fake = tmp_path / "fake-ssh"
    # The shell starts the command, then dies with the link before the end mark.
    fake.write_text('#!/bin/sh\nfor last; do :; done\nbash -c "$last" | head -c 60\nexit 0\n')
    fake.chmod(0o755)
    conn = Connection(Login("login1"), state_dir=tmp_path / "state", runner=[str(fake)])
    with pytest.raises(SchedulerError, match="cut short"):
        conn.run(["printf", "%s", "x" * 100])


def test_a_shell_that_never_runs_the_command_is_exit_3_naming_the_host(tmp_path):
    fake = tmp_path / "fake-ssh"
    fake.write_text('#!/bin/sh\necho "This account is locked" >&2\nexit 1\n')
    fake.chmod(0o755)
    conn = Connection(Login("login1"), state_dir=tmp_path / "state", runner=[str(fake)])
    with pytest.raises(SchedulerError, match=r"login shell on login1 did not run .*This account is locked"):
        conn.run(["true"])


@pytest.mark.skipif(not shutil.which("dash"), reason="dash not installed")
def test_the_framed_command_is_plain_posix_sh():
    command = FRAME.wrap("printf '%s' payload; false")
    done = subprocess.run(["dash", "-c", command], capture_output=True, timeout=30)
    assert done.stdout == BEGIN + b"payload" + END + b"1>\n"
    assert done.stderr == BEGIN + END + b"1>\n"
    assert done.returncode == 1
