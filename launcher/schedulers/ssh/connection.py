"""One SSH connection to a login node for one glaunch command.

OpenSSH multiplexes: the first remote call starts a master connection (ControlMaster=auto,
its socket under the state directory) and every later call runs over it without a new
handshake; leaving the `with` block closes it (`ssh -O exit`), a SIGTERM too (it ends the
command as an exception would), and ControlPersist ends one that a killed glaunch left.
Each call is one ssh process run through `processes.run_bounded`: it ends within its bound,
and a failure of ssh itself (exit 255) becomes a SchedulerError (exit 3) that names the
host and says, in one line, what ssh said.

The remote command is given as words, each quoted with `launcher.shell.quote` and read by
the remote account's login shell, which must be a POSIX shell (sh, bash, zsh, dash). Words
with control characters use `$'...'`, which bash, zsh and POSIX.1-2024 shells read. What
that shell's start-up files print around the command (a banner, a notice) is dropped: the
command runs framed (launcher.schedulers.ssh.framing), and only what it printed itself,
and its own exit status, come back.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from launcher import shell
from launcher.errors import SchedulerError
from launcher.processes import Finished, run_bounded, shown, without_tool_prefix
from launcher.schedulers.ssh.framing import Frame, new_frame, unframe
from launcher.schedulers.ssh.command import Login, ssh_words

# What ssh exits with when it, not the remote command, failed.
SSH_FAILED = 255
DEFAULT_TIMEOUT_S = 60.0
# `ssh -G` and `ssh -O`: local, answered at once by ssh or its master.
LOCAL_TIMEOUT_S = 10.0
# A Unix socket path holds at most 107 bytes, and ssh creates the socket under a name
# 17 characters longer before renaming it into place.
MAX_CONTROL_PATH = 88
MAX_SAID = 300

_HOST_KEY_CHANGED = re.compile(r"REMOTE HOST IDENTIFICATION HAS CHANGED|host key for .* has changed", re.I)
_HOST_KEY = re.compile(r"host key verification failed|no \S+ host key is known|host key is not known", re.I)
_REFUSED_LOGIN = re.compile(r"permission denied|too many authentication failures|"
                            r"no more authentication methods|authentication failed", re.I)
_UNREACHABLE = re.compile(r"connection refused|connection timed out|operation timed out|no route to host|"
                          r"network is unreachable|could not resolve hostname|name or service not known|"
                          r"temporary failure in name resolution|connection closed by|connection reset|"
                          r"kex_exchange_identification|timeout, server .* not responding|broken pipe", re.I)


def said(stderr: bytes, pattern: re.Pattern[str] | None = None) -> str:
    """What ssh said, as one line of visible text: the first line that `pattern` finds,
    else the last non-empty one."""
    lines = [line.strip() for line in shown(stderr).splitlines() if line.strip()]
    line = next((x for x in lines if pattern and pattern.search(x)), lines[-1] if lines else "")
    line = "".join("?" if shell.is_hidden(ch) else ch for ch in line)
    return line if len(line) <= MAX_SAID else line[:MAX_SAID] + "..."


def _ssh_said(stderr: bytes, pattern: re.Pattern[str] | None = None) -> str:
    """What ssh said (:func:`said`), less the `ssh:` it starts its own messages with."""
    return without_tool_prefix("ssh", said(stderr, pattern))


def failure_message(where: str, stderr: bytes) -> str:
    """Why ssh to `where` failed, from what it printed: host key, login refused, host not
    reached, or (else) its own last words."""
    text = shown(stderr)
    if _HOST_KEY_CHANGED.search(text):
        return (f"the host key of {where} is not the one ~/.ssh/known_hosts holds for it "
                f"(ssh: {_ssh_said(stderr, _HOST_KEY)}); check with the cluster's admins before you replace it")
    if _HOST_KEY.search(text):
        return (f"the host key of {where} is not known (ssh: {_ssh_said(stderr, _HOST_KEY)}); "
                "connect once with ssh, check the fingerprint it shows, and accept it")
    if _REFUSED_LOGIN.search(text):
        return f"{where} refused the login: permission denied (ssh: {_ssh_said(stderr, _REFUSED_LOGIN)})"
    if _UNREACHABLE.search(text):
        return f"cannot reach {where} (ssh: {_ssh_said(stderr, _UNREACHABLE)})"
    return f"ssh to {where} failed (ssh: {_ssh_said(stderr) or 'no message, exit 255'})"


class NoAnswer(SchedulerError):
    """The remote command did not end within its bound: whether it did its work is unknown."""


@dataclass(frozen=True)
class Destination:
    """Where ssh actually goes once ~/.ssh/config has been applied (`ssh -G`)."""

    user: str
    hostname: str
    port: str


def parse_destination(text: str) -> Destination | None:
    """The user, hostname and port of `ssh -G` output, or None when one is missing."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key in ("user", "hostname", "port") and value and key not in found:
            found[key] = value.strip()
    if len(found) < 3:
        return None
    return Destination(found["user"], found["hostname"], found["port"])


