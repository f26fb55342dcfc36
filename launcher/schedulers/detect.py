"""`glaunch sites detect`: a site-profile skeleton from the Slurm cluster this runs on.

The parsing is pure (text of `scontrol show partition/node -o` in, a profile mapping
out); :func:`read_scontrol` and :func:`query_cluster` are the only parts that run Slurm's
commands. `glaunch sites check` (cluster_check.py) reads the cluster with the same call.
"""

from __future__ import annotations

import datetime as dt
import getpass
import re
import shutil
from typing import Any, Mapping

import yaml

from ..errors import SchedulerError
from .slurm_client import ACCOUNTING_POLICY, Unreachable, run_command

# Gres=gpu:a100:4(S:0-1),gpu:h100:2  ->  ("a100", 4), ("h100", 2)
_GRES_GPU = re.compile(r"(?:^|,)gpu(?::(?P<type>[^:,(]+))?:(?P<count>\d+)")


def parse_records(text: str) -> list[dict[str, str]]:
    """One dict per line of `scontrol show ... -o` (KEY=VALUE words; values have no spaces,
    except OS=..., which is cut short harmlessly)."""
    records = []
    for line in text.splitlines():
        fields = {m.group(1): m.group(2) for m in re.finditer(r"(\w+)=(\S*)", line)}
        if fields:
            records.append(fields)
    return records


def gpu_kinds(gres: str) -> dict[str | None, int]:
    """GPUs per type (None: untyped) in a node's Gres string."""
    kinds: dict[str | None, int] = {}
    for m in _GRES_GPU.finditer(gres or ""):
        kinds[m["type"]] = kinds.get(m["type"], 0) + int(m["count"])
    return kinds


def gpus_of(gres: str) -> tuple[int, str | None]:
    """Total GPUs and their type (None when untyped or mixed) in a node's Gres string."""
    kinds = gpu_kinds(gres)
    types = set(kinds)
    return sum(kinds.values()), (types.pop() if len(types) == 1 else None)


# One scontrol process reads partitions, nodes and the configuration (its commands on
# stdin); -a includes hidden partitions, which a profile may well name.
SCONTROL_COMMANDS = "show partition\nshow node\nshow config\n"


def split_scontrol(text: str) -> tuple[str, str, dict[str, str]]:
    """scontrol's answer to SCONTROL_COMMANDS -> (partition records' text, node records'
    text, configuration settings). Records are told apart by their first key; the
    configuration is its `Key = value` lines."""
    parts, nodes = [], []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("PartitionName="):
            parts.append(stripped)
        elif stripped.startswith("NodeName="):
            nodes.append(stripped)
    return "\n".join(parts), "\n".join(nodes), parse_config(text)


def parse_config(text: str) -> dict[str, str]:
    """`scontrol show config` -> {setting: value}; SlurmctldHost[0] keeps its index."""
    return dict(re.findall(r"^([\w\[\]]+?)\s+=\s?(.*?)\s*$", text, re.M))


def _limit(value: str | None) -> str | None:
    return None if value in (None, "", "UNLIMITED", "NONE", "INFINITE") else value


