"""Commands asked of a login node in one round trip (launcher.schedulers.ssh.on_login.BATCH):
each runs as slurm_client's runner would run it alone (its words exactly, its stdin, the
login shell's SLURM_* variables gone), and a Slurm client on the same connection takes
their answers instead of asking again."""

from __future__ import annotations

import subprocess

from launcher.processes import Finished
from launcher.schedulers.slurm.client import Client
from launcher.schedulers.ssh import on_login
from launcher.schedulers.ssh.on_login import Asked

HOSTILE = ["$(touch pwned)", "a'b\"c", "two\nlines", "with space", "`id`", "-n", "*", ""]


class LocalConn:
    """A Connection whose remote commands run here; counts its round trips."""

    def __init__(self, cwd=None, env=None):
        self.calls = 0
        self.cwd, self.env = cwd, env

    def run(self, words, *, input=None, timeout_s=None):
        self.calls += 1
        done = subprocess.run(list(words), input=input, capture_output=True, timeout=30, cwd=self.cwd, env=self.env)
        return Finished(done.returncode, done.stdout, done.stderr)

    def where(self) -> str:
        return "here"


def test_each_command_of_a_batch_gets_its_own_words_stdin_status_and_streams(tmp_path):
    conn = LocalConn(cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "9", "SLURM_CONF": "/etc/x"})
    sub = tmp_path / "sub"
    sub.mkdir()
    answers = on_login.run_batch(conn, [
        Asked(("printf", "[%s]\\n", *HOSTILE)),
        Asked(("cat",), input="line one\n$(touch pwned)\n"),
        Asked(("sh", "-c", 'echo out; echo err >&2; exit 7')),
        Asked(("sh", "-c", 'echo "${SLURM_JOB_ID:-unset} ${SLURM_CONF:-unset}"; pwd')),
    ], cwd=str(sub))
    assert conn.calls == 1
    assert [a.returncode for a in answers] == [0, 0, 7, 0]
    assert answers[0].stdout == "".join(f"[{w}]\n" for w in HOSTILE)
    assert answers[1].stdout == "line one\n$(touch pwned)\n"
    assert (answers[2].stdout, answers[2].stderr) == ("out\n", "err\n")
    assert answers[3].stdout == f"unset /etc/x\n{tmp_path / 'sub'}\n"
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "sub" / "pwned").exists()


def test_a_batch_answer_cut_short_keeps_only_the_whole_answers():
    whole = b"0\x003\x000\x00abc" + b"1\x002\x001\x00dee"
    assert on_login.parse_batch(whole) == [(0, "abc", ""), (1, "de", "e")]
    assert on_login.parse_batch(whole[:-1]) == [(0, "abc", "")]
    assert on_login.parse_batch(b"0\x00x\x000\x00") == []


def test_a_slurm_client_takes_an_answer_asked_ahead_and_asks_again_after_a_failure(tmp_path):
    conn = LocalConn(env={"PATH": "/usr/bin:/bin"})
    on_login.ask_ahead(conn, [Asked(("echo", "ahead")), Asked(("sh", "-c", "exit 3"))])
    assert conn.calls == 1
    client = on_login.slurm_client(conn)
    assert isinstance(client, Client)
    for _ in range(2):      # a good answer holds for the whole command
        assert client.attempt(["echo", "ahead"], 5).proc.stdout == "ahead\n"
    assert client.attempt(["sh", "-c", "exit 3"], 5).proc.returncode == 3
    assert conn.calls == 1
    assert client.attempt(["sh", "-c", "exit 3"], 5).proc.returncode == 3     # asked again
    assert conn.calls == 2
    assert client.attempt(["echo", "other"], 5).proc.stdout.endswith("other\n")
    assert conn.calls == 3
