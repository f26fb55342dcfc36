"""`glaunch sites detect` without a cluster: the profile built from `scontrol show
partition/node -o` of three differently shaped clusters (tests/recorded/), and the
rendered profile loading as a valid site.

- glaunch: the local Slurm 22.05 cluster, recorded live (2 nodes, Gres=gpu:sim:2, a
  preemptible partition below a higher tier);
- hpc-a100: Slurm 23.02, select/cons_tres, typed GRES, a CPU-only partition, nodes in
  several partitions, different limits, a REQUEUE scavenger tier;
- mixedgpu: Slurm 22.05, select/cons_res (--gres only), V100 and A100 nodes in one
  partition, UNLIMITED limits, DefMemPerCPU, the default partition not first.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from launcher import api
from launcher.config import schema
from launcher.config.login import Login
from launcher.config.sites import load_site
from launcher.errors import ConfigError
from launcher.schedulers.cluster import detect
from launcher.schedulers.cluster.detect import detect_profile, render_profile
from launcher.schedulers.cluster.scontrol_text import gpu_kinds, parse_records
from launcher.schedulers.slurm.client import CLIENT, Client

RECORDED = Path(__file__).parent.parent / "recorded"
SHIPPED = Path(__file__).resolve().parents[2] / "site_configs"


def build_profile(name: str, partitions_text: str, nodes_text: str, *, select_type: str = "",
                  account: str | None = None, user: str | None = None) -> dict:
    """detect_profile's profile mapping, with only SelectType of scontrol's settings."""
    return detect_profile(name, partitions_text, nodes_text, settings={"SelectType": select_type},
                          account=account, user=user).profile


def gpus_of(gres: str) -> tuple[int, str | None]:
    """Total GPUs and their type (None when untyped or mixed), as gpu_kinds counts them."""
    kinds = gpu_kinds(gres)
    types = set(kinds)
    return sum(kinds.values()), (types.pop() if len(types) == 1 else None)


def recorded(name: str) -> str:
    """The command's output, verbatim, without the file's first line (the command)."""
    return (RECORDED / name).read_text(encoding="utf-8").partition("\n")[2]


def cluster(name: str, account: str | None = None) -> dict:
    """build_profile on a cluster's recordings, with SelectType read as query_cluster reads it."""
    settings = dict(re.findall(r"^(\w+)\s*=\s*(.*?)\s*$", recorded(f"scontrol-config-{name}.txt"), re.M))
    assert settings["ClusterName"] == name
    return build_profile(name, recorded(f"scontrol-partition-{name}.txt"), recorded(f"scontrol-node-{name}.txt"),
                         select_type=settings["SelectType"], account=account)


def part(gpus, cpus, mem, max_nodes, max_time=None, gpu_type=None, preemptible=False):
    entry = {"gpus_per_node": gpus}
    if gpu_type:
        entry["gpu_type"] = gpu_type
    entry.update(gpu_mem_gb=None, cpus_per_node=cpus, mem_gb=mem, max_nodes=max_nodes)
    if max_time:
        entry["max_time"] = max_time
    if preemptible:
        entry["preemptible"] = True
    return entry


A100_NODE = dict(cpus=128, mem=502, gpu_type="a100")     # RealMemory=515000 MB -> 502 GB

