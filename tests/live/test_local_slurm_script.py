"""scripts/local-slurm: two clusters side by side on this host, each answering on its own
configuration, and a script that manages only its own daemons: taking `defaults` down and
up leaves `main` alone, and a process that merely carries a Slurm daemon's name (or a pid
file's stale number) is never stopped. Also what `defaults` exists for: Slurm's default
EnforcePartLimits=NO and typed GRES."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from conftest import requires_slurm, requires_slurm_defaults
from slurmkit import DEFAULTS, LOCAL_SLURM, MAIN, cluster_env, out, slurm_up, wait_until

pytestmark = [requires_slurm, requires_slurm_defaults, pytest.mark.slurm, pytest.mark.slow]

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="scripts/local-slurm starts and stops daemons as root")

DAEMONS = {MAIN: ["munged", "mariadb", "slurmdbd", "slurmctld", "slurmd node1", "slurmd node2"],
           DEFAULTS: ["munged", "mariadb", "slurmdbd", "slurmctld", "slurmd dnode1", "slurmd dnode2",
                     "slurmd dnode3"]}


def script(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(LOCAL_SLURM), *args], capture_output=True, text=True, timeout=timeout)


def daemons(cluster: str) -> dict[str, int]:
    """`status NAME`: the pid of each of the cluster's daemons that runs."""
    text = script("status", cluster, timeout=60).stdout
    return {m["name"]: int(m["pid"]) for m in re.finditer(r"^  (?P<name>[^:\n]+): running \(pid (?P<pid>\d+)\)$",
                                                           text, re.M)}


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def config_value(cluster: str, key: str) -> str:
    text = Path(cluster_env(cluster)["SLURM_CONF"]).read_text()
    match = re.search(rf"^{key}=(\S+)$", text, re.M)
    assert match, f"{key} is not in the configuration of {cluster}"
    return match[1]


def squeue_row(job_id: str, cluster: str) -> str:
    return out("squeue", "-h", "-j", job_id, "-o", "%T %r", cluster=cluster).strip()


def test_each_cluster_answers_on_its_own_configuration():
    expected = {MAIN: ("glaunch", {"debug", "urgent"}, {"node1", "node2"}),
                DEFAULTS: ("glaunch_defaults", {"gpu", "short"}, {"dnode1", "dnode2", "dnode3"})}
    ports = set()
    for cluster, (name, partitions, nodes) in expected.items():
        rows = [line.split() for line in out("sinfo", "-h", "-N", "-o", "%N %R %t", cluster=cluster).splitlines()]
        assert {row[1] for row in rows} == partitions, rows
        assert {row[0] for row in rows} == nodes, rows
        # In service: the other cluster's tests run beside these, so a node may be busy,
        # completing a job, or planned for a pending one by the backfill scheduler.
        assert all(row[2] in ("idle", "mix", "alloc", "comp", "plnd") for row in rows), rows
        config = out("scontrol", "show", "config", cluster=cluster)
        assert re.search(rf"^ClusterName\s+= {name}$", config, re.M), config
        ports.add(config_value(cluster, "SlurmctldPort"))
    assert len(ports) == 2


def test_defaults_accepts_a_job_over_a_partition_limit_and_leaves_it_pending():
    """EnforcePartLimits=NO: sbatch takes the job, it never starts. `main` (ALL) refuses it."""
    job = out("sbatch", "--parsable", "-p", "short", "-N2", "-t", "1", "-o", "/dev/null", "--wrap", "true",
              cluster=DEFAULTS).strip().split(";")[0]
    try:
        assert wait_until(lambda: squeue_row(job, DEFAULTS) == "PENDING PartitionNodeLimit" or None, 30,
                          "the reason PartitionNodeLimit")
        time.sleep(3)
        assert squeue_row(job, DEFAULTS) == "PENDING PartitionNodeLimit"
    finally:
        out("scancel", job, cluster=DEFAULTS)
    refused = subprocess.run(["sbatch", "--parsable", "-p", "debug", "-N3", "-o", "/dev/null", "--wrap", "true"],
                             capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, **cluster_env(MAIN)))
    assert refused.returncode != 0 and "node count" in refused.stderr.lower(), refused.stderr


