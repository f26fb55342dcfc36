"""run.json records each file of the site profile a run was resolved from (the profile and
every file it extends): its path, the SHA-256 of its bytes as read and, in a git work
tree, the commit and whether the file differs from it; `glaunch status` shows them."""

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from launcher import api
from launcher.views.status_text import format_status

BASE = """\
name: base
scheduler: local
default_partition: local
partitions:
  local: {gpus_per_node: 1, max_nodes: 1, max_time: "01:00:00"}
"""
EXPERIMENT = "name: prov\nentrypoint: {script: train.py}\nresources: {nodes: 1, time: '00:10:00'}\n"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org",
                           "-c", "commit.gpgsign=false", *args],
                          check=True, capture_output=True, text=True, timeout=60).stdout.strip()


@pytest.fixture
def team_repo(tmp_path, monkeypatch, isolated_env):
    """A profiles repository (profiles/base.yaml, profiles/team.yaml extending it) with one
    commit, on GLAUNCH_SITE_PATH; the working directory holds exp.yaml and train.py."""
    repo = tmp_path / "profiles-repo"
    folder = repo / "profiles"
    folder.mkdir(parents=True)
    (folder / "base.yaml").write_text(BASE)
    (folder / "team.yaml").write_text("name: team\nextends: base\nenv: {TEAM: '1'}\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "profiles")
    work = tmp_path / "work"
    work.mkdir()
    (work / "exp.yaml").write_text(EXPERIMENT)
    (work / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(work)
    monkeypatch.setenv("GLAUNCH_SITE_PATH", str(folder))
    return repo, folder


def profiles_of(run) -> list[dict]:
    record = json.loads((Path(run.run_dir) / "run.json").read_text())
    return record["provenance"]["profiles"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_run_json_records_each_profile_file_its_hash_and_commit(team_repo):
    repo, folder = team_repo
    head = git(repo, "rev-parse", "HEAD")
    run = api.submit("exp.yaml", site="team", dry_run=True, runs_dir="runs")
    root = str(repo.resolve())
    assert profiles_of(run) == [
        {"path": str(folder / "base.yaml"), "sha256": sha256(folder / "base.yaml"),
         "git": {"root": root, "commit": head, "tracked": True, "modified": False}},
        {"path": str(folder / "team.yaml"), "sha256": sha256(folder / "team.yaml"),
         "git": {"root": root, "commit": head, "tracked": True, "modified": False}}]
    shown = format_status(api.status(run.run_id))
    assert f"  profile: {folder / 'team.yaml'} (sha256 {sha256(folder / 'team.yaml')[:12]}, commit {head[:12]})" \
        in shown.splitlines()


def test_a_changed_profile_shows_as_modified_with_the_hash_of_what_was_read(team_repo):
    repo, folder = team_repo
    head = git(repo, "rev-parse", "HEAD")
    with (folder / "base.yaml").open("a") as f:
        f.write("qos: changed\n")
    run = api.submit("exp.yaml", site="team", dry_run=True, runs_dir="runs")
    base, team = profiles_of(run)
    assert base["sha256"] == sha256(folder / "base.yaml") != hashlib.sha256(BASE.encode()).hexdigest()
    assert (base["git"]["commit"], base["git"]["tracked"], base["git"]["modified"]) == (head, True, True)
    assert team["git"]["modified"] is False
    assert f"  profile: {folder / 'base.yaml'} (sha256 {base['sha256'][:12]}, commit {head[:12]}, modified)" \
        in format_status(api.status(run.run_id)).splitlines()


def test_an_uncommitted_profile_and_one_outside_git(team_repo, tmp_path, monkeypatch):
    repo, folder = team_repo
    head = git(repo, "rev-parse", "HEAD")
    (folder / "mine.yaml").write_text("name: mine\nextends: team\n")
    run = api.submit("exp.yaml", site="mine", dry_run=True, runs_dir="runs")
    mine = profiles_of(run)[-1]
    assert mine["path"] == str(folder / "mine.yaml") and mine["sha256"] == sha256(folder / "mine.yaml")
    assert (mine["git"]["tracked"], mine["git"]["modified"]) == (False, True)
    assert f"  profile: {folder / 'mine.yaml'} (sha256 {mine['sha256'][:12]}, not in commit {head[:12]})" \
        in format_status(api.status(run.run_id)).splitlines()

    # Outside any work tree: no git state, the hash all the same.
    outside = tmp_path / "no-git"
    outside.mkdir()
    (outside / "loose.yaml").write_text("name: loose\nextends: team\n")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    run = api.submit("exp.yaml", site=str(outside / "loose.yaml"), dry_run=True, runs_dir="runs2")
    loose = profiles_of(run)[-1]
    assert loose == {"path": str(outside / "loose.yaml"), "sha256": sha256(outside / "loose.yaml"), "git": None}


def test_each_element_of_a_sweep_records_the_profile(team_repo):
    repo, folder = team_repo
    swept = api.submit("exp.yaml", site="team", dry_run=True, runs_dir="runs", sweep=["hparams.x=1,2"])
    assert len(swept.runs) == 2
    for element in swept.runs:
        record = json.loads((Path(element.run_dir) / "run.json").read_text())
        assert [p["path"] for p in record["provenance"]["profiles"]] == [str(folder / "base.yaml"),
                                                                         str(folder / "team.yaml")]
