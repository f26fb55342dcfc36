"""A run's road is read from its record here and checked against run.json's transport: a
copy of a cluster's record that lost its remote.json, or a record of this machine's run that
gained one, is refused (exit 1, naming run.json and the key) and never followed on the
wrong road, where a job id of one cluster names another's job. A run submitted on a login
node that an older glaunch recorded as `ssh://` (its record is its own directory) is
followed as before."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.runner.road import transport_mismatch

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("recorded, over_ssh, elsewhere, refused", [
    (None, False, False, None), (None, True, True, None),                       # older records: remote.json decides
    ("local", False, False, None), ("ssh://u@login", True, True, None),
    ("ssh://u@login", False, True, "submitted over SSH (ssh://u@login), but its record here has no remote.json"),
    ("ssh://u@login", False, False, None),        # a login node's own run, labelled by an older glaunch
    ("local", True, True, "commands ran here (transport local), but its record here holds remote.json"),
    ("local", True, False, "commands ran here (transport local), but its record here holds remote.json"),
])
def test_the_transport_recorded_and_the_record_here_must_agree(recorded, over_ssh, elsewhere, refused):
    problem = transport_mismatch(recorded, over_ssh, elsewhere=elsewhere)
    assert (problem is None) if refused is None else (refused in (problem or ""))


def glaunch(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def run_dir(tmp_path, isolated_env) -> Path:
    made = glaunch("submit", "examples/torch_ddp.yaml", "--dry-run", "--runs-dir", str(tmp_path / "runs"),
                   env=isolated_env)
    assert made.returncode == 0, made.stderr
    return next((tmp_path / "runs").iterdir())


def edit_record(folder: Path, **values) -> None:
    path = folder / "run.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))


def test_a_record_that_lost_its_remote_json_is_refused(run_dir, isolated_env):
    edit_record(run_dir, transport="ssh://u@login", run_dir="/cluster/runs/" + run_dir.name)
    for command in (("status", str(run_dir)), ("cancel", str(run_dir)), ("logs", str(run_dir))):
        done = glaunch(*command, env=isolated_env)
        assert done.returncode == 1, (command, done.stdout, done.stderr)
        assert f"{run_dir / 'run.json'}: transport: the run was submitted over SSH (ssh://u@login)" in done.stderr
        assert "Traceback" not in done.stderr


def test_a_record_of_this_machine_s_run_that_gained_a_remote_json_is_refused(run_dir, isolated_env):
    (run_dir / "remote.json").write_text(json.dumps({"login": {"host": "login"}, "run_dir": "/cluster/x"}))
    done = glaunch("status", str(run_dir), env=isolated_env)
    assert done.returncode == 1 and "transport: the run's commands ran here (transport local)" in done.stderr


def test_a_login_node_s_run_an_older_glaunch_recorded_as_ssh_is_followed_as_before(run_dir, isolated_env):
    edit_record(run_dir, transport="ssh://u@login")
    done = glaunch("status", str(run_dir), "--json", env=isolated_env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"] == "RENDERED"


def test_list_shows_a_record_whose_road_cannot_be_chosen_as_a_row_with_its_error(run_dir, isolated_env):
    edit_record(run_dir, state="RUNNING", transport="ssh://u@login", run_dir="/cluster/runs/" + run_dir.name)
    done = glaunch("list", "--json", env=isolated_env)
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["runs"]
    assert "transport: the run was submitted over SSH" in row["error"], row