PROFILES: dict[str, dict[str, Any]] = {
    "glaunch": {
        "name": "glaunch", "extends": "base-slurm", "scheduler": "slurm", "account": "glaunch",
        "gpu_directive": "gpus-per-node", "default_partition": "debug",
        "partitions": {
            # PreemptMode=REQUEUE under urgent's PriorityTier=10
            "debug": part(2, 4, 7, 2, "02:00:00", "sim", preemptible=True),
            "urgent": part(2, 4, 7, 2, "00:30:00", "sim"),
        },
    },
    "hpc-a100": {
        "name": "hpc-a100", "extends": "base-slurm", "scheduler": "slurm", "account": None,
        "gpu_directive": "gpus-per-node", "default_partition": "gpu",
        "partitions": {
            "cpu": part(0, 96, 186, 3, "3-00:00:00"),         # MaxNodes=UNLIMITED: TotalNodes; the smallest node
            "gpu": part(4, max_nodes=4, max_time="2-00:00:00", **A100_NODE),
            "gpu-long": part(4, max_nodes=2, max_time="7-00:00:00", **A100_NODE),
            "gpu-scavenge": part(4, max_nodes=4, max_time="1-00:00:00", preemptible=True, **A100_NODE),
            "debug": part(4, max_nodes=1, max_time="00:30:00", **A100_NODE),   # PriorityTier=20, PreemptMode=OFF
        },
    },
    "mixedgpu": {
        "name": "mixedgpu", "extends": "base-slurm", "scheduler": "slurm", "account": None,
        "gpu_directive": "gres", "default_partition": "batch",
        "partitions": {
            "short": part(4, 40, 186, 4, "04:00:00"),        # v100:4 and a100:8 nodes: no one type
            "batch": part(4, 40, 186, 4),                    # MaxTime=UNLIMITED
            "a100": part(8, 128, 1006, 2, "2-00:00:00", "a100"),
        },
    },
}
ACCOUNTS = {"glaunch": "glaunch"}


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_build_profile(name):
    profile = cluster(name, ACCOUNTS.get(name))
    assert profile == PROFILES[name]
    assert list(profile["partitions"]) == list(PROFILES[name]["partitions"])   # scontrol's order


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_rendered_profile_loads_as_a_valid_site(tmp_path, name):
    profile = cluster(name, ACCOUNTS.get(name))
    text = render_profile(profile, name)
    assert text.startswith(f"# {name} -- detected from Slurm cluster '{name}' by `glaunch sites detect`")
    path = tmp_path / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    site = load_site(str(path), tmp_path, {"HOME": str(tmp_path / "home")})
    assert [p.name for p in site.chain] == ["base-slurm.yaml", f"{name}.yaml"]
    config = site.config
    for key in ("name", "scheduler", "account", "gpu_directive", "default_partition"):
        assert getattr(config, key) == profile[key], key
    assert list(config.partitions) == list(profile["partitions"])
    for pname, expected in profile["partitions"].items():
        loaded = config.partitions[pname]
        full = {**vars(schema.Partition(gpus_per_node=0)), **expected}   # what the profile leaves out: defaults
        assert vars(loaded) == full, pname
        if "max_time" in expected:
            assert isinstance(loaded.max_time, str)   # "02:00:00" is no YAML 1.1 sexagesimal number


def test_rendered_profile_text():
    text = render_profile(PROFILES["glaunch"], "glaunch")
    head, _, body = text.partition("name: glaunch\n")
    assert re.fullmatch(r"# glaunch -- detected from Slurm cluster 'glaunch' by `glaunch sites detect` on "
                        r"\d{4}-\d\d-\d\d\.\n# Fill in what Slurm does not know: gpu_mem_gb \(for `glaunch plan`\), "
                        r"modules, env\n# \(NCCL/network\), setup \(the Python environment on the nodes\), container, "
                        r"runs_root\.\n", head)
    assert body == (
        "extends: base-slurm\nscheduler: slurm\naccount: glaunch\ngpu_directive: gpus-per-node\n"
        "default_partition: debug\npartitions:\n"
        "  debug:\n    gpus_per_node: 2\n    gpu_type: sim\n    gpu_mem_gb: null\n    cpus_per_node: 4\n"
        "    mem_gb: 7\n    max_nodes: 2\n    max_time: \"02:00:00\"\n    preemptible: true\n"
        "  urgent:\n    gpus_per_node: 2\n    gpu_type: sim\n    gpu_mem_gb: null\n    cpus_per_node: 4\n"
        "    mem_gb: 7\n    max_nodes: 2\n    max_time: \"00:30:00\"\n")


def test_detected_local_profile_agrees_with_the_shipped_one():
    """The hand-written local-slurm profile describes the same cluster: detect must find what Slurm knows of it."""
    shipped = yaml.safe_load((SHIPPED / "local-slurm.yaml").read_text(encoding="utf-8"))
    detected = cluster("glaunch", account="glaunch")
    for key in ("scheduler", "account", "gpu_directive", "default_partition"):
        assert detected[key] == shipped[key], key
    assert set(detected["partitions"]) == set(shipped["partitions"])
    for pname, entry in detected["partitions"].items():
        hand = shipped["partitions"][pname]
        for key, value in entry.items():
            if key != "gpu_mem_gb":     # Slurm knows no GPU memory
                assert hand.get(key) == value, f"{pname}.{key}"
        assert hand.get("preemptible", False) == entry.get("preemptible", False), pname


# --- the pieces -----------------------------------------------------------------------------


