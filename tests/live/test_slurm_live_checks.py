"""glaunch against the live local Slurm cluster (scripts/local-slurm up) where a cluster
differs from what glaunch was told: a stale profile refused before anything is queued,
the controller unreachable, a submitting shell inside an allocation, an sbatch that timed
out after queueing, a job that will never start.

The cluster is shared: jobs are small and cancelled, the controller is never stopped
(a client pointed at a copy of slurm.conf whose SlurmctldPort is closed stands for it).
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import requires_slurm
from launcher.config.sites import load_site
from launcher.schedulers.cluster.check import check_site
from launcher.schedulers.cluster.facts import read_cluster
from launcher.schedulers.slurm.client import CLIENT
from slurmkit import (REPO, SITE, final_sacct_state, glaunch, job_id_of, out, read_json, start_submit, submit,
                      the_run_dir, wait_until)

pytestmark = [requires_slurm, pytest.mark.slurm, pytest.mark.slow]

STEPS = "entrypoint.args=[--steps,6]"


def stale_profile(tmp_path: Path) -> Path:
    """local-slurm with a GPU type the nodes do not have and a max_time over debug's."""
    text = (REPO / "site_configs" / f"{SITE}.yaml").read_text()
    text = text.replace(f"name: {SITE}", "name: stale-local", 1).replace("gpu_type: sim", "gpu_type: a100")
    text = text.replace('max_time: "02:00:00"', 'max_time: "3-00:00:00"', 1)
    path = tmp_path / "stale-local.yaml"
    path.write_text(text)
    return path


STALE_LINES = [
    "partitions.debug.gpu_type: the profile says a100, the GPUs of partition debug on cluster glaunch are sim; "
    "jobs would run on other hardware",
    "partitions.debug.max_time: the profile says 3-00:00:00, partition debug on cluster glaunch allows 02:00:00; "
    "jobs over it are refused at submission (EnforcePartLimits=ALL)",
]


def jobs_of(run_id: str) -> list[str]:
    """Slurm's jobs (any state it still lists) carrying the run's id."""
    text = out("squeue", "-h", "--states=all", "-u", getpass.getuser(), "-o", "%i|%k")
    return [line.split("|")[0] for line in text.splitlines() if line.split("|")[-1] == f"glaunch:{run_id}"]


def only_run(runs: Path) -> Path:
    (run_dir,) = [p for p in runs.iterdir() if (p / "run.json").exists()]
    return run_dir


@pytest.mark.release_smoke
def test_the_shipped_profile_matches_the_live_cluster():
    report = check_site(load_site(SITE, REPO, os.environ).config, read_cluster(CLIENT))
    assert report.fatal == [] and report.warnings == [], report.format()


