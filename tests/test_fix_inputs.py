"""Input the Python API and the profiles can be given wrong: the site as an object or a
name nobody has, overrides, sweeps and --after runs of the wrong shape, a sweep's
max_parallel, sbatch options that break a job, a ZeRO stage out of range and a state
directory with no home to live in. Each is a ConfigError naming the key (exit 2 on the
command line), nothing written."""

import os
import pwd
import sys
from pathlib import Path

import pytest

from conftest import MYSITE_PROFILE as SITE, GOOD_EXPERIMENT as EXP
from launcher import api, cli
from launcher.config.load import parse_overrides
from launcher.errors import ConfigError
from launcher.rundir import registry



def written(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if not p.is_relative_to(root / "home")}


def glaunch(monkeypatch, capsys, *args):
    """(exit code, stderr) of the CLI run in-process."""
    monkeypatch.setattr(sys, "argv", ["glaunch", *args])
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    return code, capsys.readouterr().err


def refused(root: Path, call, key: str) -> ConfigError:
    before = written(root)
    with pytest.raises(ConfigError) as info:
        call()
    assert info.value.key == key, info.value
    assert written(root) == before, "nothing may be written for bad input"
    return info.value


def dry_run(**kwargs):
    return api.submit("exp.yaml", dry_run=True, runs_dir="runs", **kwargs)


# --- the site -----------------------------------------------------------------------------------


def test_an_experiments_unknown_site_names_its_site_key(mysite_workdir, monkeypatch, capsys):
    (mysite_workdir / "exp.yaml").write_text(EXP.replace("requeue:", "site: nowhere\nrequeue:"))
    code, err = glaunch(monkeypatch, capsys, "submit", "exp.yaml", "--dry-run")
    assert code == 2
    assert "exp.yaml:4: site: unknown site 'nowhere'" in err and "extends" not in err, err
    assert not (mysite_workdir / "runs").exists()


def test_a_profiles_unknown_parent_still_names_extends(mysite_workdir, monkeypatch, capsys):
    (mysite_workdir / "site_configs" / "child.yaml").write_text("extends: nowhere\nname: child\n")
    code, err = glaunch(monkeypatch, capsys, "submit", "exp.yaml", "--site", "child", "--dry-run")
    assert code == 2 and "child.yaml:1: extends: unknown site 'nowhere'" in err, err


def test_a_site_option_that_is_no_name_names_the_option(mysite_workdir, monkeypatch, capsys):
    code, err = glaunch(monkeypatch, capsys, "submit", "exp.yaml", "--site", "a b", "--dry-run")
    assert code == 2 and "--site: 'a b' is not a site name or a path" in err, err
    assert not (mysite_workdir / "runs").exists()


def test_sites_show_names_its_argument(mysite_workdir):
    assert refused(mysite_workdir, lambda: api.site_values("a b"), "SITE")


def test_a_path_object_is_a_profile_file_whatever_its_name(mysite_workdir):
    # "plain" has neither '/' nor .yaml: as text it would be looked up as a profile name.
    (mysite_workdir / "plain").write_text(SITE.replace("mysite", "plain"))
    assert dry_run(site=Path("plain")).site == "plain"
    assert dry_run(site=Path("site_configs/mysite.yaml")).site == "mysite"


@pytest.mark.parametrize("site", [123, 1.5, ["mysite"], b"mysite"])
def test_a_site_of_another_type_is_refused(mysite_workdir, site):
    err = refused(mysite_workdir, lambda: dry_run(site=site), "--site")
    assert type(site).__name__ in err.message


# --- overrides, sweeps, --after as the API takes them ----------------------------------------------


def test_one_override_string_is_one_override_everywhere(mysite_workdir):
    run = dry_run(site="mysite", overrides="resources.nodes=1")
    assert "#SBATCH --nodes=1" in (run.run_dir / "job.sbatch").read_text()
    swept = dry_run(site="mysite", overrides="resources.nodes=1", sweep="hparams.lr=1,2")
    assert len(swept.runs) == 2
    assert all("#SBATCH --nodes=1" in (r.run_dir / "job.sbatch").read_text() for r in swept.runs)


@pytest.mark.parametrize("param", ["overrides", "sweep", "after"])
@pytest.mark.parametrize("value", [5, b"resources.nodes=1", {"resources.nodes": 1}])
def test_overrides_sweep_after_of_another_shape_are_refused(mysite_workdir, param, value):
    refused(mysite_workdir, lambda: dry_run(site="mysite", **{param: value}), param)


def test_parse_overrides_refuses_a_bare_string():
    with pytest.raises(ConfigError, match="a list of KEY=VALUE strings, got the single string"):
        parse_overrides("resources.nodes=1")


@pytest.mark.parametrize("after", [[5], [None], [b"run"], [["run"]]])
def test_an_after_item_that_is_no_run_is_refused(mysite_workdir, after):
    err = refused(mysite_workdir, lambda: dry_run(site="mysite", after=after), "--after")
    assert "is not a run" in err.message or "bytes" in err.message


