"""A profile's `login:`: the login node of a cluster reached over SSH.

Every field is user input that ends up on ssh's command line, and ssh reads a word that
starts with '-' as an option, splits `user@host` at the '@' and reads `-o` values as config
text: `problems` refuses what ssh would read as anything other than the value meant
(launcher.schedulers.ssh.command.ssh_words passes each field as a word of its own).
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.errors import ConfigError
from launcher.shell import is_hidden

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


def login_of(settings: object) -> Login | None:
    """The Login a profile's `login:` settings (any object with its fields) name, or None."""
    if settings is None:
        return None
    return Login(**{key: getattr(settings, key) for key in ("host", "user", "port", "identity_file", "jump")})


def login_from_text(text: str, *, key: str) -> Login:
    """The Login of `[user@]host[:port]` as typed on the command line; ConfigError naming
    `key` for one that ssh could not take as meant."""
    user, at, rest = text.rpartition("@")
    host, colon, port_text = rest.partition(":")
    port: int | None = None
    if colon:
        if not port_text.isdigit():
            raise ConfigError(f"{text!r}: the port after ':' must be a number ([user@]host[:port])", key=key)
        port = int(port_text)
    login = Login(host=host, user=user if at else None, port=port)
    problems = login.problems()
    if problems:
        raise ConfigError(f"{text!r}: " + "; ".join(p for _, p in problems), key=key)
    return login
