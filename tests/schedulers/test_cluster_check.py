"""`glaunch sites check` without a cluster: profiles compared with recorded clusters
(tests/recorded_cluster/), every difference said in the profile's terms and classed as
fatal (refused, pending forever, other hardware) or a warning (harmless).

- glaunch: the local Slurm 22.05 cluster, recorded live (EnforcePartLimits=ALL,
  select/cons_tres, Gres=gpu:sim:2, associations enforced);
- glaunch_defaults: the second local cluster (scripts/local-slurm up defaults), recorded
  live: Slurm's defaults (EnforcePartLimits=NO, AccountingStorageEnforce=none), typed
  GRES gpu:tesla:2, partition short with MaxNodes=1;
- gpufarm: written for the tests with Slurm's defaults where the local cluster differs
  (EnforcePartLimits=NO, select/cons_res), typed GRES (h100, a100), a partition with
  MaxNodes=2, a drained node, a hidden partition, per-job QOS and association limits.
  gpufarm.yaml is the profile that matches it; each case changes one fact.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from pathlib import Path

import pytest

from launcher.config.sites import load_site
from launcher.errors import SchedulerError
from launcher.config import slurmtime
from launcher.schedulers.cluster.check import Request, compare, site_mapping
from launcher.schedulers.cluster.facts import parse_cluster

RECORDED = Path(__file__).parent.parent / "recorded_cluster"
REPO = Path(__file__).resolve().parents[2]


def recorded(name: str) -> str:
    """The command's output, verbatim, without the file's first line (the command)."""
    return (RECORDED / name).read_text(encoding="utf-8").partition("\n")[2]


def cluster(name: str, user: str, *, accounting: bool = True):
    if not accounting:
        return parse_cluster(recorded(f"{name}.scontrol.txt"), user=user,
                             accounting_note="account and QOS not checked: sacctmgr said: Connection refused")
    return parse_cluster(recorded(f"{name}.scontrol.txt"), assoc_text=recorded(f"{name}.assoc.txt"),
                         qos_text=recorded(f"{name}.qos.txt"), user=user)


def profile(name: str) -> dict:
    path = RECORDED / f"{name}.yaml" if (RECORDED / f"{name}.yaml").exists() else name
    return copy.deepcopy(site_mapping(load_site(str(path), REPO, os.environ).config))


GPUFARM = cluster("gpufarm", "alice")
GLAUNCH = cluster("glaunch", "root")
DEFAULTS = cluster("glaunch_defaults", "root")


def keys(diffs) -> list[str]:
    return [d.key for d in diffs]


def test_every_recording_names_its_command():
    for path in sorted(RECORDED.glob("*.txt")) + sorted((RECORDED / "errors").glob("*.txt")):
        first = path.read_text(encoding="utf-8").splitlines()[0]
        assert first.startswith("# ") and ("recorded" in first or "written for the tests" in first), path.name


def test_the_recordings_parse_to_what_they_say():
    assert GLAUNCH.name == "glaunch" and GLAUNCH.enforce_part_limits == "ALL"
    assert sorted(GLAUNCH.partitions) == ["debug", "urgent"] and GLAUNCH.default_partition == "debug"
    debug = GLAUNCH.partitions["debug"]
    assert [(n.name, dict(n.gpus), n.cpus, n.mem_mb) for n in debug.nodes] == [
        ("node1", {"sim": 2}, 4, 8000), ("node2", {"sim": 2}, 4, 8000)]
    assert GLAUNCH.enforce == {"associations", "limits", "qos"}
    assert {a.account for a in GLAUNCH.associations} == {"glaunch", "root"}

    assert GPUFARM.enforce_part_limits == "NO" and GPUFARM.settings["SelectType"] == "select/cons_res"
    assert sorted(GPUFARM.partitions) == ["cpu", "gpu", "gpu-a100", "interactive"]   # the hidden one too
    gpu = GPUFARM.partitions["gpu"]
    assert gpu.max_time == "1-00:00:00" and gpu.max_nodes == 4 and gpu.total_nodes == 6
    assert [n.name for n in gpu.nodes if not n.usable] == ["g006"]                    # IDLE+DRAIN
    assert GPUFARM.partitions["cpu"].max_nodes is None and GPUFARM.partitions["cpu"].node_limit == 3
    assert GPUFARM.partitions["interactive"].allow_accounts == {"staff"}
    assert GPUFARM.qos["long"].max_tres == {"node": "2"}
    proj2 = next(a for a in GPUFARM.associations if a.account == "proj2")
    assert proj2.max_wall == "12:00:00" and proj2.max_tres == {"node": "2"}


def test_the_shipped_local_profile_matches_the_local_cluster():
    report = compare(profile("local-slurm"), GLAUNCH)
    assert report.fatal == [] and report.warnings == [], report.format()
    assert report.format() == "site local-slurm matches Slurm cluster glaunch (Slurm 22.05.8)"


def test_the_shipped_defaults_profile_matches_the_second_local_cluster():
    assert DEFAULTS.enforce_part_limits == "NO" and DEFAULTS.enforce == frozenset()
    report = compare(profile("local-slurm-defaults"), DEFAULTS)
    assert report.fatal == [] and report.warnings == [], report.format()


def test_a_stale_profile_on_the_second_local_cluster():
    site = profile("local-slurm-defaults")
    site["partitions"]["gpu"].update(gpu_type="a100", max_time="1-00:00:00")
    site["partitions"]["short"]["max_nodes"] = 2
    site["account"] = "nosuch"                         # associations are not enforced there: a warning
    report = compare(site, DEFAULTS)
    assert [str(d) for d in report.fatal] == [
        "partitions.gpu.gpu_type: the profile says a100, the GPUs of partition gpu on cluster glaunch_defaults are "
        "tesla; jobs would run on other hardware",
        "partitions.gpu.max_time: the profile says 1-00:00:00, partition gpu on cluster glaunch_defaults allows "
        "04:00:00; jobs over it would pend forever (EnforcePartLimits=NO)",
        "partitions.short.max_nodes: the profile says 2, partition short on cluster glaunch_defaults gives a job at "
        "most 1 (MaxNodes=1); jobs over it would pend forever (EnforcePartLimits=NO)"]
    assert [str(d) for d in report.warnings] == [
        "account: the profile says nosuch, user root has no association with it on cluster glaunch_defaults "
        "(accounts: glaunch, root)"]


def test_the_matching_profile_has_no_fatal_difference():
    report = compare(profile("gpufarm"), GPUFARM)
    assert report.fatal == [], report.format()
    assert [str(d) for d in report.warnings] == [
        "partitions: cluster gpufarm also has partition(s) interactive, which the profile does not describe"]


def test_the_message_names_the_key_both_values_and_the_fate():
    site = profile("gpufarm")
    site["partitions"]["gpu"]["max_time"] = "2-00:00:00"
    report = compare(site, GPUFARM)
    assert [str(d) for d in report.fatal] == [
        "partitions.gpu.max_time: the profile says 2-00:00:00, partition gpu on cluster gpufarm allows 1-00:00:00; "
        "jobs over it would pend forever (EnforcePartLimits=NO)"]


def _set(path: str, value):
    def edit(site: dict) -> None:
        *parents, last = path.split(".")
        node = site
        for part in parents:
            node = node.setdefault(part, {})
        if value is _DELETE:
            node.pop(last)
        else:
            node[last] = value
    return edit


_DELETE = object()

# (change to the matching gpufarm profile, the key reported, words of the message)
FATAL = {
    "gpu type": (_set("partitions.gpu.gpu_type", "a100"), "partitions.gpu.gpu_type",
                 "the GPUs of partition gpu on cluster gpufarm are h100; jobs would run on other hardware"),
    "max_time over": (_set("partitions.gpu-a100.max_time", "1-00:00:00"), "partitions.gpu-a100.max_time",
                      "allows 12:00:00; jobs over it would pend forever (EnforcePartLimits=NO)"),
    "max_nodes over MaxNodes": (_set("partitions.gpu-a100.max_nodes", 4), "partitions.gpu-a100.max_nodes",
                                "gives a job at most 2 (MaxNodes=2); jobs over it would pend forever"),
    "max_nodes over the nodes there are": (_set("partitions.cpu.max_nodes", 8), "partitions.cpu.max_nodes",
                                           "at most 3 (3 node(s) in all)"),
    "more GPUs": (_set("partitions.gpu.gpus_per_node", 8), "partitions.gpu.gpus_per_node",
                  "have at most 4 GPUs; jobs asking the profile's GPUs are refused"),
    "GPUs where there are none": (_set("partitions.cpu.gpus_per_node", 4), "partitions.cpu.gpus_per_node",
                                  "have no GPUs"),
    "more CPUs": (_set("partitions.gpu.cpus_per_node", 128), "partitions.gpu.cpus_per_node",
                  "give a job at most 96 CPUs"),
    "more memory": (_set("partitions.gpu.mem_gb", 1000), "partitions.gpu.mem_gb",
                    "at most 502 GB (RealMemory=515000 MB)"),
    "missing partition": (_set("partitions.gpu-h200", {"gpus_per_node": 4}), "partitions.gpu-h200",
                          "cluster gpufarm has no partition gpu-h200 (it has: cpu, gpu, gpu-a100, interactive)"),
    "missing default partition": (lambda s: (s["partitions"].__setitem__("main", s["partitions"].pop("gpu")),
                                             s.__setitem__("default_partition", "main")),
                                  "partitions.main", "has no partition main"),
    "gpus-per-node on cons_res": (_set("gpu_directive", "gpus-per-node"), "gpu_directive",
                                  "runs select/cons_res, which takes GPUs only as --gres"),
    "unknown account": (_set("account", "proj9"), "account",
                        "user alice has no association with it on cluster gpufarm (accounts: proj1, proj2); "
                        "jobs are refused (InvalidAccount)"),
    "unknown QOS": (_set("qos", "premium"), "qos", "has no such QOS (it has: debug, long, normal)"),
    "QOS not in the association": (_set("qos", "debug"), "qos", "allows QOS long, normal; jobs are refused"),
    "constraint nobody has": (_set("partitions.gpu-a100.constraint", "h100"), "partitions.gpu-a100.constraint",
                              "no node of partition gpu-a100 on cluster gpufarm has feature(s) h100"),
    "QOS node limit under max_nodes": (lambda s: (_set("qos", "long")(s), _set("partitions.gpu.qos", "normal")(s),
                                           _set("partitions.gpu-a100.qos", "normal")(s)),
                                "partitions.cpu.max_nodes", "QOS long on cluster gpufarm allows 2 node(s) per job"),
    "association wall under max_time": (_set("account", "proj2"), "partitions.gpu.max_time",
                                        "the association of account proj2 on cluster gpufarm allows 12:00:00; "
                                        "jobs over it never start (AssocMaxWallDurationPerJobLimit)"),
    "account not allowed on the partition": (lambda s: (_set("partitions.interactive",
                                                             {"gpus_per_node": 4, "gpu_type": "h100",
                                                              "max_nodes": 1, "max_time": "04:00:00",
                                                              "cpus_per_node": 96, "mem_gb": 502})(s)),
                                             "account", "partition interactive on cluster gpufarm allows only "
                                                        "account(s) staff; jobs are refused"),
}


@pytest.mark.parametrize("case", sorted(FATAL))
def test_a_stale_fact_is_fatal_and_said_in_profile_terms(case):
    change, key, words = FATAL[case]
    site = profile("gpufarm")
    change(site)
    report = compare(site, GPUFARM)
    assert key in keys(report.fatal), report.format()
    assert any(d.key == key and words in d.message for d in report.fatal), report.format()


WARNING = {
    "shorter max_time": (_set("partitions.gpu.max_time", "12:00:00"), "partitions.gpu.max_time",
                         "the profile says 12:00:00, partition gpu on cluster gpufarm allows 1-00:00:00"),
    "no max_time": (_set("partitions.gpu.max_time", None), "partitions.gpu.max_time",
                    "the profile gives none, partition gpu on cluster gpufarm allows 1-00:00:00; jobs over it "
                    "would pend forever (EnforcePartLimits=NO)"),
    "fewer nodes": (_set("partitions.gpu.max_nodes", 2), "partitions.gpu.max_nodes", "gives a job up to 4"),
    "fewer GPUs": (_set("partitions.gpu.gpus_per_node", 2), "partitions.gpu.gpus_per_node", "jobs use 2 of them"),
    "no GPU type": (_set("partitions.gpu.gpu_type", None), "partitions.gpu.gpu_type",
                    "the profile gives none, the GPUs of partition gpu on cluster gpufarm are h100"),
    "another default": (_set("default_partition", "gpu-a100"), "default_partition",
                        "cluster gpufarm's default is gpu; glaunch names the partition, so jobs go to gpu-a100"),
    "fewer CPUs": (_set("partitions.gpu.cpus_per_node", 48), "partitions.gpu.cpus_per_node", "have 96 CPUs"),
    "preemptible flag": (_set("partitions.gpu.preemptible", True), "partitions.gpu.preemptible",
                         "cannot be preempted (PreemptMode=OFF)"),
}


@pytest.mark.parametrize("case", sorted(WARNING))
def test_a_conservative_or_unstated_fact_is_a_warning(case):
    change, key, words = WARNING[case]
    site = profile("gpufarm")
    change(site)
    report = compare(site, GPUFARM)
    assert report.fatal == [], report.format()
    assert any(d.key == key and words in d.message for d in report.warnings), report.format()


def test_autodetected_gpu_type_names_match_the_short_name():
    text = recorded("gpufarm.scontrol.txt").replace("gpu:h100:4", "gpu:nvidia_h100_80gb_hbm3:4")
    report = compare(profile("gpufarm"), parse_cluster(text, assoc_text=recorded("gpufarm.assoc.txt"),
                                                       qos_text=recorded("gpufarm.qos.txt"), user="alice"))
    assert "partitions.gpu.gpu_type" not in keys(report.fatal + report.warnings), report.format()


def test_a_partition_mixing_gpu_types_warns_and_names_the_constraint():
    text = recorded("gpufarm.scontrol.txt").replace("NodeName=g005 Arch=x86_64 CoresPerSocket=48  CPUAlloc=0 "
                                                      "CPUEfctv=96 CPUTot=96 CPULoad=0.02 AvailableFeatures=h100,ib "
                                                      "ActiveFeatures=h100,ib Gres=gpu:h100:4",
                                                      "NodeName=g005 Arch=x86_64 CoresPerSocket=48  CPUAlloc=0 "
                                                      "CPUEfctv=96 CPUTot=96 CPULoad=0.02 AvailableFeatures=l40s "
                                                      "ActiveFeatures=l40s Gres=gpu:l40s:4")
    assert "gpu:l40s:4" in text
    report = compare(profile("gpufarm"), parse_cluster(text))
    assert not report.fatal, report.format()
    assert any(d.key == "partitions.gpu.gpu_type" and "1 of the 6 GPU nodes" in d.message
               and "partitions.gpu.constraint" in d.message for d in report.warnings), report.format()


def test_untyped_gres_cannot_confirm_the_type():
    text = recorded("gpufarm.scontrol.txt").replace("gpu:h100:4(S:0-1)", "gpu:4(S:0-1)")
    report = compare(profile("gpufarm"), parse_cluster(text))
    assert any(d.key == "partitions.gpu.gpu_type" and "cannot be confirmed" in d.message for d in report.warnings)
    assert "partitions.gpu.gpu_type" not in keys(report.fatal)


def test_the_local_cluster_refuses_over_limit_jobs_at_submission():
    site = profile("local-slurm")
    site["partitions"]["debug"]["gpu_type"] = "a100"
    site["partitions"]["debug"]["max_time"] = "3-00:00:00"
    report = compare(site, GLAUNCH)
    assert [str(d) for d in report.fatal] == [
        "partitions.debug.gpu_type: the profile says a100, the GPUs of partition debug on cluster glaunch are sim; "
        "jobs would run on other hardware",
        "partitions.debug.max_time: the profile says 3-00:00:00, partition debug on cluster glaunch allows "
        "02:00:00; jobs over it are refused at submission (EnforcePartLimits=ALL)"]


def test_every_fatal_difference_is_listed_at_once():
    site = profile("gpufarm")
    for case in ("gpu type", "max_time over", "more GPUs", "unknown account"):
        FATAL[case][0](site)
    report = compare(site, GPUFARM)
    assert keys(report.fatal) == ["partitions.gpu.gpus_per_node", "partitions.gpu.gpu_type",
                                  "partitions.gpu-a100.max_time", "account"], report.format()
    error = report.error("/sites/gpufarm.yaml")
    assert isinstance(error, SchedulerError) and error.exit_code == 3
    text = str(error)
    assert text.startswith("/sites/gpufarm.yaml: site gpufarm does not match Slurm cluster gpufarm; "
                           "nothing was submitted:")
    assert all(str(d) in text for d in report.fatal)
    assert "glaunch sites check gpufarm" in text


def test_submit_checks_only_the_job_s_partition():
    site = profile("gpufarm")
    FATAL["max_nodes over MaxNodes"][0](site)          # gpu-a100
    FATAL["gpu type"][0](site)                         # gpu
    on_a100 = compare(site, GPUFARM, partition="gpu-a100")
    on_cpu = compare(site, GPUFARM, partition="cpu")
    assert keys(on_a100.fatal) == ["partitions.gpu-a100.max_nodes"], on_a100.format()
    assert on_cpu.fatal == [] and on_cpu.warnings == [], on_cpu.format()
    # Site-wide facts count wherever the job goes.
    FATAL["unknown account"][0](site)
    assert keys(compare(site, GPUFARM, partition="cpu").fatal) == ["account"]


def _request(partition="gpu", nodes=1, time="01:00:00", gpus=4):
    return Request(partition, nodes, slurmtime.parse(time), gpus)


def test_the_job_s_request_meets_the_limits_the_profile_leaves_out():
    site = profile("gpufarm")
    site["partitions"]["gpu"]["max_time"] = None
    site["partitions"]["gpu"]["max_nodes"] = None
    report = compare(site, GPUFARM, partition="gpu", request=_request(nodes=5, time="2-00:00:00"))
    assert [str(d) for d in report.fatal] == [
        "resources.time: 2-00:00:00 asked, partition gpu on cluster gpufarm allows 1-00:00:00 (the profile gives "
        "no partitions.gpu.max_time); this job would pend forever (EnforcePartLimits=NO)",
        "resources.nodes: 5 asked, partition gpu on cluster gpufarm gives a job at most 4; this job would pend "
        "forever (EnforcePartLimits=NO)"]
    assert compare(site, GPUFARM, partition="gpu", request=_request(nodes=4, time="1-00:00:00")).fatal == []


def test_the_job_s_request_meets_its_qos_and_association():
    site = profile("gpufarm")
    site["account"] = "proj2"                          # MaxWall=12:00:00, MaxTRES=node=2
    site["partitions"]["gpu"]["max_time"] = "12:00:00"
    site["partitions"]["gpu"]["max_nodes"] = 2
    site["partitions"]["cpu"]["max_time"] = "12:00:00"
    site["partitions"]["cpu"]["max_nodes"] = 2
    assert compare(site, GPUFARM, partition="gpu", request=_request(nodes=2, time="12:00:00")).fatal == []
    site["partitions"]["gpu"]["max_time"] = None
    report = compare(site, GPUFARM, partition="gpu", request=_request(nodes=2, time="20:00:00"))
    assert [d.key for d in report.fatal] == ["resources.time"]
    assert "the association of account proj2 on cluster gpufarm allows 12:00:00; this job would never start " \
           "(AssocMaxWallDurationPerJobLimit)" in report.fatal[0].message


def test_without_accounting_accounts_are_not_checked_and_the_report_says_so():
    site = profile("gpufarm")
    site["account"] = "proj9"
    report = compare(site, cluster("gpufarm", "alice", accounting=False))
    assert report.fatal == [], report.format()
    assert report.notes == ["account and QOS not checked: sacctmgr said: Connection refused"]
    assert "note     account and QOS not checked" in report.format()


def test_a_drained_or_inactive_partition():
    text = recorded("gpufarm.scontrol.txt")
    drained = text.replace("PartitionName=gpu-a100 ", "PartitionName=gpu-a100 ").replace(
        "MaxTime=12:00:00 MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=a[01-04] PriorityJobFactor=1 "
        "PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=OFF State=UP",
        "MaxTime=12:00:00 MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=a[01-04] PriorityJobFactor=1 "
        "PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=OFF State=DRAIN")
    assert drained != text
    report = compare(profile("gpufarm"), parse_cluster(drained))
    assert any(d.key == "partitions.gpu-a100" and "is DRAIN: it takes no new jobs" in d.message
               for d in report.fatal), report.format()
    down = drained.replace("PreemptMode=OFF State=DRAIN", "PreemptMode=OFF State=DOWN")
    report = compare(profile("gpufarm"), parse_cluster(down))
    assert report.fatal == [] and any("is DOWN" in d.message for d in report.warnings)


def test_the_report_as_json():
    site = profile("gpufarm")
    FATAL["gpu type"][0](site)
    data = compare(site, GPUFARM).to_json()
    assert data["ok"] is False and data["site"] == "gpufarm" and data["cluster"] == "gpufarm"
    assert data["fatal"][0] == dataclasses.asdict(compare(site, GPUFARM).fatal[0])
    assert data["fatal"][0]["key"] == "partitions.gpu.gpu_type" and data["fatal"][0]["partition"] == "gpu"


def test_what_the_cluster_names_is_printed_escaped():
    """A partition's name, a node's features and the cluster's name come from slurm.conf: an
    escape sequence or a line break there reaches neither the terminal nor another line."""
    from launcher.views.sites_text import format_check

    osc, csi = "\x1b]0;owned\x07", "\x9b2J"
    text = (recorded("gpufarm.scontrol.txt").replace("PartitionName=interactive", f"PartitionName=inter{osc}active")
            .replace("AvailableFeatures=h100,ib", f"AvailableFeatures=h100,i{csi}b")
            .replace("ClusterName             = gpufarm", f"ClusterName             = gpu{osc}farm"))
    farm = parse_cluster(text, user="alice")
    assert farm.name == f"gpu{osc}farm" and f"inter{osc}active" in farm.partitions
    site = profile("gpufarm")
    site["partitions"]["gpu"]["constraint"] = "a100"          # names the features the nodes have
    report = compare(site, farm)
    shown = format_check(report)
    assert not [c for c in shown if not c.isprintable() and c != "\n"], shown
    assert shown.count("\n") == len(report.fatal) + len(report.warnings) + len(report.notes)
    assert "inter\\x1b]0;owned\\x07active" in shown and "gpu\\x1b]0;owned\\x07farm" in shown
    assert "i\\x9b2Jb" in shown
    refusal = str(report.error("gpufarm.yaml"))
    assert not [c for c in refusal if not c.isprintable() and c != "\n"], refusal
    assert refusal.count("\n") == len(report.fatal) + 1
