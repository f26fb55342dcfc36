"""Profiles shared across teams: `extends` names resolve along the whole search path
(./site_configs/, each $GLAUNCH_SITE_PATH folder, ~/.config/glaunch/sites/, the shipped
profiles), the nearer file of a name winning; a profile extending its own name extends
the one it shadows; cycles across folders are errors naming the chain; and
`glaunch sites list` says where each profile comes from and what it shadows."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config import sites
from launcher.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SLURM_BASE = """\
name: base
scheduler: slurm
default_partition: gpu
partitions:
  gpu: {gpus_per_node: 4, max_nodes: 8}
"""


@pytest.fixture
def layout(tmp_path):
    """A project (cwd with site_configs/), two team folders, a HOME; the environment that
    puts them on the search path."""
    folders = {name: tmp_path / name for name in ("project/site_configs", "team-a", "team-b",
                                                   "home/.config/glaunch/sites")}
    for folder in folders.values():
        folder.mkdir(parents=True)
    environ = {"HOME": str(tmp_path / "home"),
               "GLAUNCH_SITE_PATH": f"{folders['team-a']}:{folders['team-b']}"}
    return tmp_path, folders, environ


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


def load(name, tmp_path, environ):
    return sites.load_site(name, tmp_path / "project", environ)


def test_a_team_profile_extends_a_base_in_another_search_path_folder(layout):
    tmp_path, f, environ = layout
    top = write(f["team-a"], "mycluster", "name: mycluster\nextends: base\naccount: team\n")
    base = write(f["team-b"], "base", SLURM_BASE)
    loaded = load("mycluster", tmp_path, environ)
    assert loaded.chain == (base, top)
    assert loaded.config.account == "team" and loaded.config.partitions["gpu"].gpus_per_node == 4


def test_the_nearer_base_wins_as_the_search_order_says(layout):
    """The team's profile sits in team-a; `base` is in the project, in team-a and in team-b:
    the name means the project's, as `--site base` would, wherever it is written."""
    tmp_path, f, environ = layout
    write(f["team-a"], "mycluster", "name: mycluster\nextends: base\n")
    write(f["team-a"], "base", SLURM_BASE + "account: team-a\n")
    write(f["team-b"], "base", SLURM_BASE + "account: team-b\n")
    project = write(f["project/site_configs"], "base", SLURM_BASE + "account: project\n")
    loaded = load("mycluster", tmp_path, environ)
    assert loaded.chain[0] == project and loaded.config.account == "project"
    # Without the project's, team-a's (its own folder, and earlier than team-b's).
    project.unlink()
    assert load("mycluster", tmp_path, environ).config.account == "team-a"


def test_a_shipped_base_is_found_from_a_team_folder(layout):
    tmp_path, f, environ = layout
    write(f["team-a"], "mycluster", "name: mycluster\nextends: base-slurm\ndefault_partition: gpu\n"
                                    "partitions: {gpu: {gpus_per_node: 8}}\n")
    loaded = load("mycluster", tmp_path, environ)
    assert loaded.chain[0] == sites.SHIPPED_SITES / "base-slurm.yaml"


def test_extending_its_own_name_extends_the_profile_it_shadows(layout):
    """./site_configs/mycluster.yaml with `extends: mycluster` adjusts the team's mycluster
    (the next of that name on the search path), never itself."""
    tmp_path, f, environ = layout
    team = write(f["team-a"], "mycluster", SLURM_BASE.replace("name: base", "name: mycluster") + "account: team\n")
    mine = write(f["project/site_configs"], "mycluster", "name: mycluster\nextends: mycluster\nqos: high\n")
    loaded = load("mycluster", tmp_path, environ)
    assert loaded.chain == (team, mine)
    assert (loaded.config.account, loaded.config.qos) == ("team", "high")


def test_own_name_skips_every_folder_up_to_its_own(layout):
    """A chain of same-named overlays, each extending the next folder's: project -> team-b
    -> ~/.config -> shipped. team-a has none; what comes before a folder is never reached
    from it (no loop back to the project's)."""
    tmp_path, f, environ = layout
    shipped = sites.SHIPPED_SITES / "base-slurm.yaml"
    user = write(f["home/.config/glaunch/sites"], "base-slurm",
                 "name: base-slurm\nextends: base-slurm\nqos: user\n")
    team = write(f["team-b"], "base-slurm", "name: base-slurm\nextends: base-slurm\naccount: team\n")
    mine = write(f["project/site_configs"], "base-slurm", "name: base-slurm\nextends: base-slurm\n"
                 "default_partition: gpu\npartitions: {gpu: {gpus_per_node: 2}}\n")
    loaded = load("base-slurm", tmp_path, environ)
    assert loaded.chain == (shipped, user, team, mine)
    assert (loaded.config.qos, loaded.config.account) == ("user", "team")
    # Loaded by its path, the user's extends the shipped one just the same.
    assert sites.load_site(user, tmp_path / "project", environ).chain == (shipped, user)


def test_own_name_with_nothing_further_is_a_cycle_error(layout):
    tmp_path, f, environ = layout
    write(f["team-b"], "solo", SLURM_BASE.replace("name: base", "name: solo") + "extends: solo\n")
    with pytest.raises(ConfigError) as err:
        load("solo", tmp_path, environ)
    message = str(err.value)
    assert "solo.yaml" in message and "extends" in message and "cycle" in message
    assert f"after {f['team-b']}" in message


