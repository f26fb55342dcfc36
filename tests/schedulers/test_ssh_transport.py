"""SSH transport to a login node: the `login:` fields and the ssh command line (pure), what
ssh's failures mean (recorded texts), and, against the login node of scripts/local-sshd
(requires_sshd), calls, multiplexing, failures and the one-transfer send of a tree, with ssh
run as that node's laptop user so that its own ~/.ssh/config and known_hosts apply."""

import io
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from launcher.errors import SchedulerError
from launcher.rundir.rankcontext import free_port
from launcher.schedulers.ssh import transfer
from launcher.schedulers.ssh.connection import (
    Connection,
    Destination,
    describe,
    failure_message,
    parse_destination,
    said,
)
from launcher.schedulers.ssh.command import Login, ssh_words
from launcher.schedulers.ssh.transfer import check_remote_dir, send_tree

CP = "/run/user/1000/glaunch/ssh-0123456789ab"


# --- ssh_words -----------------------------------------------------------------------------------

def test_ssh_words_of_a_bare_host_leave_the_rest_to_the_users_config():
    assert ssh_words(Login("login.example.org"), CP) == [
        "ssh", "-T", "-o", "BatchMode=yes", "-o", "ControlMaster=auto", "-o", f"ControlPath={CP}",
        "-o", "ControlPersist=60", "-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=15",
        "-o", "ServerAliveCountMax=3", "--", "login.example.org"]


def test_ssh_words_pass_every_field_as_a_word_of_its_own_and_the_host_after_the_double_dash():
    login = Login("login1", user="alice", port=2222, identity_file="~/.ssh/id_cluster", jump="bob@bastion:22")
    words = ssh_words(login, CP)
    pairs = {words[i]: words[i + 1] for i in range(len(words) - 1) if words[i] in ("-p", "-i", "-J", "-l")}
    assert pairs == {"-p": "2222", "-i": "~/.ssh/id_cluster", "-J": "bob@bastion:22", "-l": "alice"}
    assert words[-2:] == ["--", "login1"]
    assert "IdentitiesOnly=yes" in words
    # Host keys are checked as the user's ssh does: nothing here loosens it.
    assert not any("StrictHostKeyChecking" in w or "UserKnownHostsFile" in w for w in words)


def test_ssh_words_without_batch_may_prompt():
    assert not any(w.startswith("BatchMode") for w in ssh_words(Login("h"), CP, batch=False))


def test_ssh_words_keep_percent_signs_literal():
    words = ssh_words(Login("h", identity_file="/keys/100%/id"), "/tmp/50%/cm")
    assert "ControlPath=/tmp/50%%/cm" in words
    assert "/keys/100%%/id" in words


@pytest.mark.parametrize("bound, expected", [(0.2, "1"), (7.5, "8"), (600, "30")])
def test_the_connect_timeout_stays_within_the_call_and_a_ceiling(bound, expected):
    assert f"ConnectTimeout={expected}" in ssh_words(Login("h"), CP, connect_timeout_s=bound)


def test_ssh_words_refuse_a_login_with_problems():
    with pytest.raises(ValueError, match=r"login\.host"):
        ssh_words(Login("-oProxyCommand=touch /tmp/x"), CP)


@pytest.mark.parametrize("path", ["/tmp/a b/cm", '/tmp/a"b/cm', "relative/cm"])
def test_ssh_words_refuse_a_control_path_ssh_would_parse(path):
    with pytest.raises(ValueError, match="control path"):
        ssh_words(Login("h"), path)


# --- Login validation --------------------------------------------------------------------------

