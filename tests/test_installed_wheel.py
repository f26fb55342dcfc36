"""glaunch as a user installs it: the wheel built from this checkout, installed (not
editable) into a fresh virtual environment, used from an empty folder with no checkout in
sight. The shipped profiles, the templates, the starter (`glaunch init`) and the in-job
runtime must all come from the installed package.

The README's three paths are tried the same way: on a login node (the starter rendered for
a shipped Slurm profile), from a laptop (rendered for the shipped profile that submits
through the local login node, `--dry-run`, which contacts nothing; and, where the local
cluster and login node run, submitted through it to COMPLETED) and with your own
script (the README's plain torchrun script and its exp.yaml, run as written to COMPLETED
on the local site, then resumed through `entrypoint.resume_args`).

One test per stage (the live laptop path runs with the Slurm tests), so that the wheel is
built and installed once per stage: about 30 s on 16 cores, 60 to 90 s on 2 (the build, the
environment, three local runs to their end)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
# Folders of the checkout that the wheel carries inside the package (pyproject's package-dir).
DATA_DIRS = PROJECT["tool"]["setuptools"]["package-dir"]

pytestmark = pytest.mark.slow


def run(*args, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"{proc.args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def source_tree(dest: Path) -> Path:
    """What a build of this checkout reads, copied aside: the build writes its own build/ and
    egg-info beside the sources, and a build/ left in the checkout would feed files
    removed since into the next wheel."""
    names = {"pyproject.toml", PROJECT["project"]["readme"], *PROJECT["project"]["license-files"], "launcher",
             *DATA_DIRS.values()}
    for name in names:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    return dest


def clean_env(tmp_path: Path, venv: Path) -> dict[str, str]:
    """No checkout on the path, HOME and the run index in tmp, no Slurm or glaunch settings
    from the shell that runs the tests."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH", "VIRTUAL_ENV")
           and not k.startswith(("GLAUNCH_", "SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
    env.update(HOME=str(tmp_path / "home"), GLAUNCH_STATE_DIR=str(tmp_path / "state"),
               PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", PYTHONDONTWRITEBYTECODE="1")
    (tmp_path / "home").mkdir(exist_ok=True)
    return env


def check_wheel(wheel: Path) -> None:
    """Every profile, template and starter file inside the package; the license and the
    metadata in dist-info."""
    names = set(zipfile.ZipFile(wheel).namelist())
    for package, folder in DATA_DIRS.items():
        shipped = sorted(p.name for p in (REPO / folder).iterdir() if p.is_file())
        assert shipped, folder
        inside = package.replace(".", "/")
        missing = [name for name in shipped if f"{inside}/{name}" not in names]
        assert not missing, f"the wheel lacks {folder}/{missing}"
    info = next(n for n in names if n.endswith(".dist-info/METADATA")).rsplit("/", 1)[0]
    assert f"{info}/licenses/LICENSE" in names
    metadata = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    for field in ("License-Expression: MIT", "Requires-Python: >=3.10", "License-File: LICENSE",
                  "Classifier: ", "Description-Content-Type: text/markdown"):
        assert field in metadata, field


def readme_blocks(heading: str) -> dict[str, str]:
    """The first fenced block of each language under the README's `heading`."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    blocks: dict[str, str] = {}
    for language, body in re.findall(r"^```(\w+)\n(.*?)^```", text[start:end], re.S | re.M):
        blocks.setdefault(language, body)
    return blocks


def laptop_path(glaunch: Path, starter: Path, tmp_path: Path, env: dict[str, str]) -> None:
    """A profile with `login:` (the local login node's), rendered from a folder without
    Slurm: the run directory is the cluster's (`~` of runs_root shown as $HOME, the cluster
    account's), nothing is contacted and nothing written under this machine's home."""
    no_slurm = tmp_path / "laptop-bin"      # this machine's PATH holds Slurm's commands: a laptop's does not
    no_slurm.mkdir()
    (no_slurm / "git").symlink_to(shutil.which("git") or "/usr/bin/git")
    laptop = dict(env, PATH=f"{glaunch.parent}{os.pathsep}{no_slurm}")
    dry = ok(run(glaunch, "submit", "exp.yaml", "--site", "local-slurm-remote", "--dry-run", "--json",
                 cwd=starter, env=laptop))
    info = json.loads(dry.stdout)
    assert info["cluster"]["run_dir"] == f"$HOME/glaunch-remote-runs/{info['run_id']}", info
    assert not (Path(env["HOME"]) / "glaunch-remote-runs").exists()
    assert not (Path(env["GLAUNCH_STATE_DIR"]) / "ssh").exists()


def own_script_path(glaunch: Path, tmp_path: Path, env: dict[str, str]) -> None:
    """The README's own-script path as written: a plain torchrun script whose outputs go to
    `${run:dir}`, its steps read from its log lines, resumed through `resume_args`."""
    blocks = readme_blocks("## 3. With your own script")
    own = tmp_path / "own"
    own.mkdir()
    (own / "train.py").write_text(blocks["python"], encoding="utf-8")
    (own / "exp.yaml").write_text(blocks["yaml"], encoding="utf-8")
    runs = tmp_path / "own-runs"
    done = run(glaunch, "submit", "exp.yaml", "--runs-dir", runs, "--json", cwd=own, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    info = json.loads(done.stdout)
    assert info["state"] == "COMPLETED", info
    run_dir = Path(info["run_dir"])
    assert (run_dir / "out" / "ckpt.pt").is_file()
    # Its log lines are its progress, so the watchdog watched it (a script without the
    # runtime and without entrypoint.progress is "not watched").
    (start,) = json.loads(ok(run(glaunch, "status", info["run_id"], "--json", cwd=own, env=env)).stdout)["starts"]
    assert start["watchdog"]["state"] == "watching" and start["first_step"] == 1 and start["last_step"] > 1, start
    assert sorted(p.name for p in own.iterdir()) == ["exp.yaml", "train.py"]   # the outputs went into the run

    # A resume with more steps: resume_args make the script load its checkpoint of step 100.
    more = run(glaunch, "resume", info["run_id"], "entrypoint.args=[--out_dir=${run:dir}/out,--steps=120]", "--json",
               cwd=own, env=env)
    assert more.returncode == 0, more.stdout + more.stderr
    assert json.loads(more.stdout)["state"] == "COMPLETED", more.stdout
    steps = re.findall(r"iter (\d+):", ok(run(glaunch, "logs", info["run_id"], cwd=own, env=env)).stdout)
    assert steps == [str(n) for n in range(1, 121)], steps


def install_wheel(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """(the package's __init__.py, the venv's python, the clean environment): the wheel of
    this checkout built and installed into a fresh virtual environment under `tmp_path`."""
    # The wheel: built by this Python's setuptools (no index needed), without dependencies.
    wheels = tmp_path / "wheels"
    ok(run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", wheels,
           source_tree(tmp_path / "src"), cwd=tmp_path, env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")))
    (wheel,) = wheels.glob("glaunch-*.whl")
    check_wheel(wheel)

    # A fresh environment that sees this machine's torch, jinja2, submitit...; glaunch itself
    # only from the wheel: its site-packages comes before the system's, where an editable
    # install of this checkout may be.
    venv = tmp_path / "venv"
    ok(run(sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv, cwd=tmp_path,
           env=dict(os.environ)))
    python = venv / "bin" / "python"
    empty = tmp_path / "empty"
    empty.mkdir()
    env = clean_env(tmp_path, venv)
    ok(run(python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel, cwd=empty,
           env=dict(env, PIP_DISABLE_PIP_VERSION_CHECK="1")))
    where = json.loads(ok(run(python, "-c", "import json, launcher, site; print(json.dumps("
                                                "[launcher.__file__, site.getsitepackages()]))",
                              cwd=empty, env=env)).stdout)
    package, site_packages = Path(where[0]), Path(where[1][0])
    assert package == site_packages / "launcher" / "__init__.py" and venv in package.parents, where
    return package, python, env


def test_the_installed_wheel_works_from_any_folder(tmp_path):
    package, python, env = install_wheel(tmp_path)
    glaunch = python.parent / "glaunch"
    empty = tmp_path / "empty"

    # The shipped profiles, each from the installed package.
    listed = ok(run(glaunch, "sites", "list", "--json", cwd=empty, env=env))
    found = json.loads(listed.stdout)["sites"]
    assert set(found) == {p.stem for p in (REPO / "site_configs").glob("*.yaml")}, found
    assert all(Path(path).parent == package.parent / "site_configs" for path in found.values()), found

    # A copy of the starter, rendered for a shipped Slurm profile: no Slurm asked.
    copy = tmp_path / "copy"
    shutil.copytree(REPO / "starter", copy)
    dry = ok(run(glaunch, "submit", "exp.yaml", "--site", "local-slurm", "--dry-run", "--json",
                 "--runs-dir", tmp_path / "dry", cwd=copy, env=env))
    run_dir = Path(json.loads(dry.stdout)["run_dir"])
    assert "#SBATCH" in (run_dir / "job.sbatch").read_text() and str(python) in (run_dir / "job.sbatch").read_text()

    # From a laptop: the same starter, for the profile that submits through a login node.
    laptop_path(glaunch, copy, tmp_path, env)

    # glaunch init, then the starter as written, on this machine (the local site).
    ok(run(glaunch, "init", cwd=empty, env=env))
    assert sorted(p.name for p in empty.iterdir()) == ["exp.yaml", "train.py"]
    again = run(glaunch, "init", cwd=empty, env=env)
    assert again.returncode == 2 and "exp.yaml" in again.stderr and "Traceback" not in again.stderr, again.stderr
    done = run(glaunch, "submit", "exp.yaml", "--runs-dir", tmp_path / "runs", "--json", cwd=empty, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    info = json.loads(done.stdout)
    assert info["state"] == "COMPLETED", info
    result = json.loads((Path(info["run_dir"]) / "result.json").read_text())
    assert result["final_step"] == 100 and result["world_size"] == 2, result
    assert sorted(p.name for p in empty.iterdir()) == ["exp.yaml", "train.py"]   # nothing written beside them

    # With your own script: the README's, as written.
    own_script_path(glaunch, tmp_path, env)


@pytest.mark.slurm
@pytest.mark.requires_sshd
def test_the_installed_wheel_submits_from_a_laptop_through_the_login_node(tmp_path, laptop):
    """The README's laptop path, for real: from the fresh environment, on a machine without
    Slurm's commands, the starter submitted through the local login node with --wait runs
    to COMPLETED on the cluster, its steps on the console; status and logs from the laptop."""
    package, python, env = install_wheel(tmp_path)
    glaunch = python.parent / "glaunch"
    env.update({k: v for k, v in laptop.items() if k in ("PATH", "GLAUNCH_STATE_DIR", "HOME")})
    env.pop("PYTHONPATH", None)
    starter = tmp_path / "starter"
    shutil.copytree(REPO / "starter", starter)
    runs = tmp_path / "cluster runs"
    runs.mkdir()
    done = run(glaunch, "submit", "exp.yaml", "--site", "local-slurm-remote", "--runs-dir", runs, "--wait",
               cwd=starter, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "COMPLETED" in done.stdout and re.search(r"step \d+/100", done.stdout), done.stdout
    run_id = re.search(r"run (\S+): submitted", done.stdout).group(1)
    status = json.loads(ok(run(glaunch, "status", run_id, "--json", cwd=starter, env=env)).stdout)
    assert status["state"] == "COMPLETED" and status["cluster"]["run_dir"] == str(runs / run_id), status
    assert (runs / run_id / "result.json").is_file()
    assert "Traceback" not in ok(run(glaunch, "logs", run_id, cwd=starter, env=env)).stdout
