"""Clusters shaped unlike the local one (tests/recorded_cluster/): `glaunch sites detect`
gives a profile that loads and that `glaunch sites check` passes; the check refuses,
before submission and naming the limit, a job that can never run there; the sbatch
rendered for the detected profile is right for the cluster and shell-clean.

- hopper (Slurm 23.11): the default partition not first, node ranges, typed GRES beside
  nvme, nodes of two sizes in one partition, MemSpecLimit, ThreadsPerCore=2, MIG slices,
  a CPU partition, MaxCPUsPerNode/MaxMemPerNode, AllowAccounts/AllowQos, INACTIVE, DOWN,
  Hidden and RootOnly partitions, a drained node whose Reason holds `Gres=`;
- cpuonly (Slurm 24.05): no GRES anywhere, DenyAccounts, the default partition last;
- gpufarm (Slurm 22.05, select/cons_res): GPUs only as --gres;
- a generated cluster of thousands of nodes in dozens of partitions.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import schedulers
from launcher.config.load import load_experiment
from launcher.config.sites import load_site
from launcher.errors import ConfigError, SchedulerError
from launcher.config import slurmtime
from launcher.resolution.jobplan import SubmitContext
from launcher.resolution.resolve import resolve
from launcher.schedulers.cluster.check import Request, compare, site_mapping
from launcher.schedulers.cluster.facts import parse_cluster
from launcher.schedulers.cluster.detect import detect_profile, render_profile
from launcher.schedulers.cluster.scontrol_text import parse_records, split_scontrol

RECORDED = Path(__file__).parent.parent / "recorded_cluster"
REPO = Path(__file__).resolve().parents[2]


def recorded(name: str) -> str:
    """The command's output, verbatim, without the file's first line (the command)."""
    return (RECORDED / name).read_text(encoding="utf-8").partition("\n")[2]


def detect(text: str, name: str, account: str | None = None, user: str = "alice"):
    parts, nodes, settings = split_scontrol(text)
    return detect_profile(name, parts, nodes, settings=settings, account=account, user=user)


def loaded(tmp_path: Path, text: str, name: str, account: str | None = None):
    """The detected profile written as `sites detect` writes it, and loaded as a site."""
    found = detect(text, name, account)
    path = tmp_path / f"{name}.yaml"
    path.write_text(render_profile(found.profile, name, found.notes), encoding="utf-8")
    return load_site(str(path), tmp_path, {"HOME": str(tmp_path / "home")})


HOPPER = recorded("hopper.scontrol.txt")
CPUONLY = recorded("cpuonly.scontrol.txt")
GPUFARM = recorded("gpufarm.scontrol.txt")
HOPPER_ACCOUNTING = dict(assoc_text=recorded("hopper.assoc.txt"), qos_text=recorded("hopper.qos.txt"), user="alice")


# --- detect ----------------------------------------------------------------------------------


def test_hopper_detected():
    found = detect(HOPPER, "hopper", account="proj1")
    profile = found.profile
    assert profile["default_partition"] == "gpu"           # Default=YES, second in scontrol's order
    assert profile["gpu_directive"] == "gpus-per-node"     # select/cons_tres
    assert list(profile["partitions"]) == ["debug", "gpu", "mig", "cpu", "cpu-shared", "preview"]
    parts = profile["partitions"]
    # RealMemory=515000 less MemSpecLimit=8192 MB: 494 GB, not 502; the drained node's Reason
    # ("... run with Gres=gpu:h100:3 ...") does not replace its Gres.
    assert parts["gpu"] == {"gpus_per_node": 4, "gpu_type": "h100", "gpu_mem_gb": None, "cpus_per_node": 48,
                            "mem_gb": 494, "max_nodes": 17, "max_time": "2-00:00:00"}
    # 14 MIG slices a node, but CUDA shows a process one: one rank a node.
    assert parts["mig"]["gpus_per_node"] == 1 and parts["mig"]["gpu_type"] == "a100_1g.10gb"
    assert "qos" not in parts["mig"]                          # AllowQos=interactive,debug: the user's choice
    # No GRES, ThreadsPerCore=2: CPUs are hardware threads; MaxTime=UNLIMITED: no max_time.
    assert parts["cpu"] == {"gpus_per_node": 0, "gpu_mem_gb": None, "cpus_per_node": 256, "mem_gb": 486,
                            "max_nodes": 8}
    # MaxCPUsPerNode=64 and MaxMemPerNode=128000 cap what a job gets of the same nodes.
    assert parts["cpu-shared"]["cpus_per_node"] == 64 and parts["cpu-shared"]["mem_gb"] == 125
    assert found.notes == (
        "partition mig has MIG slices: gpus_per_node is 1, as CUDA shows a process one slice (a job's ranks on a "
        "node would all share the first)",
        "partition mig takes only QOS debug, interactive (AllowQos): set partitions.mig.qos to the one your jobs use",
        "partition long left out: account proj1 may not use it (AllowAccounts=proj-long)",
        "partition maint left out: State=INACTIVE: it takes no jobs",
        "partition admin left out: RootOnly=YES: only root submits there")


def test_the_left_out_partitions_follow_the_user_and_account():
    kept = detect(HOPPER, "hopper", account="proj-long", user="root").profile["partitions"]
    assert "long" in kept and "maint" not in kept
    assert "admin" not in kept          # Hidden=YES: not in a profile unless written by hand
    assert "bigmem" not in detect(CPUONLY, "cpuonly", account="guests").profile["partitions"]   # DenyAccounts
    assert "bigmem" in detect(CPUONLY, "cpuonly", account="proj1").profile["partitions"]


def test_a_partition_allowing_one_qos_gets_it():
    text = HOPPER.replace("AllowQos=interactive,debug", "AllowQos=interactive")
    assert detect(text, "hopper", account="proj1").profile["partitions"]["mig"]["qos"] == "interactive"


def test_max_nodes_is_never_more_than_the_partition_has():
    text = HOPPER.replace("PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL "
                          "Default=NO QoS=N/A DefaultTime=00:10:00 DisableRootJobs=NO ExclusiveUser=NO "
                          "ExclusiveTopo=NO GraceTime=0 Hidden=NO MaxNodes=2 ",
                          "PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL "
                          "Default=NO QoS=N/A DefaultTime=00:10:00 DisableRootJobs=NO ExclusiveUser=NO "
                          "ExclusiveTopo=NO GraceTime=0 Hidden=NO MaxNodes=64 ")
    assert text != HOPPER
    assert detect(text, "hopper", account="proj1").profile["partitions"]["debug"]["max_nodes"] == 4


def test_cpu_cluster_detected():
    profile = detect(CPUONLY, "cpuonly", account="proj1").profile
    assert profile["default_partition"] == "batch"          # Default=YES, last
    assert profile["gpu_directive"] == "gpus-per-node"
    assert {p: (e["gpus_per_node"], e["cpus_per_node"], e["mem_gb"]) for p, e in profile["partitions"].items()} \
        == {"short": (0, 64, 246), "bigmem": (0, 256, 2007), "batch": (0, 64, 246)}


def test_a_cons_res_cluster_asks_gpus_as_gres():
    assert detect(GPUFARM, "gpufarm").profile["gpu_directive"] == "gres"
    cray = GPUFARM.replace("SelectType              = select/cons_res", "SelectType              = select/cray_aries")
    assert detect(cray, "gpufarm").profile["gpu_directive"] == "gres"
    cray = cray.replace("SelectTypeParameters    = CR_CORE_MEMORY",
                        "SelectTypeParameters    = CR_CORE_MEMORY,OTHER_CONS_TRES")
    assert detect(cray, "gpufarm").profile["gpu_directive"] == "gpus-per-node"


def test_a_partition_name_no_profile_takes_is_left_out(tmp_path):
    text = CPUONLY.replace("PartitionName=short ", "PartitionName=short+ ").replace("Partitions=short,", "Partitions=short+,")
    site = loaded(tmp_path, text, "cpuonly", "proj1")
    assert list(site.config.partitions) == ["bigmem", "batch"]
    assert "# Review: partition short+ left out: its name is not one a profile takes" in \
        (tmp_path / "cpuonly.yaml").read_text(encoding="utf-8")


def test_no_partition_for_this_account_is_a_clear_error():
    text = CPUONLY.replace("AllowAccounts=ALL", "AllowAccounts=staff").replace("DenyAccounts=guests",
                                                                                "AllowAccounts=staff")
    with pytest.raises(SchedulerError, match=r"no partition of the cluster takes this user's jobs: partition "
                                             r"short left out: account proj1 may not use it"):
        detect(text, "cpuonly", account="proj1")


@pytest.mark.parametrize("name,text,account", [("hopper", HOPPER, "proj1"), ("cpuonly", CPUONLY, "proj1"),
                                               ("gpufarm", GPUFARM, "proj1")])
def test_the_detected_profile_loads_and_the_check_passes_it(tmp_path, name, text, account):
    site = loaded(tmp_path, text, name, account)
    report = compare(site_mapping(site.config), parse_cluster(text))
    assert report.fatal == [], report.format()


def test_reason_text_never_replaces_a_field():
    [record] = parse_records("NodeName=n1 Gres=gpu:h100:4(S:0-1) State=IDLE+DRAIN Reason=swap, Gres=gpu:h100:3 "
                             "State=DOWN [root@2024-06-24T09:12:01]")
    assert (record["Gres"], record["State"]) == ("gpu:h100:4(S:0-1)", "IDLE+DRAIN")


# --- check --------------------------------------------------------------------------------------


def hopper_profile(tmp_path):
    return site_mapping(loaded(tmp_path, HOPPER, "hopper", "proj1").config)


def test_mem_spec_limit_is_not_a_job_s(tmp_path):
    site = hopper_profile(tmp_path)
    site["partitions"]["cpu"]["mem_gb"] = 502                  # RealMemory, MemSpecLimit forgotten
    report = compare(site, parse_cluster(HOPPER))
    assert [str(d) for d in report.fatal] == [
        "partitions.cpu.mem_gb: the profile says 502 GB, the nodes of partition cpu on cluster hopper give a job "
        "at most 486 GB (RealMemory=515000 MB less MemSpecLimit=16384 MB); jobs asking that much are refused"]


def test_max_cpus_per_node_caps_the_partition(tmp_path):
    site = hopper_profile(tmp_path)
    site["partitions"]["cpu-shared"].update(cpus_per_node=256, mem_gb=486)
    report = compare(site, parse_cluster(HOPPER))
    assert [d.key for d in report.fatal] == ["partitions.cpu-shared.cpus_per_node", "partitions.cpu-shared.mem_gb"]
    assert "give a job at most 64 CPUs" in report.fatal[0].message
    assert "at most 125 GB (MaxMemPerNode=128000 MB)" in report.fatal[1].message


def request(partition="gpu", nodes=1, time="01:00:00", gpus=4, **kw):
    return Request(partition, nodes, slurmtime.parse(time), gpus, **kw)


def test_more_big_nodes_than_the_partition_has_never_start(tmp_path):
    """gpu: 16 nodes with 4 H100s, gpu020 with 8. A profile saying 8 is warned about; a job on
    2 such nodes is refused before submission, naming what is missing."""
    site = hopper_profile(tmp_path)
    site["partitions"]["gpu"]["gpus_per_node"] = 8
    cluster = parse_cluster(HOPPER)
    report = compare(site, cluster, partition="gpu")
    assert report.fatal == [], report.format()
    assert any(d.key == "partitions.gpu.gpus_per_node" and "only 1 of the 17 nodes" in d.message
               and "jobs on more than 1 node(s) never start" in d.message for d in report.warnings), report.format()
    assert compare(site, cluster, partition="gpu", request=request(gpus=8)).fatal == []
    report = compare(site, cluster, partition="gpu", request=request(nodes=2, gpus=8))
    assert [str(d) for d in report.fatal] == [
        "resources.nodes: 2 node(s) with 8 GPU(s) asked, partition gpu on cluster hopper has only 1 of its 17 nodes "
        "with that much; this job can never start (Requested node configuration is not available)"]


def test_memory_cpus_and_features_count_per_node(tmp_path):
    site = hopper_profile(tmp_path)
    cluster = parse_cluster(HOPPER)
    big = request(nodes=2, mem_mb=1000 * 1024)
    assert "2 node(s) with 4 GPU(s), 1024000 MB of memory asked" in compare(site, cluster, partition="gpu",
                                                                             request=big).fatal[0].message
    wide = request(nodes=2, cpus_per_node=96)
    assert "only 1 of its 17 nodes" in compare(site, cluster, partition="gpu", request=wide).fatal[0].message
    hbm = request(nodes=2, constraint="hbm3")
    assert "feature(s) hbm3" in compare(site, cluster, partition="gpu", request=hbm).fatal[0].message
    assert compare(site, cluster, partition="gpu", request=request(nodes=16, constraint="h100&nvme")).fatal == []
    assert compare(site, cluster, partition="gpu", request=request(nodes=2, constraint="[hbm3|ib]")).fatal == []


def test_a_job_on_more_nodes_than_are_up_waits(tmp_path):
    site = hopper_profile(tmp_path)
    report = compare(site, parse_cluster(HOPPER), partition="cpu", request=request("cpu", nodes=8, gpus=0))
    assert report.fatal == [], report.format()
    assert any(d.key == "resources.nodes" and "has 8 that fit, of which 7 take jobs now" in d.message
               for d in report.warnings), report.format()


def test_the_job_s_request_through_the_plan(tmp_path):
    """Request.of_plan carries the plan's per-node CPUs and memory: the check and the
    rendered sbatch ask the same."""
    site = loaded(tmp_path, HOPPER, "hopper", "proj1")
    plan = plan_on(site, tmp_path, "resources.partition=gpu", "resources.nodes=2", "resources.mem_gb=400")
    req = Request.of_plan(plan)
    assert (req.cpus_per_node, req.mem_mb, req.gpus_per_node) == (48, 400 * 1024, 4)


def test_allow_qos_without_a_profile_qos(tmp_path):
    site = hopper_profile(tmp_path)
    with_accounting = parse_cluster(HOPPER, **HOPPER_ACCOUNTING)
    report = compare(site, with_accounting, partition="mig")
    assert [str(d) for d in report.fatal] == [
        "partitions.mig.qos: the profile gives none, so jobs run under QOS normal (the association's default), "
        "partition mig on cluster hopper allows only QOS debug, interactive; jobs are refused"]
    report = compare(site, parse_cluster(HOPPER), partition="mig")
    assert report.fatal == [] and any(d.key == "partitions.mig.qos" for d in report.warnings), report.format()
    site["partitions"]["mig"]["qos"] = "interactive"
    assert compare(site, with_accounting, partition="mig").fatal == []


def test_cray_select_with_cons_tres_takes_gpus_per_node():
    site = site_mapping(load_site(str(RECORDED / "gpufarm.yaml"), REPO, {}).config)
    site["gpu_directive"] = "gpus-per-node"
    cray = GPUFARM.replace("select/cons_res", "select/cray_aries")
    assert "gpu_directive" in [d.key for d in compare(site, parse_cluster(cray)).fatal]
    cray = cray.replace("SelectTypeParameters    = CR_CORE_MEMORY",
                        "SelectTypeParameters    = CR_CORE_MEMORY,OTHER_CONS_TRES")
    assert "gpu_directive" not in [d.key for d in compare(site, parse_cluster(cray)).fatal]


# --- the rendered sbatch ---------------------------------------------------------------------------


def plan_on(site, tmp_path, *overrides):
    exp = load_experiment(REPO / "examples" / "torch_ddp.yaml", list(overrides))
    exp = dataclasses.replace(exp, path=Path("/home/alice/exp/torch_ddp.yaml"))
    environ = {"HOME": "/home/alice", "USER": "alice"}
    ctx = SubmitContext(cwd="/home/alice/exp", python="/usr/bin/python3", environ=environ,
                        run_id="torch-ddp-20260101-000000-abcd")
    return resolve(exp, site, ctx)


def directives(text: str) -> list[str]:
    return re.findall(r"^#SBATCH (--[a-z-]+(?:=\S+)?)", text, re.M)


SBATCH_CASES = {
    # cluster, account, overrides, the directives that say where and what
    "gres on cons_res": ("gpufarm", GPUFARM, "proj1", ["resources.nodes=2"],
                         ["--partition=gpu", "--account=proj1", "--nodes=2", "--ntasks-per-node=4", "--gres=gpu:4",
                          "--cpus-per-task=24", "--time=00:20:00"]),
    "cpu cluster": ("cpuonly", CPUONLY, "proj1", ["resources.nodes=3"],
                    ["--partition=batch", "--account=proj1", "--nodes=3", "--ntasks-per-node=1",
                     "--cpus-per-task=64", "--time=00:20:00"]),
    "mig slices, one QOS": ("hopper", HOPPER.replace("AllowQos=interactive,debug", "AllowQos=interactive"),
                            "proj1", ["resources.partition=mig"],
                            ["--partition=mig", "--account=proj1", "--qos=interactive", "--nodes=1",
                             "--ntasks-per-node=1", "--gpus-per-node=1", "--cpus-per-task=64", "--time=00:20:00"]),
    "hyperthreads, MaxCPUsPerNode": ("hopper", HOPPER, "proj1", ["resources.partition=cpu-shared"],
                                     ["--partition=cpu-shared", "--account=proj1", "--nodes=1",
                                      "--ntasks-per-node=1", "--cpus-per-task=64", "--time=00:20:00"]),
}


@pytest.mark.parametrize("case", sorted(SBATCH_CASES))
def test_the_sbatch_for_the_detected_profile(tmp_path, case):
    name, text, account, overrides, expected = SBATCH_CASES[case]
    site = loaded(tmp_path, text, name, account)
    plan = plan_on(site, tmp_path, *overrides)
    files = schedulers.get(plan.scheduler).render(plan)
    found = [d for d in directives(files["job.sbatch"])
             if d.split("=")[0] in ("--partition", "--account", "--qos", "--nodes", "--ntasks-per-node",
                                    "--gres", "--gpus-per-node", "--cpus-per-task", "--time", "--mem")]
    assert found == expected, files["job.sbatch"]
    report = compare(site_mapping(site.config), parse_cluster(text), partition=plan.allocation.partition,
                     request=Request.of_plan(plan))
    assert report.fatal == [], report.format()
    for fname in ("job.sbatch", "env.sh"):
        path = tmp_path / fname
        path.write_text(files[fname], encoding="utf-8")
        syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=60)
        assert syntax.returncode == 0, syntax.stderr
        if shutil.which("shellcheck"):
            check = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True, timeout=120)
            assert check.returncode == 0, check.stdout


# --- a cluster of thousands of nodes ----------------------------------------------------------------


def big_cluster(nodes: int, partitions: int) -> str:
    """`nodes` nodes (every tenth with 8 A100s and 2 TB instead of 4 H100s), each in every
    one of `partitions` partitions, in scontrol's one-line format."""
    node_line = next(line for line in GPUFARM.splitlines() if line.startswith("NodeName=g001 "))
    names = ",".join(f"p{j:02d}" for j in range(partitions))
    lines = [f"PartitionName=p{j:02d} AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL Default={'YES' if j == 1 else 'NO'} "
             f"Hidden=NO MaxNodes=UNLIMITED MaxTime=2-00:00:00 MaxCPUsPerNode=UNLIMITED Nodes=n[00000-{nodes - 1:05d}] "
             f"PriorityTier=1 RootOnly=NO PreemptMode=OFF State=UP TotalCPUs={96 * nodes} TotalNodes={nodes}"
             for j in range(partitions)]
    for i in range(nodes):
        line = node_line.replace("NodeName=g001 ", f"NodeName=n{i:05d} ").replace("Partitions=gpu,interactive",
                                                                                    f"Partitions={names}")
        if i % 10 == 9:
            line = line.replace("Gres=gpu:h100:4(S:0-1)", "Gres=gpu:a100:8(S:0-1)").replace(
                "RealMemory=515000", "RealMemory=2060000")
        lines.append(line)
    return "\n".join(lines) + "\nClusterName = big\nSelectType = select/cons_tres\nEnforcePartLimits = ALL\n"


