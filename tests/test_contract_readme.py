"""README.md says what the product does: its experiment and site profile examples load,
validate and render as written, and every command and option its "Using it" block shows
exists with that name."""

import json
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from launcher.cli import cli

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def yaml_block(heading: str) -> str:
    """The first ```yaml block after `heading`."""
    start = README.index("```yaml\n", README.index(heading)) + len("```yaml\n")
    return README[start:README.index("```", start)]


def bash_block(heading: str) -> str:
    start = README.index("```bash\n", README.index(heading)) + len("```bash\n")
    return README[start:README.index("```", start)]


@pytest.fixture
def readme_configs(tmp_path):
    """The README's experiment (its site: mycluster) and site profile, as a user would save them."""
    (tmp_path / "site_configs").mkdir()
    (tmp_path / "site_configs" / "mycluster.yaml").write_text(yaml_block("## Writing a site profile"))
    (tmp_path / "exp.yaml").write_text(yaml_block("## Experiment config"))
    (tmp_path / "train.py").write_text("print('training')\n")
    return tmp_path


def glaunch(*args, env, cwd):
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_readme_experiment_and_profile_work_as_written(readme_configs, isolated_env):
    env = dict(isolated_env, PYTHONPATH=str(REPO))
    cwd = readme_configs
    proc = glaunch("sites", "validate", "mycluster", env=env, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(glaunch("sites", "show", "mycluster", "--json", env=env, cwd=cwd).stdout)
    values = {row["key"]: row["value"] for row in shown["values"]}
    assert values["partitions.gpu.gpus_per_node"] == 4 and values["runs_root"] == "/scratch/$USER/glaunch"
    # The experiment's own `site:` names the profile; --runs-dir keeps the run out of /scratch.
    proc = glaunch("submit", "exp.yaml", "--dry-run", "--json", "--runs-dir", str(cwd / "runs"), env=env, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["site"] == "mycluster" and info["dry_run"] is True
    script = (Path(info["run_dir"]) / "job.sbatch").read_text()
    assert "--nodes=2" in script and "--time=04:00:00" in script and "--partition=gpu" in script
    assert "--gpus-per-node=4" in script and "--account=abc123" in script
    hparams = json.loads((Path(info["run_dir"]) / "hparams.json").read_text())
    assert hparams == {"lr": 3.0e-4}
    proc = glaunch("plan", "exp.yaml", "--json", env=env, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    assert {row["name"] for row in json.loads(proc.stdout)["strategies"]} >= {"ddp", "zero2", "fsdp", "zero3"}
    proc = glaunch("submit", "exp.yaml", "--dry-run", "--runs-dir", str(cwd / "runs"), "--sweep",
                   "hparams.lr=1e-4,3e-4", "--sweep", "resources.nodes=1,2", env=env, cwd=cwd)
    assert proc.returncode == 0 and "4 element(s) in 2 job array(s)" in proc.stdout, proc.stderr


def readme_commands() -> list[str]:
    """Each command the "Using it" block shows, alternatives (`a | b`) apart, comments off."""
    out = []
    for line in bash_block("## Using it").splitlines():
        line = line.split("  #", 1)[0].strip()
        if not line.startswith("glaunch "):
            continue
        first, *rest = [part.strip() for part in line.split(" | ")]
        out += [first] + [f"glaunch {part}" for part in rest]
    return out


def resolve(words: list[str]) -> tuple[click.Command, list[str]]:
    """The click command the words name, and the words after it."""
    command: click.Command = cli
    words = list(words)
    while isinstance(command, click.Group) and words and words[0] in command.commands:
        command = command.commands[words.pop(0)]
    return command, words


def test_every_command_and_option_the_readme_shows_exists():
    commands = readme_commands()
    assert len(commands) >= 15, commands
    for line in commands:
        words = line.split()[1:]
        command, rest = resolve(words)
        assert not isinstance(command, click.Group), f"README: {line!r} names no command"
        options = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
        shown = set(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", " ".join(rest)))
        assert shown <= options, f"README: {line!r} shows {sorted(shown - options)}, not options of the command"


def test_bench_dry_run_says_which_checkout_it_times(tmp_path):
    """`python bench/dry_run.py` times the installed console script: it says when that
    imports another checkout's launcher than the one the bench belongs to."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import dry_run
    finally:
        sys.path.remove(str(REPO / "bench"))
    other = tmp_path / "other"
    (other / "launcher").mkdir(parents=True)
    (other / "launcher" / "__init__.py").write_text("")
    elsewhere = str(tmp_path)
    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    assert dry_run.timed_tree(dict(base, PYTHONPATH=str(REPO)), True, elsewhere) == "this checkout"
    assert dry_run.timed_tree(dict(base, PYTHONPATH=str(other)), True, elsewhere).startswith(
        f"{other}, NOT this checkout")
    assert dry_run.timed_tree(dict(base, PYTHONPATH=str(other)), False, elsewhere) == "this checkout"


def bundle_table() -> set[str]:
    """The names the first column of "The run bundle"'s table gives (`logs/` for a folder)."""
    section = README[README.index("## The run bundle"):]
    section = section[:section.index("\n## ", 3)]
    names = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names |= set(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return names


def test_every_file_of_a_rendered_bundle_is_in_the_readme_table(tmp_path, isolated_env):
    env = dict(isolated_env, PYTHONPATH=str(REPO))
    proc = glaunch("submit", "examples/deepspeed_zero2.yaml", "--site", "local-slurm", "--dry-run", "--json",
                   "--runs-dir", str(tmp_path / "runs"), env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    run_dir = Path(json.loads(proc.stdout)["run_dir"])
    written = {p.name + ("/" if p.is_dir() else "") for p in run_dir.iterdir()}
    assert {"job.sbatch", "env.sh", "ds_config.json", "resolved.yaml", "run.json", "logs/", "code/"} <= written
    missing = written - bundle_table()
    assert not missing, f"README's run bundle table does not name {sorted(missing)}"
