"""The Slurm cluster's facts that `glaunch sites check` compares a site profile with:
partitions, nodes and settings from one `scontrol` call, and, where slurmdbd answers,
the user's associations and the QOS from `sacctmgr`.

The parsers are pure (the tests feed them recorded answers; scontrol's text itself is read
in scontrol_text.py); `read_cluster` asks Slurm.
"""

from __future__ import annotations

import getpass
import grp
import math
import os
import pwd
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping

from launcher.processes import without_tool_prefix
from launcher.schedulers.cluster.scontrol_text import (
    expand_hostlist,
    gpu_kinds,
    parse_records,
    read_scontrol,
    split_scontrol,
)
from launcher.schedulers.slurm.client import ACCOUNTING_POLICY, Client, Unreachable

ASSOC_FORMAT = ("Account", "Partition", "QOS", "DefaultQOS", "MaxWall", "MaxTRES")
QOS_FORMAT = ("Name", "MaxWall", "MaxTRES", "MaxTRESPerNode")
# The words of a node's state (scontrol writes e.g. IDLE+DRAIN, DOWN+NOT_RESPONDING; before
# 21.08 DOWN*) for which it takes no job now. A POWERED_DOWN one (power saving, cloud:
# sinfo's idle~) is powered up for a job.
UNUSABLE = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING", "FUTURE",
                      "INVAL", "INVALID_REG"})
# The other words of node states from Slurm 22.05 to 25.11 (24.11 added PLANNED: idle, kept
# by the backfill scheduler for a job; BLOCKED: idle, fenced off by an exclusive topology
# job). A word outside both sets is read past (the node counts as taking jobs) and said.
KNOWN_STATE_WORDS = UNUSABLE | frozenset({
    "IDLE", "ALLOCATED", "ALLOC", "MIXED", "COMPLETING", "UNKNOWN", "ERROR", "RESERVED", "MAINT", "MAINTENANCE",
    "CLOUD", "POWERED_DOWN", "POWERING_DOWN", "POWERING_UP", "POWER_DOWN", "POWER_UP", "POWER_DRAIN",
    "REBOOT", "REBOOT_REQUESTED", "REBOOT_ISSUED", "RESUME", "NO_RESPOND", "PERFCTRS", "DYNAMIC_FUTURE",
    "DYNAMIC_NORM", "PLANNED", "BLOCKED", "UNDRAIN"})


@dataclass(frozen=True)
class Node:
    name: str
    gpus: Mapping[str | None, int]      # per GPU type (None: untyped)
    cpus: int | None                    # CPUEfctv (22.05+: without specialized cores), else CPUTot
    mem_mb: int | None                  # RealMemory
    features: frozenset[str]
    state: str
    partitions: tuple[str, ...]
    mem_spec_mb: int = 0                # MemSpecLimit: kept for Slurm's daemons, never a job's

    @property
    def gpu_count(self) -> int:
        return sum(self.gpus.values())

    @property
    def usable(self) -> bool:
        words = self.state.upper().split("+")
        return not any(w.rstrip("*~#$@!%^") in UNUSABLE or w.endswith("*") for w in words)

    @property
    def unknown_state_words(self) -> tuple[str, ...]:
        """The words of its state glaunch does not know (a newer Slurm's), which `usable` reads past."""
        words = (w.rstrip("*~#$@!%^") for w in self.state.upper().split("+"))
        return tuple(w for w in words if w and w not in KNOWN_STATE_WORDS)

    @property
    def job_mem_mb(self) -> int | None:
        """The memory a job can have here: RealMemory less MemSpecLimit."""
        return None if self.mem_mb is None else max(self.mem_mb - self.mem_spec_mb, 0)


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    state: str
    max_time: str | None                # None: UNLIMITED
    max_nodes: int | None               # None: UNLIMITED
    total_nodes: int
    nodes: tuple[Node, ...]
    allow_accounts: frozenset[str] | None   # None: ALL
    deny_accounts: frozenset[str]
    allow_qos: frozenset[str] | None
    deny_qos: frozenset[str]
    max_cpus_per_node: int | None
    max_mem_per_node_mb: int | None
    preempt_mode: str
    priority_tier: int
    hidden: bool = False
    root_only: bool = False
    qos: str | None = None              # the partition's own QOS (QoS=), whose limits bind every job there
    allow_groups: frozenset[str] | None = None   # None: ALL
    max_mem_per_cpu_mb: int | None = None         # MaxMemPerCPU, the partition's or the cluster's (None: none)

    @property
    def node_limit(self) -> int:
        """The most nodes one job can get: MaxNodes, and never more than the partition has."""
        return min(self.max_nodes, self.total_nodes) if self.max_nodes is not None else self.total_nodes

    def job_cpus(self, node: Node) -> int | None:
        """The CPUs a job can have on `node` here (MaxCPUsPerNode caps the node's)."""
        if node.cpus is None or self.max_cpus_per_node is None:
            return node.cpus
        return min(node.cpus, self.max_cpus_per_node)

    def job_mem_mb(self, node: Node) -> int | None:
        """The memory a job can have on `node` here (MaxMemPerNode caps the node's)."""
        mem = node.job_mem_mb
        if mem is None or self.max_mem_per_node_mb is None:
            return mem
        return min(mem, self.max_mem_per_node_mb)

    def job_cpu_counts(self) -> list[int]:
        """The CPUs a job can have on each node here, where known."""
        return [c for c in (self.job_cpus(n) for n in self.nodes) if c is not None]

    def cpus_for_mem(self, mem_mb: float) -> int | None:
        """The CPUs a node of a job asking `mem_mb` there must have: Slurm raises a job's
        CPUs to ceil(mem / MaxMemPerCPU) (None: no MaxMemPerCPU here)."""
        return math.ceil(mem_mb / self.max_mem_per_cpu_mb) if self.max_mem_per_cpu_mb else None


