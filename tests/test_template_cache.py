"""Compiled templates cached between runs (launcher.rendering.render): a template edited
since is compiled again, a cache that cannot be made, read or written never stops a
render, and a command that fails writes no cache. Real jinja2, real files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jinja2

from launcher.rendering.render import TemplateCache, make_environment, template_cache_dir

REPO = Path(__file__).resolve().parent.parent


def _render(templates: Path, cache: str | None, **values) -> str:
    """A fresh environment, as a new glaunch process has, that saves what it compiled."""
    env = make_environment(jinja2.FileSystemLoader(str(templates)), cache)
    text = env.get_template("t.j2").render(**values)
    if env.bytecode_cache is not None:
        env.bytecode_cache.save()
    return text


def test_a_changed_template_is_compiled_again(tmp_path):
    templates, cache = tmp_path / "templates", tmp_path / "cache"
    templates.mkdir()
    cache.mkdir()
    (templates / "t.j2").write_text("one {{ x }}\n")
    assert _render(templates, str(cache), x=1) == "one 1\n"
    assert len(list(cache.iterdir())) == 1
    assert _render(templates, str(cache), x=2) == "one 2\n"
    (templates / "t.j2").write_text("two {{ x }}\n")
    assert _render(templates, str(cache), x=3) == "two 3\n"


def test_a_damaged_cache_file_is_a_miss(tmp_path):
    templates, cache = tmp_path / "templates", tmp_path / "cache"
    templates.mkdir()
    cache.mkdir()
    (templates / "t.j2").write_text("{{ x }}!\n")
    _render(templates, str(cache), x=0)
    (entry,) = cache.iterdir()
    for damage in (entry.read_bytes()[:40], b"j2" + b"\x80\x02garbage", b""):
        entry.write_bytes(damage)
        assert _render(templates, str(cache), x=1) == "1!\n"


def test_a_cache_that_cannot_be_written_is_no_cache(tmp_path):
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "t.j2").write_text("{{ x }}\n")
    blocker = tmp_path / "file"
    blocker.write_text("")
    for unusable in (blocker / "below", blocker):
        assert _render(templates, str(unusable), x=5) == "5\n"
        assert _render(templates, str(unusable), x=6) == "6\n"
    assert blocker.read_text() == ""


def _plant(templates: Path, folder: Path) -> None:
    """Compiled code for t.j2 that prints PLANTED, filed where a cache in `folder` looks."""
    env = make_environment(jinja2.FileSystemLoader(str(templates)), str(folder))
    cache = env.bytecode_cache
    source, filename, _ = env.loader.get_source(env, "t.j2")
    bucket = jinja2.bccache.Bucket(env, cache.get_cache_key("t.j2", filename), cache.get_source_checksum(source))
    bucket.code = env.compile("PLANTED {{ x }}\n", "t.j2", filename)
    folder.mkdir(parents=True, exist_ok=True)
    with open(cache._get_cache_filename(bucket), "wb") as f:
        bucket.write_bytecode(f)


def test_the_cache_folder_is_the_users_own(tmp_path):
    assert template_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == str(tmp_path / "glaunch" / "templates")
    assert template_cache_dir({"XDG_CACHE_HOME": "relative"}).endswith("/.cache/glaunch/templates")
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "t.j2").write_text("{{ x }}\n")
    own = tmp_path / "own" / "glaunch"
    assert _render(templates, str(own), x=1) == "1\n"
    assert own.stat().st_mode & 0o777 == 0o700 and len(list(own.iterdir())) == 1
    _plant(templates, own)
    assert _render(templates, str(own), x=1) == "PLANTED 1\n"      # the cache is read...
    shared = tmp_path / "shared"
    _plant(templates, shared)
    os.chmod(shared, 0o777)
    assert not TemplateCache(str(shared), "%s.cache").usable(create=True)
    assert _render(templates, str(shared), x=2) == "2\n"           # ...but not one others may write to
    assert len(list(shared.iterdir())) == 1


def _dry_run(tmp_path: Path, runs: str, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), GLAUNCH_STATE_DIR=str(tmp_path / "state"))
    return subprocess.run([sys.executable, "-m", "launcher.cli", "submit", "examples/torch_ddp.yaml", "--dry-run",
                           "--runs-dir", runs, *extra], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_dry_run_fills_the_cache_and_renders_the_same_from_it(tmp_path):
    outputs = []
    for n in range(2):
        proc = _dry_run(tmp_path, str(tmp_path / f"runs{n}"))
        assert proc.returncode == 0, proc.stderr
        (run_dir,) = (tmp_path / f"runs{n}").iterdir()
        outputs.append([(run_dir / name).read_text().replace(run_dir.name, "RUN").replace(f"runs{n}", "RUNS")
                        for name in ("job.sbatch", "env.sh")])
    assert outputs[0] == outputs[1]
    assert len(list((tmp_path / "cache" / "glaunch" / "templates").iterdir())) >= 4


def test_a_submit_that_fails_after_rendering_writes_no_cache(tmp_path):
    """The runs directory cannot be made (a file is in the way): refused after the files
    were rendered, and nothing is written, the template cache included."""
    (tmp_path / "blocker").write_text("")
    proc = _dry_run(tmp_path, str(tmp_path / "blocker" / "runs"))
    assert proc.returncode == 2, proc.stderr
    assert not (tmp_path / "cache").exists()


def test_a_rendered_run_dir_the_file_system_refuses_is_not_written(tmp_path, monkeypatch):
    """The exit hook asks whether a rendered run dir got its run.json; a name too long
    for the file system is an answer (no), never an error at exit."""
    from launcher.rendering import render

    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "t.j2").write_text("{{ x }}\n")
    cache = tmp_path / "cache"
    env = make_environment(jinja2.FileSystemLoader(str(templates)), str(cache))
    env.get_template("t.j2").render(x=1)
    monkeypatch.setattr(render, "_RENDERED", [str(tmp_path / ("x" * 3000) / "run")])
    render._save_if_written(env.bytecode_cache)
    assert not cache.exists()
    monkeypatch.setattr(render, "_RENDERED", [str(tmp_path / "run")])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{}")
    render._save_if_written(env.bytecode_cache)
    assert len(list(cache.iterdir())) == 1