def test_parse_records_reads_every_line_of_the_local_cluster():
    parts = parse_records(recorded("scontrol-partition-glaunch.txt"))
    assert [(p["PartitionName"], p["Default"], p["MaxTime"], p["PriorityTier"], p["PreemptMode"]) for p in parts] \
        == [("debug", "YES", "02:00:00", "1", "REQUEUE"), ("urgent", "NO", "00:30:00", "10", "OFF")]
    assert parts[0]["TRES"] == "cpu=8,mem=16000M,node=2,billing=8,gres/gpu=4"   # '=' inside a value
    nodes = parse_records(recorded("scontrol-node-glaunch.txt"))
    assert [(n["NodeName"], n["Gres"], n["CPUTot"], n["RealMemory"], n["Partitions"]) for n in nodes] \
        == [("node1", "gpu:sim:2", "4", "8000", "debug,urgent"), ("node2", "gpu:sim:2", "4", "8000", "debug,urgent")]
    assert nodes[0]["OS"] == "Linux" and nodes[0]["BootTime"] == "2026-12-03T12:55:32"   # OS=... has spaces


def test_parse_records_keeps_the_keys_after_a_reason_with_spaces():
    nodes = {n["NodeName"]: n for n in parse_records(recorded("scontrol-node-hpc-a100.txt"))}
    assert list(nodes) == ["cn001", "cn002", "cn003", "gn001", "gn002", "gn003", "gn004"]
    assert nodes["gn003"]["State"] == "IDLE+DRAIN" and nodes["gn003"]["Reason"] == "nvlink"
    assert nodes["gn003"]["Partitions"] == "gpu,gpu-scavenge"
    assert nodes["cn001"]["Gres"] == "(null)" and nodes["cn001"]["AllocTRES"] == ""


def test_parse_records_skips_lines_without_fields():
    assert parse_records("\n# comment\nNo such partition\nPartitionName=x Default=NO\n") \
        == [{"PartitionName": "x", "Default": "NO"}]


@pytest.mark.parametrize("gres, found", [
    ("gpu:sim:2", (2, "sim")),
    ("gpu:a100:4(S:0-1)", (4, "a100")),
    ("gpu:8(S:0-7)", (8, None)),
    ("gpu:4", (4, None)),
    ("gpu:a100:4(S:0-1),gpu:h100:2", (6, None)),            # two types: no one type
    ("gpu:a100:2(S:0),gpu:a100:2(S:1)", (4, "a100")),
    ("gpu:a100_3g.40gb:7(S:0-1)", (7, "a100_3g.40gb")),     # MIG slices
    ("gpu:tesla:2(S:0),mps:200", (2, "tesla")),
    ("lscratch:3570,gpu:A100:4(S:0-1)", (4, "A100")),
    ("mps:200", (0, None)),
    ("(null)", (0, None)),
    ("", (0, None)),
])
def test_gpus_of(gres, found):
    assert gpus_of(gres) == found


def test_gpu_directive_follows_the_select_plugin():
    parts, nodes = recorded("scontrol-partition-glaunch.txt"), recorded("scontrol-node-glaunch.txt")
    assert build_profile("c", parts, nodes, select_type="select/cons_tres")["gpu_directive"] == "gpus-per-node"
    assert build_profile("c", parts, nodes, select_type="select/cons_res")["gpu_directive"] == "gres"
    assert build_profile("c", parts, nodes, select_type="select/linear")["gpu_directive"] == "gres"
    cpu_only = "".join(line for line in recorded("scontrol-node-hpc-a100.txt").splitlines(True)
                       if "Partitions=cpu " in line)
    profile = build_profile("c", recorded("scontrol-partition-hpc-a100.txt"), cpu_only, select_type="select/cons_res")
    assert profile["gpu_directive"] == "gpus-per-node"      # no GPUs: nothing to ask --gres for


def test_without_a_default_partition_the_first_is_the_default():
    text = recorded("scontrol-partition-mixedgpu.txt").replace("Default=YES", "Default=NO")
    profile = build_profile("c", text, recorded("scontrol-node-mixedgpu.txt"))
    assert profile["default_partition"] == "short"
    assert build_profile("c", "", "")["default_partition"] is None


def test_preemptible_needs_a_higher_tier_to_preempt_it():
    text = recorded("scontrol-partition-glaunch.txt").replace("PriorityTier=10", "PriorityTier=1")
    profile = build_profile("c", text, recorded("scontrol-node-glaunch.txt"), select_type="select/cons_tres")
    assert [p.get("preemptible", False) for p in profile["partitions"].values()] == [False, False]


