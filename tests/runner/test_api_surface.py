"""What `help(launcher.api)` and pydoc show of the run commands: each with its signature
and its own docstring; and a run started here without `echo` printing nothing."""

from __future__ import annotations

import pydoc
import re

import pytest

from launcher import api

RUN_COMMANDS = ("status", "wait", "cancel", "logs", "resume", "detect_site")


@pytest.mark.parametrize("name", RUN_COMMANDS)
def test_pydoc_shows_each_run_command_with_its_signature_and_docstring(name):
    text = pydoc.render_doc(api, renderer=pydoc.plaintext)
    functions = text[text.index("FUNCTIONS"):]
    m = re.search(rf"^    {name}\((?P<params>[^\n]*)\) -> [^\n]+\n(?P<doc>(?:        [^\n]*\n)+)", functions, re.M)
    assert m, f"help(launcher.api) does not show {name}"
    assert m["params"].startswith(("run: 'RunRef'", "name: 'str | None'"))
    first_line = (getattr(api, name).__doc__ or "").strip().splitlines()[0]
    assert first_line and first_line in m["doc"]


def test_a_local_submit_without_echo_prints_nothing(tmp_path, isolated_env, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("print('hello from rank 0', flush=True)\n")
    (tmp_path / "exp.yaml").write_text("name: quiet\nentrypoint: {script: t.py}\n"
                                       "resources: {nodes: 1, gpus_per_node: 0, time: '5'}\n")
    run = api.submit("exp.yaml", runs_dir=str(tmp_path / "runs"), echo=None)
    assert run.state == "COMPLETED"
    assert capfd.readouterr() == ("", "")