HOSTILE = [
    # (fields, key, what the problem says)
    ({"host": ""}, "login.host", "empty"),
    ({"host": "-oProxyCommand=sh"}, "login.host", "starts with '-'"),
    ({"host": "login1 -v"}, "login.host", "whitespace"),
    ({"host": "login1\n"}, "login.host", "control characters (U+000A)"),
    ({"host": "login\x1b[2J"}, "login.host", "control characters (U+001B)"),
    ({"host": "login\u200b1"}, "login.host", "control characters (U+200B)"),
    ({"host": "alice@login1"}, "login.host", "login.user"),
    ({"host": "ssh://login1"}, "login.host", "'/'"),
    ({"host": "h" * 254}, "login.host", "at most 253"),
    ({"host": 42}, "login.host", "must be text"),
    ({"user": "-l"}, "login.user", "starts with '-'"),
    ({"user": "al ice"}, "login.user", "whitespace"),
    ({"user": "alice\t"}, "login.user", "control characters (U+0009)"),
    ({"user": "al\x00ice"}, "login.user", "control characters (U+0000)"),
    ({"user": ""}, "login.user", "empty"),
    ({"port": 0}, "login.port", "not in 1..65535"),
    ({"port": 65536}, "login.port", "not in 1..65535"),
    ({"port": -22}, "login.port", "not in 1..65535"),
    ({"port": "22"}, "login.port", "whole number"),
    ({"port": True}, "login.port", "whole number"),
    ({"port": 22.0}, "login.port", "whole number"),
    ({"identity_file": "id_rsa"}, "login.identity_file", "absolute path"),
    ({"identity_file": "~alice/.ssh/id"}, "login.identity_file", "absolute path"),
    ({"identity_file": "-i/etc/shadow"}, "login.identity_file", "absolute path"),
    ({"identity_file": "/keys/id\n"}, "login.identity_file", "control characters"),
    ({"jump": "-oProxyCommand=sh"}, "login.jump", "starts with '-'"),
    ({"jump": "bastion,"}, "login.jump", "empty hop"),
    ({"jump": "alice@-evil"}, "login.jump", "starts with '-'"),
    ({"jump": "bastion one"}, "login.jump", "whitespace"),
    ({"jump": "alice@:22"}, "login.jump", "names no host"),
]


@pytest.mark.parametrize("fields, key, problem", HOSTILE, ids=[f"{k}-{i}" for i, (_, k, _) in enumerate(HOSTILE)])
def test_each_hostile_field_gives_its_problem(fields, key, problem):
    login = Login(**{"host": "login1", **fields})
    found = login.problems()
    assert [k for k, _ in found] == [key], found
    assert problem in found[0][1]


@pytest.mark.parametrize("login", [
    Login("login1"),
    Login("login1.cluster.example.org", user="alice", port=22, identity_file="~/.ssh/id_ed25519"),
    Login("10.0.0.5", user="first.last@corp.example", port=65535, identity_file="/home/a/.ssh/my key"),
    Login("::1", port=1, jump="alice@bastion:2222,bob@10.1.1.1"),
    Login("cluster-alias_2", identity_file="~"),
])
def test_ordinary_logins_have_no_problems(login):
    assert login.problems() == []


def test_a_login_is_shown_as_user_at_host_port():
    assert Login("h", user="u", port=2).shown == "u@h:2"
    assert Login("h").shown == "h"


# --- what ssh's failures mean (recorded texts) -------------------------------------------------

CHANGED = b"""\
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!
Someone could be eavesdropping on you right now (man-in-the-middle attack)!
Host key for [127.0.0.1]:2222 has changed and you have requested strict checking.
Host key verification failed.
"""


@pytest.mark.parametrize("stderr, expected, line", [
    (CHANGED, "is not the one ~/.ssh/known_hosts holds", "Host key verification failed."),
    (b"No ED25519 host key is known for [localhost]:2222 and you have requested strict checking.\r\n"
     b"Host key verification failed.\r\n", "is not known", "No ED25519 host key is known"),
    (b"Warning: Identity file /k not accessible: No such file or directory.\n"
     b"root@127.0.0.1: Permission denied (publickey).\n", "refused the login: permission denied",
     "root@127.0.0.1: Permission denied (publickey)."),
    (b"ssh: connect to host 127.0.0.1 port 2223: Connection refused\r\n", "cannot reach",
     "Connection refused"),
    (b"ssh: Could not resolve hostname nowhere.invalid: Name or service not known\n", "cannot reach",
     "Could not resolve hostname"),
    (b"kex_exchange_identification: read: Connection reset by peer\n", "cannot reach", "kex_exchange"),
    (b"something else entirely\n", "ssh to alice@login1:22 failed", "something else entirely"),
    (b"", "no message, exit 255", ""),
])
def test_ssh_failures_name_the_host_and_what_ssh_said(stderr, expected, line):
    message = failure_message("alice@login1:22", stderr)
    assert "alice@login1:22" in message
    assert expected in message
    assert line in message
    assert "\n" not in message and "\r" not in message


