"""glaunch on the second local cluster, the one with Slurm's defaults (`scripts/local-slurm
up defaults`, site_configs/local-slurm-defaults.yaml): EnforcePartLimits=NO, typed GRES
asked for with --gres, a partition with MaxNodes=1. There a request over a partition's
limit is accepted and pends forever, so the profile must be checked against the cluster
before anything is queued, and a job that got in anyway must be reported.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import requires_slurm_defaults

from launcher.config.sites import load_site
from launcher.schedulers.cluster.check import check_site
from launcher.schedulers.cluster.facts import read_cluster
from launcher.schedulers.slurm.client import CLIENT
from slurmkit import REPO, glaunch, read_json, wait_until

SITE = "local-slurm-defaults"
STEPS = "entrypoint.args=[--steps,6]"


pytestmark = [pytest.mark.slurm, pytest.mark.slow, requires_slurm_defaults]


@pytest.fixture
def env(slurm_defaults_env):
    """The environment of a user of the defaults cluster: SLURM_CONF names it. (Asked of
    scripts/local-slurm, never of the nodes' state: the cluster's benches may hold every
    node while this module is collected.)"""
    CLIENT.forget_down()
    return slurm_defaults_env


def on_cluster(env, *cmd) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True, env=env).stdout


def jobs_of(env, run_id: str) -> list[str]:
    text = on_cluster(env, "squeue", "-h", "--states=all", "-u", getpass.getuser(), "-o", "%i|%k")
    return [line.split("|")[0] for line in text.splitlines() if line.split("|")[-1] == f"glaunch:{run_id}"]


def variant(tmp_path: Path, body: str, name: str = "variant") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\nextends: {SITE}\n{body}")
    return path


def test_the_shipped_profile_matches_the_defaults_cluster(env):
    report = check_site(load_site(SITE, REPO, os.environ).config, read_cluster(CLIENT))
    assert report.fatal == [], report.format()


STALE = ("partitions:\n"
         "  gpu: {gpu_type: a100, max_time: '1-00:00:00'}\n"
         "  short: {max_nodes: 2}\n")
STALE_GPU = [
    "partitions.gpu.gpu_type: the profile says a100, the GPUs of partition gpu on cluster glaunch_defaults are "
    "tesla; jobs would run on other hardware",
    "partitions.gpu.max_time: the profile says 1-00:00:00, partition gpu on cluster glaunch_defaults allows "
    "04:00:00; jobs over it would pend forever (EnforcePartLimits=NO)",
]
STALE_SHORT = [
    "partitions.short.max_nodes: the profile says 2, partition short on cluster glaunch_defaults gives a job at "
    "most 1 (MaxNodes=1); jobs over it would pend forever (EnforcePartLimits=NO)",
]


def test_a_stale_profile_is_refused_with_every_difference_and_nothing_queued(tmp_path, env):
    site = variant(tmp_path, STALE, "stale-defaults")
    report = check_site(load_site(str(site), REPO, os.environ).config, read_cluster(CLIENT))
    assert [str(d) for d in report.fatal] == STALE_GPU + STALE_SHORT, report.format()

    runs = tmp_path / "runs"
    proc = glaunch("submit", "examples/torch_ddp.yaml", "--site", str(site), "--runs-dir", str(runs), STEPS,
                   env=env, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert all(line in proc.stderr for line in STALE_GPU), proc.stderr
    (run_dir,) = runs.iterdir()
    record = read_json(run_dir / "run.json")
    assert record["state"] == "REFUSED" and record["job_id"] is None
    assert jobs_of(env, record["run_id"]) == []


UNKNOWING = "partitions:\n  gpu: {max_time: null}\n"     # the profile does not know gpu's MaxTime


def test_a_request_over_a_limit_the_profile_does_not_know_is_refused_at_submit(tmp_path, env):
    runs = tmp_path / "runs"
    proc = glaunch("submit", "--wait", "examples/torch_ddp.yaml", "--site", str(variant(tmp_path, UNKNOWING)),
                   "--runs-dir", str(runs), STEPS, "resources.time=05:00:00", env=env, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert ("resources.time: 05:00:00 asked, partition gpu on cluster glaunch_defaults allows 04:00:00 (the profile "
            "gives no partitions.gpu.max_time); this job would pend forever (EnforcePartLimits=NO)") in proc.stderr
    (run_dir,) = runs.iterdir()
    assert jobs_of(env, read_json(run_dir / "run.json")["run_id"]) == []


def test_a_job_over_a_limit_the_profile_does_not_know_is_reported_as_never_starting(tmp_path, env):
    """--no-check: nothing stops it before Slurm, which accepts it (EnforcePartLimits=NO)."""
    runs = tmp_path / "runs"
    proc = glaunch("submit", "--no-check", "--json", "examples/torch_ddp.yaml", "--site",
                   str(variant(tmp_path, UNKNOWING)), "--runs-dir", str(runs), STEPS, "resources.time=05:00:00",
                   env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    try:
        def blocked():
            # Slurm says PartitionConfig at submission, PartitionTimeLimit once its scheduler looked.
            summary = json.loads(glaunch("status", info["run_id"], "--json", env=env).stdout)
            return summary if "PartitionTimeLimit" in (summary["detail"] or "") else None

        summary = wait_until(blocked, 300, "status to say the job never starts")
        assert summary["reason"] == "never starts"
        assert summary["state"] == "PENDING"
        assert summary["detail"].startswith(
            f"job {info['job_id']} never starts: resources.time 05:00:00 is over the time limit of partition gpu "
            "on the cluster (the profile's partitions.gpu.max_time: (not set)) (Reason=PartitionTimeLimit)")
    finally:
        subprocess.run(["scancel", info["job_id"]], capture_output=True, timeout=30, env=env)


def test_wait_exits_3_on_a_job_over_a_limit_the_profile_does_not_know(tmp_path, env):
    runs = tmp_path / "runs"
    try:
        proc = glaunch("submit", "--no-check", "--wait", "examples/torch_ddp.yaml", "--site",
                       str(variant(tmp_path, UNKNOWING)), "--runs-dir", str(runs), STEPS, "resources.time=05:00:00",
                       env=env, timeout=300)
    except subprocess.TimeoutExpired:
        proc = None
    finally:
        for run_dir in runs.iterdir() if runs.exists() else []:
            job = read_json(run_dir / "run.json").get("job_id")
            if job:
                subprocess.run(["scancel", job], capture_output=True, timeout=30, env=env)
    assert proc is not None and proc.returncode == 3, proc and proc.stderr
    # Whichever of Slurm's two reasons for it --wait saw first (PartitionConfig at submission,
    # PartitionTimeLimit once the scheduler looked), it is said as never starting.
    assert "never starts" in proc.stderr, proc.stderr
    assert "Reason=PartitionTimeLimit" in proc.stderr or "Reason=PartitionConfig" in proc.stderr, proc.stderr
