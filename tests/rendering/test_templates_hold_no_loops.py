"""The shell glaunch writes starts things; the job controller (launcher.jobcontrol.controller)
decides. No template holds a loop or a case block, in the shell it renders or in Jinja, and
neither does any rendered script of the golden bundles."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from launcher.rendering.render import TEMPLATES

GOLDEN = Path(__file__).parent.parent / "golden"
# A compound command of the shell where a command starts: the line's start, after ; & | or
# after then, do, else.
SHELL_LOOP = re.compile(r"(?:^|[;&|(]\s*|\b(?:then|do|else)\s+)(while|until|for|select|case)\b")
JINJA_LOOP = re.compile(r"\{%-?\s*(for|while)\b")


def loops(text: str) -> list[str]:
    """The lines of `text` that hold a loop or a case block (comments left out)."""
    found = []
    for line in text.splitlines():
        code = re.sub(r"(^|\s)#.*$", "", line).strip()
        if SHELL_LOOP.search(code) or JINJA_LOOP.search(line):
            found.append(line)
    return found


@pytest.mark.parametrize("path", sorted(TEMPLATES.glob("*.j2")), ids=lambda p: p.name)
def test_no_template_holds_a_loop_or_a_case(path):
    assert loops(path.read_text()) == []


@pytest.mark.parametrize("path", sorted([*GOLDEN.glob("*.sbatch"), *GOLDEN.glob("*.sh")]), ids=lambda p: p.name)
def test_no_rendered_script_holds_a_loop_or_a_case(path):
    assert loops(path.read_text()) == []


@pytest.mark.parametrize("line", ["while true; do", "for name in a b; do", 'case "$x" in', "x=1; for a in b; do :; done",
                                  "if true; then while :; do :; done; fi", "{% for line in directives %}"])
def test_a_loop_is_found(line):
    assert loops(line) == [line]


@pytest.mark.parametrize("line", ["# the watchdog, for the batch log", "exec python -m x --for-each", "echo before"])
def test_prose_and_words_are_no_loop(line):
    assert loops(line) == []