def test_what_ssh_said_is_one_visible_line():
    assert said(b"first\n\x1b[31mred\xff\n\n") == "?[31mred\ufffd"
    assert len(said(b"x" * 5000)) < 400


def test_ssh_G_tells_where_an_alias_goes():
    out = "user root\nhostname 127.0.0.1\nport 2222\nidentityfile ~/.ssh/id_ed25519\n"
    destination = parse_destination(out)
    assert destination == Destination("root", "127.0.0.1", "2222")
    assert describe(Login("glaunch-login"), destination) == "glaunch-login (root@127.0.0.1:2222)"
    assert describe(Login("127.0.0.1"), destination) == "root@127.0.0.1:2222"
    assert describe(Login("h", user="u"), parse_destination("user u\n")) == "u@h"


@pytest.mark.parametrize("remote_dir", ["", "/", ".", "..", "runs/..", "~/runs/x", "/a\0b"])
def test_a_remote_dir_that_names_nothing_to_create_is_refused(remote_dir):
    with pytest.raises(ValueError):
        check_remote_dir(remote_dir)


# --- against the local login node ---------------------------------------------------------------

HOSTILE_WORDS = ["", " ", "a b", "'", '"', "'\"'", "$(touch /tmp/glaunch-pwned)", "`id`", "$HOME", "${PATH}",
                 "*", "~", "~root", "\n", "a\nb", "\t", "-n", "--", "-e", "\\", "\\n", ";", "|", "&&", "!",
                 "#", "x=1", "é", "日本", "\x1b[31m", "\x7f", "%s", "%", "{a,b}", "[a]", ">out", "<in"]


@pytest.fixture
def laptop(local_sshd_env):
    """How this process runs ssh as the laptop user, and a state dir of that user's."""
    user = local_sshd_env["GLAUNCH_SSHD_LAPTOP_USER"]
    entry = pwd.getpwnam(user)
    state = tempfile.mkdtemp(prefix="glaunch-sshtest-")
    os.chown(state, entry.pw_uid, entry.pw_gid)
    yield {"runner": ("runuser", "-u", user, "--"), "state": state, "entry": entry,
           "port": int(local_sshd_env["GLAUNCH_SSHD_PORT"]), "alias": local_sshd_env["GLAUNCH_SSHD_ALIAS"],
           "user": local_sshd_env["GLAUNCH_SSHD_USER"]}
    shutil.rmtree(state, ignore_errors=True)


def connect(laptop, login=None, timeout_s=20.0):
    return Connection(login or Login(laptop["alias"]), state_dir=laptop["state"], timeout_s=timeout_s,
                      runner=laptop["runner"])


@pytest.mark.requires_sshd
def test_hostile_words_reach_the_remote_command_exactly(laptop):
    with connect(laptop) as conn:
        done = conn.run(["printf", "%s\\0", *HOSTILE_WORDS])
    assert done.returncode == 0, done.err
    assert done.stdout.split(b"\0")[:-1] == [w.encode() for w in HOSTILE_WORDS]
    assert not os.path.exists("/tmp/glaunch-pwned")


@pytest.mark.requires_sshd
def test_one_master_connection_serves_every_call_and_closes_with_the_command(laptop):
    with connect(laptop) as conn:
        assert not conn.master_running()
        # The client's address and port, the same for every call: one TCP connection.
        seen = {conn.run(["sh", "-c", 'echo "$SSH_CONNECTION"']).out for _ in range(3)}
        assert conn.run(["id", "-un"]).out.strip() == laptop["user"]
        assert conn.round_trips == 4
        assert len(seen) == 1, seen
        assert conn.master_running()
        check = conn.words()
        socket_path = conn.control_path
        assert os.path.dirname(socket_path) == laptop["state"]
        assert stat.S_ISSOCK(os.stat(socket_path).st_mode)
    assert not conn.master_running()
    assert not os.path.exists(socket_path)
    assert "-O" not in check