def test_cpus_per_node_leaves_out_specialized_cores():
    nodes = recorded("scontrol-node-hpc-a100.txt").replace(
        "CPUAlloc=0 CPUEfctv=128 CPUTot=128", "CPUAlloc=0 CPUEfctv=120 CPUTot=128").replace(
        "Boards=1", "Boards=1 CoreSpecCount=4 CPUSpecList=60-63,124-127")
    profile = build_profile("c", recorded("scontrol-partition-hpc-a100.txt"), nodes, select_type="select/cons_tres")
    assert profile["partitions"]["gpu-long"]["cpus_per_node"] == 120    # gn002's 128 less 8 specialized


# Two shapes that detect should turn into valid profiles, and does not yet.
TINY_PARTITIONS = ("PartitionName=main Default=YES MaxNodes=UNLIMITED MaxTime=UNLIMITED Nodes=n1 PriorityTier=1 "
                   "PreemptMode=OFF TotalCPUs=4 TotalNodes=1\n")


def test_a_node_without_configured_memory_gives_a_valid_profile(tmp_path):
    nodes = "NodeName=n1 CPUTot=4 RealMemory=1 Gres=(null) Partitions=main State=IDLE\n"
    check_loads(tmp_path, build_profile("tiny", TINY_PARTITIONS, nodes))


def test_a_partition_without_nodes_gives_a_valid_profile(tmp_path):
    parts = TINY_PARTITIONS + ("PartitionName=spare Default=NO MaxNodes=UNLIMITED MaxTime=UNLIMITED Nodes=(null) "
                               "PriorityTier=1 PreemptMode=OFF TotalCPUs=0 TotalNodes=0\n")
    nodes = "NodeName=n1 CPUTot=4 RealMemory=8000 Gres=(null) Partitions=main State=IDLE\n"
    check_loads(tmp_path, build_profile("tiny", parts, nodes))


def check_loads(tmp_path, profile):
    path = tmp_path / "tiny.yaml"
    path.write_text(render_profile(profile, "tiny"), encoding="utf-8")
    try:
        load_site(str(path), tmp_path, {"HOME": str(tmp_path / "home")})
    except ConfigError as exc:
        pytest.fail(f"the detected profile does not load: {exc}")


# --- what the cluster names: checked before it becomes a file name, escaped before it is shown --

ESC_TITLE = "\x1b]0;owned\x07"              # OSC: sets the terminal's title
CSI = "\x9b2J"                              # C1 CSI: clears the screen


def scontrol_answer(cluster_name: str, partitions: str = TINY_PARTITIONS,
                    nodes: str = "NodeName=n1 CPUTot=4 RealMemory=8000 Gres=gpu:a100:2 Partitions=main State=IDLE\n"
                    ) -> str:
    """scontrol's answer to SCONTROL_COMMANDS on a cluster of the given name."""
    return partitions + nodes + f"Configuration data as of 2026-01-01T00:00:00\nClusterName             = {cluster_name}\n" \
        "SelectType              = select/cons_tres\n"


@pytest.fixture
def fake_cluster(monkeypatch, tmp_path, isolated_env):
    """query_cluster reads `answer["text"]` instead of asking scontrol; no sacctmgr, user alice."""
    answer = {"text": scontrol_answer("tiny")}
    monkeypatch.setattr(detect, "read_scontrol", lambda client, command: answer["text"])
    monkeypatch.setattr(Client, "has_command", lambda self, name: False)
    monkeypatch.setattr(detect, "current_user", lambda client: "alice")
    monkeypatch.setattr(detect, "user_groups", lambda client, user: None)
    monkeypatch.chdir(tmp_path)
    return answer


def files_near(folder: Path) -> set[Path]:
    """Every file under the test's folder but its home, and the entries of the two folders
    above it: where a name with `..` in it could write. (Not every file above: those are
    every earlier test's, thousands of them.)"""
    return ({p for p in folder.rglob("*") if "home" not in p.relative_to(folder).parts}
            | set(folder.parent.iterdir()) | set(folder.parent.parent.iterdir()))


@pytest.mark.parametrize("cluster_name", ["../../escaped", "/tmp/glaunch-absolute", "..", ".hidden", "-rf",
                                          "a" * 300, "tiny" + ESC_TITLE, "a/b"])
