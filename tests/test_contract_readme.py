"""README.md and the reference pages under docs/ say what the product does: the
experiment and site profile examples load, validate and render as written, every `glaunch`
command line their shell blocks show names a command, options of it, and arguments its
parser takes, and every relative link resolves to a file (and heading) that exists."""

import json
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from launcher import api
from launcher.cli import cli

REPO = Path(__file__).resolve().parent.parent
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DOCS = {path: path.read_text() for path in DOC_FILES}
# Every page, README first: a heading is looked for wherever it is.
ALL_TEXT = "\n".join(DOCS.values())


def section(heading: str) -> str:
    """The text under `heading` (a `## ` line of README or a docs page), up to the next `## `."""
    start = ALL_TEXT.index(f"\n{heading}\n") + 1
    end = ALL_TEXT.find("\n## ", start + len(heading))
    return ALL_TEXT[start:end if end >= 0 else len(ALL_TEXT)]


def fenced(text: str, language: str) -> list[str]:
    """Every ```language block of `text`, without its fences."""
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


def yaml_block(heading: str) -> str:
    """The first ```yaml block under `heading`."""
    return fenced(section(heading), "yaml")[0]


@pytest.fixture
def readme_configs(tmp_path):
    """The experiment (its site: mycluster) and site profile of docs/, as a user would save them."""
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


def shown_commands() -> list[tuple[str, str]]:
    """(page, command line) for each `glaunch` command a shell block of README or docs/
    shows: comments off, `a && b` and alternatives (`a | b`) apart, variable assignments
    before it dropped."""
    out = []
    for path, text in DOCS.items():
        for block in fenced(text, "bash"):
            for line in block.splitlines():
                for part in line.split("  #", 1)[0].split("&&"):
                    words = part.split()
                    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                        words.pop(0)
                    if words[:1] != ["glaunch"]:
                        continue
                    first, *rest = [alt.strip() for alt in " ".join(words).split(" | ")]
                    out += [(path.name, first)] + [(path.name, f"glaunch {alt}") for alt in rest]
    return out


def resolve(words: list[str]) -> tuple[click.Command, list[str]]:
    """The click command the words name, and the words after it."""
    command: click.Command = cli
    words = list(words)
    while isinstance(command, click.Group) and words and words[0] in command.commands:
        command = command.commands[words.pop(0)]
    return command, words


def as_typed(words: list[str]) -> list[str]:
    """A usage line's words as a user would type them: `[...]` opened, the first of `a|b`
    taken, a `...` of repetition left out, a number `N` made one."""
    out = []
    for word in words:
        word = re.sub(r"\[([^]|]*)\|[^]]*\]", r"\1", word).replace("[", "").replace("]", "")
        word = re.sub(r"\|[^\s,]*", "", word)
        if word and word != "...":
            out.append("1" if word == "N" else word)
    return out


def test_every_command_and_option_the_docs_show_exists_and_parses():
    """Each shown line's command exists and is not a group, each option it shows is one of
    that command's, and click's parser takes the whole line (arity, option values, choices):
    `make_context` parses and converts without running the command."""
    commands = shown_commands()
    assert len(commands) >= 30, commands
    assert {"README.md", "commands.md", "remote.md"} <= {page for page, _ in commands}
    for page, line in commands:
        command, rest = resolve(line.split()[1:])
        assert not isinstance(command, click.Group), f"{page}: {line!r} names no command"
        options = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
        shown = set(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", " ".join(rest)))
        assert shown <= options, f"{page}: {line!r} shows {sorted(shown - options)}, not options of the command"
        try:
            command.make_context(command.name, as_typed(rest))
        except click.ClickException as exc:
            pytest.fail(f"{page}: {line!r} does not parse: {exc.format_message()}")


def anchor_of(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_of_the_docs_resolves_and_every_page_is_linked():
    linked = set()
    for path, text in DOCS.items():
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            assert dest.exists(), f"{path.name}: link {target!r}: no file {dest}"
            linked.add(dest)
            if anchor:
                headings = re.findall(r"^#+ (.+)$", dest.read_text(), re.M)
                assert anchor in {anchor_of(h) for h in headings}, f"{path.name}: link {target!r}: no such heading"
    unlinked = {p.name for p in DOC_FILES[1:]} - {p.name for p in linked if p.parent == REPO / "docs"}
    assert not unlinked, f"README links to no page {sorted(unlinked)}"


def test_the_api_page_names_only_what_the_api_exports():
    shown = set(re.findall(r"\bapi\.([a-z_]+)\(", DOCS[REPO / "docs" / "api.md"]))
    assert len(shown) >= 12 and shown <= set(api.__all__), sorted(shown - set(api.__all__))


def test_the_laptop_profile_of_the_readme_validates(tmp_path, isolated_env):
    (tmp_path / "site_configs").mkdir()
    (tmp_path / "site_configs" / "mycluster.yaml").write_text(yaml_block("## 2. From a laptop"))
    proc = glaunch("sites", "validate", "mycluster", env=dict(isolated_env, PYTHONPATH=str(REPO)), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(glaunch("sites", "show", "mycluster", "--json", env=dict(isolated_env, PYTHONPATH=str(REPO)),
                               cwd=tmp_path).stdout)
    values = {row["key"]: row["value"] for row in shown["values"]}
    assert values["login.host"] == "login1.mycluster.org" and values["runs_root"] == "~/glaunch-runs"


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
    names = set()
    for line in section("## The run bundle").splitlines():
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
    assert not missing, f"docs/run-bundle.md's table does not name {sorted(missing)}"
