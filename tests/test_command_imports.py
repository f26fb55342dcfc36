"""A command loads its own road: `glaunch submit --dry-run` renders and writes the bundle
without loading the code that follows, resumes or sweeps runs, talks SSH, logs a
submission's warnings or prints another command's text (bench/dry_run.py times it)."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# The modules of other commands' roads, and the packages below them only those load.
NOT_ON_THE_DRY_RUN = (
    "launcher.runner.manage", "launcher.runner.logs", "launcher.runner.resume",
    "launcher.runner.sweep_submission", "launcher.runner.site_tools", "launcher.runner.remote",
    "launcher.schedulers.ssh.connection", "launcher.views.console", "launcher.views.status_text",
    "launcher.views.plan_text", "launcher.views.listing", "logging",
    "launcher.runner.dependencies", "launcher.runner.lookup",
    # Slurm's submission and following: a dry run renders job.sbatch and asks Slurm nothing.
    "launcher.schedulers.cluster.check", "launcher.schedulers.cluster.facts", "launcher.schedulers.cluster.partition",
    "launcher.schedulers.cluster.report", "launcher.schedulers.cluster.scontrol_text",
    "launcher.schedulers.cluster.torchprobe", "launcher.schedulers.slurm.client", "launcher.schedulers.slurm.queries",
    "launcher.schedulers.slurm.recording", "launcher.schedulers.slurm.state", "launcher.schedulers.slurm.submit",
    "submitit",
)


def loaded_by_the_cli(*args: str, env: dict, cwd: Path = REPO) -> set[str]:
    """The modules loaded once the command line ran `glaunch ARGS` to its end, in a fresh
    interpreter (its output is dropped)."""
    code = ("import contextlib, io, sys\n"
            f"sys.argv = ['glaunch', *{list(args)!r}]\n"
            "from launcher import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n"
            "        cli.main()\n"
            "    except SystemExit as exc:\n"
            "        assert not exc.code, exc.code\n"
            "print(' '.join(sorted(sys.modules)))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


@pytest.mark.parametrize("site", ["local", "local-slurm"])
def test_a_dry_run_loads_no_other_commands_road(site, tmp_path, isolated_env):
    loaded = loaded_by_the_cli("submit", "examples/torch_ddp.yaml", "--dry-run", "--site", site,
                               "--runs-dir", str(tmp_path / "runs"), env=isolated_env)
    assert "launcher.runner.submission" in loaded         # it did run the submission
    assert not loaded & set(NOT_ON_THE_DRY_RUN), sorted(loaded & set(NOT_ON_THE_DRY_RUN))


def test_the_check_can_fail(tmp_path, isolated_env):
    """`glaunch list` loads the road that follows runs: the check above sees such a module."""
    loaded = loaded_by_the_cli("list", env=isolated_env)
    assert {"launcher.runner.manage", "launcher.views.listing"} <= loaded


# What only a submission loads: resolving a plan, rendering it, the planner (`status` of a
# run whose resolved.yaml names its model's size runs that one).
NOT_WHEN_FOLLOWING = (
    "launcher.resolution.resolve", "launcher.resolution.jobplan", "launcher.resolution.strategy",
    "launcher.resolution.planner", "launcher.rendering.render",
    "launcher.rendering.templating", "launcher.config.sites", "launcher.config.load", "launcher.runner.bundle",
    "launcher.runner.submission", "launcher.runner.snapshot", "submitit",
)


@pytest.mark.parametrize("args", [("--version",), ("list",), ("list", "--json"), ("status", "{run}")])
def test_following_a_run_loads_no_submission_road(args, tmp_path, isolated_env):
    """`list`, and `status` of a run that never started (a dry run's), load none of what
    resolves or renders a run: a command a user runs again and again starts fast."""
    runs = tmp_path / "runs"
    made = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", "examples/torch_ddp.yaml", "--dry-run",
                           "--runs-dir", str(runs), "--json"], cwd=REPO, env=isolated_env, capture_output=True,
                          text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    run = next(runs.iterdir())
    loaded = loaded_by_the_cli(*(a.format(run=run) for a in args), env=isolated_env)
    assert "launcher.cli" in loaded
    assert not loaded & set(NOT_WHEN_FOLLOWING), sorted(loaded & set(NOT_WHEN_FOLLOWING))
