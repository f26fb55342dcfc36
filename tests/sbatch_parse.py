"""How sbatch reads an #SBATCH line: the rules of `_get_argument` in Slurm's
src/sbatch/opt.c, for tests that check what sbatch reads back without a cluster.

Arguments are split at unquoted whitespace; '...' or "..." group characters; a
backslash makes the next character literal, inside quotes too; an unquoted '#' ends the
line; an unmatched quote is a fatal error.
"""

from __future__ import annotations


class SbatchParseError(ValueError):
    pass


def directive_arguments(line: str) -> list[str]:
    """The arguments sbatch takes from one `#SBATCH ...` line."""
    if not line.startswith("#SBATCH"):
        raise SbatchParseError(f"not an #SBATCH line: {line!r}")
    if "\n" in line:
        raise SbatchParseError("a directive is one line")
    rest = line[len("#SBATCH"):]
    args = []
    while True:
        arg, rest = _argument(rest)
        if arg is None:
            return args
        args.append(arg)


def _argument(text: str) -> tuple[str | None, str]:
    i = 0
    while i < len(text) and text[i] in " \t\v\f\r":
        i += 1
    if i < len(text) and text[i] == ":":
        raise SbatchParseError("Unexpected `:`")
    if i == len(text):
        return None, ""
    out: list[str] = []
    quote = None
    escape = False
    while i < len(text) and (quote or text[i] not in " \t\v\f\r") and text[i] != "\n":
        ch = text[i]
        if escape:
            escape = False
        elif ch == "\\":
            escape = True
            i += 1
            continue
        elif quote:
            if ch == quote:
                quote = None
                i += 1
                continue
        elif ch in "\"'":
            quote = ch
            i += 1
            continue
        elif ch == "#":
            break
        out.append(ch)
        i += 1
    if quote:
        raise SbatchParseError(f"Unmatched `{quote}`")
    if not out:     # nothing copied (an unquoted '#', or only quotes): no more arguments
        return None, ""
    return "".join(out), text[i:]


def read_directives(script: str) -> list[str]:
    """Every argument sbatch takes from a script's leading #SBATCH lines."""
    args: list[str] = []
    for line in script.split("\n")[1:]:
        if line.startswith("#SBATCH"):
            args += directive_arguments(line)
        elif line.strip() and not line.lstrip().startswith("#"):
            break
    return args
