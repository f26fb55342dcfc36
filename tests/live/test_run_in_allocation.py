"""`glaunch run` inside an existing allocation: refused (exit 2, nothing written) outside
one, on a non-Slurm site, or asking more nodes than it has; on the real local cluster,
inside `salloc -N2`: 4 ranks on both nodes with result.json, and a run interrupted with
Ctrl-C stops with a checkpoint that a later `glaunch run` resumes, ending with bitwise the
parameters of a run never interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import requires_slurm
from slurmkit import REPO, SITE, read_json, wait_until

EXAMPLE = "examples/torch_ddp.yaml"


def glaunch(*args, env, timeout=120):
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def without_allocation(env):
    return {k: v for k, v in env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


def test_outside_an_allocation_is_refused(tmp_path, isolated_env):
    proc = glaunch("run", EXAMPLE, "--site", SITE, "--runs-dir", str(tmp_path / "runs"),
                   env=without_allocation(isolated_env))
    assert proc.returncode == 2 and "SLURM_JOB_ID" in proc.stderr and "salloc" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()


def test_a_local_site_or_too_many_nodes_is_refused(tmp_path, isolated_env):
    inside = dict(without_allocation(isolated_env), SLURM_JOB_ID="4242", SLURM_JOB_NUM_NODES="1",
                  SLURM_JOB_NODELIST="node1")
    proc = glaunch("run", EXAMPLE, "--runs-dir", str(tmp_path / "runs"), env=inside)
    assert proc.returncode == 2 and "is not a Slurm site" in proc.stderr
    proc = glaunch("run", EXAMPLE, "--site", SITE, "--runs-dir", str(tmp_path / "runs"), "resources.nodes=2",
                   env=inside)
    assert proc.returncode == 2 and "resources.nodes" in proc.stderr and "the allocation (job 4242) has 1" in proc.stderr
    assert not (tmp_path / "runs").exists()


# --- on the local cluster --------------------------------------------------------------------------

SALLOC = ["salloc", "-N2", "--exclusive", "--gpus-per-node=2", "-p", "debug", "-A", "glaunch", "-t", "10"]


def in_salloc(tmp_path, env, *args, pid_file=None) -> subprocess.Popen:
    """`glaunch run ... --json` inside a new two-node allocation; its pid into `pid_file`."""
    command = " ".join(["exec", sys.executable, "-m", "launcher.cli", "run", "--json", *args])
    if pid_file is not None:
        command = f"echo $$ > {pid_file}; {command}"
    return subprocess.Popen([*SALLOC, "bash", "-c", command], cwd=REPO, env=without_allocation(env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(proc: subprocess.Popen, timeout: float = 900) -> dict:
    stdout, stderr = proc.communicate(timeout=timeout)
    assert stdout.strip().startswith("{"), stdout + stderr[-3000:]
    return json.loads(stdout)


@pytest.mark.slurm
@pytest.mark.release_only     # in the Slurm 24.11 sandbox, whose `main` is idle most of CI's run
@requires_slurm
def test_run_inside_salloc_then_interrupted_and_resumed_bitwise(tmp_path, isolated_env):
    steps = 120
    common = [EXAMPLE, "--site", SITE, "--runs-dir", str(tmp_path / "runs"), "resources.nodes=2"]

    # Uninterrupted: 4 ranks on the allocation's two nodes.
    whole = finished(in_salloc(tmp_path, isolated_env, *common, f"entrypoint.args=[--steps,{steps}]"))
    run_dir = Path(whole["run_dir"])
    assert whole["state"] == "COMPLETED" and whole["exit_code"] == 0
    result = read_json(run_dir / "result.json")
    assert result["world_size"] == 4 and result["final_step"] == steps
    record = read_json(run_dir / "run.json")
    allocation = record["allocation"]["job_id"]
    assert record["job_id"] == allocation and record["starts"][0]["state"] == "COMPLETED"
    for rank, node in ((0, "node1"), (1, "node1"), (2, "node2"), (3, "node2")):
        log = (run_dir / "logs" / f"{allocation}_{rank}_log.err").read_text()
        assert f"rank {rank}/4 on {node}:" in log
    assert "never submitted with sbatch" in (run_dir / "job.sbatch").read_text()
    assert "scontrol requeue" not in (run_dir / "job.sbatch").read_text()

    # Interrupted with Ctrl-C: the ranks stop with a checkpoint, in a checkpoint.dir a later run takes over.
    ckpt = tmp_path / "ckpt"
    pid_file = tmp_path / "glaunch.pid"
    slow = [*common, f"checkpoint.dir={ckpt}", "checkpoint.every_steps=1000",
            f"entrypoint.args=[--steps,{steps},--seconds-per-step,0.1,--log-every,1]"]
    proc = in_salloc(tmp_path, isolated_env, *slow, pid_file=pid_file)

    def progressed():
        runs = [p for p in (tmp_path / "runs").glob("*/logs/*_0_log.out") if p.parent.parent != run_dir]
        return runs and runs[0].read_text().count("step ") >= 20

    wait_until(progressed, 600, "the second run to make progress")
    os.kill(int(pid_file.read_text()), signal.SIGINT)
    stopped = finished(proc)
    assert stopped["state"] == "CANCELLED" and stopped["exit_code"] == 1
    first = read_json(Path(stopped["run_dir"]) / "run.json")
    at = first["starts"][0]["stopped_at"]
    assert at is not None and 20 <= at < steps and first["detail"].startswith("interrupted (Ctrl-C): stopped at step")

    # The same checkpoint.dir is that run's: a later run in another allocation is refused ...
    refused = subprocess.run([*SALLOC, sys.executable, "-m", "launcher.cli", "run", *common, f"checkpoint.dir={ckpt}"],
                             cwd=REPO, env=without_allocation(isolated_env), capture_output=True, text=True,
                             timeout=600)
    assert refused.returncode == 2 and f"holds the checkpoints of run {first['run_id']}" in refused.stderr
    # ... unless it takes them over by name: it resumes from that checkpoint, bitwise.
    resumed = finished(in_salloc(tmp_path, isolated_env, *common, f"checkpoint.dir={ckpt}",
                                 f"checkpoint.take_over={first['run_id']}", f"entrypoint.args=[--steps,{steps}]"))
    assert resumed["state"] == "COMPLETED"
    last = read_json(Path(resumed["run_dir"]) / "run.json")
    assert last["starts"][0]["resumed_from"] == at
    assert read_json(Path(resumed["run_dir"]) / "result.json")["param_sha256"] == result["param_sha256"]
