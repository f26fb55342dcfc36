"""Bad input the runner and the command line refuse: what a submission needs on disk (the
entry point, a runs directory), the command line's own usage, runs and sweeps that do not
exist, the Python API's overrides, sweeps, --after runs and max_parallel of the wrong
shape, and a state directory with no home to live in. Each row: the input and the
fragments its one error line must hold (tests/badinput.py says what else is checked)."""

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from badinput import EXP, QUIET_EXP, Refused, RefusedCall, refuse, refuse_call, run_cli, table
from launcher import api
from launcher.errors import ConfigError
from launcher.rundir import registry

REPO = Path(__file__).resolve().parents[2]

NO_SWEEP = "glaunch: error: command line: SWEEP: no sweep 'no-such-sweep' (`glaunch list` shows runs and sweeps)"
NO_RUN = "glaunch: error: command line: RUN: no run 'no-such-run'"

CASES = [
    # --- what a submission needs on disk ---
    Refused("missing-script", {"exp.yaml": EXP.replace("train.py", "nope.py")}, [], ["exp.yaml:2: entrypoint.script",
                                                                                   "not found"]),
    # The checkpoint warning names the script; a script that is not there is the error, alone.
    Refused("missing-script-no-warning-first",
            {"exp.yaml": QUIET_EXP.replace("requeue: {max: 0}\n", "").replace("train.py", "nope.py")}, [],
            ["entrypoint.script", "not found"]),
    # Not a dry run: the default requeue.max warns about checkpoints; the missing script it names is the error.
    Refused("missing-script-local-run", {"exp.yaml": "name: good\nentrypoint: {script: nope.py}\n"},
            ["--site", "local"], ["exp.yaml:2: entrypoint.script", "not found"], dry_run=False),
    Refused("missing-script-of-a-sweep", {"exp.yaml": EXP.replace("train.py", "nope.py")},
            ["--sweep", "hparams.lr=1,2"], ["exp.yaml:2: entrypoint.script", "sweep element 0", "not found"]),
    Refused("missing-script-from-the-command-line", {"exp.yaml": EXP}, ["entrypoint.script=nope.py"],
            ["command line: entrypoint.script", "not found"]),
    Refused("runs-dir-is-a-file", {"exp.yaml": QUIET_EXP, "afile": "x"}, ["--runs-dir", "afile"],
            ["--runs-dir", "is a file"]),
    # --- what the code snapshot leaves out that every start runs ---
    *[Refused(f"snapshot-exclude-{name}", {}, [f"code.exclude=[{value}]", *more],
              ["exp.yaml: code.exclude: ", shown, "train.py", "entrypoint.script"])
      for name, value, shown, more in [("script", "train.py", "'train.py'", []), ("every-py", "'*.py'", "'*.py'", []),
                                       ("script-of-a-sweep", "train.py", "'train.py'",
                                        ["--sweep", "hparams.lr=1,2"])]],
    Refused("snapshot-exclude-the-module",
            {"exp.yaml": EXP.replace("script: train.py", "module: pkg.main"), "pkg/__init__.py": "",
             "pkg/main.py": "print('hi')\n"},
            ["code.exclude=[pkg]"], ["exp.yaml: code.exclude: ", "'pkg'", "pkg/__init__.py", "entrypoint.module"]),
    # Not a dry run: without the refusal the job would start and die on the missing script.
    Refused("snapshot-exclude-local-run",
            {"exp.yaml": "name: good\nentrypoint: {script: train.py}\nrequeue: {max: 0}\n"},
            ["--site", "local", "code.snapshot=true", "code.exclude=['*.py']"],
            ["exp.yaml: code.exclude: ", "'*.py'", "train.py"], dry_run=False),
    # --- the command line's usage: one line too ---
    *[Refused(f"usage-{name}", {}, args, [fragment], command=None, site=None)
      for name, args, fragment in [
          ("submit-without-experiment", ["submit"], "Missing argument 'EXPERIMENT'. (glaunch submit --help)"),
          ("max-parallel-without-sweep", ["submit", "exp.yaml", "--max-parallel", "2"],
           "--max-parallel applies to a sweep"),
          ("max-parallel-zero", ["submit", "exp.yaml", "--max-parallel", "0"],
           "'--max-parallel': 0 is not in the range"),
          ("logs-negative-rank", ["logs", "somerun", "--rank", "-1"], "'--rank': -1 is not in the range x>=0"),
          ("unknown-command", ["bogus"], "No such command 'bogus'")]],
    # --- runs and sweeps the user named ---
    Refused("status-of-an-unknown-run", {}, ["status", "no-such-run"], [NO_RUN], command=None, site=None,
            check=lambda err: err.startswith(NO_RUN)),
    Refused("list-of-a-name-that-is-no-sweep", {}, ["list", "no-such-sweep"], [NO_SWEEP], command=None, site=None,
            check=lambda err: err == NO_SWEEP + "\n"),
]