def test_thousands_of_nodes_parse_and_compare():
    """10,000 nodes in 30 partitions: the parse is linear in the records (each node is
    filed under its partitions once), the type comparison is per type, not per node pair."""
    text = big_cluster(10_000, 30)
    parts, nodes, settings = split_scontrol(text)
    profile = detect_profile("big", parts, nodes, settings=settings).profile
    assert profile["default_partition"] == "p01"
    assert profile["partitions"]["p29"] == {"gpus_per_node": 4, "gpu_mem_gb": None, "cpus_per_node": 96,
                                            "mem_gb": 502, "max_nodes": 10_000, "max_time": "2-00:00:00"}
    cluster = parse_cluster(text)
    assert len(cluster.partitions["p00"].nodes) == 10_000
    site = dict(profile, partitions={p: dict(e, gpu_type="h100") for p, e in profile["partitions"].items()})
    report = compare(site, cluster)
    assert report.fatal == [], report.format()
    assert len([d for d in report.warnings if d.key.endswith(".gpu_type") and "1000 of the 10000" in d.message]) == 30
    report = compare(site, cluster, partition="p07", request=request("p07", nodes=1001, gpus=8))
    assert "only 1000 of its 10000 nodes" in report.fatal[0].message


def test_a_partition_qos_binds_every_job_there(tmp_path):
    """QoS=gpu-part on partition gpu (MaxWall 1 day, 8 nodes a job): a profile allowing more
    never starts its longest jobs; a job over it is refused before submission."""
    text = HOPPER.replace("Default=YES QoS=N/A", "Default=YES QoS=gpu-part")
    assert text != HOPPER
    cluster = parse_cluster(text, assoc_text=HOPPER_ACCOUNTING["assoc_text"], user="alice",
                            qos_text=HOPPER_ACCOUNTING["qos_text"] + "gpu-part|1-00:00:00|node=8|\n")
    site = hopper_profile(tmp_path)
    report = compare(site, cluster, partition="gpu")
    assert [str(d) for d in report.fatal] == [
        "partitions.gpu.max_time: the profile says 2-00:00:00, partition gpu's QOS gpu-part on cluster hopper "
        "allows 1-00:00:00; jobs over it never start (QOSMaxWallDurationPerJobLimit)",
        "partitions.gpu.max_nodes: the profile says 17, partition gpu's QOS gpu-part on cluster hopper allows 8 "
        "node(s) per job; jobs over it never start (QOSMaxNodePerJobLimit)"]
    site["partitions"]["gpu"].update(max_time=None, max_nodes=None)
    report = compare(site, cluster, partition="gpu", request=request(nodes=9, time="1-12:00:00"))
    assert [d.key for d in report.fatal] == ["resources.time", "resources.nodes"], report.format()
    assert "partition gpu's QOS gpu-part on cluster hopper allows 8 per job" in report.fatal[1].message


