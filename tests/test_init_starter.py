"""`glaunch init [DIR]`: the starter experiment it writes renders on every shipped site,
and it never writes over a file (exit 2, naming it, nothing written). The starter run to
its end from an installed wheel is tests/test_installed_wheel.py's."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import api, schedulers
from launcher.config import load, sites
from launcher.errors import ConfigError
from launcher.resolution.jobplan import SubmitContext
from launcher.resolution.resolve import resolve

REPO = Path(__file__).resolve().parents[1]
STARTER = REPO / "starter"
SLURM_SITES = sorted(p.stem for p in sites.SHIPPED_SITES.glob("*.yaml") if p.stem not in ("base-slurm", "local"))


def glaunch(*args, cwd, env):
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=cwd, env=dict(env, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=120)


def test_init_writes_the_starter_and_says_how_to_run_it(tmp_path, isolated_env):
    proc = glaunch("init", "new/exp dir", cwd=tmp_path, env=isolated_env)
    assert proc.returncode == 0, proc.stderr
    folder = tmp_path / "new" / "exp dir"
    assert sorted(p.name for p in folder.iterdir()) == ["exp.yaml", "train.py"]
    for name in ("exp.yaml", "train.py"):
        assert (folder / name).read_bytes() == (STARTER / name).read_bytes()
    assert "cd 'new/exp dir' && glaunch submit exp.yaml" in proc.stdout
    here = glaunch("init", cwd=folder.parent, env=isolated_env)
    assert here.returncode == 0 and "cd " not in here.stdout, here.stderr
    assert (folder.parent / "exp.yaml").is_file()


@pytest.mark.parametrize("existing", ["exp.yaml", "train.py"])
def test_init_writes_over_no_file_and_then_writes_nothing(tmp_path, isolated_env, existing):
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / existing).write_text("mine\n")
    proc = glaunch("init", str(folder), cwd=tmp_path, env=isolated_env)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert str(folder / existing) in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert [p.name for p in folder.iterdir()] == [existing]
    assert (folder / existing).read_text() == "mine\n"


def test_init_takes_a_dangling_link_for_a_file_and_refuses_a_dir_that_is_a_file(tmp_path):
    (tmp_path / "exp.yaml").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError) as caught:
        api.init(tmp_path)
    assert caught.value.exit_code == 2 and caught.value.file == str(tmp_path / "exp.yaml")
    assert not (tmp_path / "nowhere").exists() and not (tmp_path / "train.py").exists()
    (tmp_path / "plain").write_text("")
    with pytest.raises(ConfigError, match="not a folder"):
        api.init(tmp_path / "plain")


def _render(site: str) -> dict[str, str]:
    environ = {"HOME": "/home/alice", "USER": "alice", "SCRATCH": "/scratch/alice", "WORK": "/work/alice",
               "SCRATCHDIR": "/scratchdir/alice", "PROJECT": "/project/p1"}
    exp = load.load_experiment(STARTER / "exp.yaml")
    exp = dataclasses.replace(exp, path=Path("/home/alice/starter/exp.yaml"))
    ctx = SubmitContext(cwd="/home/alice/starter", python="/usr/bin/python3", environ=environ,
                        run_id="starter-20260101-000000-abcd")
    plan = resolve(exp, sites.load_site(site, Path("/nonexistent"), environ), ctx)
    return schedulers.get(plan.scheduler).render(plan)


@pytest.mark.parametrize("site", ["local", *SLURM_SITES])
def test_the_starter_renders_on_every_shipped_site_as_written(site):
    files = _render(site)
    assert "train.py" in files["job.sbatch"] + files["task.json"]
    if site != "local":
        assert "#SBATCH --nodes=1" in files["job.sbatch"] and "#SBATCH --time=00:10:00" in files["job.sbatch"]


def test_the_starter_is_what_the_package_ships():
    """pyproject ships starter/ as launcher/starter, and api.init writes exactly its files."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert project["package-dir"]["launcher.starter"] == "starter" and "launcher.starter" in project["packages"]
    assert sorted(p.name for p in STARTER.iterdir() if p.name != "__pycache__") == sorted(api.STARTER_FILES)
