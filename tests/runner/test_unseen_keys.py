"""A KEY=VALUE override (or a swept key, see test_sweep.py) that changes the experiment but
no file the job reads is a warning at submit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import api, schedulers
from launcher.errors import ConfigError
from launcher.resolution.jobplan import SubmitContext
from launcher.resolution.resolve import resolve
from launcher.runner import submission
from launcher.runner.unseen import job_files, unseen_overrides

REPO = Path(__file__).resolve().parents[2]
WARNING = "overriding {} changes nothing the job sees (not in its args, env or hparams)"


def prepared(tmp_path, *overrides, site="local-slurm", sweep=()):
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        if sweep:
            return api.prepare_sweep("examples/torch_ddp.yaml", list(sweep), site=site, overrides=list(overrides),
                                     runs_dir=str(tmp_path / "runs"), dry_run=True)
        return api.prepare("examples/torch_ddp.yaml", site=site, overrides=list(overrides),
                           runs_dir=str(tmp_path / "runs"), dry_run=True)
    finally:
        os.chdir(cwd)


def test_an_override_only_the_planner_reads_is_a_warning(tmp_path, isolated_env):
    warnings = prepared(tmp_path, "model.params=5e6", "hparams.lr=0.1", "precision=fp32", "resources.nodes=2").warnings
    assert WARNING.format("model.params") in warnings
    assert not any(word in w for w in warnings for word in ("hparams.lr", "precision", "resources.nodes"))


def test_an_override_that_sets_what_is_there_is_no_warning(tmp_path, isolated_env):
    assert not any("changes nothing" in w for w in prepared(tmp_path, "resources.nodes=1").warnings)


def test_overrides_beside_a_sweep_are_checked_too(tmp_path, isolated_env):
    sweep = prepared(tmp_path, "model.params=5e6", "requeue.max=1", sweep=["hparams.lr=0.1,0.2"])
    assert sweep.unseen == () and sweep.unseen_overrides == ("model.params",)
    assert WARNING.format("model.params") in sweep.warnings


def test_unseen_overrides_compares_the_job_files_and_keeps_the_needed_ones():
    def files_of(overrides):
        if "name=x" not in overrides:
            raise ConfigError("missing", file="exp.yaml", key="name")
        record = "\n".join(overrides)
        job = "\n".join(o for o in overrides if not o.startswith("model."))
        return {"resolved.yaml": record, "job.sbatch": job, "env.sh": ""}

    assert unseen_overrides(["name=x", "model.params=1", "hparams.lr=2"], files_of) == ("model.params",)
    assert unseen_overrides([], files_of) == ()


def test_unseen_overrides_renders_as_often_for_three_hundred_overrides_as_for_ten():
    """Rendering without each override in turn is quadratic in their number: only those
    that could change nothing the job sees are rendered without (the last of a key's
    repeats, say; never one of hparams, whose every change is in hparams.json)."""

    def outcome(repeats):
        renders = []

        def files_of(overrides):
            renders.append(len(overrides))
            config = dict(o.split("=", 1) for o in overrides)    # the last of a key's values wins
            job = {key: value for key, value in config.items() if not key.startswith("model.")}
            return {"resolved.yaml": repr(sorted(config.items())), "job.sbatch": repr(sorted(job.items()))}

        overrides = [*(f"hparams.k{i}={i}" for i in range(repeats)), *(f"env.V{i}=x" for i in range(repeats)),
                     *(f"model.params={i}" for i in range(repeats)),
                     *(f"resources.nodes={i % 3 + 1}" for i in range(repeats))]
        return unseen_overrides(overrides, files_of), len(renders)

    (few, renders_few), (many, renders_many) = outcome(10), outcome(300)
    assert few == many == ("model.params",)
    assert renders_few == renders_many <= 5


def test_a_submission_resolves_as_often_with_two_hundred_overrides_as_with_twenty(tmp_path, isolated_env, monkeypatch):
    resolves = []
    real_resolve = submission.resolve
    monkeypatch.setattr(submission, "resolve", lambda *args, **kw: resolves.append(1) or real_resolve(*args, **kw))

    def outcome(count):
        resolves.clear()
        overrides = [*(f"hparams.k{i}={i}" for i in range(count // 2)),
                     *(f"model.params={i + 1}e6" for i in range(count // 2))]
        return prepared(tmp_path, *overrides, site="local").warnings, len(resolves)

    (few, resolves_few), (many, resolves_many) = outcome(20), outcome(200)
    assert WARNING.format("model.params") in few and few == many
    assert resolves_few == resolves_many


def _files_of(site, first=None):
    """What the submission compares: the bundle rendered with these overrides, under one run id."""
    def files_of(overrides):
        exp, loaded_site = submission.load(REPO / "examples/torch_ddp.yaml", site, overrides)
        ctx = SubmitContext(cwd=str(REPO), python=sys.executable, environ=dict(os.environ), run_id="r-1",
                            runs_dir=str(REPO / "runs"))
        plan = resolve(exp, loaded_site, submission.with_code_root(exp, loaded_site, ctx, {}))
        return schedulers.get(plan.scheduler).render(plan)
    return files_of


def _rendered_without_each(overrides, files_of):
    """The definition: the keys of the overrides without which the experiment differs and
    the job's files do not (each override left out in turn)."""
    try:
        base = files_of(overrides)
    except ConfigError:
        return ()
    keys = []
    for index, override in enumerate(overrides):
        try:
            without = files_of([*overrides[:index], *overrides[index + 1:]])
        except ConfigError:
            continue
        if without["resolved.yaml"] != base["resolved.yaml"] and job_files(without) == job_files(base):
            keys.append(override.partition("=")[0])
    return tuple(keys)