def test_nodes_found_by_the_partition_s_host_list():
    """A node record without Partitions=: the partition's Nodes= (gpu[001-016,020]) names them."""
    text = re.sub(r"Partitions=\S+ ", "", HOPPER)
    assert "Partitions=" not in text
    cluster = parse_cluster(text)
    assert [n.name for n in cluster.partitions["gpu"].nodes] == [f"gpu{i:03d}" for i in range(1, 17)] + ["gpu020"]
    assert len(cluster.partitions["admin"].nodes) == 25 and len(cluster.partitions["cpu"].nodes) == 8


def test_powered_down_nodes_take_jobs(tmp_path):
    """Power saving (sinfo's idle~): Slurm powers a node up for a job; not-responding ones wait."""
    site = hopper_profile(tmp_path)
    saving = HOPPER.replace("State=IDLE ThreadsPerCore=2", "State=IDLE+CLOUD+POWERED_DOWN ThreadsPerCore=2")
    report = compare(site, parse_cluster(saving), partition="cpu", request=request("cpu", nodes=7, gpus=0))
    assert report.fatal == [] and report.warnings == [], report.format()
    gone = saving.replace("State=IDLE+CLOUD+POWERED_DOWN", "State=IDLE+NOT_RESPONDING")
    report = compare(site, parse_cluster(gone), partition="cpu")
    assert any(d.key == "partitions.cpu" and "no node of partition cpu on cluster hopper takes jobs now" in d.message
               for d in report.warnings), report.format()