def dry_run(**kwargs):
    return api.submit("exp.yaml", dry_run=True, runs_dir="runs", **kwargs)


CALLS = [
    # --- overrides, sweeps, --after as the API takes them ---
    *[RefusedCall(f"{param}-{type(value).__name__}", lambda param=param, value=value: dry_run(site="mysite",
                                                                                               **{param: value}),
                  param)
      for value in [5, b"resources.nodes=1", {"resources.nodes": 1}] for param in ["overrides", "sweep", "after"]],
    *[RefusedCall(f"after-item-{type(after[0]).__name__}", lambda after=after: dry_run(site="mysite", after=after),
                  "--after", check=lambda error: "is not a run" in error.message or "bytes" in error.message)
      for after in [[5], [None], [b"run"], [["run"]]]],
    # One string is one run, not a list of its characters.
    RefusedCall("after-one-string", lambda: dry_run(site="mysite", after="abc"), "--after",
                check=lambda error: "'abc'" in error.message),
    *[RefusedCall(f"max-parallel-{type(value).__name__}",
                  lambda value=value: dry_run(site="mysite", sweep=["hparams.lr=1,2"], max_parallel=value),
                  "max_parallel", check=lambda error, value=value: type(value).__name__ in error.message)
      for value in ["2", True, 1.5]],
    RefusedCall("max-parallel-below-one", lambda: dry_run(site="mysite", sweep=["hparams.lr=1,2"], max_parallel=0),
                "--max-parallel"),
    # --- runs, ranks and folders: a value of another type is named, never a TypeError or a folder ---
    *[RefusedCall(f"{name}-run-{type(value).__name__}", lambda call=call, value=value: call(value), "run",
                  [type(value).__name__])
      for value in [None, 5, "", b"run"]
      for name, call in [("status", api.status), ("cancel", api.cancel), ("wait", api.wait),
                         ("logs", api.logs), ("resume", api.resume)]],
    RefusedCall("list-sweep-int", lambda: api.list_runs(sweep=5), "sweep", ["int"]),
    *[RefusedCall(f"logs-rank-{value!r}", lambda value=value: api.logs("no-such-run", rank=value), "rank",
                  [repr(value)])
      for value in [-1, True, 1.5, "0"]],
    *[RefusedCall(f"runs-dir-{type(value).__name__}", lambda value=value: api.submit("exp.yaml", site="mysite",
                                                                                   dry_run=True, runs_dir=value),
                  "runs_dir", [type(value).__name__])
      for value in [5, b"runs", 1.5]],
    RefusedCall("snapshot-exclude-through-the-api",
                lambda: dry_run(site="mysite", overrides=["code.exclude=['*.py']"]), "code.exclude",
                ["'*.py'", "train.py"]),
    RefusedCall("sweep-runs-dir-int", lambda: api.submit("exp.yaml", site="mysite", dry_run=True, runs_dir=5,
                                                         sweep=["hparams.lr=1,2"]), "runs_dir", ["int"]),
]


@table(CASES)
def test_refused(case, tmp_path, monkeypatch, capsys, isolated_env):
    refuse(case, tmp_path, monkeypatch, capsys)


@table(CALLS)
def test_refused_call(case, mysite_workdir):
    refuse_call(case, mysite_workdir)


