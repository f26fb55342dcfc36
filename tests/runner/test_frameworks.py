"""A plain Lightning script (one that imports Lightning and not glaunch's runtime) gets the
time limit's warning as SIGUSR1, the signal Lightning's SLURMEnvironment saves and requeues
on; every other script keeps SIGUSR2, glaunch's stop request. Decided at submit from the
entry script's text (launcher.runner.frameworks), kept by `glaunch resume`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launcher.runner import frameworks

PLAIN_LIGHTNING = "import lightning as L\nfrom lightning.pytorch.demos import BoringModel\n"
OLD_LIGHTNING = "import os\n\nimport pytorch_lightning as pl\n"
WITH_RUNTIME = ("import lightning as L\n"
                "from launcher.runtime.lightning import GlaunchCallback, cluster_environment\n")


@pytest.mark.parametrize("text, signal", [
    (PLAIN_LIGHTNING, "USR1"),
    (OLD_LIGHTNING, "USR1"),
    (WITH_RUNTIME, "USR2"),
    ("import torch\n# import lightning is only a comment here\nprint('lightning')\n", "USR2"),
    ("import torch.distributed as dist\n", "USR2"),
])
def test_the_warning_signal_follows_the_script_s_imports(tmp_path, text, signal):
    script = tmp_path / "train.py"
    script.write_text(text)
    assert frameworks.warning_signal(str(script)) == signal


def test_an_unreadable_script_or_a_module_keeps_glaunch_s_signal(tmp_path):
    assert frameworks.warning_signal(str(tmp_path / "missing.py")) == "USR2"
    assert frameworks.warning_signal(str(tmp_path)) == "USR2"          # a folder
    assert frameworks.warning_signal(None) == "USR2"
    assert frameworks.recorded_signal("USR1") == "USR1"
    assert frameworks.recorded_signal("KILL") == frameworks.recorded_signal(None) == "USR2"


def submit_dry(tmp_path: Path, text: str, env) -> Path:
    (tmp_path / "train.py").write_text(text)
    (tmp_path / "exp.yaml").write_text("name: fw\nentrypoint: {script: train.py}\n"
                                       "resources: {time: '5'}\nrequeue: {signal_lead_s: 10}\n")
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", "exp.yaml", "--dry-run", "--runs-dir",
                           "runs"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    return run_dir


@pytest.mark.parametrize("text, signal", [(PLAIN_LIGHTNING, "USR1"), (WITH_RUNTIME, "USR2")])
def test_the_job_warns_with_the_script_s_signal(tmp_path, isolated_env, text, signal):
    run_dir = submit_dry(tmp_path, text, isolated_env)
    assert f"--signal={signal}@10" in (run_dir / "job.sbatch").read_text()
    assert yaml.safe_load((run_dir / "resolved.yaml").read_text())["derived"]["warning_signal"] == signal


def test_slurm_warns_a_plain_lightning_job_with_sigusr1():
    import dataclasses

    from launcher.config.load import load_experiment
    from launcher.config.sites import load_site
    from launcher.resolution.jobplan import SubmitContext
    from launcher.resolution.resolve import resolve
    from launcher.schedulers.slurm.script import sbatch_directives

    repo = Path(__file__).resolve().parents[2]
    environ = {"HOME": "/home/alice", "USER": "alice"}
    plan = resolve(load_experiment(repo / "examples" / "torch_ddp.yaml", ["requeue.signal_lead_s=45"]),
                   load_site("local-slurm", Path("/nonexistent"), environ),
                   SubmitContext(cwd="/home/alice/exp", python="/usr/bin/python3", environ=environ, run_id="fw-1"))
    assert "#SBATCH --signal=USR2@45" in sbatch_directives(plan)
    usr1 = dataclasses.replace(plan, recovery=dataclasses.replace(plan.recovery, warning_signal="USR1"))
    assert "#SBATCH --signal=USR1@45" in sbatch_directives(usr1)


def test_a_resume_keeps_the_signal_the_submission_chose(tmp_path, isolated_env):
    """`glaunch resume` re-renders the job from resolved.yaml: a plain Lightning run keeps
    SIGUSR1 though the script (over SSH: on the cluster only) is not read again."""
    import dataclasses

    from launcher.resolution.resolve import resolve
    from launcher.runner.resumable import RecordedConfig

    run_dir = submit_dry(tmp_path, PLAIN_LIGHTNING, isolated_env)
    recorded = RecordedConfig.read(run_dir)
    exp, site = recorded.load([])
    plan = resolve(exp, site, recorded.context(exp, site))
    assert plan.recovery.warning_signal == "USR2"                 # resolution alone does not read the script
    assert recorded.conventions(plan).recovery.warning_signal == "USR1"
    usr1 = dataclasses.replace(plan, recovery=dataclasses.replace(plan.recovery, warning_signal="USR1"))
    assert recorded.conventions(usr1).recovery.warning_signal == "USR1"