@dataclass(frozen=True)
class Association:
    account: str
    partition: str | None
    qos: frozenset[str]
    default_qos: str | None
    max_wall: str | None
    max_tres: Mapping[str, str]


@dataclass(frozen=True)
class Qos:
    name: str
    max_wall: str | None
    max_tres: Mapping[str, str]             # per job
    max_tres_per_node: Mapping[str, str]


@dataclass(frozen=True)
class Cluster:
    name: str
    settings: Mapping[str, str]
    partitions: Mapping[str, Partition]
    user: str | None = None
    associations: tuple[Association, ...] | None = None   # None: sacctmgr gave no answer
    qos: Mapping[str, Qos] | None = None
    accounting_note: str | None = None                     # why associations/QOS are unknown
    groups: frozenset[str] | None = None                   # the user's Unix groups (None: unknown)

    @property
    def slurm_version(self) -> str | None:
        """The release slurmctld runs (`show config`'s SLURM_VERSION, e.g. 24.11.5)."""
        return self.settings.get("SLURM_VERSION") or None

    @property
    def slurm_release(self) -> tuple[int, int] | None:
        """(major, minor) of slurm_version: (24, 11) for 24.11.5; None when unknown."""
        return slurm_release(self.slurm_version)

    @property
    def enforce_part_limits(self) -> str:
        return (self.settings.get("EnforcePartLimits") or "NO").upper()

    @property
    def enforce(self) -> frozenset[str]:
        """AccountingStorageEnforce's words (associations, limits, qos, safe, ...)."""
        value = self.settings.get("AccountingStorageEnforce", "") or ""
        return frozenset(w.strip().lower() for w in value.split(",") if w.strip() and w.strip() != "none")

    @property
    def default_partition(self) -> str | None:
        return next((p.name for p in self.partitions.values() if p.default), None)

    @property
    def takes_gpus_per_node(self) -> bool:
        """Whether sbatch takes --gpus-per-node: select/cons_tres (or Cray's select with
        OTHER_CONS_TRES) does; cons_res and linear take GPUs only as --gres. Unknown: yes."""
        return takes_gpus_per_node(self.settings)


def slurm_release(version: str | None) -> tuple[int, int] | None:
    """`24.11.5` (or `24.11.0-0rc1`) -> (24, 11); None for anything else."""
    found = re.match(r"(\d+)\.(\d+)(?:\D|$)", version or "")
    return (int(found[1]), int(found[2])) if found else None


def takes_gpus_per_node(settings: Mapping[str, str]) -> bool:
    select = settings.get("SelectType", "") or ""
    params = (settings.get("SelectTypeParameters", "") or "").upper()
    return not select or "cons_tres" in select or "OTHER_CONS_TRES" in params


def _limit(value: str | None) -> str | None:
    return None if value in (None, "", "UNLIMITED", "NONE", "INFINITE", "(null)", "N/A") else value


def parse_int(value: str | None) -> int | None:
    """A count or limit; None when UNLIMITED, unset or not a number."""
    value = _limit(value)
    return int(value) if value is not None and value.isdigit() else None