TERMINATED_CLIENT = """
import sys
from launcher.schedulers.ssh.command import Login
from launcher.schedulers.ssh.connection import Connection

alias, state, *runner = sys.argv[1:]
with Connection(Login(alias), state_dir=state, timeout_s=60, runner=runner) as conn:
    conn.run(["true"])
    print(conn.control_path, flush=True)
    conn.run(["sleep", "30"])
"""


@pytest.mark.requires_sshd
def test_a_command_ended_by_sigterm_closes_its_master_at_once(laptop):
    """`timeout glaunch logs -f RUN`: SIGTERM unwinds the command as an exception would, so
    its master is closed, not left up until ControlPersist (60 s) ends it."""
    proc = subprocess.Popen([sys.executable, "-c", TERMINATED_CLIENT, laptop["alias"], laptop["state"],
                             *laptop["runner"]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        socket_path = proc.stdout.readline().strip()
        assert socket_path and stat.S_ISSOCK(os.stat(socket_path).st_mode), proc.stderr.read() if proc.poll() else ""
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    assert time.monotonic() - began < 15
    assert not os.path.exists(socket_path)


# The SIGTERM comes as the master is being closed: at the start of `ssh -O exit`.
TERMINATED_WHILE_CLOSING = """
import os, signal, sys
from launcher.schedulers.ssh.command import Login
from launcher.schedulers.ssh.connection import Connection

control = Connection._control
def terminated_then_control(self, command):
    if command == "exit":
        os.kill(os.getpid(), signal.SIGTERM)
    return control(self, command)
Connection._control = terminated_then_control

alias, state, *runner = sys.argv[1:]
with Connection(Login(alias), state_dir=state, timeout_s=60, runner=runner) as conn:
    conn.run(["true"])
    print(conn.control_path, flush=True)
print("after the block", flush=True)
"""


@pytest.mark.requires_sshd
def test_a_sigterm_while_the_master_closes_lets_the_close_finish_then_ends_the_command(laptop):
    proc = subprocess.run([sys.executable, "-c", TERMINATED_WHILE_CLOSING, laptop["alias"], laptop["state"],
                           *laptop["runner"]], capture_output=True, text=True, timeout=60)
    socket_path, *after = proc.stdout.splitlines()
    assert proc.returncode == 128 + signal.SIGTERM and after == [], proc.stdout + proc.stderr
    assert socket_path and not os.path.exists(socket_path)
    assert subprocess.run(["pgrep", "-f", socket_path], capture_output=True).returncode == 1


@pytest.mark.requires_sshd
def test_the_remote_exit_status_is_the_callers(laptop):
    with connect(laptop) as conn:
        done = conn.run(["sh", "-c", "echo out; echo err >&2; exit 7"], input=None)
        echoed = conn.run(["cat"], input=b"\x00\xffbytes in\n" * 1000)
    assert (done.returncode, done.out, done.err) == (7, "out\n", "err\n")
    assert echoed.stdout == b"\x00\xffbytes in\n" * 1000


@pytest.mark.requires_sshd
def test_a_closed_port_is_exit_3_naming_the_host(laptop):
    port = free_port()
    start = time.monotonic()
    with connect(laptop, Login("127.0.0.1", user="root", port=port), timeout_s=15) as conn, \
            pytest.raises(SchedulerError) as caught:
        conn.run(["true"])
    assert time.monotonic() - start < 15
    assert caught.value.exit_code == 3
    assert f"cannot reach root@127.0.0.1:{port}" in str(caught.value)
    assert "Connection refused" in str(caught.value)


@pytest.mark.requires_sshd
def test_a_host_that_never_answers_is_given_up_within_the_bound(laptop):
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)      # the TCP handshake completes; no SSH banner ever comes
        port = silent.getsockname()[1]
        start = time.monotonic()
        with connect(laptop, Login("127.0.0.1", user="root", port=port), timeout_s=3) as conn, \
                pytest.raises(SchedulerError) as caught:
            conn.run(["true"])
        took = time.monotonic() - start
    assert took < 3 + 5, took
    assert caught.value.exit_code == 3
    assert f"root@127.0.0.1:{port}" in str(caught.value)


@pytest.mark.requires_sshd
def test_a_key_the_host_does_not_accept_is_permission_denied(laptop):
    keys = tempfile.mkdtemp(dir=laptop["state"])
    key = os.path.join(keys, "stranger")
    os.chown(keys, laptop["entry"].pw_uid, laptop["entry"].pw_gid)
    subprocess.run(["runuser", "-u", laptop["entry"].pw_name, "--", "ssh-keygen", "-q", "-t", "ed25519", "-N", "",
                    "-f", key], check=True, timeout=30)
    login = Login("127.0.0.1", user=laptop["user"], port=laptop["port"], identity_file=key)
    with connect(laptop, login) as conn, pytest.raises(SchedulerError) as caught:
        conn.run(["true"])
    assert caught.value.exit_code == 3
    message = str(caught.value)
    assert f"root@127.0.0.1:{laptop['port']} refused the login: permission denied" in message
    assert "(publickey)" in message


@pytest.mark.requires_sshd
def test_an_unknown_host_key_is_refused_not_learnt(laptop):
    known_hosts = os.path.join(laptop["entry"].pw_dir, ".ssh", "known_hosts")
    before = Path(known_hosts).read_bytes()
    # The same sshd under a name known_hosts has no key for.
    login = Login("localhost", user=laptop["user"], port=laptop["port"])
    with connect(laptop, login) as conn, pytest.raises(SchedulerError) as caught:
        conn.run(["touch", "/tmp/glaunch-should-not-exist"])
    assert caught.value.exit_code == 3
    assert f"the host key of root@localhost:{laptop['port']} is not known" in str(caught.value)
    assert Path(known_hosts).read_bytes() == before
    assert not os.path.exists("/tmp/glaunch-should-not-exist")


# --- send_tree ------------------------------------------------------------------------------------

HOSTILE_NAMES = ["plain.txt", "with space", "it's", 'say "hi"', "new\nline", "$(touch pwned)", "`id`",
                 "-rf", "--", "-", "back\\slash", "star*", "é日本", "tab\there", ".hidden", "semi;colon"]


def hostile_tree(root):
    os.makedirs(root)
    for i, name in enumerate(HOSTILE_NAMES):
        with open(os.path.join(root, name), "wb") as f:
            f.write(f"{i}: {name}\n".encode() + bytes(range(256)))
    os.makedirs(os.path.join(root, "-dir", "a b", "$(sub)"))
    with open(os.path.join(root, "-dir", "a b", "$(sub)", "deep\n"), "wb") as f:
        f.write(b"deep")
    os.makedirs(os.path.join(root, "empty dir"))
    with open(os.fsdecode(os.path.join(os.fsencode(root), b"not-utf8-\xff\xfe")), "wb") as f:
        f.write(b"latin")
    open(os.path.join(root, "empty"), "wb").close()
    script = os.path.join(root, "run me.sh")
    with open(script, "w") as f:
        f.write("#!/bin/sh\necho hi\n")
    os.chmod(script, 0o755)
    os.symlink("with space", os.path.join(root, "link -> it"))
    with open(os.path.join(root, "long" * 60), "wb") as f:     # 240 bytes: past ustar's 100
        f.write(b"long name")


def snapshot(root):
    """Every entry under root (bytes paths): its kind, content or target, and exec bit."""
    found = {}
    broot = os.fsencode(root)
    for dirpath, dirnames, filenames in os.walk(broot):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, broot)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = ("dir",)
            else:
                found[rel] = ("file", Path(os.fsdecode(path)).read_bytes(), bool(st.st_mode & stat.S_IXUSR))
    return found