def test_a_cycle_across_folders_names_the_chain(layout):
    tmp_path, f, environ = layout
    x = write(f["team-a"], "x", "name: x\nextends: y\n")
    y = write(f["home/.config/glaunch/sites"], "y", "name: y\nextends: x\n")
    with pytest.raises(ConfigError) as err:
        load("x", tmp_path, environ)
    message = str(err.value)
    assert "cycle" in message and f"{x} -> {y} -> {x}" in message


def test_a_profile_given_by_path_finds_names_beside_it_first(layout):
    """Off the search path, the profile's own folder comes first (a checkout of a profiles
    repository used by path), then the search path."""
    tmp_path, f, environ = layout
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    write(checkout, "base", SLURM_BASE + "account: checkout\n")
    write(f["project/site_configs"], "base", SLURM_BASE + "account: project\n")
    top = write(checkout, "mycluster", "name: mycluster\nextends: base\n")
    assert sites.load_site(top, tmp_path / "project", environ).config.account == "checkout"
    # Its own name from there: the search path's.
    write(checkout, "base", "name: base\nextends: base\n")
    assert sites.load_site(checkout / "base.yaml", tmp_path / "project", environ).config.account == "project"


def test_each_file_of_the_chain_is_recorded_with_the_hash_of_what_was_read(layout):
    import hashlib

    tmp_path, f, environ = layout
    base = write(f["team-b"], "base", SLURM_BASE)
    top = write(f["team-a"], "mycluster", "name: mycluster\nextends: base\n")
    loaded = load("mycluster", tmp_path, environ)
    assert loaded.files == (sites.ProfileFile(str(base), hashlib.sha256(base.read_bytes()).hexdigest()),
                            sites.ProfileFile(str(top), hashlib.sha256(top.read_bytes()).hexdigest()))


# --- glaunch sites list ------------------------------------------------------------------


def test_found_profiles_say_where_each_comes_from_and_what_it_shadows(layout):
    tmp_path, f, environ = layout
    mine = write(f["project/site_configs"], "mycluster", "name: mycluster\n")
    team = write(f["team-b"], "mycluster", "name: mycluster\n")
    user = write(f["home/.config/glaunch/sites"], "local", "name: local\n")
    only = write(f["team-a"], "teamonly", "name: teamonly\n")
    found = {p["name"]: p for p in sites.found_profiles(tmp_path / "project", environ)}
    assert found["mycluster"] == {"name": "mycluster", "path": str(mine), "folder": str(mine.parent),
                                  "source": "site_configs",
                                  "shadows": [{"path": str(team), "folder": str(team.parent),
                                               "source": "GLAUNCH_SITE_PATH"}]}
    assert found["local"]["path"] == str(user) and found["local"]["source"] == "user"
    assert found["local"]["shadows"] == [{"path": str(sites.SHIPPED_SITES / "local.yaml"),
                                          "folder": str(sites.SHIPPED_SITES), "source": "shipped"}]
    assert (found["teamonly"]["path"], found["teamonly"]["shadows"]) == (str(only), [])
    assert found["base-slurm"]["source"] == "shipped"
    folders = sites.search_folders(tmp_path / "project", environ)
    assert [(d["folder"], d["source"]) for d in folders] == [
        (str(f["project/site_configs"]), "site_configs"), (str(f["team-a"]), "GLAUNCH_SITE_PATH"),
        (str(f["team-b"]), "GLAUNCH_SITE_PATH"), (str(f["home/.config/glaunch/sites"]), "user"),
        (str(sites.SHIPPED_SITES), "shipped")]


def glaunch(*args, cwd, environ):
    env = {k: v for k, v in os.environ.items() if k != "GLAUNCH_SITE_PATH"}
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env=dict(env, **environ, PYTHONPATH=str(REPO)), timeout=120)


def test_sites_list_text_and_json(layout):
    tmp_path, f, environ = layout
    mine = write(f["project/site_configs"], "mycluster", "name: mycluster\n")
    team = write(f["team-a"], "mycluster", "name: mycluster\n")
    (f["team-b"]).rmdir()
    text = glaunch("sites", "list", cwd=tmp_path / "project", environ=environ)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[:6] == [
        "search path (the first file of a name wins):",
        f"  1. ./site_configs/          {f['project/site_configs']}",
        f"  2. $GLAUNCH_SITE_PATH       {f['team-a']}",
        f"  3. $GLAUNCH_SITE_PATH       {f['team-b']} (not there)",
        f"  4. ~/.config/glaunch/sites  {f['home/.config/glaunch/sites']}",
        f"  5. shipped with glaunch     {sites.SHIPPED_SITES}"]
    at = lines.index(f"{'mycluster':28s} {mine}  (./site_configs/)")
    assert lines[at + 1] == f"  {'shadows':26s} {team}  ($GLAUNCH_SITE_PATH)"
    assert f"{'local':28s} {sites.SHIPPED_SITES / 'local.yaml'}  (shipped with glaunch)" in lines

    data = json.loads(glaunch("sites", "list", "--json", cwd=tmp_path / "project", environ=environ).stdout)
    assert data["sites"]["mycluster"] == str(mine)
    assert [d["source"] for d in data["search_path"]] == ["site_configs", "GLAUNCH_SITE_PATH", "GLAUNCH_SITE_PATH",
                                                          "user", "shipped"]
    assert [d["exists"] for d in data["search_path"]] == [True, True, False, True, True]
    mycluster = next(p for p in data["profiles"] if p["name"] == "mycluster")
    assert mycluster["source"] == "site_configs" and mycluster["shadows"] == [
        {"path": str(team), "folder": str(f["team-a"]), "source": "GLAUNCH_SITE_PATH"}]
