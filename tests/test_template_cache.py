"""Compiled templates cached between runs (launcher.rendering.render): a template edited
since is compiled again, and a cache that cannot be made, read or written never stops a
render. Real jinja2, real files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jinja2

from launcher.rendering.render import make_environment, template_cache_dir

REPO = Path(__file__).resolve().parent.parent


def _render(templates: Path, cache: str | None, **values) -> str:
    """A fresh environment, as a new glaunch process has."""
    return make_environment(jinja2.FileSystemLoader(str(templates)), cache).get_template("t.j2").render(**values)


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
    assert _render(templates, str(tmp_path / "no" / "such" / "dir"), x=5) == "5\n"
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert template_cache_dir({"XDG_CACHE_HOME": str(blocker)}) is None


def test_the_cache_folder_is_the_users_own(tmp_path):
    assert template_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == str(tmp_path / "glaunch" / "templates")
    assert (tmp_path / "glaunch" / "templates").stat().st_mode & 0o777 == 0o700
    shared = tmp_path / "shared"
    (shared / "glaunch" / "templates").mkdir(parents=True)
    os.chmod(shared / "glaunch" / "templates", 0o777)        # others could plant code in it
    assert template_cache_dir({"XDG_CACHE_HOME": str(shared)}) is None


def test_a_dry_run_fills_the_cache_and_renders_the_same_from_it(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), GLAUNCH_STATE_DIR=str(tmp_path / "state"))
    outputs = []
    for n in range(2):
        proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", "examples/torch_ddp.yaml", "--dry-run",
                               "--runs-dir", str(tmp_path / f"runs{n}")], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        (run_dir,) = (tmp_path / f"runs{n}").iterdir()
        outputs.append([(run_dir / name).read_text().replace(run_dir.name, "RUN").replace(f"runs{n}", "RUNS")
                        for name in ("job.sbatch", "env.sh")])
    assert outputs[0] == outputs[1]
    assert len(list((tmp_path / "cache" / "glaunch" / "templates").iterdir())) >= 4