def leftovers(parent):
    return [n for n in os.listdir(parent) if n.startswith(".glaunch-")]


@pytest.fixture
def trees(tmp_path):
    local = str(tmp_path / "local tree")
    hostile_tree(local)
    remote_parent = tmp_path / "remote runs"
    remote_parent.mkdir()
    return local, str(remote_parent)


@pytest.mark.requires_sshd
def test_a_hostile_tree_arrives_byte_identical_in_one_call(laptop, trees):
    local, parent = trees
    dest = os.path.join(parent, "-run $(x) 'one'\nâ")
    with connect(laptop) as conn:
        send_tree(conn, local, dest)
        assert conn.round_trips == 1
    assert snapshot(dest) == snapshot(local)
    assert len(snapshot(local)) == len(HOSTILE_NAMES) + 10
    assert leftovers(parent) == []
    assert not os.path.exists(os.path.join(parent, "pwned"))


@pytest.mark.requires_sshd
def test_a_second_send_to_the_same_dir_is_refused_and_changes_nothing(laptop, trees):
    local, parent = trees
    dest = os.path.join(parent, "run-1")
    with connect(laptop) as conn:
        send_tree(conn, local, dest)
        first = snapshot(dest)
        with open(os.path.join(local, "plain.txt"), "wb") as f:
            f.write(b"changed")
        with pytest.raises(SchedulerError) as caught:
            send_tree(conn, local, dest)
    assert caught.value.exit_code == 3
    assert "already exists" in str(caught.value) and "root@127.0.0.1" in str(caught.value)
    assert snapshot(dest) == first
    assert leftovers(parent) == []