def build_profile(name: str, partitions_text: str, nodes_text: str, *, select_type: str = "",
                  account: str | None = None) -> dict[str, Any]:
    """The profile mapping for the cluster described by scontrol's one-line records."""
    nodes = {n["NodeName"]: n for n in parse_records(nodes_text) if "NodeName" in n}
    parts = [p for p in parse_records(partitions_text) if "PartitionName" in p]
    tiers = {p["PartitionName"]: int(p.get("PriorityTier", "1") or 1) for p in parts}
    profile_parts: dict[str, Any] = {}
    default = None
    for p in parts:
        pname = p["PartitionName"]
        members = [n for n in nodes.values() if pname in n.get("Partitions", "").split(",")]
        gpus = [gpus_of(n.get("Gres", "")) for n in members] or [(0, None)]
        counts = [c for c, _ in gpus]
        types = {t for _, t in gpus}
        # CPUEfctv leaves out the cores Slurm keeps for itself (CoreSpecCount): what jobs get.
        cpus = [int(n.get("CPUEfctv") or n["CPUTot"]) for n in members
                if (n.get("CPUEfctv") or n.get("CPUTot", "")).isdigit()]
        mems = [int(n["RealMemory"]) for n in members if n.get("RealMemory", "").isdigit()]
        entry: dict[str, Any] = {"gpus_per_node": min(counts)}
        gtype = types.pop() if len(types) == 1 else None
        if gtype:
            entry["gpu_type"] = gtype
        entry["gpu_mem_gb"] = None
        if cpus:
            entry["cpus_per_node"] = min(cpus)
        if mems and min(mems) >= 1024:     # RealMemory=1 is slurm.conf's "not configured"
            entry["mem_gb"] = min(mems) // 1024
        max_nodes = _limit(p.get("MaxNodes")) or p.get("TotalNodes")
        if max_nodes and max_nodes.isdigit() and int(max_nodes) >= 1:
            entry["max_nodes"] = int(max_nodes)
        if _limit(p.get("MaxTime")):
            entry["max_time"] = p["MaxTime"]
        lower = any(tiers[other] > tiers[pname] for other in tiers if other != pname)
        if p.get("PreemptMode", "OFF") not in ("OFF", "") and lower:
            entry["preemptible"] = True
        profile_parts[pname] = entry
        if p.get("Default") == "YES":
            default = pname
    any_gpus = any(e["gpus_per_node"] for e in profile_parts.values())
    return {
        "name": name,
        "extends": "base-slurm",
        "scheduler": "slurm",
        "account": account,
        # --gpus-per-node needs select/cons_tres; older selectors only honour --gres.
        "gpu_directive": "gpus-per-node" if (not any_gpus or "cons_tres" in select_type) else "gres",
        "default_partition": default or (parts[0]["PartitionName"] if parts else None),
        "partitions": profile_parts,
    }


class _Dumper(yaml.SafeDumper):
    """Quotes strings with a ':' so no YAML 1.1 reader takes "02:00:00" for a number."""


_Dumper.add_representer(str, lambda d, v: d.represent_scalar(
    "tag:yaml.org,2002:str", v, style='"' if ":" in v else None))


def render_profile(profile: Mapping[str, Any], cluster: str) -> str:
    stamp = dt.date.today().isoformat()
    head = (f"# {profile['name']} -- detected from Slurm cluster {cluster!r} by `glaunch sites detect` on {stamp}.\n"
            "# Fill in what Slurm does not know: gpu_mem_gb (for `glaunch plan`), modules, env\n"
            "# (NCCL/network), setup (the Python environment on the nodes), container, runs_root.\n")
    return head + yaml.dump(dict(profile), Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def read_scontrol(command: str = "glaunch sites detect") -> str:
    """scontrol's answer to SCONTROL_COMMANDS: one call for partitions, nodes and settings."""
    if shutil.which("scontrol") is None:
        raise SchedulerError(f"scontrol is not on PATH: run `{command}` on a Slurm login node")
    proc = run_command("scontrol", "-a", "-o", input=SCONTROL_COMMANDS)
    if "PartitionName=" not in proc.stdout or "ClusterName" not in proc.stdout:
        said = (proc.stderr or proc.stdout).strip()
        raise SchedulerError(f"scontrol gave no partitions or no configuration: {said[:500]}")
    return proc.stdout


def query_cluster(name: str | None) -> tuple[str, str]:
    """(profile name, profile text) for the cluster this machine submits to."""
    partitions_text, nodes_text, settings = split_scontrol(read_scontrol())
    cluster = settings.get("ClusterName", "cluster")
    account = None
    if shutil.which("sacctmgr"):
        user = getpass.getuser()
        try:
            proc = run_command("sacctmgr", "-n", "-P", "show", "user", user, "format=defaultaccount",
                               policy=ACCOUNTING_POLICY, controller=False)
        except Unreachable:
            proc = None     # no accounting answer: the skeleton leaves the account to fill in
        if proc is not None and proc.returncode == 0 and proc.stdout.strip():
            account = proc.stdout.split()[0]
    profile = build_profile(name or cluster, partitions_text, nodes_text,
                            select_type=settings.get("SelectType", ""), account=account)
    return profile["name"], render_profile(profile, cluster)
