"""The ssh command line that reaches a profile's `login:` (launcher.config.login).

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

from launcher.config.login import Login

__all__ = ["Login", "ssh_words"]

# A master left by a glaunch that died goes away on its own this long after its last use.
CONTROL_PERSIST_S = 60
# A connection that stops answering is given up after INTERVAL * COUNT_MAX seconds, even
# within a long bound (a `logs -f`).
SERVER_ALIVE_INTERVAL_S = 15
SERVER_ALIVE_COUNT_MAX = 3
# Longest wait for the TCP connection and the SSH handshake, within each call's own bound.
MAX_CONNECT_TIMEOUT_S = 30


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
