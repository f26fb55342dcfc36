"""The templates' language (launcher.rendering.templating): every template of templates/
renders as Jinja renders it under the settings glaunch used to render with (StrictUndefined,
trim_blocks, lstrip_blocks, keep_trailing_newline); any syntax outside the language, and
any name without a value, is refused; a value is never read as a template."""

from __future__ import annotations

import itertools
import re

import pytest

from launcher.rendering import templating
from launcher.rendering.render import TEMPLATES, template

NAMES = re.compile(r"\{\{\s*(\w+)\s*\}\}|\{%\s*(?:if|include)\s+(\w+)\s*%\}")
INCLUDED = {"launch_template": ("local.launch.sh.j2", "slurm.launch.sh.j2"),
            "rendezvous_template": ("local.rendezvous.sh.j2", "slurm.rendezvous.sh.j2")}
# Values as a run can give them: empty, several lines, shell text, text that looks like a tag.
TEXTS = ("", "one line", "two\nlines\n", "  $(touch /tmp/x) '\"' {{ run_id }} {% if x %}\t")


def _names(file: str) -> set[str]:
    text = (TEMPLATES / file).read_text(encoding="utf-8")
    names = {a or b for a, b in NAMES.findall(text)}
    for name in list(names):
        for included in INCLUDED.get(name, ()):
            names |= _names(included)
    return names


def _cases(file: str):
    """Values for every name `file` uses: each text in turn, each `if` both ways, each include."""
    names = sorted(_names(file))
    includes = [INCLUDED[name] for name in names if name in INCLUDED]
    for text, chosen in itertools.product(TEXTS, itertools.product(*includes) if includes else [()]):
        values: dict[str, object] = {name: text for name in names}
        values.update(zip([n for n in names if n in INCLUDED], chosen))
        values["nodes"] = 3
        yield values


@pytest.mark.parametrize("file", sorted(p.name for p in TEMPLATES.glob("*.j2")))
def test_every_template_renders_as_jinja_renders_it(file):
    import jinja2                                   # the dev extra's: this test never skips
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
                             autoescape=False, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    compared = 0
    for values in _cases(file):
        assert template(file, **values) == env.get_template(file).render(**values), values
        compared += 1
    assert compared >= len(TEXTS)


@pytest.mark.parametrize("text, expected", [
    ("a {{ x }} b\n", "a 1 b\n"),
    ("{% if t %}\nyes\n{% endif %}\nend\n", "yes\nend\n"),
    ("{% if f %}\nno\n{% endif %}\nend\n", "end\n"),
    ("    {% if t %}\n  in\n    {% endif %}\n", "  in\n"),            # blanks before a block tag go
    ("{% if t %}{% if f %}no{% endif %}{{ x }}{% endif %}", "1"),     # blocks nest
    ("x {% include inc %}y", "x [1]\ny"),     # the included file's newline stays
    ("{{ x }}{{x}}{{  x  }}", "111"),
])
def test_the_language(text, expected):
    files = {"main": text, "inc.j2": "[{{ x }}]\n"}

    def load(name):
        return templating.parse(files[name], name)

    values = {"x": 1, "t": True, "f": "", "inc": "inc.j2"}
    assert templating.render(load("main"), values, "main", load) == expected


@pytest.mark.parametrize("text, message", [
    ("{% for a in b %}{% endfor %}", "'{% for a in b %}' is not a tag"),
    ("{% if a %}x{% else %}y{% endif %}", "'{% else %}' is not a tag"),
    ("{% if a %}x", "{% if a %} has no {% endif %}"),
    ("x{% endif %}", "'{% endif %}' closes no {% if %}"),
    ("{{ a.b }}", "'{{ a.b }}' is not a tag"),
    ("{{ a | upper }}", "'{{ a | upper }}' is not a tag"),
    ("{% if %}x{% endif %}", "'{% if %}' is not a tag"),
    ("{%- if a %}x{% endif %}", "'{%- if a %}' is not a tag"),
    ("{% include %}", "'{% include %}' is not a tag"),
    ("a {{ b", "'{{' opens no tag"),
    ("a {% if b", "'{%' opens no tag"),
    ("{# a comment #}", "'{#' opens no tag"),
    ("{{ a }} and {{ b", "'{{' opens no tag"),
])
def test_syntax_outside_the_language_is_refused(text, message):
    with pytest.raises(templating.TemplateError) as caught:
        templating.parse(text, "t.j2")
    assert str(caught.value).startswith("t.j2: ")
    assert message in str(caught.value)


@pytest.mark.parametrize("text, missing", [
    ("{{ x }}", "x"), ("{% if y %}{% endif %}", "y"), ("{% include z %}", "z"),
    ("{% if t %}{{ deep }}{% endif %}", "deep"),
])
def test_a_name_without_a_value_is_refused(text, missing):
    nodes = templating.parse(text, "t.j2")
    with pytest.raises(templating.TemplateError, match=f"t.j2: no value for '{missing}'"):
        templating.render(nodes, {"t": True}, "t.j2", lambda name: ())


def test_a_checkout_s_crlf_renders_as_lf():
    nodes = templating.parse("#!/bin/bash\r\n{% if t %}\r\necho {{ x }}\r\n{% endif %}\r\n", "t.j2")
    assert templating.render(nodes, {"t": True, "x": 1}, "t.j2", lambda name: ()) == "#!/bin/bash\necho 1\n"


def test_a_value_is_never_read_as_a_template():
    nodes = templating.parse("<{{ x }}>", "t.j2")
    assert templating.render(nodes, {"x": "{{ y }}{% if z %}"}, "t.j2", lambda name: ()) == "<{{ y }}{% if z %}>"