def test_sites_check_refuses_a_stale_profile_naming_every_difference(tmp_path, isolated_env):
    report = check_site(load_site(str(stale_profile(tmp_path)), REPO, os.environ).config, read_cluster(CLIENT))
    assert [str(d) for d in report.fatal] == STALE_LINES + [
        "partitions.urgent.gpu_type: the profile says a100, the GPUs of partition urgent on cluster glaunch are "
        "sim; jobs would run on other hardware"]
    proc = glaunch("sites", "check", str(stale_profile(tmp_path)), env=isolated_env, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert all(line in proc.stdout + proc.stderr for line in STALE_LINES)
    assert "Traceback" not in proc.stderr


def test_submit_refuses_a_stale_profile_and_queues_nothing(tmp_path, isolated_env):
    runs = tmp_path / "runs"
    proc, _ = submit("examples/torch_ddp.yaml", runs, isolated_env, STEPS, site=str(stale_profile(tmp_path)),
                     wait=False, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"{tmp_path / 'stale-local.yaml'}: site stale-local does not match Slurm cluster glaunch; nothing was " \
           "submitted:" in proc.stderr
    for line in STALE_LINES:           # the job uses debug: urgent's difference is not this job's
        assert line in proc.stderr
    assert "partitions.urgent" not in proc.stderr
    record = read_json(only_run(runs) / "run.json")
    assert record["state"] == "REFUSED" and record["job_id"] is None
    assert jobs_of(record["run_id"]) == []


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unreachable_conf(tmp_path: Path) -> tuple[Path, int]:
    """A copy of the client's Slurm configuration whose SlurmctldPort nobody listens on."""
    src = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
    conf_dir = tmp_path / "slurm-unreachable"
    conf_dir.mkdir()
    for path in src.parent.iterdir():
        if path.is_file() and path.suffix == ".conf" and path.name != "slurmdbd.conf":
            shutil.copy(path, conf_dir / path.name)
    port = closed_port()
    conf = conf_dir / src.name
    text, n = re.subn(r"(?im)^SlurmctldPort=.*$", f"SlurmctldPort={port}", conf.read_text())
    conf.write_text(text if n else text + f"\nSlurmctldPort={port}\n")
    return conf, port


def assert_bounded(stderr: str) -> None:
    """The Slurm calls gave up within their bound (slurm_client.RetryPolicy's 40 s, plus
    the time to end the last attempt), as the message counts them."""
    m = re.search(r"\((\d+) attempt\(s\) in (\d+) s\)", stderr)
    assert m and int(m[2]) <= 45, stderr


@pytest.mark.release_only     # in the Slurm 24.11 sandbox, whose `main` is idle most of CI's run
def test_controller_unreachable_submit_and_status_end_within_a_minute(tmp_path, isolated_env):
    runs = tmp_path / "runs"
    # Long enough to be running still when the status that cannot reach Slurm gives up (40 s).
    proc, info = submit("examples/torch_ddp.yaml", runs / "first", isolated_env,
                        "entrypoint.args=[--steps,90,--seconds-per-step,1]", wait=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    first = info["run_id"]
    conf, port = unreachable_conf(tmp_path)
    down = dict(isolated_env, SLURM_CONF=str(conf))
    named = f"cannot reach the Slurm controller, slurmctld on {socket.gethostname()}"
    # What a status costs with the controller up, on this machine under its load now: the
    # minute the product promises is on top of starting Python and glaunch.
    start = time.monotonic()
    assert glaunch("status", first, "--json", env=isolated_env, timeout=300).returncode == 0
    baseline = time.monotonic() - start

    start = time.monotonic()
    status = glaunch("status", first, env=down, timeout=300)
    took = time.monotonic() - start
    assert status.returncode == 3 and took < 60 + baseline, (took, baseline, status.stderr)
    assert_bounded(status.stderr)
    assert named in status.stderr and f"port {port} (SlurmctldHost in {conf})" in status.stderr, status.stderr
    assert "Traceback" not in status.stderr
    record = read_json(runs / "first" / first / "run.json")
    assert record["unreachable"]["message"] in status.stderr

    start = time.monotonic()
    refused, _ = submit("examples/torch_ddp.yaml", runs / "second", down, STEPS, wait=False, timeout=300)
    took = time.monotonic() - start
    assert refused.returncode == 3 and took < 60 + baseline, (took, baseline, refused.stderr)
    assert_bounded(refused.stderr)
    assert named in refused.stderr and "Traceback" not in refused.stderr
    second = read_json(only_run(runs / "second") / "run.json")
    assert second["state"] == "REFUSED" and second["job_id"] is None
    assert second["reason"] == "unreachable" and second["detail"].startswith(named)

    # The controller answers again: the first run goes on, nothing was queued twice.
    status = glaunch("status", first, "--json", env=isolated_env, timeout=120)
    assert status.returncode == 0, status.stderr
    assert "unreachable" not in read_json(runs / "first" / first / "run.json")
    assert final_sacct_state(info["job_id"], timeout=180) == "COMPLETED"
    assert jobs_of(first) == [info["job_id"]]
    assert jobs_of(second["run_id"]) == []


def test_submit_from_an_allocation_shell_runs_with_the_size_it_asked(tmp_path, isolated_env):
    shell = dict(isolated_env, SLURM_JOB_ID="1", SLURM_NTASKS="1", SLURM_NNODES="1", SLURM_JOB_NUM_NODES="1",
                 SLURM_NODELIST="node9", SLURM_TASKS_PER_NODE="1", SBATCH_TIMELIMIT="1")
    proc, info = submit("examples/torch_ddp.yaml", tmp_path / "runs", shell, "resources.nodes=2", STEPS,
                        timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "glaunch: warning: ignoring SBATCH_TIMELIMIT from the environment" in proc.stderr
    job_id, run_dir = info["job_id"], tmp_path / "runs" / info["run_id"]
    assert read_json(run_dir / "result.json")["world_size"] == 4
    logs = {p.name: p.read_text() for p in (run_dir / "logs").glob(f"{job_id}_*_log.err")}
    assert len(logs) == 4
    for rank, node in {0: "node1", 1: "node1", 2: "node2", 3: "node2"}.items():
        assert f"rank {rank}/4 on {node}:" in logs[f"{job_id}_{rank}_log.err"], rank
    # The experiment's 20 minutes, not SBATCH_TIMELIMIT's one.
    assert out("sacct", "-n", "-P", "-X", "-j", job_id, "-o", "Timelimit").split() == ["00:20:00"]


def test_sbatch_that_timed_out_after_queueing_queues_the_run_once(tmp_path, isolated_env):
    """A fake sbatch in front of the real one: it queues the job, then hangs as if the
    controller's answer were lost (the preflight's `--test-only` it passes on)."""
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    real = shutil.which("sbatch")
    (fakes / "sbatch").write_text(f'#!/bin/bash\ncase " $* " in *" --test-only "*) exec "{real}" "$@";; esac\n'
                                  f'"{real}" "$@" >> "{fakes}/queued" 2>&1\nexec sleep 120\n')
    (fakes / "sbatch").chmod(0o755)
    env = dict(isolated_env, PATH=f"{fakes}{os.pathsep}{isolated_env['PATH']}")
    proc, info = submit("examples/torch_ddp.yaml", tmp_path / "runs", env, STEPS, wait=False, timeout=120)
    try:
        assert proc.returncode == 0, proc.stderr
        queued = re.findall(r"Submitted batch job (\d+)", (fakes / "queued").read_text())
        assert queued == [info["job_id"]]                     # one sbatch, and glaunch found its job
        assert jobs_of(info["run_id"]) == [info["job_id"]]
    finally:
        for job in re.findall(r"Submitted batch job (\d+)", (fakes / "queued").read_text()):
            subprocess.run(["scancel", job], capture_output=True, timeout=30)


def later_profile(tmp_path: Path) -> Path:
    """local-slurm whose jobs begin in an hour: the test makes them wait on a failed job
    before they could start."""
    site = tmp_path / "later.yaml"
    site.write_text(f"name: later\nextends: {SITE}\nsbatch: {{begin: 'now+1hour'}}\n")
    return site


def never_to_start(job_id: str) -> None:
    """Make the job depend on one that failed, and due now: Slurm then keeps it pending
    with Reason=DependencyNeverSatisfied (a user may edit their own job's dependency)."""
    failed = out("sbatch", "--parsable", "-A", "glaunch", "-t", "1", "-o", "/dev/null", "--wrap", "false").strip()
    assert final_sacct_state(failed) == "FAILED"
    out("scontrol", "update", f"JobId={job_id}", f"Dependency=afterok:{failed}")
    out("scontrol", "update", f"JobId={job_id}", "StartTime=now")


def test_a_job_that_never_starts_is_said_so_in_profile_terms(tmp_path, isolated_env):
    proc, info = submit("examples/torch_ddp.yaml", tmp_path / "runs", isolated_env, STEPS,
                        site=str(later_profile(tmp_path)), wait=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    try:
        never_to_start(info["job_id"])

        def blocked():
            summary = json.loads(glaunch("status", info["run_id"], "--json", env=isolated_env).stdout)
            return summary if summary["reason"] == "never starts" else None

        summary = wait_until(blocked, 300, "status to say the job never starts")
        assert summary["state"] == "PENDING"
        assert summary["detail"] == (
            f"job {info['job_id']} never starts: the run it waits for ended in a way its dependency excludes "
            f"(--after) (Reason=DependencyNeverSatisfied). It stays queued until cancelled (glaunch cancel "
            f"{info['run_id']})")
        text = glaunch("status", info["run_id"], env=isolated_env).stdout
        assert f"reason: never starts; job {info['job_id']} never starts" in text
        record = read_json(tmp_path / "runs" / info["run_id"] / "run.json")
        assert record["blocked"] is True and record["pending_reason"] == "DependencyNeverSatisfied"
    finally:
        subprocess.run(["scancel", info["job_id"]], capture_output=True, timeout=30)


def test_wait_exits_3_on_a_job_that_never_starts(tmp_path, isolated_env):
    runs = tmp_path / "runs"
    proc = start_submit("examples/torch_ddp.yaml", runs, isolated_env, STEPS, site=str(later_profile(tmp_path)))
    job_id = None
    try:
        job_id = job_id_of(the_run_dir(runs))
        never_to_start(job_id)
        try:
            _, stderr = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, stderr = proc.communicate()
    finally:
        if job_id:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
    assert proc.returncode == 3, stderr
    assert "never starts" in stderr and "DependencyNeverSatisfied" in stderr and "Traceback" not in stderr
