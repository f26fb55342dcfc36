"""A site profile's `login:`: checked as ssh would take it (exit 2 naming the profile and
the key), and carried into the plan."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config.login import Login, login_of
from launcher.config.sites import load_site
from launcher.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SITE = """\
name: far
scheduler: slurm
default_partition: p
partitions: {p: {gpus_per_node: 1}}
runs_root: /scratch/runs
"""


def write_site(tmp_path: Path, login: str) -> Path:
    path = tmp_path / "far.yaml"
    path.write_text(SITE + login + "\n")
    return path


@pytest.mark.parametrize(("login", "key", "said"), [
    ("login: {host: '-oProxyCommand=x'}", "login.host", "starts with '-'"),
    ("login: {host: 'a b'}", "login.host", "whitespace"),
    ("login: {host: alice@login1}", "login.host", "login.user"),
    ("login: {port: 22}", "login.host", "required"),
    ("login: {host: h, port: 0}", "login.port", "not in 1..65535"),
    ("login: {host: h, port: 70000}", "login.port", "not in 1..65535"),
    ("login: {host: h, port: ssh}", "login.port", "integer"),
    ("login: {host: h, user: '-l'}", "login.user", "starts with '-'"),
    ("login: {host: h, identity_file: id_rsa}", "login.identity_file", "absolute"),
    ("login: {host: h, jump: 'a,,b'}", "login.jump", "empty hop"),
])
def test_a_bad_login_is_refused_naming_the_profile_and_the_key(tmp_path, login, key, said):
    path = write_site(tmp_path, login)
    with pytest.raises(ConfigError) as caught:
        load_site(str(path), tmp_path, {})
    assert caught.value.key == key and said in caught.value.message
    assert str(path) in str(caught.value.file)


def test_a_bad_login_is_exit_2_from_the_command_line(tmp_path):
    path = write_site(tmp_path, "login: {host: h, port: 70000}")
    done = subprocess.run([sys.executable, "-m", "launcher.cli", "sites", "validate", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "login.port" in done.stdout + done.stderr


def test_a_good_login_is_loaded_whole(tmp_path):
    path = write_site(tmp_path, "login: {host: login1.example.org, user: alice, port: 2200, jump: bastion}")
    site = load_site(str(path), tmp_path, {}).config
    assert login_of(site.login) == Login("login1.example.org", "alice", 2200, None, "bastion")


def test_the_submission_goes_through_the_login_only_where_slurm_does_not_answer(tmp_path, monkeypatch,
                                                                                 isolated_env):
    """The profile's login reaches the submission's road (a dry run opens no connection);
    where sbatch is on PATH, the road is direct."""
    from launcher.runner import submission
    from launcher.runner.direct import DIRECT
    from launcher.runner.submission_road import SubmittedOverSSH

    write_site(tmp_path, "login: {host: login1}")
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "exp.yaml").write_text("name: e\nentrypoint: {script: train.py}\nrequeue: {max: 0}\n")
    monkeypatch.chdir(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").symlink_to("/usr/bin/git")
    monkeypatch.setenv("PATH", str(bin_dir))
    prepared = submission.prepare("exp.yaml", site="./far.yaml", dry_run=True)
    assert isinstance(prepared.road, SubmittedOverSSH)
    assert prepared.road.login == Login("login1") and prepared.road.conn is None
    (bin_dir / "sbatch").symlink_to("/bin/true")
    direct = submission.prepare("exp.yaml", site="./far.yaml", dry_run=True)
    assert direct.road is DIRECT