@pytest.mark.parametrize("args", [[], ["sites"]])
def test_no_subcommand_shows_the_help(args, mysite_workdir, monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", *args])
    assert code == 2
    assert (out + err).lstrip().startswith("Usage: glaunch") and "Commands:" in out + err


# --- the state directory ---------------------------------------------------------------------


def test_state_dir_without_any_home_is_refused(monkeypatch):
    def no_passwd_entry(uid):          # mock: a uid with no passwd entry cannot be made here
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", no_passwd_entry)
    with pytest.raises(ConfigError) as info:
        registry.state_dir({})
    assert info.value.key == "GLAUNCH_STATE_DIR" and "set GLAUNCH_STATE_DIR" in info.value.message
    with pytest.raises(ConfigError):
        registry.check_state_dir({"HOME": "tmp"})


def test_state_dir_without_home_is_the_users_own_home():
    home = pwd.getpwuid(os.getuid()).pw_dir
    expected = Path(home) / ".local" / "state" / "glaunch"
    assert registry.state_dir({}) == expected
    assert registry.state_dir({"HOME": "relative", "XDG_STATE_HOME": "also/relative"}) == expected
    assert registry.state_dir({"HOME": "/h"}) == Path("/h/.local/state/glaunch")
    assert registry.state_dir({"HOME": "/h", "XDG_STATE_HOME": "/x"}) == Path("/x/glaunch")
    assert registry.state_dir({"GLAUNCH_STATE_DIR": "/g", "HOME": "/h"}) == Path("/g")


def test_submit_without_home_writes_its_index_under_the_users_home(mysite_workdir, monkeypatch, tmp_path):
    def passwd_home(uid):              # mock: this user's real home is not the test's to write into
        return pwd.struct_passwd(("u", "x", uid, uid, "", str(tmp_path / "pwhome"), "/bin/sh"))

    monkeypatch.setattr(pwd, "getpwuid", passwd_home)
    for key in ("HOME", "XDG_STATE_HOME", "GLAUNCH_STATE_DIR"):
        monkeypatch.delenv(key, raising=False)
    run = dry_run(site="mysite")
    index = tmp_path / "pwhome" / ".local" / "state" / "glaunch" / registry.INDEX_FILE
    assert run.run_id in index.read_text()


# --- what the checks let through --------------------------------------------------------------


def test_warning_still_shown_for_a_dry_run(mysite_workdir, monkeypatch, capsys):
    (mysite_workdir / "exp.yaml").write_text(QUIET_EXP.replace("requeue: {max: 0}\n", ""))
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "submit", "exp.yaml", "--site", "mysite", "--dry-run"])
    assert code == 0, err
    assert err.startswith("glaunch: warning: exp.yaml: no checkpoint settings")


def test_a_plain_lightning_script_is_not_warned_it_restarts_from_step_0(mysite_workdir, monkeypatch, capsys):
    """Lightning saves its hpc_ckpt at the warning and resumes from it by itself: the warning
    would be false of it."""
    (mysite_workdir / "train.py").write_text("import lightning as L\nprint('hi')\n")
    (mysite_workdir / "exp.yaml").write_text(QUIET_EXP.replace("requeue: {max: 0}\n", ""))
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "submit", "exp.yaml", "--site", "mysite", "--dry-run"])
    assert code == 0, err
    assert "no checkpoint settings" not in err


def test_local_run_warns_before_it_starts(mysite_workdir, isolated_env):
    (mysite_workdir / "exp.yaml").write_text("name: good\nentrypoint: {script: train.py}\n")
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", "exp.yaml", "--site", "local"],
                          cwd=mysite_workdir, env=dict(isolated_env, PYTHONPATH=str(REPO)), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("glaunch: warning: exp.yaml: no checkpoint settings"), proc.stderr
    assert proc.stdout.startswith("run good-") and "running on this machine" in proc.stdout.splitlines()[0]
    assert "hi" in proc.stdout


def test_one_override_string_is_one_override_everywhere(mysite_workdir):
    run = dry_run(site="mysite", overrides="resources.nodes=1")
    assert "#SBATCH --nodes=1" in (run.run_dir / "job.sbatch").read_text()
    swept = dry_run(site="mysite", overrides="resources.nodes=1", sweep="hparams.lr=1,2")
    assert len(swept.runs) == 2
    assert all("#SBATCH --nodes=1" in (r.run_dir / "job.sbatch").read_text() for r in swept.runs)


def test_max_parallel_whole_number_is_taken(mysite_workdir):
    assert len(dry_run(site="mysite", sweep=["hparams.lr=1,2"], max_parallel=1).runs) == 2
