"""What a remote command answered, apart from what the login shell printed around it.

The account's shell on the login node reads ~/.bashrc (Debian's bash does so for a command
sent by sshd), ~/.profile or the site's profile scripts, and those may print a banner, a
quota notice or a module message on stdout and stderr, before the command and after it (an
EXIT trap). None of that may reach a parser. So every remote command is sent framed: the
shell prints a begin mark on both streams, runs the command, then prints an end mark that
carries its exit status, on both streams. The marks hold a random token chosen for that
call, and the command text spells it in two halves joined only when printed: a banner that
echoes the command line ($BASH_EXECUTION_STRING) still cannot print a mark.

What lies between the marks is the command's own output, byte for byte; what lies outside
them is dropped. A stream that holds the begin mark but not the end one was cut short.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

# printf's format for each mark: the token goes in as two arguments.
_BEGIN_FORMAT = "<glaunch %s%s>\\n"
_END_FORMAT = "</glaunch %s%s %s>\\n"
_STATUS = re.compile(rb"(\d{1,3})>\n")


@dataclass(frozen=True)
class Frame:
    """The marks of one call."""

    token: str

    @property
    def begin(self) -> bytes:
        return f"<glaunch {self.token}>\n".encode()

    @property
    def end(self) -> bytes:
        return f"</glaunch {self.token} ".encode()

    def wrap(self, command: str) -> str:
        """`command` (shell text: one simple command) framed on stdout and stderr; the
        shell exits with the command's status. `command printf`: a function named printf
        that a profile defines is not called."""
        head, tail = self.token[:len(self.token) // 2], self.token[len(self.token) // 2:]
        begin = f"command printf '{_BEGIN_FORMAT}' {head} {tail}"
        end = f"command printf '{_END_FORMAT}' {head} {tail} \"$s\""
        return f"{begin}; {begin} >&2; {command}; s=$?; {end}; {end} >&2; exit \"$s\""


def new_frame() -> Frame:
    return Frame(f"{secrets.token_hex(8)}{secrets.token_hex(8)}")


@dataclass(frozen=True)
class Unframed:
    """One stream of a framed call. `began`: the begin mark was seen; `status`: the exit
    status in the end mark, None when that mark never came (the stream was cut short, or
    the shell never ran the command); `payload`: what lies between the marks, or after the
    begin mark when the end never came, or the whole stream when nothing began."""

    began: bool
    status: int | None
    payload: bytes


def unframe(stream: bytes, frame: Frame) -> Unframed:
    """What the command printed on `stream`, apart from what the shell printed around it."""
    start = stream.find(frame.begin)
    if start < 0:
        return Unframed(False, None, stream)
    body = start + len(frame.begin)
    end = stream.find(frame.end, body)
    if end < 0:
        return Unframed(True, None, stream[body:])
    status = _STATUS.match(stream, end + len(frame.end))
    if status is None:
        return Unframed(True, None, stream[body:end])
    return Unframed(True, int(status.group(1)), stream[body:end])