def test_a_cluster_name_that_is_no_profile_name_is_refused_and_nothing_written(fake_cluster, tmp_path, cluster_name):
    fake_cluster["text"] = scontrol_answer(cluster_name)
    before = files_near(tmp_path)
    with pytest.raises(ConfigError) as info:
        api.detect_site(write_to=True)
    assert info.value.key == "--name" and info.value.exit_code == 2
    assert "ClusterName" in info.value.message and "--name" in str(info.value)
    assert "\x1b" not in str(info.value) and "\x07" not in str(info.value)
    assert files_near(tmp_path) == before
    assert not Path("/tmp/glaunch-absolute.yaml").exists()


def test_a_good_name_given_replaces_a_bad_cluster_name(fake_cluster, tmp_path):
    fake_cluster["text"] = scontrol_answer("../../escaped")
    name, text, path = api.detect_site("tiny", write_to=True)
    assert name == "tiny" and path == tmp_path / "home" / ".config" / "glaunch" / "sites" / "tiny.yaml"
    assert path.read_text() == text
    assert "'../../escaped'" in text.splitlines()[0]          # the cluster's name, quoted, in the comment


@pytest.mark.parametrize("name", ["../x", "a" * 300, "x\x1by"])
def test_a_bad_name_given_is_refused_as_a_profile_name_is(fake_cluster, name):
    with pytest.raises(ConfigError) as info:
        detect.query_cluster(CLIENT, name)
    assert info.value.key == "--name"


HOSTILE_PARTITIONS = (
    TINY_PARTITIONS
    + f"PartitionName=gp{ESC_TITLE}u Default=NO MaxNodes=UNLIMITED MaxTime=UNLIMITED Nodes=n1 PriorityTier=1 "
      "PreemptMode=OFF TotalNodes=1\n"
    + f"PartitionName=x{CSI} Default=NO MaxNodes=UNLIMITED MaxTime=UNLIMITED Nodes=n1 PriorityTier=1 "
      f"PreemptMode=OFF TotalNodes=1 AllowQos=normal,q{ESC_TITLE}\n"
    + f"PartitionName=solo Default=NO MaxNodes=UNLIMITED MaxTime=UNLIMITED Nodes=n1 PriorityTier=1 "
      f"PreemptMode=OFF TotalNodes=1 AllowQos=q{ESC_TITLE}\n"
    + "PartitionName=locked Default=NO MaxNodes=UNLIMITED MaxTime=UNLIMITED Nodes=n1 PriorityTier=1 "
      f"PreemptMode=OFF TotalNodes=1 AllowAccounts=a{CSI}\n")
HOSTILE_NODES = f"NodeName=n1 CPUTot=4 RealMemory=8000 Gres=gpu:a{ESC_TITLE}:2 Partitions=main,solo State=IDLE\n"


def control_characters(text: str) -> list[str]:
    return [c for c in text if not c.isprintable() and c != "\n"]


def test_control_characters_from_the_cluster_reach_neither_the_profile_nor_the_terminal(fake_cluster, tmp_path):
    fake_cluster["text"] = scontrol_answer("tiny", HOSTILE_PARTITIONS, HOSTILE_NODES)
    detected = detect_profile("tiny", HOSTILE_PARTITIONS, HOSTILE_NODES, account="acct", user="alice")
    assert list(detected.profile["partitions"]) == ["main", "solo"]
    assert "gpu_type" not in detected.profile["partitions"]["main"]      # the GRES type is no name
    assert "qos" not in detected.profile["partitions"]["solo"]           # nor the one QOS it takes
    notes = "\n".join(detected.notes)
    assert not control_characters(notes), notes
    assert "partition 'gp\\x1b]0;owned\\x07u' left out" in notes           # named, escaped
    assert "partition 'x\\x9b2J' left out" in notes
    assert "partitions.solo.qos" in notes and "partitions.main.gpu_type" in notes
    name, text, _ = api.detect_site(write_to=False)
    assert not control_characters(text), text
    path = tmp_path / "tiny.yaml"
    path.write_text(text, encoding="utf-8")
    site = load_site(str(path), tmp_path, {"HOME": str(tmp_path / "home")})   # it still loads
    assert list(site.config.partitions) == ["main", "solo", "locked"]      # no account known: locked is kept


def test_sites_detect_prints_no_control_character(fake_cluster, tmp_path, monkeypatch, capsys):
    from badinput import run_cli

    fake_cluster["text"] = scontrol_answer("tiny", HOSTILE_PARTITIONS, HOSTILE_NODES)
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "sites", "detect", "-o", "-"])
    assert code == 0, err
    assert not control_characters(out + err) and "left out" in out
    fake_cluster["text"] = scontrol_answer("../" + ESC_TITLE)
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "sites", "detect"])
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert not control_characters(err) and "--name" in err
    assert not (tmp_path / "site_configs").exists()


