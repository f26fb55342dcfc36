"""A partition's MaxMemPerCPU (scontrol prints it in place of MaxMemPerNode; unset there,
the cluster's own value holds): Slurm raises a job's CPUs on a node to ceil(mem /
MaxMemPerCPU), so memory past MaxMemPerCPU x the CPUs a job can have on a node never
runs (refused at submission: no node can hold it), and memory past it for the CPUs
asked silently costs more CPUs. Said for the profile (`sites check`) and for one job's
own ask (`submit`, before anything is queued).

The clusters are tests/recorded_cluster/hopper.scontrol.txt with one limit changed.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys

import pytest

from launcher.config.sites import load_site
from launcher.errors import SchedulerError
from launcher.schedulers.cluster.check import compare, site_mapping
from launcher.schedulers.cluster.facts import parse_cluster
from launcher.schedulers.cluster.detect import render_profile
from launcher.schedulers.slurm.scheduler import SlurmScheduler
from test_cluster_shapes import HOPPER, detect, hopper_profile, plan_on, request


def changed(text: str, old: str, new: str) -> str:
    out = text.replace(old, new)
    assert out != text, old
    return out


def enforcing(text: str) -> str:
    out = re.sub(r"^EnforcePartLimits\s+= NO$", "EnforcePartLimits       = ALL", text, flags=re.M)
    assert out != text
    return out


# cpu-shared: 8 nodes of 256 CPUs, MaxCPUsPerNode=64; MaxMemPerNode=128000 becomes MaxMemPerCPU=4000:
# a job gets at most 4000 MB x 64 = 256000 MB (250 GB) a node.
PER_CPU = changed(HOPPER, "DefMemPerNode=UNLIMITED MaxMemPerNode=128000", "DefMemPerCPU=2000 MaxMemPerCPU=4000")
# gpu: 16 nodes of 48 CPUs and gpu020 of 192, no MaxCPUsPerNode.
GPU_PER_CPU = changed(HOPPER, "MaxMemPerNode=UNLIMITED TRES=cpu=960,", "MaxMemPerCPU=8000 TRES=cpu=960,")
# The cluster's own MaxMemPerCPU: partition cpu sets none (MaxMemPerNode=UNLIMITED), cpu-shared
# keeps its MaxMemPerNode=128000.
GLOBAL_PER_CPU = changed(HOPPER, "MaxMemPerNode           = UNLIMITED", "MaxMemPerCPU            = 1000")
GLOBAL_PER_NODE = changed(HOPPER, "MaxMemPerNode           = UNLIMITED", "MaxMemPerNode           = 100000")
# MaxMemPerCPU=UNLIMITED is the partition's own setting: no limit, whatever the cluster's.
OWN_UNLIMITED = changed(GLOBAL_PER_CPU, "MaxMemPerNode=128000", "MaxMemPerCPU=UNLIMITED")

ON = "partition cpu-shared on cluster hopper"


def test_max_mem_per_cpu_is_parsed_and_unset_is_no_limit():
    parts = parse_cluster(PER_CPU).partitions
    assert (parts["cpu-shared"].max_mem_per_cpu_mb, parts["cpu-shared"].max_mem_per_node_mb) == (4000, None)
    assert parts["cpu"].max_mem_per_cpu_mb is None                    # MaxMemPerNode=UNLIMITED, none for the cluster
    original = parse_cluster(HOPPER).partitions
    assert all(p.max_mem_per_cpu_mb is None for p in original.values())
    assert original["cpu-shared"].max_mem_per_node_mb == 128000
    fallback = parse_cluster(GLOBAL_PER_CPU).partitions
    assert (fallback["cpu"].max_mem_per_cpu_mb, fallback["cpu-shared"].max_mem_per_cpu_mb) == (1000, None)
    assert fallback["cpu-shared"].max_mem_per_node_mb == 128000       # its own limit, not the cluster's
    own = parse_cluster(OWN_UNLIMITED).partitions["cpu-shared"]
    assert (own.max_mem_per_cpu_mb, own.max_mem_per_node_mb) == (None, None)
    assert parse_cluster(GLOBAL_PER_NODE).partitions["cpu"].max_mem_per_node_mb == 100000


REFUSED = "more than any node gives; jobs asking that much are refused at submission (Requested node configuration is not available)"
PROFILE_CASES = {
    # cluster, partition, the profile's cpus_per_node and mem_gb, the fatal differences, the warnings
    # naming MaxMemPerCPU
    "over MaxMemPerCPU x MaxCPUsPerNode": (
        PER_CPU, "cpu-shared", 64, 300,
        [f"partitions.cpu-shared.mem_gb: the profile says 300 GB, {ON} gives a job at most 250 GB a node "
         f"(MaxMemPerCPU=4000 MB x MaxCPUsPerNode=64): a job asking that much needs 77 CPUs a node, {REFUSED}"], []),
    "one GB over, refused at submission": (
        enforcing(PER_CPU), "cpu-shared", 64, 251,
        [f"partitions.cpu-shared.mem_gb: the profile says 251 GB, {ON} gives a job at most 250 GB a node "
         "(MaxMemPerCPU=4000 MB x MaxCPUsPerNode=64): a job asking that much needs 65 CPUs a node, "
         f"{REFUSED}"], []),
    "exactly MaxMemPerCPU x the CPUs": (PER_CPU, "cpu-shared", 64, 250, [], []),
    "within, for fewer CPUs": (PER_CPU, "cpu-shared", 16, 60, [], []),
    "more than the profile's CPUs carry": (
        PER_CPU, "cpu-shared", 32, 200, [],
        [f"partitions.cpu-shared.mem_gb: the profile says 200 GB and 32 CPUs, {ON} gives 32 CPUs at most 125 GB "
         "(MaxMemPerCPU=4000 MB); Slurm raises the CPUs of a job asking that much to 52 a node"]),
    "more CPUs than the small nodes have": (
        GPU_PER_CPU, "gpu", 48, 494, [],
        ["partitions.gpu.mem_gb: the profile says 494 GB and 48 CPUs, partition gpu on cluster hopper gives 48 CPUs "
         "at most 375 GB (MaxMemPerCPU=8000 MB); Slurm raises the CPUs of a job asking that much to 64 a node, "
         "which only 1 of its 17 nodes give; jobs wait for them"]),
    "over the node's memory: said once, as before": (
        PER_CPU, "cpu-shared", 64, 490,
        [f"partitions.cpu-shared.mem_gb: the profile says 490 GB, the nodes of {ON} give a job at most 486 GB "
         "(RealMemory=515000 MB less MemSpecLimit=16384 MB); jobs asking that much are refused"], []),
    "the cluster's MaxMemPerCPU, no MaxCPUsPerNode": (
        GLOBAL_PER_CPU, "cpu", 256, 486,
        ["partitions.cpu.mem_gb: the profile says 486 GB, partition cpu on cluster hopper gives a job at most 250 GB "
         f"a node (MaxMemPerCPU=1000 MB x 256 CPUs): a job asking that much needs 498 CPUs a node, {REFUSED}"], []),
    "MaxMemPerNode still caps": (
        HOPPER, "cpu-shared", 64, 200,
        [f"partitions.cpu-shared.mem_gb: the profile says 200 GB, the nodes of {ON} give a job at most 125 GB "
         "(MaxMemPerNode=128000 MB); jobs asking that much are refused"], []),
    "the cluster's MaxMemPerNode": (
        GLOBAL_PER_NODE, "cpu", 256, 486,
        ["partitions.cpu.mem_gb: the profile says 486 GB, the nodes of partition cpu on cluster hopper give a job "
         "at most 97 GB (MaxMemPerNode=100000 MB); jobs asking that much are refused"], []),
    "MaxMemPerCPU=UNLIMITED": (OWN_UNLIMITED, "cpu-shared", 64, 300, [], []),
    "no MaxMemPerCPU anywhere": (changed(HOPPER, "MaxMemPerNode=128000", "MaxMemPerNode=UNLIMITED"),
                                 "cpu-shared", 16, 300, [], []),
}


@pytest.mark.parametrize("case", PROFILE_CASES)
def test_the_profile_s_memory_against_max_mem_per_cpu(tmp_path, case):
    text, pname, cpus, mem_gb, fatal, warnings = PROFILE_CASES[case]
    site = hopper_profile(tmp_path)
    site["partitions"][pname].update(cpus_per_node=cpus, mem_gb=mem_gb)
    report = compare(site, parse_cluster(text), partition=pname)
    assert [str(d) for d in report.fatal] == fatal, report.format()
    assert [str(d) for d in report.warnings if "MaxMemPerCPU" in d.message] == warnings, report.format()


REQUEST_CASES = {
    # cluster, the job's CPUs and MB a node, the fatal differences, the warnings naming MaxMemPerCPU
    "over, EnforcePartLimits=NO: refused all the same": (
        PER_CPU, 64, 300 * 1024,
        [f"resources.mem_gb: 307200 MB a node asked, {ON} gives a job at most 256000 MB a node (MaxMemPerCPU=4000 "
         "MB x MaxCPUsPerNode=64): this job needs 77 CPUs a node, more than any node gives; this job is "
         "refused at submission (Requested node configuration is not available)"],
        []),
    "one MB over, EnforcePartLimits=ALL": (
        enforcing(PER_CPU), 64, 256001,
        [f"resources.mem_gb: 256001 MB a node asked, {ON} gives a job at most 256000 MB a node (MaxMemPerCPU=4000 "
         "MB x MaxCPUsPerNode=64): this job needs 65 CPUs a node, more than any node gives; this job is "
         "refused at submission (Requested node configuration is not available)"], []),
    "over, CPUs left to Slurm": (
        PER_CPU, None, 300 * 1024,
        [f"resources.mem_gb: 307200 MB a node asked, {ON} gives a job at most 256000 MB a node (MaxMemPerCPU=4000 "
         "MB x MaxCPUsPerNode=64): this job needs 77 CPUs a node, more than any node gives; this job is "
         "refused at submission (Requested node configuration is not available)"],
        []),
    "more than its CPUs carry": (
        PER_CPU, 16, 100 * 1024, [],
        [f"resources.mem_gb: 102400 MB a node asked with 16 CPUs, {ON} gives 16 CPUs at most 64000 MB "
         "(MaxMemPerCPU=4000 MB); Slurm raises this job's CPUs to 26 a node"]),
    "exactly what its CPUs carry": (PER_CPU, 64, 256000, [], []),
    "no MaxMemPerCPU": (HOPPER, 16, 100 * 1024, [], []),
    "MaxMemPerCPU=UNLIMITED": (OWN_UNLIMITED, 16, 300 * 1024, [], []),
}


@pytest.mark.parametrize("case", REQUEST_CASES)
def test_the_job_s_memory_against_max_mem_per_cpu(tmp_path, case):
    text, cpus, mem_mb, fatal, warnings = REQUEST_CASES[case]
    site = hopper_profile(tmp_path)
    site["partitions"]["cpu-shared"].pop("mem_gb")       # the job's own ask, past no profile limit
    job = request("cpu-shared", gpus=0, cpus_per_node=cpus, mem_mb=mem_mb)
    report = compare(site, parse_cluster(text), partition="cpu-shared", request=job)
    assert [str(d) for d in report.fatal] == fatal, report.format()
    assert [str(d) for d in report.warnings if "MaxMemPerCPU" in d.message] == warnings, report.format()


def test_a_job_asking_the_profile_s_memory_is_told_once(tmp_path):
    site = hopper_profile(tmp_path)
    cluster = parse_cluster(PER_CPU)
    site["partitions"]["cpu-shared"].update(cpus_per_node=64, mem_gb=300)
    report = compare(site, cluster, partition="cpu-shared", request=request("cpu-shared", gpus=0, cpus_per_node=64,
                                                                              mem_mb=300 * 1024))
    assert [d.key for d in report.fatal] == ["partitions.cpu-shared.mem_gb"], report.format()
    site["partitions"]["cpu-shared"].update(cpus_per_node=32, mem_gb=200)
    report = compare(site, cluster, partition="cpu-shared", request=request("cpu-shared", gpus=0, cpus_per_node=32,
                                                                              mem_mb=200 * 1024))
    assert report.fatal == [] and [d.key for d in report.warnings if "MaxMemPerCPU" in d.message] == [
        "partitions.cpu-shared.mem_gb"], report.format()


def test_the_raised_cpus_decide_which_nodes_fit(tmp_path):
    """gpu with MaxMemPerCPU=8000: 400 GB raises a job to 52 CPUs a node, which the 48-CPU
    nodes lack though their memory would do; only gpu020 (192 CPUs) takes such a node."""
    cluster = parse_cluster(GPU_PER_CPU)
    part = cluster.partitions["gpu"]
    job = request(nodes=2, cpus_per_node=48, mem_mb=400 * 1024)
    assert [n.name for n in part.nodes if job.fits(part, n)] == ["gpu020"]
    assert job.cpus_on(part) == 52 and request(cpus_per_node=96, mem_mb=1024).cpus_on(part) == 96
    site = hopper_profile(tmp_path)
    report = compare(site, cluster, partition="gpu", request=job)
    assert [str(d) for d in report.fatal] == [
        "resources.nodes: 2 node(s) with 4 GPU(s), 48 CPUs, 409600 MB of memory asked, partition gpu on cluster "
        "hopper has only 1 of its 17 nodes with that much; this job can never start (Requested node configuration "
        "is not available)"], report.format()
    assert compare(site, cluster, partition="gpu", request=request(cpus_per_node=48, mem_mb=400 * 1024)).fatal == []


def test_fake_submit_refuses_before_queuing(tmp_path, monkeypatch):
    """Stand-ins for scontrol and sacctmgr (no Slurm here) answer with the changed hopper; the
    check `submit` runs before its preflight refuses the job (SchedulerError, exit 3)."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    (tmp_path / "scontrol.txt").write_text(PER_CPU, encoding="utf-8")
    for name, body in (("scontrol", f'cat >/dev/null\ncat "{tmp_path / "scontrol.txt"}"\n'),
                       ("sacctmgr", "echo 'sacctmgr: error: Connection refused' >&2\nexit 1\n")):
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}", encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    found = detect(HOPPER, "hopper", account="proj1")
    del found.profile["partitions"]["cpu-shared"]["mem_gb"]
    path = tmp_path / "hopper.yaml"
    path.write_text(render_profile(found.profile, "hopper", found.notes), encoding="utf-8")
    site = load_site(str(path), tmp_path, {"HOME": str(tmp_path / "home")})
    plan = plan_on(site, tmp_path, "resources.partition=cpu-shared", "resources.mem_gb=300")
    with pytest.raises(SchedulerError) as err:
        SlurmScheduler().check_cluster(plan)
    assert (f"resources.mem_gb: 307200 MB a node asked, {ON} gives a job at most 256000 MB a node "
            "(MaxMemPerCPU=4000 MB x MaxCPUsPerNode=64): this job needs 77 CPUs a node") in str(err.value)
    plan = plan_on(site, tmp_path, "resources.partition=cpu-shared", "resources.mem_gb=250")
    # The nodes' interpreter (asked here, standing in for the nodes) is this one, with torch.
    plan = dataclasses.replace(plan, launch=dataclasses.replace(plan.launch, python=(sys.executable,)))
    assert not [w for w in SlurmScheduler().check_cluster(plan) if "MaxMemPerCPU" in w]


@pytest.mark.parametrize("text, partition, mem_gb", [
    (PER_CPU, "cpu-shared", 250),              # 4000 MB x MaxCPUsPerNode=64
    (GLOBAL_PER_CPU, "cpu", 250),              # the cluster's 1000 MB x 256 CPUs
    (GLOBAL_PER_NODE, "cpu", 97),              # the cluster's MaxMemPerNode=100000
], ids=["partition-MaxMemPerCPU", "cluster-MaxMemPerCPU", "cluster-MaxMemPerNode"])
def test_detect_writes_the_memory_a_job_can_have_and_check_agrees(tmp_path, text, partition, mem_gb):
    found = detect(text, "hopper", "proj1")
    assert found.profile["partitions"][partition]["mem_gb"] == mem_gb
    path = tmp_path / "hopper.yaml"
    path.write_text(render_profile(found.profile, "hopper", found.notes), encoding="utf-8")
    site = site_mapping(load_site(str(path), tmp_path, {"HOME": str(tmp_path / "home")}).config)
    assert not [d for d in compare(site, parse_cluster(text)).fatal if "mem_gb" in d.key], compare(
        site, parse_cluster(text)).fatal
