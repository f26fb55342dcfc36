"""A profile's `login:` and the ssh command line that reaches it.

Every field is user input that ends up on ssh's command line, and ssh reads a word that
starts with '-' as an option, splits `user@host` at the '@' and reads `-o` values as config
text: `problems` refuses what ssh would read as anything other than the value meant, and
`ssh_words` passes each field as a word of its own, the destination after `--`. The
options given here are those glaunch needs (batch mode, multiplexing, bounds); everything
else, host key checking included, comes from the user's ~/.ssh/config and ssh's defaults,
as when the user types `ssh HOST`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from launcher.shell import is_hidden

# A master left by a glaunch that died goes away on its own this long after its last use.
CONTROL_PERSIST_S = 60
# A connection that stops answering is given up after INTERVAL * COUNT_MAX seconds, even
# within a long bound (a `logs -f`).
SERVER_ALIVE_INTERVAL_S = 15
SERVER_ALIVE_COUNT_MAX = 3
# Longest wait for the TCP connection and the SSH handshake, within each call's own bound.
MAX_CONNECT_TIMEOUT_S = 30
# Longest host name in DNS; a ~/.ssh/config alias is no longer in practice.
MAX_HOST = 253
MAX_USER = 256


@dataclass(frozen=True)
class Login:
    """The login node of a cluster, as a profile's `login:` names it. Only `host` is
    needed: `user`, `port` and the key default to the user's ~/.ssh/config, then ssh's own
    defaults; `jump` is ssh's -J (ProxyJump: `[user@]host[:port]`, comma-separated)."""

    host: str
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    jump: str | None = None

    def problems(self) -> list[tuple[str, str]]:
        """(key, what is wrong) for each field ssh could not take as meant; empty when all
        are fine. The key is the field's path in the profile (`login.port`)."""
        found = [("login.host", p) for p in _name_problems(self.host, "host", MAX_HOST)]
        if not found and ("@" in self.host or "/" in self.host):
            found.append(("login.host", f"{self.host!r} is not a host name: put the user in login.user"
                          if "@" in self.host else f"{self.host!r} is not a host name (it contains '/')"))
        if self.user is not None:
            found += [("login.user", p) for p in _name_problems(self.user, "user", MAX_USER)]
        if self.port is not None:
            found += [("login.port", p) for p in _port_problems(self.port)]
        if self.identity_file is not None:
            found += [("login.identity_file", p) for p in _path_problems(self.identity_file)]
        if self.jump is not None:
            found += [("login.jump", p) for p in _jump_problems(self.jump)]
        return found

    @property
    def shown(self) -> str:
        """The login as a user recognises it in a message: `user@host:port`, with what the
        profile leaves to ~/.ssh/config left out."""
        return f"{self.user + '@' if self.user else ''}{self.host}{f':{self.port}' if self.port else ''}"


def _text_problem(value: object, what: str) -> str | None:
    if not isinstance(value, str):
        return f"{what} must be text, not {type(value).__name__}"
    if not value:
        return f"{what} is empty"
    hidden = sorted({f"U+{ord(ch):04X}" for ch in value if is_hidden(ch) and ch != " "})
    if hidden:
        return f"{what} {value!r} contains control characters ({', '.join(hidden)})"
    return None


def _name_problems(value: object, what: str, longest: int) -> list[str]:
    problem = _text_problem(value, what)
    if problem:
        return [problem]
    text = str(value)
    found = []
    if any(ch.isspace() for ch in text):
        found.append(f"{what} {text!r} contains whitespace")
    if text.startswith("-"):
        found.append(f"{what} {text!r} starts with '-': ssh would read it as an option")
    if len(text) > longest:
        found.append(f"{what} is {len(text)} characters long (at most {longest})")
    return found


def _port_problems(port: object) -> list[str]:
    if isinstance(port, bool) or not isinstance(port, int):
        return [f"port must be a whole number, not {port!r}"]
    if not 1 <= port <= 65535:
        return [f"port {port} is not in 1..65535"]
    return []


def _path_problems(path: object) -> list[str]:
    problem = _text_problem(path, "identity_file")
    if problem:
        return [problem]
    text = str(path)
    if not (text.startswith("/") or text == "~" or text.startswith("~/")):
        return [f"identity_file {text!r} must be an absolute path or start with ~/ "
                "(a relative one would depend on where glaunch runs)"]
    if "\n" in text or "\r" in text:
        return [f"identity_file {text!r} contains a line break"]
    return []


def _jump_problems(jump: object) -> list[str]:
    problem = _text_problem(jump, "jump")
    if problem:
        return [problem]
    text = str(jump)
    if any(ch.isspace() for ch in text):
        return [f"jump {text!r} contains whitespace"]
    for hop in text.split(","):
        if not hop:
            return [f"jump {text!r} has an empty hop (ssh -J takes [user@]host[:port],...)"]
        host = hop.rpartition("@")[2]
        if hop.startswith("-") or host.startswith("-"):
            return [f"jump {text!r}: {hop!r} starts with '-': ssh would read it as an option"]
        if not host or host.startswith(":"):
            return [f"jump {text!r}: {hop!r} names no host"]
    return []


def ssh_words(login: Login, control_path: str, *, batch: bool = True, connect_timeout_s: float = 15.0,
              program: str = "ssh") -> list[str]:
    """The ssh command line up to and including the destination; the remote command, one
    word of quoted shell text, goes after it. `batch`: never prompt (a password, a passphrase,
    an unknown host key): fail instead, as a command with a bound must. ValueError when
    `login` has problems: they are refused earlier, where the profile is read."""
    problems = login.problems()
    if problems:
        raise ValueError("; ".join(f"{key}: {text}" for key, text in problems))
    if any(ch.isspace() or ch in "\"'\\" for ch in control_path) or not control_path.startswith("/"):
        # ssh reads -o values as config text: quotes and spaces would be parsed.
        raise ValueError(f"control path {control_path!r} must be absolute, without spaces or quotes")
    connect = max(1, min(math.ceil(connect_timeout_s), MAX_CONNECT_TIMEOUT_S))
    words = [program, "-T"]
    if batch:
        words += ["-o", "BatchMode=yes"]
    words += [
        "-o", "ControlMaster=auto",
        # ssh expands %-tokens in ControlPath: a literal % is %%.
        "-o", "ControlPath=" + control_path.replace("%", "%%"),
        "-o", f"ControlPersist={CONTROL_PERSIST_S}",
        "-o", f"ConnectTimeout={connect}",
        "-o", f"ServerAliveInterval={SERVER_ALIVE_INTERVAL_S}",
        "-o", f"ServerAliveCountMax={SERVER_ALIVE_COUNT_MAX}",
    ]
    if login.port is not None:
        words += ["-p", str(login.port)]
    if login.identity_file is not None:
        # ssh expands %-tokens in identity paths too; and the profile's key is the one meant,
        # not whatever an agent offers first (a server counts each offer as a failed try).
        words += ["-i", login.identity_file.replace("%", "%%"), "-o", "IdentitiesOnly=yes"]
    if login.jump is not None:
        words += ["-J", login.jump]
    if login.user is not None:
        words += ["-l", login.user]
    return words + ["--", login.host]