CORPUS = [
    ["model.params=5e6", "model.params=6e6", "hparams.lr=0.1", "model.params=7e6", "hparams.lr=0.2"],
    ["model.params=5e6", "model={params: 1e6}", "model.layers=2", "model={layers: 3}", "model.layers=4"],
    ["env.DS_ACCELERATOR=cpu", "env.NEW=1", "env={OTHER: 2}", "env.NEW=1", "env.GLOO_SOCKET_IFNAME=lo"],
    ["hparams={a: 1}", "hparams.a=2", "hparams.b={c: 1}", "hparams.b.c=1", "hparams.lr=0.01", "hparams={a: 2}"],
    ["resources.nodes=1", "resources.nodes=2", "resources.nodes=1", "checkpoint.keep=2", "checkpoint.keep=3"],
    ["strategy.name=deepspeed", "deepspeed.x=1", "deepspeed.x=2", "deepspeed={x: 2}", "deepspeed.y={z: 1}"],
    ["env.NCCL_DEBUG=INFO", "env.FOO=3", "env.NCCL_DEBUG=INFO", "env={BAR: 1}", "env.FOO=3", "env.DS_ACCELERATOR=cpu"],
    ["model.params=1e6", "model=null", "model.params=2e6", "watchdog.slow_node=report", "name=other"],
    ["model.params=1e6", "model.params=", "model.params=2e6", "resources.nodes=0", "resources.nodes=1"],
]


@pytest.mark.parametrize("overrides", CORPUS, ids=lambda overrides: overrides[0])
def test_unseen_overrides_says_what_rendering_without_each_override_says(overrides, isolated_env):
    files_of = _files_of("local-slurm")
    site_env = submission.load(REPO / "examples/torch_ddp.yaml", "local-slurm")[1].config.env
    assert unseen_overrides(overrides, files_of, site_env) == _rendered_without_each(overrides, files_of)


def _finished_within(seconds, command, env):
    """The command, run to its end within `seconds` (a loaded machine's bound: it takes a
    few), else the test fails saying so."""
    try:
        return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(command[:6])} ... still ran after {seconds} s")


def test_three_thousand_overrides_on_the_command_line_take_seconds(tmp_path, isolated_env):
    overrides = [*(f"hparams.k{i}={i}" for i in range(2000)), *(f"hparams.lr={i}" for i in range(500)),
                 *(f"model.params={i + 1}e6" for i in range(500))]
    proc = _finished_within(20, [sys.executable, "-m", "launcher.cli", "submit", "examples/torch_ddp.yaml",
                                 "--dry-run", "--runs-dir", str(tmp_path / "runs"), *overrides], isolated_env)
    assert proc.returncode == 0, proc.stderr
    assert WARNING.format("model.params") in proc.stderr


def test_twenty_thousand_overrides_through_the_api_take_seconds(tmp_path, isolated_env):
    script = """if True:
        import sys
        from launcher import api
        overrides = ([f"hparams.k{i}={i}" for i in range(10000)] + [f"hparams.k{i % 100}=x{i}" for i in range(5000)]
                     + [f"model.params={i + 1}e6" for i in range(5000)])
        run = api.submit("examples/torch_ddp.yaml", overrides=overrides, dry_run=True, runs_dir=sys.argv[1])
        print(sum("changes nothing" in warning for warning in run.warnings))
    """
    proc = _finished_within(30, [sys.executable, "-c", script, str(tmp_path / "runs")], isolated_env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1"]
