"""A KEY=VALUE override (or a swept key, see test_sweep.py) that changes the experiment but
no file the job reads is a warning at submit."""

from __future__ import annotations

import os
from pathlib import Path

from launcher import api
from launcher.errors import ConfigError
from launcher.runner.unseen import unseen_overrides

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
