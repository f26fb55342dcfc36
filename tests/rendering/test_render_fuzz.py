"""Generated values (hypothesis) in the shell helpers and the rendered contexts: whatever
the text, bash and sbatch's parser read back exactly what was meant, no hidden character
is written raw, and a value a context cannot carry is refused naming its key."""

from __future__ import annotations

import re
import subprocess

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from sbatch_parse import directive_arguments  # noqa: E402
from test_hostile_strings import CONTEXTS, _expand, _hidden, check_rendered, render_case  # noqa: E402

from launcher.errors import ConfigError  # noqa: E402
from launcher import shell  # noqa: E402

# Shell and sbatch metacharacters, separators, hidden characters, and anything else.
SPECIAL = list("$`'\"\\ \n\t\r;|&<>(){}[]*?~#%,:=!-/.") + ["\x1b", "\x07", "\x7f", "\x9b", "\x85", "\u202e",
                                                           "\u200b", "\u2028", "\xa0", "é", "✓", "🚀", "a", "Z", "0",
                                                           "HOME", "$HOME", "$$", "${HOME}", "$(", "`"]
TEXT = st.one_of(
    st.lists(st.sampled_from(SPECIAL), max_size=12).map("".join),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=24),
)
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
BASH_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/h"}


def _bash_words(words: str, cwd) -> list[str]:
    out = subprocess.run(["bash", "-c", f"printf '%s\\0' {words}"], cwd=cwd, capture_output=True, env=BASH_ENV,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1]


@SETTINGS
@given(value=TEXT)
def test_quote_and_expandable_read_back(value, tmp_path):
    # bash sets $_ (the last argument of the previous command) itself: no environment says what it holds.
    assume(not re.search(r"\$(?:_(?![A-Za-z0-9_])|\{_\})", value))
    quoted, expanded = shell.quote(value), shell.expandable(value)
    assert not _hidden(quoted, "") and not _hidden(expanded, "")
    assert _bash_words(f"{quoted} {expanded}", tmp_path) == [value, _expand(value, BASH_ENV)]
    assert not list(tmp_path.iterdir()), "a value ran as a command"


@SETTINGS
@given(value=TEXT)
def test_sbatch_values_read_back_or_are_refused(value):
    problem = shell.sbatch_value_problem(value)
    if problem is None:
        line = shell.sbatch_directive("comment", value)
        assert not _hidden(line, "")
        assert directive_arguments(line) == [f"--comment={value}"]
    else:
        assert _hidden(value, "")


FUZZ_CONTEXTS = ["env", "args", "runs-dir", "checkpoint-dir", "workdir", "mount-pyxis", "mounted-checkpoint",
                 "sbatch-extra", "constraint", "module", "image-pyxis", "python"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(context=st.sampled_from(FUZZ_CONTEXTS), value=TEXT)
def test_rendered_contexts_read_back_or_refuse(context, value, tmp_path_factory):
    assume("${" not in value)        # OmegaConf interpolation: the loader's, tested with it
    root = str(tmp_path_factory.getbasetemp() / "fuzz-render")
    cwd = tmp_path_factory.mktemp("fuzz")
    result = render_case(context, value, root)
    if isinstance(result, ConfigError):
        assert result.key and result.key.startswith(CONTEXTS[context][1]), (result.key, str(result))
        assert not _hidden(str(result))
        return
    plan, files = result
    for name in ("job.sbatch", "env.sh"):
        assert not _hidden(files[name]), name
    check_rendered(context, value, plan, files, cwd)
    assert not list(cwd.rglob("PWNED*")) and not [p for p in cwd.iterdir() if p.name not in
                                                  ("env.sh", "modules.out")]