def test_one_after_string_is_one_run(mysite_workdir):
    err = refused(mysite_workdir, lambda: dry_run(site="mysite", after="abc"), "--after")
    assert "'abc'" in err.message


@pytest.mark.parametrize("value", ["2", True, 1.5])
def test_max_parallel_must_be_a_whole_number(mysite_workdir, value):
    err = refused(mysite_workdir, lambda: dry_run(site="mysite", sweep=["hparams.lr=1,2"], max_parallel=value),
                  "max_parallel")
    assert type(value).__name__ in err.message


def test_max_parallel_below_one_names_the_option(mysite_workdir):
    refused(mysite_workdir, lambda: dry_run(site="mysite", sweep=["hparams.lr=1,2"], max_parallel=0), "--max-parallel")


def test_max_parallel_whole_number_is_taken(mysite_workdir):
    assert len(dry_run(site="mysite", sweep=["hparams.lr=1,2"], max_parallel=1).runs) == 2


# --- sbatch options that break the job ---------------------------------------------------------


@pytest.mark.parametrize("option,why", [("export", "srun inside the job inherits the job's environment"),
                                        ("test-only", "nothing would ever be queued"),
                                        ("wait", "block glaunch submit until the job ended"),
                                        ("expo", "abbreviation of --export")])
def test_sbatch_options_that_break_the_job_are_refused(mysite_workdir, monkeypatch, capsys, option, why):
    with open(mysite_workdir / "site_configs" / "mysite.yaml", "a") as f:
        f.write(f"sbatch: {{{option}: NONE}}\n")
    code, err = glaunch(monkeypatch, capsys, "submit", "exp.yaml", "--site", "mysite", "--dry-run")
    line = len(SITE.splitlines()) + 1                 # the line appended above
    assert code == 2 and f"mysite.yaml:{line}: sbatch.{option}:" in err and why in err, err
    assert not (mysite_workdir / "runs").exists()


def test_wait_all_nodes_is_not_taken_for_wait(mysite_workdir):
    with open(mysite_workdir / "site_configs" / "mysite.yaml", "a") as f:
        f.write("sbatch: {wait-all-nodes: 1}\n")
    assert "#SBATCH --wait-all-nodes=1" in (dry_run(site="mysite").run_dir / "job.sbatch").read_text()


# --- strategy.zero_stage ---------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "deepspeed"])
@pytest.mark.parametrize("stage", [4, -1])
def test_zero_stage_out_of_range_is_refused_whatever_the_strategy(mysite_workdir, strategy, stage):
    err = refused(mysite_workdir, lambda: dry_run(site="mysite", overrides=[f"strategy.name={strategy}",
                                                                      f"strategy.zero_stage={stage}"]),
                  "strategy.zero_stage")
    assert "0..3" in err.message


def test_zero_stage_in_range_with_ddp_is_taken(mysite_workdir):
    assert dry_run(site="mysite", overrides=["strategy.name=ddp", "strategy.zero_stage=3"]).state == "RENDERED"


# --- the state directory -------------------------------------------------------------------------


def test_state_dir_without_home_is_the_users_own_home():
    home = pwd.getpwuid(os.getuid()).pw_dir
    expected = Path(home) / ".local" / "state" / "glaunch"
    assert registry.state_dir({}) == expected
    assert registry.state_dir({"HOME": "relative", "XDG_STATE_HOME": "also/relative"}) == expected
    assert registry.state_dir({"HOME": "/h"}) == Path("/h/.local/state/glaunch")
    assert registry.state_dir({"HOME": "/h", "XDG_STATE_HOME": "/x"}) == Path("/x/glaunch")
    assert registry.state_dir({"GLAUNCH_STATE_DIR": "/g", "HOME": "/h"}) == Path("/g")


def test_state_dir_without_any_home_is_refused(monkeypatch):
    def no_passwd_entry(uid):          # mock: a uid with no passwd entry cannot be made here
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", no_passwd_entry)
    with pytest.raises(ConfigError) as info:
        registry.state_dir({})
    assert info.value.key == "GLAUNCH_STATE_DIR" and "set GLAUNCH_STATE_DIR" in info.value.message
    with pytest.raises(ConfigError):
        registry.check_state_dir({"HOME": "tmp"})


def test_submit_without_home_writes_its_index_under_the_users_home(mysite_workdir, monkeypatch, tmp_path):
    def passwd_home(uid):              # mock: this user's real home is not the test's to write into
        return pwd.struct_passwd(("u", "x", uid, uid, "", str(tmp_path / "pwhome"), "/bin/sh"))

    monkeypatch.setattr(pwd, "getpwuid", passwd_home)
    for key in ("HOME", "XDG_STATE_HOME", "GLAUNCH_STATE_DIR"):
        monkeypatch.delenv(key, raising=False)
    run = dry_run(site="mysite")
    index = tmp_path / "pwhome" / ".local" / "state" / "glaunch" / registry.INDEX_FILE
    assert run.run_id in index.read_text()