def _names(value: str | None) -> frozenset[str] | None:
    """AllowAccounts=ALL -> None (anyone); a comma list -> its names."""
    value = _limit(value)
    if value is None or value.upper() == "ALL":
        return None
    return frozenset(v for v in value.split(",") if v)


def _tres(value: str | None) -> dict[str, str]:
    """`node=4,gres/gpu=8` -> {"node": "4", "gres/gpu": "8"}."""
    out = {}
    for item in (value or "").split(","):
        key, sep, amount = item.partition("=")
        if sep and key:
            out[key.strip()] = amount.strip()
    return out


def parse_nodes(text: str) -> list[Node]:
    nodes = []
    for r in parse_records(text):
        if "NodeName" not in r:
            continue
        cpus = r.get("CPUEfctv") or r.get("CPUTot")
        features = _limit(r.get("AvailableFeatures"))
        nodes.append(Node(r["NodeName"], gpu_kinds(r.get("Gres", "")), parse_int(cpus), parse_int(r.get("RealMemory")),
                          frozenset(features.split(",")) if features else frozenset(), r.get("State", ""),
                          tuple(p for p in r.get("Partitions", "").split(",") if p),
                          parse_int(r.get("MemSpecLimit")) or 0))
    return nodes


def _mem_limits(record: Mapping[str, str], settings: Mapping[str, str]) -> tuple[int | None, int | None]:
    """A partition's (MaxMemPerNode, MaxMemPerCPU) in MB. scontrol prints one of them;
    MaxMemPerNode=UNLIMITED is "not set here", and then the cluster's own value holds."""
    if "MaxMemPerCPU" in record:
        return None, parse_int(record["MaxMemPerCPU"])      # MaxMemPerCPU=UNLIMITED: no limit
    per_node = parse_int(record.get("MaxMemPerNode"))
    if per_node is None:
        return parse_int(settings.get("MaxMemPerNode")), parse_int(settings.get("MaxMemPerCPU"))
    return per_node, None


def parse_partitions(parts_text: str, nodes_text: str,
                     settings: Mapping[str, str] | None = None) -> dict[str, Partition]:
    """`scontrol show partition -o` and `show node -o` -> the partitions, in scontrol's
    order, each with its nodes: read from the nodes' Partitions= in one pass, else (a
    node record without it) from the partition's Nodes= host list. `settings` (`show
    config`) give the memory limits a partition does not set itself."""
    members: dict[str, list[Node]] = defaultdict(list)
    by_name: dict[str, Node] = {}
    for node in parse_nodes(nodes_text):
        by_name[node.name] = node
        for pname in node.partitions:
            members[pname].append(node)
    partitions = {}
    for r in parse_records(parts_text):
        name = r.get("PartitionName")
        if not name:
            continue
        nodes = tuple(members.get(name, ()))
        listed = _limit(r.get("Nodes"))
        if not nodes and listed:
            names = list(by_name) if listed == "ALL" else expand_hostlist(listed)
            nodes = tuple(by_name[n] for n in names if n in by_name)
        max_mem_per_node, max_mem_per_cpu = _mem_limits(r, settings or {})
        partitions[name] = Partition(
            name=name, default=r.get("Default") == "YES", state=r.get("State", "UP"),
            max_time=_limit(r.get("MaxTime")), max_nodes=parse_int(r.get("MaxNodes")),
            total_nodes=parse_int(r.get("TotalNodes")) or len(nodes), nodes=nodes,
            allow_accounts=_names(r.get("AllowAccounts")), deny_accounts=_names(r.get("DenyAccounts")) or frozenset(),
            allow_qos=_names(r.get("AllowQos")), deny_qos=_names(r.get("DenyQos")) or frozenset(),
            max_cpus_per_node=parse_int(r.get("MaxCPUsPerNode")), max_mem_per_node_mb=max_mem_per_node,
            preempt_mode=r.get("PreemptMode", "OFF"), priority_tier=parse_int(r.get("PriorityTier")) or 1,
            hidden=r.get("Hidden") == "YES", root_only=r.get("RootOnly") == "YES", qos=_limit(r.get("QoS")),
            allow_groups=_names(r.get("AllowGroups")), max_mem_per_cpu_mb=max_mem_per_cpu)
    return partitions