def test_a_check_report_escapes_what_the_cluster_named(monkeypatch):
    from launcher.schedulers.cluster.check import compare
    from launcher.schedulers.cluster.facts import parse_cluster
    from launcher.views.sites_text import format_check

    text = scontrol_answer("tiny" + ESC_TITLE, HOSTILE_PARTITIONS, HOSTILE_NODES)
    report = compare({"name": "tiny", "partitions": {"main": {"gpus_per_node": 2, "gpu_type": "a100"}}},
                     parse_cluster(text, user="alice"))
    shown = format_check(report)
    assert not control_characters(shown), shown
    assert len(shown.splitlines()) == 1 + len(report.fatal) + len(report.warnings) + len(report.notes)
    assert "\\x1b]0;owned\\x07" in shown
    assert not control_characters(str(report.error("tiny.yaml")).replace("\n", ""))


# --- over SSH: the login shell's python3 ----------------------------------------------------


def login_shell_answers(monkeypatch, stdout: str, returncode: int = 0) -> list[tuple[str, ...]]:
    """The client answers `stdout` to the login-shell question (and records what was asked)."""
    asked: list[tuple[str, ...]] = []

    def call(self, *cmd, **kwargs):
        asked.append(cmd)
        return subprocess.CompletedProcess(list(cmd), returncode, stdout, "")

    monkeypatch.setattr(Client, "call", call)
    return asked


def test_detect_over_ssh_writes_the_python3_of_the_login_shell_and_none_of_what_it_prints(fake_cluster,
                                                                                          monkeypatch, tmp_path):
    banner = "Welcome to tiny!\nGLAUNCH-PYTHON3 is not a command\nmodule: loaded pytorch/2.5\n"
    asked = login_shell_answers(monkeypatch, banner + "GLAUNCH-PYTHON3 /opt/envs/torch/bin/python3\n")
    _, text = detect.query_cluster(CLIENT, None, login=Login("login1", user="alice"))
    profile = yaml.safe_load(text)
    assert profile["python"] == "/opt/envs/torch/bin/python3"
    assert asked == [("bash", "-lc", detect.FIND_PYTHON)]
    assert "Welcome" not in text and "module:" not in text
    (tmp_path / "tiny.yaml").write_text(text)
    site = load_site(str(tmp_path / "tiny.yaml"), tmp_path, {"HOME": str(tmp_path / "home")})
    assert site.config.python == "/opt/envs/torch/bin/python3"


@pytest.mark.parametrize(("stdout", "returncode"), [
    ("GLAUNCH-PYTHON3 \n", 0),                       # command -v found none
    ("GLAUNCH-PYTHON3 python3\n", 0),                # not a path
    ("GLAUNCH-PYTHON3 /usr/bin/py\x1b]0;x\x07\n", 0),
    ("", 127),                                       # no bash there
])
def test_detect_over_ssh_without_a_python3_says_to_set_python(fake_cluster, monkeypatch, stdout, returncode):
    login_shell_answers(monkeypatch, stdout, returncode)
    _, text = detect.query_cluster(CLIENT, None, login=Login("login1"))
    assert "python" not in yaml.safe_load(text)
    assert "# Review: the login shell has no python3 on its PATH: set python:" in text
    assert "\x1b" not in text


def test_detect_on_the_cluster_itself_asks_no_login_shell(fake_cluster, monkeypatch):
    asked = login_shell_answers(monkeypatch, "GLAUNCH-PYTHON3 /usr/bin/python3\n")
    _, text = detect.query_cluster(CLIENT, None)
    assert asked == [] and "python" not in yaml.safe_load(text)


@pytest.mark.parametrize("banner", ["", "Welcome\n", "a notice that ends no line", "\x1b[0mcolour, no newline"])
def test_the_python3_line_is_read_whatever_the_login_profile_printed_before_it(banner, tmp_path):
    """FIND_PYTHON run by a real bash after a profile's output: one that left its last line
    open does not hide the line the answer is read from."""
    profile = tmp_path / "profile"
    profile.write_text(f"printf '%s' {shlex.quote(banner)}\n")
    done = subprocess.run(["bash", "-c", f". {shlex.quote(str(profile))}; {detect.FIND_PYTHON}"], capture_output=True,
                          text=True, timeout=30, env={"PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin"})
    assert detect.read_python(done.stdout) == shutil.which("python3", path=os.path.dirname(sys.executable)
                                                           + ":/usr/bin:/bin")