@pytest.mark.requires_sshd
def test_a_missing_remote_parent_is_exit_3_unless_asked_to_create_it(laptop, trees):
    local, parent = trees
    dest = os.path.join(parent, "not", "there", "run")
    with connect(laptop) as conn:
        with pytest.raises(SchedulerError, match=r"no directory .*not/there.* on glaunch-login") as caught:
            send_tree(conn, local, dest)
        assert caught.value.exit_code == 3
        assert not os.path.exists(os.path.join(parent, "not"))
        send_tree(conn, local, dest, parents=True)
    assert snapshot(dest) == snapshot(local)


REAL_ARCHIVE = transfer.archive


def truncated_in_a_member(local_dir, last=None):
    data = REAL_ARCHIVE(local_dir, last)
    return data[: len(data) // 2 + 100]


def without_the_last_member(local_dir, last=None):
    """A stream that stops between two members: tar itself sees nothing wrong."""
    return REAL_ARCHIVE(local_dir, None)


@pytest.mark.requires_sshd
@pytest.mark.parametrize("broken", [truncated_in_a_member, without_the_last_member])
def test_a_stream_cut_short_leaves_nothing_on_the_cluster(laptop, trees, monkeypatch, broken):
    local, parent = trees
    monkeypatch.setattr(transfer, "archive", broken)
    dest = os.path.join(parent, "run-cut")
    with connect(laptop) as conn, pytest.raises(SchedulerError) as caught:
        send_tree(conn, local, dest)
    assert caught.value.exit_code == 3
    assert "nothing was left there" in str(caught.value)
    assert os.listdir(parent) == []


@pytest.mark.requires_sshd
def test_a_transfer_killed_at_its_bound_leaves_nothing_on_the_cluster(laptop, tmp_path):
    local = tmp_path / "big"
    local.mkdir()
    (local / "zeros").write_bytes(bytes(256 << 20))
    parent = tmp_path / "remote"
    parent.mkdir()
    with connect(laptop) as conn:
        # The master up first: the bound then falls inside the stream (~1 s here), not the handshake.
        conn.run(["true"])
        with pytest.raises(SchedulerError, match=r"did not answer within 0\.5 s"):
            send_tree(conn, local, str(parent / "run"), timeout_s=0.5)
    # The remote side notices the cut stream and cleans up on its own, a moment later.
    deadline = time.monotonic() + 20
    while os.listdir(parent) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert os.listdir(parent) == []


def test_the_archive_holds_the_tree_then_the_marker(tmp_path):
    local = tmp_path / "t"
    hostile_tree(str(local))
    with tarfile.open(fileobj=io.BytesIO(transfer.archive(local, ".glaunch-complete-x"))) as tar:
        names = tar.getnames()
    assert names[-1] == ".glaunch-complete-x"
    assert "new\nline" in names and "-dir/a b/$(sub)/deep\n" in names


@pytest.mark.skipif(not shutil.which("shellcheck"), reason="shellcheck not installed")
def test_the_local_login_node_script_is_shellcheck_clean():
    script = Path(__file__).resolve().parents[2] / "scripts" / "local-sshd"
    check = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout


def test_the_receiving_script_is_plain_posix_sh(tmp_path):
    from launcher import shell

    assert "$'" not in shell.quote(transfer.RECEIVE)     # read alike by every POSIX login shell
    if shutil.which("shellcheck"):
        script = tmp_path / "receive.sh"
        script.write_text("#!/bin/sh\n" + transfer.RECEIVE + "\n")
        check = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout
