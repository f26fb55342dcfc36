"""The code snapshot on the real local Slurm cluster: a script edited in the work tree while
its job waits in the queue does not reach the job, which runs the snapshot and ends with
the parameters the unedited code gives; run.json names the commit."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import requires_slurm
from slurmkit import REPO, SITE, glaunch, out, read_json, squeue_state, submit, wait_until

pytestmark = [requires_slurm, pytest.mark.slurm, pytest.mark.slow]

EXAMPLE = REPO / "examples" / "torch_ddp.py"
TRAIN = f"""\
import runpy, sys
from settings import STEPS
sys.argv = [{str(EXAMPLE)!r}, "--steps", str(STEPS)]
runpy.run_path({str(EXAMPLE)!r}, run_name="__main__")
"""


def git(cwd, *args) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@x", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@x")
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True, timeout=30,
                          env=env).stdout.strip()


def test_edit_while_queued_does_not_reach_the_job(tmp_path, isolated_env):
    repo = tmp_path / "proj"
    repo.mkdir()
    (repo / "train.py").write_text(TRAIN)
    (repo / "settings.py").write_text("STEPS = 20\n")
    (repo / "exp.yaml").write_text("name: snap\nentrypoint: {script: train.py}\nresources: {nodes: 1, time: '10'}\n"
                                   "checkpoint: {every_steps: 10}\nrequeue: {max: 1, signal_lead_s: 30}\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "twenty steps")
    commit = git(repo, "rev-parse", "HEAD")
    # The job is held in the queue (a start time far ahead) while the work tree changes, then let go.
    site = tmp_path / "site.yaml"
    site.write_text(f"name: later\nextends: {SITE}\nsbatch: {{begin: now+600}}\n")

    proc, info = submit(str(repo / "exp.yaml"), tmp_path / "runs", isolated_env, site=str(site), wait=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir, job_id = tmp_path / "runs" / info["run_id"], info["job_id"]
    try:
        (repo / "settings.py").write_text("STEPS = 30\n")
        (repo / "train.py").write_text("raise SystemExit('edited after submit')\n")
        assert squeue_state(job_id) == "PENDING"          # the edit happened while it waited
        out("scontrol", "update", f"JobId={job_id}", "StartTime=now")
        wait_until(lambda: read_json(run_dir / "run.json")["state"] in ("COMPLETED", "FAILED"), 600, "the run to end")
    finally:
        if squeue_state(job_id):
            glaunch("cancel", info["run_id"], env=isolated_env)
    record = read_json(run_dir / "run.json")
    assert record["state"] == "COMPLETED", record
    result = read_json(run_dir / "result.json")
    assert result["final_step"] == 20 and result["world_size"] == 2

    # The parameters of the unedited code: torch_ddp, 20 steps, 2 ranks, on the local site.
    local = glaunch("submit", "examples/torch_ddp.yaml", "--runs-dir", str(tmp_path / "local"),
                    "entrypoint.args=[--steps,20]", env=isolated_env)
    assert local.returncode == 0, local.stderr[-2000:]
    (local_dir,) = (tmp_path / "local").iterdir()
    assert result["param_sha256"] == read_json(local_dir / "result.json")["param_sha256"]

    origin = record["provenance"]
    assert origin["git"]["commit"] == commit and origin["git"]["branch"] == "main"
    assert origin["git"]["dirty"] is False and origin["git"]["patch"] is None
    assert origin["scheduler_version"].startswith("slurm")
    assert (run_dir / "code" / "settings.py").read_text() == "STEPS = 20\n"
    log = (run_dir / "logs" / f"{job_id}_0_log.err").read_text()
    assert f"python {run_dir}/code/train.py" in log
    status = glaunch("status", info["run_id"], env=isolated_env).stdout
    assert f"code: commit {commit[:12]} (main), clean tree" in status
    assert json.loads(glaunch("status", info["run_id"], "--json", env=isolated_env).stdout)["provenance"]["git"][
        "commit"] == commit
