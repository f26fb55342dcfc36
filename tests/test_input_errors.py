"""Bad input found by trying glaunch as a new user and as an attacker of its inputs: each
is one error line naming the file and the dotted key, exit 2, nothing written, and through
the Python API a ConfigError."""

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import MYSITE_PROFILE as SITE, GOOD_EXPERIMENT as EXP
from launcher import api, cli
from launcher.config import load
from launcher.config.schema import MAX_RUN_NAME
from launcher.errors import ConfigError
from launcher.config import slurmtime

REPO = Path(__file__).resolve().parent.parent



def glaunch(monkeypatch, capsys, *args):
    """(exit code, stdout, stderr) of the CLI run in-process."""
    monkeypatch.setattr(sys, "argv", ["glaunch", *args])
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out, err = capsys.readouterr()
    return code, out, err


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if not p.is_relative_to(root / "home")}


def refused(root, monkeypatch, capsys, args, *fragments, command="submit"):
    """The CLI refuses: exit 2, one stderr line holding every fragment, nothing written."""
    before = files_under(root)
    extra = ["--site", "mysite", "--dry-run"] if command == "submit" else ["--site", "mysite"]
    code, out, err = glaunch(monkeypatch, capsys, command, *args[:1], *extra, *args[1:])
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    assert len(err.strip().splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"
    assert files_under(root) == before, "nothing may be written for bad input"
    return err


# --- ${...} that OmegaConf's grammar cannot parse ---------------------------------------------

@pytest.mark.parametrize("where,text,key", [
    ("hparams", "hparams: {a: '${}'}\n", "exp.yaml:5: hparams.a"),
    ("hparams-space", "hparams: {a: '${ }'}\n", "exp.yaml:5: hparams.a"),
    ("bash-default-in-env", "env: {A: '${HOME:-$(touch PWNED)}'}\n", "exp.yaml:5: env.A"),
    ("bash-default-in-args", "entrypoint: {script: train.py, args: ['${x:-$(touch PWNED)}']}\n", "entrypoint.args[0]"),
])
def test_unparsable_interpolation_names_its_key(where, text, key, mysite_workdir, monkeypatch, capsys):
    exp = EXP.replace("entrypoint: {script: train.py}\n", "") if where == "bash-default-in-args" else EXP
    (mysite_workdir / "exp.yaml").write_text(exp + text)
    err = refused(mysite_workdir, monkeypatch, capsys, ["exp.yaml"], key, "is not an interpolation")
    assert "cannot interpolate" not in err
    assert not list(mysite_workdir.rglob("PWNED*"))


def test_unparsable_interpolation_in_an_override_is_the_command_lines(mysite_workdir, monkeypatch, capsys):
    refused(mysite_workdir, monkeypatch, capsys, ["exp.yaml", "hparams.a=${a b}"], "command line: hparams.a",
            "is not an interpolation")


def test_unparsable_interpolation_in_a_site_names_the_profile_key(mysite_workdir, monkeypatch, capsys):
    (mysite_workdir / "site_configs" / "mysite.yaml").write_text(SITE + "account: '${}'\n")
    refused(mysite_workdir, monkeypatch, capsys, ["exp.yaml"], "mysite.yaml:7: account", "is not an interpolation")


def test_interpolation_cycle_says_so(mysite_workdir, monkeypatch, capsys):
    (mysite_workdir / "exp.yaml").write_text(EXP + "hparams: {a: '${hparams.b}', b: '${hparams.a}'}\n")
    err = refused(mysite_workdir, monkeypatch, capsys, ["exp.yaml"], "hparams.a", "refers to itself")
    assert "literal shell variable" not in err, "the shell hint is for names that are not found"


def test_resolver_warnings_do_not_reach_stderr(mysite_workdir, isolated_env):
    """In a process of its own: pytest would capture the Python warning itself."""
    (mysite_workdir / "exp.yaml").write_text(EXP + "hparams: {a: '${oc.deprecated:name}'}\n")
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", "exp.yaml", "--site", "mysite",
                           "--dry-run"], cwd=mysite_workdir, env=dict(isolated_env, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


# --- names too long for a directory ------------------------------------------------------------

def test_too_long_name_is_refused_before_anything_is_written(mysite_workdir, monkeypatch, capsys):
    (mysite_workdir / "exp.yaml").write_text(EXP.replace("name: good", "name: " + "a" * 300))
    refused(mysite_workdir, monkeypatch, capsys, ["exp.yaml"], "exp.yaml:1: name", "300 characters", str(MAX_RUN_NAME))


def test_longest_name_renders(mysite_workdir, monkeypatch, capsys):
    (mysite_workdir / "exp.yaml").write_text(EXP.replace("name: good", "name: " + "a" * MAX_RUN_NAME))
    code, out, err = glaunch(monkeypatch, capsys, "submit", "exp.yaml", "--site", "mysite", "--dry-run")
    assert code == 0, err


def test_longest_name_sweeps(mysite_workdir, monkeypatch, capsys):
    """A sweep adds the most to a run name: its elements' directories must still be creatable."""
    (mysite_workdir / "exp.yaml").write_text(EXP.replace("name: good", "name: " + "a" * MAX_RUN_NAME))
    code, out, err = glaunch(monkeypatch, capsys, "submit", "exp.yaml", "--site", "mysite", "--dry-run",
                             "--sweep", "hparams.lr=1,2")
    assert code == 0, err


# --- the command line's own arguments ----------------------------------------------------------

def test_experiment_that_is_a_directory_is_one_line(mysite_workdir, monkeypatch, capsys):
    (mysite_workdir / "exp.yaml").unlink()
    (mysite_workdir / "exp.yaml").mkdir()
    for command in ("submit", "plan"):
        refused(mysite_workdir, monkeypatch, capsys, ["exp.yaml"], "exp.yaml", "is a directory", command=command)


def test_runs_dir_that_is_a_file_names_the_option(mysite_workdir, monkeypatch, capsys):
    (mysite_workdir / "afile").write_text("x")
    refused(mysite_workdir, monkeypatch, capsys, ["exp.yaml", "--runs-dir", "afile"], "--runs-dir", "is a file")


def test_empty_runs_dir_is_refused(mysite_workdir, monkeypatch, capsys):
    refused(mysite_workdir, monkeypatch, capsys, ["exp.yaml", "--runs-dir", ""], "--runs-dir", "empty")
    assert not (mysite_workdir / "runs").exists()


def test_warning_does_not_precede_an_error(mysite_workdir, monkeypatch, capsys):
    """The checkpoint warning names the script; a script that is not there is the error, alone."""
    (mysite_workdir / "exp.yaml").write_text(EXP.replace("requeue: {max: 0}\n", "").replace("train.py", "nope.py"))
    refused(mysite_workdir, monkeypatch, capsys, ["exp.yaml"], "entrypoint.script", "not found")


def test_warning_still_shown_for_a_dry_run(mysite_workdir, monkeypatch, capsys):
    (mysite_workdir / "exp.yaml").write_text(EXP.replace("requeue: {max: 0}\n", ""))
    code, out, err = glaunch(monkeypatch, capsys, "submit", "exp.yaml", "--site", "mysite", "--dry-run")
    assert code == 0, err
    assert err.startswith("glaunch: warning: exp.yaml: no checkpoint settings")


# --- plan: the experiment's GPU count ---------------------------------------------------------

@pytest.mark.parametrize("gpus,fragments", [
    ("0", ["command line: resources.gpus_per_node", "got 0"]),
    ("-1", ["command line: resources.gpus_per_node", "got -1"]),
    ("9", ["command line: resources.gpus_per_node", "partition 'gpu'", "has 4"]),
])
def test_plan_blames_the_experiments_gpu_count(gpus, fragments, mysite_workdir, monkeypatch, capsys):
    (mysite_workdir / "exp.yaml").write_text(EXP + "model: {params: 7e9}\n")
    refused(mysite_workdir, monkeypatch, capsys, ["exp.yaml", f"resources.gpus_per_node={gpus}"], *fragments,
            command="plan")


def test_plan_blames_the_site_for_a_partition_without_gpus(mysite_workdir, monkeypatch, capsys):
    (mysite_workdir / "exp.yaml").write_text(EXP + "model: {params: 7e9}\n")
    refused(mysite_workdir, monkeypatch, capsys, ["exp.yaml", "resources.partition=cpu"],
            "mysite.yaml:6: partitions.cpu.gpus_per_node", command="plan")


# --- time limits beyond what Slurm holds --------------------------------------------------------

def test_time_beyond_slurms_range_is_refused(mysite_workdir, monkeypatch, capsys):
    (mysite_workdir / "site_configs" / "mysite.yaml").write_text(SITE.replace(', max_time: "1-00:00:00"', ""))
    refused(mysite_workdir, monkeypatch, capsys, ["exp.yaml", "resources.time=99999999-00:00:00"],
            "command line: resources.time", "longer than any time limit Slurm can hold")
    longest = slurmtime.MAX_MINUTES // 1440           # whole days
    assert slurmtime.parse(f"{longest}-00:00:00") == longest * 86400
    with pytest.raises(ValueError, match="Slurm can hold"):
        slurmtime.parse(f"{longest + 1}-00:00:00")


# --- the Python API -----------------------------------------------------------------------------

@pytest.mark.parametrize("overrides,fragment", [
    ([4], "override 4 is not KEY=VALUE text"),
    ([None], "override None is not KEY=VALUE text"),
    ([b"resources.nodes=1"], "it is bytes"),
])
def test_api_overrides_of_another_type_are_config_errors(overrides, fragment, mysite_workdir):
    with pytest.raises(ConfigError) as info:
        api.submit("exp.yaml", site="mysite", overrides=overrides, dry_run=True)
    assert fragment in str(info.value)
    assert info.value.exit_code == 2
    assert not (mysite_workdir / "runs").exists()


def test_overrides_as_one_string_are_refused_not_split(mysite_workdir):
    with pytest.raises(ConfigError, match="a list of KEY=VALUE strings"):
        load.load_experiment("exp.yaml", "resources.nodes=1")


@pytest.mark.parametrize("experiment", [None, 3])
def test_api_experiment_that_is_no_path(experiment, mysite_workdir):
    with pytest.raises(ConfigError, match="the experiment must be a YAML file's path"):
        api.prepare(experiment, site="mysite")


def test_api_too_long_name_is_a_config_error(mysite_workdir):
    with pytest.raises(ConfigError) as info:
        api.submit("exp.yaml", site="mysite", overrides=["name=" + "b" * (MAX_RUN_NAME + 1)], dry_run=True)
    assert info.value.key == "name" and info.value.file == "command line"
    assert not (mysite_workdir / "runs").exists()
    assert os.listdir(mysite_workdir / "site_configs") == ["mysite.yaml"]


# --- counts beyond what PyTorch and Slurm hold ---------------------------------------------------

UNBOUNDED_SITE = "name: mysite\nscheduler: slurm\npartitions:\n  gpu: {gpus_per_node: 8}\n"


@pytest.mark.parametrize("override,key,fragment", [
    ("resources.nodes=268435456", "resources.nodes", "2147483648 ranks, more than PyTorch can number"),
    ("resources.nodes=9223372036854775807", "resources.nodes", "more than PyTorch can number"),
    ("resources.cpus_per_task=65534", "resources.cpus_per_task", "more than Slurm can request (65533)"),
    ("resources.mem_gb=1e300", "resources.mem_gb", "more than Slurm can request"),
    ("batch.micro_size=9223372036854775807", "batch.micro_size", "more than a 64-bit count holds"),
])
def test_counts_beyond_the_jobs_consumers_are_refused(override, key, fragment, mysite_workdir, monkeypatch, capsys):
    (mysite_workdir / "site_configs" / "mysite.yaml").write_text(UNBOUNDED_SITE)
    refused(mysite_workdir, monkeypatch, capsys, ["exp.yaml", override], f"command line: {key}", fragment)


def test_largest_world_size_renders(mysite_workdir):
    (mysite_workdir / "site_configs" / "mysite.yaml").write_text(UNBOUNDED_SITE)
    prepared = api.prepare("exp.yaml", site="mysite", overrides=["resources.nodes=268435455"], dry_run=True)
    assert prepared.plan.world_size == 2 ** 31 - 8
    assert "#SBATCH --nodes=268435455" in prepared.files["job.sbatch"]


# --- what exec() cannot start ------------------------------------------------------------------

def test_the_exec_string_bound_is_the_kernels():
    """A program starts with an environment string of MAX_EXEC_STRING bytes, not one more."""
    from launcher.resolution.resolve import MAX_EXEC_STRING

    def starts(size):
        env = {"PATH": "/usr/bin:/bin", "A": "x" * (size - len("A="))}
        try:
            return subprocess.run(["/bin/true"], env=env, timeout=60).returncode == 0
        except OSError as exc:
            assert exc.errno == errno.E2BIG, exc
            return False
    assert starts(MAX_EXEC_STRING)
    assert not starts(MAX_EXEC_STRING + 1)


@pytest.mark.parametrize("text,key,fragment", [
    ("env: {A: '%s'}\n" % ("x" * 131070), "exp.yaml:5: env.A", "131072 bytes long"),
    # Aliases make a small file a large environment.
    ("env: {V0: &v '%s', %s}\n" % ("x" * 100000, ", ".join(f"V{i}: *v" for i in range(1, 11))), "env.V10",
     "ARG_MAX"),
    ("launcher: torchrun\nentrypoint: {script: train.py, args: ['%s']}\n" % ("y" * 131072),
     "entrypoint.args[0]", "131072 bytes long"),
], ids=["env-value", "env-total", "torchrun-arg"])
def test_what_exec_cannot_start_is_refused(text, key, fragment, mysite_workdir, monkeypatch, capsys):
    exp = EXP.replace("entrypoint: {script: train.py}\n", "") if "entrypoint" in text else EXP
    (mysite_workdir / "exp.yaml").write_text(exp + text)
    refused(mysite_workdir, monkeypatch, capsys, ["exp.yaml"], key, fragment)


def test_long_arguments_are_fine_under_srun(mysite_workdir):
    """Under srun the script runs in the task's own process: its arguments are never exec'd."""
    (mysite_workdir / "exp.yaml").write_text(EXP.replace("{script: train.py}", "{script: train.py, args: ['%s']}"
                                                  % ("y" * 200000)))
    prepared = api.prepare("exp.yaml", site="mysite", dry_run=True)
    assert prepared.plan.entry_args == ("y" * 200000,)


def test_site_env_too_long_names_the_profile(mysite_workdir, monkeypatch, capsys):
    (mysite_workdir / "site_configs" / "mysite.yaml").write_text(SITE + "env: {BIG: '%s'}\n" % ("z" * 140000))
    refused(mysite_workdir, monkeypatch, capsys, ["exp.yaml"], "mysite.yaml:7: env.BIG", "MAX_ARG_STRLEN")


# --- documents and keys that show nothing ---------------------------------------------------------

@pytest.mark.parametrize("text", ["---\n", "# only a comment\n--- \n...\n"])
def test_a_document_marker_alone_is_an_empty_file(text, mysite_workdir, monkeypatch, capsys):
    (mysite_workdir / "exp.yaml").write_text(text)
    refused(mysite_workdir, monkeypatch, capsys, ["exp.yaml"], "exp.yaml: the file is empty")


@pytest.mark.parametrize("key,shown", [("''", "unknown key ''"), ("' resources'", "unknown key ' resources'"),
                                       ("resources\u200b", "unknown key 'resources\\u200b'")])
def test_an_unknown_key_that_would_not_show_is_quoted(key, shown, mysite_workdir, monkeypatch, capsys):
    (mysite_workdir / "exp.yaml").write_text(EXP + f"{key}: 1\n")
    refused(mysite_workdir, monkeypatch, capsys, ["exp.yaml"], shown)


def test_api_sweep_of_another_type_is_a_config_error(mysite_workdir):
    with pytest.raises(ConfigError, match=r"is not KEY=V1,V2,\.\.\. text, it is int"):
        api.prepare_sweep("exp.yaml", [5], site="mysite", dry_run=True)


@pytest.mark.parametrize("override", ["resources.partition=", "checkpoint.dir=", "checkpoint.dir= ",
                                      "strategy.nvme_path=", "model.factory="])
def test_an_empty_choice_is_refused_not_taken_for_the_default(override, mysite_workdir, monkeypatch, capsys):
    """`checkpoint.dir=$CKPT` with CKPT unset must not quietly mean the default."""
    key = override.split("=")[0]
    refused(mysite_workdir, monkeypatch, capsys, ["exp.yaml", override], f"command line: {key}", "leave it out")


# --- usage errors: one line too; no arguments at all: the help --------------------------------------

@pytest.mark.parametrize("args,fragment", [
    (["submit"], "Missing argument 'EXPERIMENT'. (glaunch submit --help)"),
    (["submit", "exp.yaml", "--max-parallel", "2"], "--max-parallel applies to a sweep"),
    (["submit", "exp.yaml", "--max-parallel", "0"], "'--max-parallel': 0 is not in the range"),
    (["logs", "somerun", "--rank", "-1"], "'--rank': -1 is not in the range x>=0"),
    (["bogus"], "No such command 'bogus'"),
])
def test_usage_errors_are_one_line(args, fragment, mysite_workdir, monkeypatch, capsys):
    code, out, err = glaunch(monkeypatch, capsys, *args)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("glaunch: error: ") and fragment in err, err


@pytest.mark.parametrize("args", [[], ["sites"]])
def test_no_subcommand_shows_the_help(args, mysite_workdir, monkeypatch, capsys):
    code, out, err = glaunch(monkeypatch, capsys, *args)
    assert code == 2
    assert (out + err).lstrip().startswith("Usage: glaunch") and "Commands:" in out + err


# --- the local scheduler: the same one-line errors, warnings once the checks passed ------------------

def test_local_run_of_a_missing_script_is_one_line(mysite_workdir, monkeypatch, capsys):
    """The default requeue.max warns about checkpoints; the missing script it names is the error."""
    (mysite_workdir / "exp.yaml").write_text("name: good\nentrypoint: {script: nope.py}\n")
    before = files_under(mysite_workdir)
    code, out, err = glaunch(monkeypatch, capsys, "submit", "exp.yaml", "--site", "local")
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and "entrypoint.script" in err and "not found" in err, err
    assert out == ""
    assert files_under(mysite_workdir) == before


def test_local_run_warns_before_it_starts(mysite_workdir, isolated_env):
    (mysite_workdir / "exp.yaml").write_text("name: good\nentrypoint: {script: train.py}\n")
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", "exp.yaml", "--site", "local"],
                          cwd=mysite_workdir, env=dict(isolated_env, PYTHONPATH=str(REPO)), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("glaunch: warning: exp.yaml: no checkpoint settings"), proc.stderr
    assert proc.stdout.startswith("run good-") and "running on this machine" in proc.stdout.splitlines()[0]
    assert "hi" in proc.stdout


def test_a_huge_key_is_shortened_in_the_error(mysite_workdir, monkeypatch, capsys):
    """YAML's explicit keys (`? key`) have no length limit: the error line stays short."""
    (mysite_workdir / "exp.yaml").write_text(EXP + "? " + "k" * 500000 + "\n: 1\n")
    err = refused(mysite_workdir, monkeypatch, capsys, ["exp.yaml"], "... (500000 characters): unknown key")
    assert len(err) < 1000


def test_a_site_profile_given_as_the_experiment_says_so(mysite_workdir, monkeypatch, capsys):
    refused(mysite_workdir, monkeypatch, capsys, ["site_configs/mysite.yaml"], "mysite.yaml:4: partitions",
            "this is a site profile", "give it with --site")
