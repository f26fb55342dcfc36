"""The one place that turns values into shell text.

Every value that reaches a rendered script passes through a function here:

- `quote` makes a single literal word: nothing in it expands or executes.
- `expandable` is for environment values: `$VAR` and `${VAR}` references expand when
  the job runs (so `$SLURM_JOB_ID` or `$USER` mean what a site author expects), `$$` is a
  literal `$`, and command substitution, backticks, globbing, quotes and newlines stay
  literal.
- `join` quotes each word of a command line.
- `sbatch_directive` writes an `#SBATCH` line the way sbatch's own parser reads it back.

Characters a terminal or an editor would not show as themselves (control characters,
C1 codes such as \\x9b, invisible format characters) are never written raw: words holding
them are ANSI-C quoted (`$'\\x1b'`), and `#SBATCH` values, which have no such escape,
refuse them. So a rendered script, and the dry run that prints it, is plain visible text.

Templates receive already-quoted text from these helpers; they never quote themselves.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

_SAFE_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_VAR_REF = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\})")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Env values: `$$` (a literal `$`), a variable reference, or a run of other text.
_ENV_TOKEN = re.compile(r"\$\$|" + _VAR_REF.pattern)


class ShellTextError(ValueError):
    """A value no shell word (or #SBATCH line) can carry."""


def is_hidden(ch: str) -> bool:
    """A character that must not appear raw in a script: not printable (C0/C1 control
    characters, DEL, format and separator characters other than the space)."""
    return not ch.isprintable()


def text_problem(text: str) -> str | None:
    """Why `text` cannot be carried by any rendered file, or None."""
    if "\0" in text:
        return "contains a NUL character"
    if any("\ud800" <= ch <= "\udfff" for ch in text):
        return "contains a lone surrogate (not valid Unicode text)"
    return None


def hidden_characters(text: str, allowed: str = "") -> list[str]:
    """The hidden characters of `text` (other than `allowed`), as U+XXXX names."""
    return sorted({f"U+{ord(ch):04X}" for ch in text if is_hidden(ch) and ch not in allowed})


def _check(text: str) -> str:
    problem = text_problem(text)
    if problem:
        raise ShellTextError(f"{text!r} {problem}")
    return text


def quote(value: object) -> str:
    """One shell word that bash reads back as exactly `str(value)`."""
    text = _check(str(value))
    if text and _SAFE_WORD.fullmatch(text):
        return text
    quoted = shlex.quote(text)
    # $'...' for hidden characters, and for a backslash before a closing quote, which
    # shellcheck takes for a mistaken escape (SC1003).
    if any(is_hidden(ch) for ch in text) or "\\'" in quoted:
        return ansi_c_quote(text)
    return quoted


_ANSI_C_NAMED = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def ansi_c_quote(text: str) -> str:
    """`$'...'`: hidden characters as \\xHH escapes of their UTF-8 bytes, so the script
    text stays visible and bash reads back the exact bytes in any locale."""
    out = []
    for ch in _check(text):
        if ch in _ANSI_C_NAMED:
            out.append(_ANSI_C_NAMED[ch])
        elif is_hidden(ch):
            out.append("".join(f"\\x{b:02x}" for b in ch.encode("utf-8")))
        else:
            out.append(ch)
    return "$'" + "".join(out) + "'"


def join(words: Iterable[object]) -> str:
    return " ".join(quote(w) for w in words)


def expandable(value: object) -> str:
    """A shell word in which only `$NAME` / `${NAME}` references expand; `$$` is `$`."""
    text = _check(str(value))
    parts: list[str] = []      # adjacent pieces of one word
    double: list[str] = []     # the body of the double-quoted piece being built

    def literal(chunk: str) -> None:
        for run_hidden, run in _runs(chunk):
            if run_hidden:
                flush()
                parts.append(ansi_c_quote(run))
            else:
                double.append(_literal_for_double_quotes(run))

    def flush() -> None:
        if double:
            parts.append('"' + "".join(double) + '"')
            double.clear()

    pos = 0
    for match in _ENV_TOKEN.finditer(text):
        literal(text[pos:match.start()])
        token = match.group(0)
        if token == "$$":
            double.append("\\$")
        elif token[1] != "{" and match.end() < len(text) and not text[match.end()].isascii():
            # Braced, so no locale can read the next character as part of the name.
            double.append("${" + token[1:] + "}")
        else:
            double.append(token)
        pos = match.end()
    literal(text[pos:])
    flush()
    return "".join(parts) or '""'


def _runs(text: str) -> list[tuple[bool, str]]:
    """`text` cut into maximal runs of hidden / visible characters."""
    runs: list[tuple[bool, str]] = []
    for ch in text:
        hidden = is_hidden(ch)
        if runs and runs[-1][0] == hidden:
            runs[-1] = (hidden, runs[-1][1] + ch)
        else:
            runs.append((hidden, ch))
    return runs


def _literal_for_double_quotes(text: str) -> str:
    # Inside "...", only $, `, \ and " are special (and ! in interactive shells, not here).
    return re.sub(r'([$`"\\])', r"\\\1", text)


def export(name: str, value: object, *, expand: bool = True) -> str:
    """`export NAME=VALUE`; the name must already be validated by `is_env_name`."""
    if not is_env_name(name):
        raise ShellTextError(f"not an environment variable name: {name!r}")
    return f"export {name}={expandable(value) if expand else quote(value)}"


def prepend_path(name: str, directory: object) -> str:
    """`export NAME=DIRECTORY${NAME:+:$NAME}`: the literal `directory` first on a
    colon-separated search path (PYTHONPATH), what NAME held before after it."""
    if not is_env_name(name):
        raise ShellTextError(f"not an environment variable name: {name!r}")
    return f'export {name}={quote(directory)}"${{{name}:+:${name}}}"'


def is_env_name(name: str) -> bool:
    return bool(_ENV_NAME.fullmatch(name))


# --- #SBATCH lines ---------------------------------------------------------------------
#
# sbatch reads its directives itself (src/sbatch/opt.c, _get_argument), not through a
# shell: arguments are split at unquoted whitespace; '...' and "..." group characters; a
# backslash makes the next character literal, inside quotes too; an unquoted '#' ends the
# line; a line cannot continue onto the next. So a value is written bare when it holds
# none of those characters, else inside "..." with \ and " escaped. Hidden characters
# have no escape there: such values are refused.

_SBATCH_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


def sbatch_value_problem(value: object) -> str | None:
    """Why `value` cannot be an #SBATCH value, or None."""
    text = str(value)
    problem = text_problem(text)
    if problem:
        return problem
    if "\n" in text or "\r" in text:
        return "holds a line break: an #SBATCH directive is one line"
    hidden = hidden_characters(text)
    if hidden:
        return (f"holds {', '.join(hidden)}: an #SBATCH line cannot hold control characters (nor other "
                "invisible ones)")
    return None


def sbatch_quote(value: object) -> str:
    """The value as one argument of an #SBATCH line (see above)."""
    text = str(value)
    problem = sbatch_value_problem(text)
    if problem:
        raise ShellTextError(f"{text!r} {problem}")
    if _SBATCH_SAFE.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sbatch_directive(key: str, value: object = True) -> str:
    """`#SBATCH --key` (value True) or `#SBATCH --key=value`."""
    if not re.fullmatch(r"[a-z][a-z0-9-]*", key):
        raise ShellTextError(f"not an sbatch option name: {key!r}")
    if value is True:
        return f"#SBATCH --{key}"
    return f"#SBATCH --{key}={sbatch_quote(value)}"
