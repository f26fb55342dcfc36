"""Where `glaunch sites detect` writes the profile: where the user's own profiles live
(~/.config/glaunch/sites/, a folder the site search path reads), or where -o says; never
into the profiles shipped with glaunch, whatever the working directory (from a checkout's
root, ./site_configs/ is the shipped folder)."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher import api
from launcher.config import sites
from launcher.config.sites import find_site
from launcher.errors import ConfigError
from launcher.schedulers.cluster import detect
from launcher.schedulers.slurm.client import Client
from test_detect import scontrol_answer


@pytest.fixture
def cluster(monkeypatch, tmp_path, isolated_env):
    """query_cluster reads a one-partition cluster named `tiny` instead of asking scontrol;
    the working directory is a checkout whose ./site_configs/ is the shipped profiles."""
    monkeypatch.setattr(detect, "read_scontrol", lambda client, command: scontrol_answer("tiny"))
    monkeypatch.setattr(Client, "has_command", lambda self, name: False)
    monkeypatch.setattr(detect, "current_user", lambda client: "alice")
    monkeypatch.setattr(detect, "user_groups", lambda client, user: None)
    checkout = tmp_path / "checkout"
    shipped = checkout / "site_configs"
    shipped.mkdir(parents=True)
    (shipped / "local.yaml").write_text("name: local\nscheduler: local\n")
    monkeypatch.setattr(sites, "SHIPPED_SITES", shipped)
    monkeypatch.chdir(checkout)
    return shipped


def user_folder(env) -> Path:
    return Path(env["HOME"]) / ".config" / "glaunch" / "sites"


def test_detect_writes_the_user_s_own_profiles_not_the_shipped_ones(cluster, isolated_env):
    name, text, path = api.detect_site("mine", write_to=True)
    assert path == user_folder(isolated_env) / "mine.yaml" and path.read_text() == text
    assert sorted(p.name for p in cluster.iterdir()) == ["local.yaml"]
    # ... where the name finds it from any working directory.
    assert find_site("mine", Path("/"), isolated_env) == path


def test_glaunch_sites_detect_from_a_checkout_s_root_leaves_the_shipped_profiles_alone(cluster, isolated_env,
                                                                                    monkeypatch, capsys):
    from badinput import run_cli

    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "sites", "detect", "--name", "mine"])
    assert code == 0, err
    written = user_folder(isolated_env) / "mine.yaml"
    assert out == f"wrote {written}; check it with: glaunch sites validate {written}\n"
    assert sorted(p.name for p in cluster.iterdir()) == ["local.yaml"]


@pytest.mark.parametrize("where", ["site_configs/mine.yaml", "site_configs/sub/mine.yaml", "{shipped}/mine.yaml",
                                   "other/../site_configs/mine.yaml"])
def test_an_output_inside_the_shipped_profiles_is_refused(cluster, monkeypatch, capsys, where):
    from badinput import run_cli

    output = where.format(shipped=cluster)
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "sites", "detect", "--name", "mine", "-o", output])
    assert code == 2 and out == "" and "--output" in err and "shipped" in err and "Traceback" not in err
    assert sorted(p.name for p in cluster.rglob("*")) == ["local.yaml"]
    with pytest.raises(ConfigError) as info:
        api.detect_site("mine", write_to=output)
    assert info.value.key == "--output" and info.value.exit_code == 2


def test_an_output_elsewhere_is_written(cluster, tmp_path):
    _, text, path = api.detect_site("mine", write_to=tmp_path / "profiles" / "mine.yaml")
    assert path == tmp_path / "profiles" / "mine.yaml" and path.read_text() == text


def test_without_home_the_default_folder_is_unknown(cluster, monkeypatch):
    monkeypatch.delenv("HOME")
    with pytest.raises(ConfigError, match="-o") as info:
        api.detect_site("mine", write_to=True)
    assert info.value.exit_code == 2
    assert sorted(p.name for p in cluster.iterdir()) == ["local.yaml"]
