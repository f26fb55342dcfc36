"""Submission through submitit to the real local Slurm cluster (two nodes, 2 GRES GPUs each):
the examples on 2 nodes in both launch modes, the exact bytes sbatch received, the same
training result as the local site, preflight refusals, and the commands that follow runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import requires_slurm
from slurmkit import (REPO, SITE, assert_completed_on_two_nodes, final_sacct_state, glaunch, out,
                      processes_mentioning, read_json, squeue_state, submit, wait_until)

pytestmark = [requires_slurm, pytest.mark.slurm, pytest.mark.slow]

# Lightning's and DeepSpeed's examples on two nodes: the uninterrupted runs their preemption
# tests compare with (tests/live/test_slurm_requeue.py), checked the same way.
TWO_NODES = {
    "torch-srun": ("examples/torch_ddp.yaml", ["launcher=srun"], 40),
    "torch-torchrun": ("examples/torch_ddp.yaml", ["launcher=torchrun"], 40),
}


@pytest.mark.parametrize("case", [pytest.param(case, marks=pytest.mark.release_smoke) if case == "torch-srun" else case
                                  for case in sorted(TWO_NODES)])
def test_example_on_two_nodes(case, tmp_path, isolated_env):
    example, overrides, steps = TWO_NODES[case]
    torchrun = "torchrun" in case
    # torchrun: without --json, stdout is the --wait console a user sees.
    proc, info = submit(example, tmp_path / "runs", isolated_env, "resources.nodes=2", *overrides,
                        console=torchrun)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    job_id, run_dir = info["job_id"], tmp_path / "runs" / info["run_id"]
    assert info["state"] == "COMPLETED"
    assert_completed_on_two_nodes(run_dir, job_id, steps, tasks_per_rank=not torchrun)
    if torchrun:
        # One task (a torchrun agent) per node, whose node rank is its Slurm node id:
        # ranks 0-1 on node1 (task 0), 2-3 on node2 (task 1), as srun places them.
        logs = {p.name: p.read_text() for p in (run_dir / "logs").glob(f"{job_id}_*_log.err")}
        assert len(logs) == 2
        for task, node in ((0, "node1"), (1, "node2")):
            log = logs[f"{job_id}_{task}_log.err"]
            assert f"glaunch: node {task} on {node}: torchrun --nnodes=2 --nproc-per-node=2" in log
            joined = re.findall(r"joined gloo: rank (\d)/4, local rank (\d), node (\d) \((node\d)\)", log)
            assert sorted(joined) == [(str(2 * task + local), str(local), str(task), node) for local in (0, 1)], joined
        # The --wait console follows global rank 0's output: its training lines.
        assert f"step 10/{steps} loss" in proc.stdout and f"done: step {steps} param_sha256" in proc.stdout, \
            proc.stdout[-3000:]
        _check_torchrun_logs(run_dir, isolated_env)


def _check_torchrun_logs(run_dir, env):
    """`glaunch logs` tags a torchrun task's lines with its node and global ranks;
    `--rank N` is global rank N alone: its worker's own log (torchrun's --log-dir)."""
    shown = glaunch("logs", str(run_dir), env=env)
    assert shown.returncode == 0, shown.stderr[-2000:]
    lines = shown.stdout.splitlines()
    assert any(line.startswith("[node0 r0-1] done: step ") for line in lines), lines[-20:]
    assert any(re.match(r"\[node1 r2-3!\] glaunch\[rank 2\]: joined gloo: rank 2/4", line) for line in lines)
    assert {line.split("]")[0] + "]" for line in lines} <= {"[node0 r0-1]", "[node0 r0-1!]", "[node1 r2-3]",
                                                             "[node1 r2-3!]"}
    rank3 = glaunch("logs", str(run_dir), "--rank", "3", env=env).stdout.splitlines()
    assert rank3 and all(line.startswith(("[r3]", "[r3!]")) for line in rank3), rank3[:5]
    assert any("joined gloo: rank 3/4" in line for line in rank3)
    assert not any("joined gloo: rank 2/4" in line for line in rank3), rank3[:5]


def other_torch(folder: Path) -> tuple[Path, str]:
    """A second torch on the nodes' path, the installed one under another version: its
    files linked, its version.py rewritten. (The folder, the version it says.)"""
    import torch

    real, version = Path(torch.__file__).parent, "2.99.0+other"
    (folder / "torch").mkdir(parents=True)
    for entry in real.iterdir():
        if entry.name != "version.py":
            (folder / "torch" / entry.name).symlink_to(entry)
    text = re.sub(r"(?m)^__version__ = .*$", f"__version__ = {version!r}", (real / "version.py").read_text())
    (folder / "torch" / "version.py").write_text(text)
    return folder, version


def test_same_parameters_locally_and_on_slurm_and_the_nodes_torch_is_named(tmp_path, isolated_env):
    """Same seed, same world size (2): the launch path changes nothing of the training. The
    nodes import another torch than the submitting one (a second one first on their path):
    the start records it per node and `status` names the difference."""
    import torch

    args = "entrypoint.args=[--steps,30]"
    local = glaunch("submit", "examples/torch_ddp.yaml", "--runs-dir", str(tmp_path / "local"), args,
                    env=isolated_env)
    assert local.returncode == 0, local.stderr[-2000:]
    path, version = other_torch(tmp_path / "other-torch")
    proc, info = submit("examples/torch_ddp.yaml", tmp_path / "slurm", isolated_env, "resources.nodes=1", args,
                        f"env.PYTHONPATH={path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (local_dir,) = (tmp_path / "local").iterdir()
    local_result = read_json(local_dir / "result.json")
    slurm_result = read_json(tmp_path / "slurm" / info["run_id"] / "result.json")
    assert local_result["world_size"] == slurm_result["world_size"] == 2
    assert local_result["param_sha256"] == slurm_result["param_sha256"]

    start = read_json(tmp_path / "slurm" / info["run_id"] / "run.json")["starts"][-1]
    assert start["versions"]["node1"]["torch"] == version, start
    status = glaunch("status", info["run_id"], env=isolated_env)
    assert f"warning: the ranks import torch {version} on node1, not the {torch.__version__} the run was " \
           "submitted with" in status.stdout, status.stdout


# --- preflight: sbatch --test-only refuses, glaunch says why in the profile's terms ------------

def _site_variant(tmp_path, body: str):
    path = tmp_path / "variant.yaml"
    path.write_text(f"name: variant\nextends: {SITE}\n{body}")
    return path


# A profile that disagrees with the cluster is refused by the check against the live cluster
# (before sbatch is asked); what the profile cannot know is refused by sbatch --test-only.
PREFLIGHT = {
    # kind: (site profile additions, experiment overrides, expected words in the message, who refuses)
    "unknown partition": ("partitions: {ghost: {gpus_per_node: 2, max_nodes: 2}}\n",
                          ["resources.partition=ghost"], "partitions.ghost: cluster glaunch has no partition ghost",
                          "check"),
    "gpus over the node": ("partitions: {debug: {gpus_per_node: 4}}\n", [],
                           "partitions.debug.gpus_per_node: the profile says 4", "check"),
    "time over the limit": ("partitions: {debug: {max_time: '12:00:00'}}\n", ["resources.time=10:00:00"],
                            "partitions.debug.max_time: the profile says 12:00:00", "check"),
    "unknown account": ("account: nosuch\n", [], "account: the profile says nosuch", "check"),
    "too many nodes": ("partitions: {debug: {max_nodes: 4}}\n", ["resources.nodes=3"],
                       "partitions.debug.max_nodes: the profile says 4", "check"),
    "unknown qos": ("qos: nosuchqos\n", [], "qos: the profile says nosuchqos", "check"),
    "memory over the node": ("partitions: {debug: {mem_gb: null}}\n", ["resources.mem_gb=100"],
                             "partition debug on cluster glaunch has none of its 2 nodes with that much", "check"),
    # A reservation is no part of what the check reads: sbatch --test-only refuses it.
    "unknown reservation": ("sbatch: {reservation: nosuch}\n", [], "sbatch --test-only refused the job",
                            "preflight"),
}


@pytest.mark.parametrize("kind", sorted(PREFLIGHT))
def test_preflight_refusal(kind, tmp_path, isolated_env):
    body, overrides, expected, refuser = PREFLIGHT[kind]
    site = _site_variant(tmp_path, body)
    name = f"preflight-{kind.replace(' ', '-')}"
    proc = glaunch("submit", "examples/torch_ddp.yaml", "--site", str(site), "--runs-dir", str(tmp_path / "runs"),
                   f"name={name}", *overrides, env=isolated_env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert expected in proc.stderr, proc.stderr
    marker = "sbatch said:" if refuser == "preflight" else "does not match Slurm cluster"
    assert marker in proc.stderr and "Traceback" not in proc.stderr
    # Nothing reached the queue.
    assert out("squeue", "-h", "-n", name).strip() == ""
    assert out("sacct", "-n", "-X", "--name", name, "-o", "JobID").strip() == ""
    (run_dir,) = (tmp_path / "runs").iterdir()
    record = read_json(run_dir / "run.json")
    assert record["state"] == "REFUSED" and record["job_id"] is None


# --- following and managing runs --------------------------------------------------------------

def test_status_logs_list_cancel_on_a_real_job(tmp_path, isolated_env):
    proc, info = submit("examples/torch_ddp.yaml", tmp_path / "runs", isolated_env, "resources.nodes=2",
                        "entrypoint.args=[--steps,2000,--seconds-per-step,0.2,--log-every,5]", wait=False)
    assert proc.returncode == 0, proc.stderr
    assert f"job {info['job_id']}" in glaunch("status", info["run_id"], env=isolated_env).stdout
    run_id, job_id, run_dir = info["run_id"], info["job_id"], tmp_path / "runs" / info["run_id"]

    def running_with_progress():
        status = json.loads(glaunch("status", run_id, "--json", env=isolated_env).stdout)
        logs = glaunch("logs", run_id, env=isolated_env).stdout
        return status["state"] == "RUNNING" and "[r0] step " in logs and status

    status = wait_until(running_with_progress, 600, "the job to run and log steps")
    assert status["job_id"] == job_id and status["accounting"] is True and status["site"] == SITE

    logs = glaunch("logs", run_id, env=isolated_env).stdout
    for rank in range(4):
        assert f"[r{rank}!] glaunch: rank {rank}/4 on " in logs, rank
    only_two = glaunch("logs", run_id, "--rank", "2", env=isolated_env).stdout
    assert only_two and all(line.startswith("[r2") for line in only_two.splitlines())

    listed = json.loads(glaunch("list", "--json", env=isolated_env).stdout)["runs"]
    row = next(r for r in listed if r["run_id"] == run_id)
    assert row["state"] == "RUNNING" and row["site"] == SITE and row["nodes"] == 2
    assert run_id in glaunch("list", env=isolated_env).stdout

    cancel = glaunch("cancel", run_id, env=isolated_env)
    assert cancel.returncode == 0 and f"cancelled job {job_id}" in cancel.stdout
    wait_until(lambda: squeue_state(job_id) == "", 300, "the job to leave the queue")
    assert final_sacct_state(job_id) == "CANCELLED"
    assert json.loads(glaunch("status", run_id, "--json", env=isolated_env).stdout)["state"] == "CANCELLED"
    # No task, torchrun worker or end-of-start step outlives the job.
    wait_until(lambda: not processes_mentioning(str(run_dir)), 120, "the job's processes to end")
    # -f on a finished run prints what there is and returns.
    followed = glaunch("logs", run_id, "-f", env=isolated_env, timeout=60)
    assert followed.returncode == 0 and "[r0] step " in followed.stdout


def test_status_without_accounting_says_so_and_a_plain_scancel_ends_the_run_cancelled(tmp_path, isolated_env):
    """A cluster without slurmdbd: sacct fails, so states come from squeue alone. A stand-in
    sacct that fails like Slurm's does is put on PATH (accounting cannot be switched off
    under the running cluster). Then the user's own `scancel` of the running job (not
    `glaunch cancel`): its SIGTERM stops the ranks as the time limit's warning would, yet
    the run ends CANCELLED and is neither requeued nor resubmitted."""
    proc, info = submit("examples/torch_ddp.yaml", tmp_path / "runs", isolated_env,
                        "entrypoint.args=[--steps,900,--seconds-per-step,0.1]", wait=False)
    assert proc.returncode == 0, proc.stderr
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sacct").write_text("#!/bin/sh\necho 'sacct: error: Slurm accounting storage is disabled' >&2\nexit 1\n")
    (fake / "sacct").chmod(0o755)
    env = dict(isolated_env, PATH=f"{fake}:{isolated_env['PATH']}")
    wait_until(lambda: json.loads(glaunch("status", info["run_id"], "--json", env=env).stdout)["state"]
               in ("RUNNING", "COMPLETED"), 600, "the job to start")
    status = glaunch("status", info["run_id"], env=env)
    assert "no Slurm accounting here: states come from squeue only" in status.stdout
    assert json.loads(glaunch("status", info["run_id"], "--json", env=env).stdout)["accounting"] is False
    record = tmp_path / "runs" / info["run_id"] / "run.json"

    def stepping() -> bool:
        progress = json.loads(glaunch("status", info["run_id"], "--json", env=env).stdout)["progress"]
        return bool(progress) and progress["step"] >= 5

    wait_until(stepping, 300, "the ranks to take steps")
    subprocess.run(["scancel", info["job_id"]], capture_output=True, timeout=30, check=True)
    wait_until(lambda: read_json(record)["state"] != "RUNNING" or None, 180, "the job's end to be recorded")
    ended = json.loads(glaunch("status", info["run_id"], "--json", env=env).stdout)
    assert ended["state"] == "CANCELLED", ended
    assert [(s["job_id"], s["state"], s["reason"]) for s in ended["starts"]] == [(info["job_id"], "CANCELLED",
                                                                                  "cancelled")]
    wait_until(lambda: squeue_state(info["job_id"]) == "", 300, "the job to leave the queue")
    queued = out("squeue", "-h", "-o", "%k")
    assert f"glaunch:{info['run_id']}" not in queued.split(), queued


@pytest.mark.release_smoke
def test_sites_detect_writes_a_profile_that_validates(tmp_path, isolated_env):
    target = tmp_path / "detected.yaml"
    proc = glaunch("sites", "detect", "--name", "detected", "-o", str(target), env=isolated_env)
    assert proc.returncode == 0, proc.stderr
    validate = glaunch("sites", "validate", str(target), env=isolated_env)
    assert validate.returncode == 0, validate.stderr
    show = json.loads(glaunch("sites", "show", str(target), "--json", env=isolated_env).stdout)
    values = {row["key"]: row["value"] for row in show["values"]}
    assert values["name"] == "detected" and values["default_partition"] == "debug"
    assert values["account"] == "glaunch" and values["gpu_directive"] == "gpus-per-node"
    assert values["partitions.debug.gpus_per_node"] == 2 and values["partitions.debug.gpu_type"] == "sim"
    assert values["partitions.debug.cpus_per_node"] == 4 and values["partitions.debug.max_nodes"] == 2
    assert values["partitions.debug.max_time"] == "02:00:00" and values["partitions.debug.preemptible"] is True
    assert values["partitions.urgent.max_time"] == "00:30:00" and values["partitions.urgent.preemptible"] is False
    # The detected profile submits for real.
    run = glaunch("submit", "examples/torch_ddp.yaml", "--site", str(target), "--runs-dir", str(tmp_path / "runs"),
                  "--wait", "entrypoint.args=[--steps,10]", env=isolated_env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    # Refuses to overwrite.
    again = glaunch("sites", "detect", "-o", str(target), env=isolated_env)
    assert again.returncode == 2 and "already exists" in again.stderr


def test_dry_run_needs_no_slurm(tmp_path, isolated_env):
    env = dict(isolated_env, PATH="/nonexistent")
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit",
                           "examples/torch_ddp.yaml", "--site", SITE, "--dry-run", "--runs-dir",
                           str(tmp_path / "runs")], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --gpus-per-node=2" in proc.stdout