def describe(login: Login, destination: Destination | None) -> str:
    """`user@host:port` for messages; the profile's name first where ~/.ssh/config maps it
    elsewhere (`login1 (alice@10.0.0.5:22)`)."""
    if destination is None:
        return login.shown
    real = f"{destination.user}@{destination.hostname}:{destination.port}"
    return real if destination.hostname == login.host else f"{login.host} ({real})"


def _exit_on_term(_signum: int, _frame: object) -> None:
    raise SystemExit(128 + signal.SIGTERM)


class Connection:
    """The connection of one glaunch command to `login`. `timeout_s` bounds each call
    (a call may ask for another bound); `state_dir` holds the master's socket, private to
    this connection. `runner`: words put before ssh, to run it as another local user
    (`runuser -u NAME --`) or through a wrapper. `round_trips` counts the calls that went
    to the host (one per ssh process run; `ssh -O` asks the local master, not the host)."""

    def __init__(self, login: Login, *, state_dir: str | os.PathLike[str], timeout_s: float = DEFAULT_TIMEOUT_S,
                 batch: bool = True, runner: Sequence[str] = ()) -> None:
        self.login = login
        self.timeout_s = timeout_s
        self.batch = batch
        self.round_trips = 0
        self._runner = tuple(runner)
        self._state_dir = Path(state_dir)
        self._control_path: str | None = None
        self._own_dir: str | None = None
        self._where: str | None = None
        self._entered = 0                   # open `with` blocks (a shared connection nests them)
        self._previous_term: object = None  # SIGTERM's handler before the outermost block, where it set one

    def __enter__(self) -> Connection:
        # A SIGTERM (`timeout`, a supervisor) ends the command as an exception would, so the
        # block closes the master instead of leaving it to ControlPersist. Only where nothing
        # else handles SIGTERM, and only in the main thread, where Python runs handlers.
        if (self._entered == 0 and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
            self._previous_term = signal.signal(signal.SIGTERM, _exit_on_term)
        self._entered += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._entered -= 1
        owns_term = self._previous_term is not None
        held: list[int] = []
        if owns_term:
            # A SIGTERM while the master is closed waits for the close: raised at once, it
            # would cut `ssh -O exit` short and leave the master to ControlPersist.
            signal.signal(signal.SIGTERM, lambda signum, _frame: held.append(signum))
        try:
            self.close()
        finally:
            if owns_term and self._entered == 0:
                signal.signal(signal.SIGTERM, self._previous_term)  # type: ignore[arg-type]
                self._previous_term = None
            elif owns_term:
                signal.signal(signal.SIGTERM, _exit_on_term)
        if held:
            raise SystemExit(128 + signal.SIGTERM)

    @property
    def control_path(self) -> str:
        """The master's socket: chosen at the first call, unique to this connection."""
        if self._control_path is None:
            self._control_path = self._new_control_path()
        return self._control_path

    def _new_control_path(self) -> str:
        name = f"ssh-{secrets.token_hex(6)}"
        try:
            self._state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            path = str(self._state_dir.resolve() / name)
        except OSError:
            path = ""
        if not path or len(os.fsencode(path)) > MAX_CONTROL_PATH or not re.fullmatch(r"[A-Za-z0-9_./+=-]+", path):
            # A state directory too deep (or oddly named) for a socket: a private one in /tmp.
            self._own_dir = tempfile.mkdtemp(prefix="glaunch-ssh-")
            path = os.path.join(self._own_dir, name)
        return path

    def words(self, *, timeout_s: float | None = None) -> list[str]:
        """The ssh command line up to the destination, as this connection runs it."""
        bound = self.timeout_s if timeout_s is None else timeout_s
        return [*self._runner, *ssh_words(self.login, self.control_path, batch=self.batch, connect_timeout_s=bound)]

    def run(self, words: Sequence[str], *, input: bytes | None = None, timeout_s: float | None = None) -> Finished:
        """Run `words` on the login node (each word quoted: nothing in them expands) with
        `input` on its stdin, within `timeout_s` (default: the connection's). The remote
        command's own exit status is the caller's to judge; SchedulerError when ssh could
        not run it: host unreachable, host key unknown or changed, login refused; NoAnswer
        (a SchedulerError) when it did not end within the bound."""
        bound = self.timeout_s if timeout_s is None else timeout_s
        frame = new_frame()
        argv = self.words(timeout_s=bound) + [frame.wrap(shell.join(words))]
        self.round_trips += 1
        try:
            done = run_bounded(argv, timeout_s=bound, input=input)
        except OSError as exc:
            raise SchedulerError(f"cannot run ssh to reach {self.where()}: {exc.strerror or exc}") from None
        if done is None:
            raise NoAnswer(f"{self.where()} did not answer within {bound:g} s over ssh")
        return self._answer(done, frame)

    def _answer(self, done: Finished, frame: Frame) -> Finished:
        """The command's own exit status and output, without what the login shell printed
        around them (launcher.schedulers.ssh.framing): SchedulerError when ssh failed, or
        the answer was cut short, or the shell never ran the command."""
        out, err = unframe(done.stdout, frame), unframe(done.stderr, frame)
        if out.status is not None:
            return Finished(out.status, out.payload, err.payload, done.truncated)
        if done.returncode == SSH_FAILED:
            raise SchedulerError(failure_message(self.where(), err.payload))
        if out.began and done.truncated:
            return Finished(done.returncode, out.payload, err.payload, True)
        if out.began:
            detail = said(err.payload) or f"exit {done.returncode}"
            raise SchedulerError(f"the answer of {self.where()} over ssh was cut short ({detail})")
        detail = said(err.payload) or said(out.payload) or f"exit {done.returncode}"
        raise SchedulerError(f"the login shell on {self.where()} did not run glaunch's command ({detail}); "
                             "the account's shell must be a POSIX shell (sh, bash, zsh) whose start-up files "
                             "let a command run")

    def master_running(self) -> bool:
        """Whether this connection's master is up (`ssh -O check`)."""
        if self._control_path is None:
            return False
        done = self._control("check")
        return done is not None and done.returncode == 0

    def close(self) -> None:
        """Close the master (`ssh -O exit`), if one was started; idempotent."""
        if self._control_path is not None and os.path.exists(self._control_path):
            self._control("exit")
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)
            self._own_dir = None

    def _control(self, command: str) -> Finished | None:
        ssh = self.words(timeout_s=LOCAL_TIMEOUT_S)
        at = len(self._runner) + 1
        try:
            return run_bounded(ssh[:at] + ["-O", command] + ssh[at:], timeout_s=LOCAL_TIMEOUT_S)
        except OSError:
            return None

    def where(self) -> str:
        """The login as a message names it: `ssh -G` says where ~/.ssh/config takes it."""
        if self._where is None:
            ssh = self.words(timeout_s=LOCAL_TIMEOUT_S)
            at = len(self._runner) + 1
            try:
                done = run_bounded(ssh[:at] + ["-G"] + ssh[at:], timeout_s=LOCAL_TIMEOUT_S)
            except OSError:
                done = None
            ok = done is not None and done.returncode == 0
            self._where = describe(self.login, parse_destination(done.out) if done is not None and ok else None)
        return self._where