# --- through the command line, with stand-ins for Slurm's commands ------------------------------------


def fake_slurm(tmp_path: Path, cluster: str, account: str) -> dict[str, str]:
    """Mock scontrol and sacctmgr (no Slurm here) answering from the recordings; the environment
    that puts them first on PATH."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    for name, body in (
            ("scontrol", f'cat >/dev/null\ntail -n +2 "{RECORDED / f"{cluster}.scontrol.txt"}"\n'),
            ("sacctmgr", f'case "$*" in\n  *"show user"*) echo {account} ;;\n'
                         f'  *"show assoc"*) tail -n +2 "{RECORDED / f"{cluster}.assoc.txt"}" ;;\n'
                         f'  *"show qos"*) tail -n +2 "{RECORDED / f"{cluster}.qos.txt"}" ;;\nesac\n')):
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}", encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", HOME=str(tmp_path / "home"),
                PYTHONPATH=str(REPO))


def glaunch(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_sites_detect_then_check_on_hopper(tmp_path):
    env = fake_slurm(tmp_path, "hopper", "proj1")
    detected = glaunch(env, tmp_path, "sites", "detect")
    assert detected.returncode == 0, detected.stderr
    path = Path(env["HOME"]) / ".config" / "glaunch" / "sites" / "hopper.yaml"     # the user's own profiles
    text = path.read_text(encoding="utf-8")
    assert "# Review: partition mig takes only QOS debug, interactive (AllowQos)" in text
    assert "account: proj1" in text and "default_partition: gpu" in text
    # The one choice detection leaves to the user is what the check refuses: the user's default
    # QOS is not one partition mig takes.
    checked = glaunch(env, tmp_path, "sites", "check", "hopper")
    assert checked.returncode == 3, checked.stdout + checked.stderr
    assert "FATAL    partitions.mig.qos: the profile gives none, so jobs run under QOS normal" in checked.stdout
    path.write_text(text.replace("    max_time: \"04:00:00\"\n", "    max_time: \"04:00:00\"\n    qos: interactive\n"),
                    encoding="utf-8")
    checked = glaunch(env, tmp_path, "sites", "check", "hopper")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "FATAL" not in checked.stdout and "Traceback" not in checked.stderr


def test_sites_detect_with_no_partition_for_the_account(tmp_path):
    env = fake_slurm(tmp_path, "cpuonly", "guests")
    recording = RECORDED / "cpuonly.scontrol.txt"
    text = recording.read_text(encoding="utf-8").replace("AllowAccounts=ALL", "AllowAccounts=staff")
    (tmp_path / "cpuonly-staff.txt").write_text(text, encoding="utf-8")
    scontrol = tmp_path / "fake-bin" / "scontrol"
    scontrol.write_text(scontrol.read_text().replace(str(recording), str(tmp_path / "cpuonly-staff.txt")))
    detected = glaunch(env, tmp_path, "sites", "detect")
    assert detected.returncode == 3 and "Traceback" not in detected.stderr, detected.stderr
    assert "no partition of the cluster takes this user's jobs: partition short left out: account guests may not " \
           "use it (AllowAccounts=staff)" in detected.stderr
    assert not (tmp_path / "site_configs").exists()


def test_a_job_naming_no_partition_is_checked_on_the_default_one():
    site = {"name": "bare", "partitions": {}}
    report = compare(site, parse_cluster(CPUONLY), request=request(None, nodes=5, gpus=0))
    assert [str(d) for d in report.fatal] == [
        "resources.nodes: 5 asked, partition batch on cluster cpuonly gives a job at most 4; this job is refused at "
        "submission (EnforcePartLimits=ALL)"], report.format()


def test_a_profile_copying_max_time_unlimited_is_told_what_to_write(tmp_path):
    path = tmp_path / "copied.yaml"
    path.write_text("name: copied\nextends: base-slurm\ndefault_partition: cpu\npartitions:\n  cpu:\n"
                    "    gpus_per_node: 0\n    max_time: UNLIMITED\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_site(str(path), tmp_path, {"HOME": str(tmp_path / "home")})
    assert err.value.key == "partitions.cpu.max_time" and "leave it out or write null" in str(err.value)


def test_allow_groups():
    """AllowGroups=ml-staff on partition debug: a user in none of them is refused there."""
    text = HOPPER.replace("PartitionName=debug AllowGroups=ALL", "PartitionName=debug AllowGroups=ml-staff,admins")
    assert text != HOPPER
    parts, nodes, settings = split_scontrol(text)
    found = detect_profile("hopper", parts, nodes, settings=settings, account="proj1", user="alice",
                           groups=frozenset({"alice", "users"}))
    assert "debug" not in found.profile["partitions"]
    assert "partition debug left out: user alice is in none of its groups (AllowGroups=admins,ml-staff)" in found.notes
    profile = detect(HOPPER, "hopper", account="proj1").profile
    outsider = parse_cluster(text, user="alice", groups=frozenset({"alice", "users"}))
    assert [str(d) for d in compare(profile, outsider, partition="debug").fatal] == [
        "partitions.debug: user alice is in none of the groups partition debug on cluster hopper allows "
        "(AllowGroups=admins,ml-staff); jobs are refused"]
    member = parse_cluster(text, user="alice", groups=frozenset({"alice", "ml-staff"}))
    assert compare(profile, member, partition="debug").fatal == []
    assert compare(profile, parse_cluster(text, user="alice"), partition="debug").fatal == []   # groups unknown


def test_glaunch_run_in_an_allocation_with_fewer_cpus_on_a_node(tmp_path):
    """An allocation over nodes of two sizes (SLURM_JOB_CPUS_PER_NODE=48,24): the plan's 4 tasks
    x 12 CPUs fit the first node only; refused before any srun, naming the key to set."""
    from launcher.schedulers.slurm.allocation import Allocation, AllocationScheduler

    site = loaded(tmp_path, HOPPER, "hopper", "proj1")
    plan = plan_on(site, tmp_path, "resources.partition=gpu", "resources.nodes=2")
    assert (plan.allocation.tasks_per_node, plan.allocation.cpus_per_task) == (4, 12)
    environ = {"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_CPUS_PER_NODE": "48,24"}
    with pytest.raises(ConfigError) as err:
        AllocationScheduler(Allocation.of(environ)).check(plan)
    assert err.value.key == "resources.cpus_per_task" and "has 24 CPUs on a node" in str(err.value)
    AllocationScheduler(Allocation.of(dict(environ, SLURM_JOB_CPUS_PER_NODE="96(x2)"))).check(plan)
    AllocationScheduler(Allocation.of({"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "2"})).check(plan)


def test_qos_gpu_and_cpu_limits_per_job_and_per_node(tmp_path):
    """QOS gpu8: MaxTRES=gres/gpu=8,cpu=96 per job, MaxTRESPerNode=gres/gpu=4: jobs over them
    never start; said before submission with the reason Slurm would pend them with."""
    cluster = parse_cluster(HOPPER, user="alice",
                            assoc_text=HOPPER_ACCOUNTING["assoc_text"].replace("debug,interactive,normal",
                                                                               "debug,gpu8,interactive,normal"),
                            qos_text=HOPPER_ACCOUNTING["qos_text"] + "gpu8|2-00:00:00|gres/gpu=8,cpu=96|gres/gpu=4\n")
    site = hopper_profile(tmp_path)
    site["qos"] = "gpu8"
    assert compare(site, cluster, partition="gpu", request=request(nodes=2, cpus_per_node=48)).fatal == []
    report = compare(site, cluster, partition="gpu", request=request(nodes=3, cpus_per_node=48))
    assert [str(d) for d in report.fatal] == [
        "resources.gpus_per_node: 3 node(s) x 4 GPU(s) = 12 asked, QOS gpu8 on cluster hopper allows 8 GPU(s) per "
        "job; this job would never start (QOSMaxGRESPerJob)",
        "resources.cpus_per_task: 3 node(s) x 48 CPUs = 144 asked, QOS gpu8 on cluster hopper allows 96 CPUs per "
        "job; this job would never start (QOSMaxCpuPerJobLimit)"], report.format()
    report = compare(site, cluster, partition="gpu", request=request(gpus=8))
    assert any(d.key == "resources.gpus_per_node" and "allows 4 per node" in d.message and "QOSMaxGRESPerNode"
               in d.message for d in report.fatal), report.format()


def test_sites_detect_into_a_path_it_cannot_write_is_one_error_line(tmp_path):
    env = fake_slurm(tmp_path, "cpuonly", "proj1")
    (tmp_path / "file").write_text("")
    detected = glaunch(env, tmp_path, "sites", "detect", "-o", str(tmp_path / "file" / "below" / "x.yaml"))
    assert detected.returncode == 2 and "Traceback" not in detected.stderr, detected.stderr
    assert detected.stderr.startswith("glaunch: error: ") and "--output: cannot write " in detected.stderr
    assert len(detected.stderr.splitlines()) == 1


def test_the_current_user_is_known_without_a_passwd_entry(monkeypatch):
    """getpass.getuser raises where the uid has no passwd entry and USER/LOGNAME are unset
    (a container run as an arbitrary uid); Slurm still takes the job, so does glaunch."""
    import getpass

    from launcher.schedulers.cluster.facts import current_user
    from launcher.schedulers.slurm.client import CLIENT

    def no_entry():
        raise KeyError("getpwuid(): uid not found")
    monkeypatch.setattr(getpass, "getuser", no_entry)        # mock: no such uid can be made here
    assert current_user(CLIENT) == str(os.getuid())