def parse_cluster(scontrol_text: str, *, assoc_text: str | None = None, qos_text: str | None = None,
                  user: str | None = None, accounting_note: str | None = None,
                  groups: frozenset[str] | None = None) -> Cluster:
    """The facts `compare` reads: scontrol's answer to SCONTROL_COMMANDS, and sacctmgr's
    `-n -P` rows in ASSOC_FORMAT and QOS_FORMAT (None: not reachable)."""
    parts_text, nodes_text, settings = split_scontrol(scontrol_text)
    partitions = parse_partitions(parts_text, nodes_text, settings)
    assocs = None if assoc_text is None else tuple(parse_associations(assoc_text))
    qos = None if qos_text is None else {q.name: q for q in parse_qos(qos_text)}
    return Cluster(settings.get("ClusterName", "cluster"), settings, partitions, user, assocs, qos, accounting_note,
                   groups)


def parse_associations(text: str) -> list[Association]:
    """`sacctmgr -n -P show assoc where user=U cluster=C format=<ASSOC_FORMAT>`."""
    rows = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < len(ASSOC_FORMAT) or not fields[0]:
            continue
        account, partition, qos, default_qos, max_wall, max_tres = fields[:6]
        rows.append(Association(account, partition or None, frozenset(q for q in qos.split(",") if q),
                                default_qos or None, _limit(max_wall), _tres(max_tres)))
    return rows


def parse_qos(text: str) -> list[Qos]:
    """`sacctmgr -n -P show qos format=<QOS_FORMAT>`."""
    rows = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < len(QOS_FORMAT) or not fields[0]:
            continue
        name, max_wall, max_tres, per_node = fields[:4]
        rows.append(Qos(name, _limit(max_wall), _tres(max_tres), _tres(per_node)))
    return rows


def read_cluster(client: Client, command: str = "glaunch sites check") -> Cluster:
    """The live cluster's facts, asked through `client`: one scontrol call, and sacctmgr
    where slurmdbd answers."""
    text = read_scontrol(client, command)
    _, _, settings = split_scontrol(text)
    cluster_name = settings.get("ClusterName", "")
    user = current_user(client)
    assoc_text = qos_text = None
    note = None
    if not client.has_command("sacctmgr"):
        note = "account and QOS not checked: sacctmgr is not on PATH"
    else:
        try:
            assoc_cmd, qos_cmd = accounting_commands(user, cluster_name)
            assoc = client.call(*assoc_cmd, policy=ACCOUNTING_POLICY, controller=False)
            qos = client.call(*qos_cmd, policy=ACCOUNTING_POLICY, controller=False)
            if assoc.returncode == 0 and qos.returncode == 0:
                assoc_text, qos_text = assoc.stdout, qos.stdout
            else:
                said = (assoc.stderr or qos.stderr or "").strip().splitlines()
                note = ("account and QOS not checked: sacctmgr said: "
                        + (without_tool_prefix("sacctmgr", said[-1]) if said else "nothing"))
        except Unreachable as exc:
            note = f"account and QOS not checked: {exc.message}"
    return parse_cluster(text, assoc_text=assoc_text, qos_text=qos_text, user=user, accounting_note=note,
                         groups=user_groups(client, user))


def accounting_commands(user: str, cluster_name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The sacctmgr commands read_cluster runs: `user`'s associations (on `cluster_name`,
    when known) and the QOS."""
    where = [f"user={user}"] + ([f"cluster={cluster_name}"] if cluster_name else [])
    return (("sacctmgr", "-n", "-P", "show", "assoc", "where", *where, "format=" + ",".join(ASSOC_FORMAT)),
            ("sacctmgr", "-n", "-P", "show", "qos", "format=" + ",".join(QOS_FORMAT)))


def current_user(client: Client) -> str:
    """The login name Slurm knows this user by (on the login node where `client` runs
    Slurm's commands over SSH); the uid as text where there is none (no passwd entry and
    no USER/LOGNAME: a container run as an arbitrary uid)."""
    account = client.remote_account()
    if account is not None:
        return account.user
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def user_groups(client: Client, user: str) -> frozenset[str] | None:
    """The names of `user`'s Unix groups, as slurmctld resolves them for AllowGroups (None:
    not known here)."""
    account = client.remote_account()
    if account is not None:
        return account.groups if user == account.user else None
    try:
        gids = os.getgrouplist(user, pwd.getpwnam(user).pw_gid)
    except (KeyError, OSError):
        return None
    names = set()
    for gid in gids:
        try:
            names.add(grp.getgrgid(gid).gr_name)
        except KeyError:
            continue
    return frozenset(names)
