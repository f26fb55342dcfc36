"""The text of `glaunch sites list|show|validate`."""

from __future__ import annotations

import json
from typing import Any, Mapping

from launcher.views.text import printable


def format_sites(found: Mapping[str, Any]) -> str:
    """The profiles found (launcher.api.sites()): each name and its file, then those a
    profile earlier on the search path shadows."""
    lines = [f"{name:28s} {path}" for name, path in sorted(found["sites"].items())]
    lines += [f"{name:28s} {path} (shadowed)" for name, path in found["shadowed"]]
    return "\n".join(lines) or "no site profiles found"


def format_site(shown: Mapping[str, Any]) -> str:
    """One profile resolved (launcher.api.sites(SITE)): every key's value and the file it
    came from."""
    lines = [f"site {shown['site']}: {shown['file']}", "extends chain: " + " -> ".join(shown["chain"])]
    rows = shown["values"]
    width = max(len(r["key"]) for r in rows)
    lines += [printable(f"  {r['key']:{width}s} = {json.dumps(r['value'])}    # {r['from']}") for r in rows]
    return "\n".join(lines)


def format_check(report: Any) -> str:
    """What `glaunch sites check` prints (a CheckReport): a line each, every character the
    cluster named escaped, line breaks too."""
    return "\n".join(printable(line) for line in report.lines())


def validated(item: Any, path: Any) -> str:
    return f"ok    {printable(item)} ({printable(path)})"


def invalid(item: Any, error: Exception) -> str:
    return f"error {printable(item)}: {printable(error, lines=True)}"