def test_defaults_gpus_are_typed_gres():
    def visible(*gres: str) -> subprocess.CompletedProcess:
        return subprocess.run(["srun", "-N1", "-t", "1", *gres, "printenv", "CUDA_VISIBLE_DEVICES"],
                              capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, **cluster_env(DEFAULTS)))

    assert "Gres=gpu:tesla:2" in out("scontrol", "show", "node", "dnode1", cluster=DEFAULTS)
    assert visible("--gres=gpu:2").stdout.strip() == "0,1"
    assert visible("--gres=gpu:tesla:1").stdout.strip() == "0"
    other_type = visible("--gres=gpu:sim:1")
    assert other_type.returncode != 0 and "not available" in other_type.stderr, other_type.stderr


@needs_root
def test_up_is_idempotent_when_up():
    """A second `up` installs, configures and restarts nothing: the same daemons run on."""
    before = daemons(DEFAULTS)
    assert sorted(before) == sorted(DAEMONS[DEFAULTS])
    proc = script("up", DEFAULTS)
    assert proc.returncode == 0, proc.stderr
    assert not re.search(r"installing|restarting|stopping|cancelling", proc.stderr), proc.stderr
    assert daemons(DEFAULTS) == before


@needs_root
def test_down_and_up_of_defaults_touch_nothing_else():
    main_before = daemons(MAIN)
    assert sorted(main_before) == sorted(DAEMONS[MAIN])
    # Not ours, though named like a Slurm daemon: `down` must leave it running.
    foreign = subprocess.Popen(["bash", "-c", "exec -a slurmctld sleep 600"])
    ctld_pid_file = Path(config_value(DEFAULTS, "SlurmctldPidFile"))
    # Two jobs run when the cluster stops, and slurmctld saves both as running. `down` leaves
    # their processes alone: `live` goes on after `up`. Those of `stale` are then killed, as a
    # restart of the machine would: a fresh `up` must not let it hold its node, with nothing
    # behind it, until its time limit.
    stale, live = (out("sbatch", "--parsable", "-t", "20", "-o", "/dev/null", "--wrap", f"sleep {seconds}",
                       cluster=DEFAULTS).strip().split(";")[0] for seconds in (6001, 6002))
    for job in (stale, live):
        wait_until(lambda: squeue_row(job, DEFAULTS).startswith("RUNNING") or None, 60, f"job {job} to run")
    try:
        down = script("down", DEFAULTS)
        for pattern in (rf"^slurmstepd: \[{stale}\.", "^sleep 6001$"):
            subprocess.run(["pkill", "-KILL", "-f", pattern], timeout=30)
        assert down.returncode == 0, down.stderr
        assert not slurm_up(DEFAULTS)
        assert script("status", DEFAULTS).returncode != 0
        assert foreign.poll() is None
        assert daemons(MAIN) == main_before and all(alive(pid) for pid in main_before.values())
        assert slurm_up(MAIN)

        # Nothing is up: a second `down` does nothing and succeeds.
        again = script("down", DEFAULTS)
        assert again.returncode == 0, again.stderr

        # A stale pid file whose number now belongs to another slurmctld: not ours to stop.
        ctld_pid_file.write_text(f"{foreign.pid}\n")
        not_ours = script("down", DEFAULTS)
        assert not_ours.returncode == 0, not_ours.stderr
        assert foreign.poll() is None
        assert "slurmctld: stopped" in script("status", DEFAULTS).stdout
    finally:
        up = script("up", DEFAULTS)
        foreign.kill()
        foreign.wait(timeout=30)
    assert up.returncode == 0, up.stderr
    try:
        assert re.search(rf"cancelling job\(s\) [\d ]*\b{stale}\b[\d ]* of cluster defaults, left from before it "
                         "stopped", up.stderr), up.stderr
        assert not re.search(rf"cancelling job\(s\) .*\b{live}\b", up.stderr), up.stderr
        assert stale not in out("squeue", "-h", "-o", "%A", cluster=DEFAULTS).split()
        assert squeue_row(live, DEFAULTS).startswith("RUNNING")
    finally:
        out("scancel", live, cluster=DEFAULTS)
    assert slurm_up(DEFAULTS)
    assert sorted(daemons(DEFAULTS)) == sorted(DAEMONS[DEFAULTS])
    assert daemons(MAIN) == main_before
