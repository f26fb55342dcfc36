"""The text of `glaunch sites list|show|validate`."""

from __future__ import annotations

import json
from typing import Any, Mapping

from launcher.views.text import printable


# What put a folder on the search path (launcher.config.sites.SOURCE_*), as users spell it.
SOURCES = {"site_configs": "./site_configs/", "GLAUNCH_SITE_PATH": "$GLAUNCH_SITE_PATH",
           "user": "~/.config/glaunch/sites", "shipped": "shipped with glaunch"}


def format_sites(found: Mapping[str, Any]) -> str:
    """The profiles found (launcher.api.sites()): the search path, then each name with the
    file it finds and where that comes from, and under it the files it shadows."""
    p = printable
    folders = found.get("search_path") or []
    width = max((len(SOURCES.get(f["source"], f["source"])) for f in folders), default=0)
    lines = ["search path (the first file of a name wins):"]
    lines += [f"  {i}. {SOURCES.get(f['source'], f['source']):{width}s}  {p(f['folder'])}"
              + ("" if f["exists"] else " (not there)") for i, f in enumerate(folders, 1)]
    lines.append("")
    for profile in found["profiles"]:
        lines.append(f"{p(profile['name']):28s} {p(profile['path'])}  ({SOURCES.get(profile['source'], '?')})")
        lines += [f"  {'shadows':26s} {p(s['path'])}  ({SOURCES.get(s['source'], '?')})" for s in profile["shadows"]]
    if not found["profiles"]:
        lines.append("no site profiles found")
    return "\n".join(lines)


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
