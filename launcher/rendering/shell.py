"""The one place that turns values into shell text.

Every value that reaches a rendered script passes through a function here:

- `quote` makes a single literal word: nothing in it expands or executes.
- `expandable` is for environment values: `$VAR` and `${VAR}` references expand when
  the job runs (so `$SLURM_JOB_ID` or `$USER` mean what a site author expects), while
  command substitution, backticks, globbing, quotes and newlines stay literal.
- `join` quotes each word of a command line.

Templates receive already-quoted text from these helpers; they never quote themselves.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

_SAFE_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_VAR_REF = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\})")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def quote(value: object) -> str:
    """One shell word that bash reads back as exactly `str(value)`."""
    text = str(value)
    if text and _SAFE_WORD.fullmatch(text):
        return text
    if "\n" in text or "\r" in text:
        # $'...' keeps control characters visible and literal in the script text.
        return ansi_c_quote(text)
    return shlex.quote(text)


def ansi_c_quote(text: str) -> str:
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == "'":
            out.append("\\'")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "$'" + "".join(out) + "'"


def join(words: Iterable[object]) -> str:
    return " ".join(quote(w) for w in words)


def split_command(command: str) -> list[str]:
    """Split a command given as one string (e.g. a site's `python:`) into words."""
    return shlex.split(command)


def expandable(value: object) -> str:
    """A double-quoted word in which only `$NAME` / `${NAME}` references expand."""
    text = str(value)
    pieces = []
    pos = 0
    for match in _VAR_REF.finditer(text):
        pieces.append(_literal_for_double_quotes(text[pos:match.start()]))
        pieces.append(match.group(0))
        pos = match.end()
    pieces.append(_literal_for_double_quotes(text[pos:]))
    body = "".join(pieces)
    if "\n" in body or "\r" in body:
        # Keep a newline literal without breaking the line structure of the script:
        # close the double quotes, add $'\n', reopen.
        body = body.replace("\r", '"$\'\\r\'"').replace("\n", '"$\'\\n\'"')
    return '"' + body + '"'


def _literal_for_double_quotes(text: str) -> str:
    # Inside "...", only $, `, \ and " are special (and ! in interactive shells, not here).
    return re.sub(r'([$`"\\])', r"\\\1", text)


def export(name: str, value: object, *, expand: bool = True) -> str:
    """`export NAME=VALUE`; the name must already be validated by `is_env_name`."""
    if not is_env_name(name):
        raise ValueError(f"not an environment variable name: {name!r}")
    return f"export {name}={expandable(value) if expand else quote(value)}"


def is_env_name(name: str) -> bool:
    return bool(_ENV_NAME.fullmatch(name))


def sbatch_directive(key: str, value: object = True) -> str:
    """`#SBATCH --key=value`. Slurm reads these lines itself, not bash: values are
    quoted the way sbatch's own parser undoes them (it honours double/single quotes)."""
    if value is True:
        return f"#SBATCH --{key}"
    text = str(value)
    if "\n" in text or "\r" in text:
        raise ValueError(f"#SBATCH --{key}: a directive cannot hold a newline")
    return f"#SBATCH --{key}={quote(text)}"
