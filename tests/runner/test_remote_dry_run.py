"""A dry run of a profile with `login:`, from a machine without Slurm: it shows the paths
the cluster will get (the cluster account's home and name as $HOME and $USER, since it
asks the cluster nothing), runs from the code snapshot there, and writes nothing outside
glaunch's own record folder: not under this machine's home, not at the stand-ins' paths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.runner import remote

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def laptop(tmp_path, isolated_env):
    """PATH without Slurm's commands or ssh: a dry run needs neither."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").symlink_to("/usr/bin/git")
    env = {k: v for k, v in isolated_env.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env.update(PATH=str(bin_dir), PYTHONPATH=str(REPO))
    return env


def glaunch(env, *args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def every_text(folder: Path) -> str:
    """What glaunch wrote (the code snapshot, its patch and the carried lib/ are copies of source)."""
    return "\n".join(p.read_text(errors="replace") for p in folder.rglob("*")
                     if p.is_file() and not {"code", "lib", "code.patch"} & set(p.relative_to(folder).parts))


def nothing_at_the_stand_ins(env) -> None:
    assert not Path(remote.SHOWN_HOME).exists()
    assert not (Path(env["HOME"]) / "glaunch-remote-runs").exists()
    assert not (Path(env["GLAUNCH_STATE_DIR"]) / "ssh").exists()      # no connection was opened


def test_a_dry_run_over_ssh_shows_the_cluster_s_paths_and_contacts_nothing(laptop):
    done = glaunch(laptop, "submit", "examples/torch_ddp.yaml", "--site", "local-slurm-remote", "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    run_id = info["run_id"]
    cluster_dir = f"$HOME/glaunch-remote-runs/{run_id}"
    assert info["cluster"] == {"host": "glaunch-login", "run_dir": cluster_dir}
    rendered = Path(info["run_dir"])
    assert rendered.parent == Path(laptop["GLAUNCH_STATE_DIR"]) / "remote-runs"
    script = (rendered / "job.sbatch").read_text()
    assert f"#SBATCH --output={cluster_dir}/logs/%j_batch.log" in script
    # Over SSH the ranks run from the code snapshot on the cluster, not this machine's folder.
    assert f"#SBATCH --chdir={cluster_dir}/code" in script
    assert f"source {cluster_dir}/env.sh" in script
    assert remote.SHOWN_HOME not in every_text(rendered) and remote.SHOWN_USER not in every_text(rendered)
    nothing_at_the_stand_ins(laptop)
    text = glaunch(laptop, "submit", "examples/torch_ddp.yaml", "--site", "local-slurm-remote", "--dry-run")
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("run directory on glaunch-login: $HOME/glaunch-remote-runs/"), text.stdout[:300]


def test_a_dry_run_over_ssh_names_the_profile_s_user_and_shows_an_unknown_one_as_USER(laptop, tmp_path):
    work = tmp_path / "work"
    (work / "site_configs").mkdir(parents=True)
    (work / "site_configs" / "named.yaml").write_text(
        "name: named\nextends: local-slurm-remote\nlogin:\n  host: glaunch-login\n  user: alice\n"
        "runs_root: /scratch/$USER/runs\n")
    (work / "site_configs" / "unnamed.yaml").write_text(
        "name: unnamed\nextends: local-slurm-remote\nruns_root: /scratch/$USER/runs\n")
    (work / "train.py").write_text("print('hi')\n")
    (work / "exp.yaml").write_text("name: t\nentrypoint:\n  script: train.py\n")
    for site, user in (("named", "alice"), ("unnamed", "$USER")):
        done = glaunch(laptop, "submit", "exp.yaml", "--site", site, "--dry-run", "--json", cwd=work)
        assert done.returncode == 0, done.stderr
        info = json.loads(done.stdout)
        assert info["cluster"]["run_dir"] == f"/scratch/{user}/runs/{info['run_id']}"
    nothing_at_the_stand_ins(laptop)
    assert not Path("/scratch/alice").exists()


def test_a_sweep_s_dry_run_over_ssh_shows_the_cluster_s_paths(laptop):
    done = glaunch(laptop, "submit", "examples/torch_ddp.yaml", "--site", "local-slurm-remote", "--dry-run",
                   "--json", "--sweep", "hparams.lr=0.1,0.2")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    sweep_dir = Path(info["sweep_dir"])
    assert sweep_dir.parent == Path(laptop["GLAUNCH_STATE_DIR"]) / "remote-runs"
    array = (sweep_dir / "array-0.sbatch").read_text()
    assert f"[0]=$HOME/glaunch-remote-runs/{info['sweep_id']}/{info['sweep_id']}-0" in array
    assert remote.SHOWN_HOME not in every_text(sweep_dir)
    nothing_at_the_stand_ins(laptop)
