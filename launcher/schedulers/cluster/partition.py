"""One partition of a site profile against the same partition of the live cluster: its
state, GPUs (count and type), CPUs, memory, time and node limits, features, who may use
it, preemption, and the per-job limits of the QOS and association its jobs run under.

Each check is a rule: the profile's partition and the cluster's facts in, zero or more
differences out. `partition_diffs` runs them in order, which is the order they are said in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple

from launcher.config import slurmtime
from launcher.schedulers.cluster.facts import Association, Cluster, Partition, parse_int
from launcher.schedulers.cluster.report import Difference


def to_seconds(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return slurmtime.parse(text)
    except ValueError:
        return None


def fate(cluster: Cluster, *, this_job: bool = False) -> str:
    """What happens to a job over a partition limit (this one, or any)."""
    mode = cluster.enforce_part_limits
    if mode in ("NO", ""):
        return f"{'this job' if this_job else 'jobs over it'} would pend forever (EnforcePartLimits=NO)"
    return f"{'this job is' if this_job else 'jobs over it are'} refused at submission (EnforcePartLimits={mode})"


def _gpu_type_matches(profile_type: str, cluster_type: str | None) -> bool:
    """`a100` matches `a100` and Slurm's autodetected `nvidia_a100-sxm4-80gb`."""
    if cluster_type is None:
        return False
    words = re.split(r"[^a-z0-9]+", cluster_type.lower())
    return profile_type.lower() == cluster_type.lower() or profile_type.lower() in words


def _constraint_features(expr: str) -> tuple[list[str], bool]:
    """The feature names of a --constraint expression, and whether any one of them is
    enough (an OR expression)."""
    names = re.findall(r"[A-Za-z_][\w.-]*", expr)
    return names, "|" in expr


def has_features(expr: str | None, features: frozenset[str]) -> bool:
    """Whether a node with `features` can satisfy the --constraint `expr` (`a&b`: all;
    `a|b`, `[a|b]`: any one)."""
    if not expr:
        return True
    names, any_one = _constraint_features(expr)
    return any(f in features for f in names) if any_one else all(f in features for f in names)


# Slurm's answer to a job that no node of the partition can hold, whatever EnforcePartLimits says.
NO_NODE_FITS = "jobs asking that much are refused at submission (Requested node configuration is not available)"


def _memory_source(part: Partition, mem_mb: int) -> str:
    """Where a node's memory for jobs comes from, in Slurm's words."""
    node = next(n for n in part.nodes if part.job_mem_mb(n) == mem_mb)
    if part.max_mem_per_node_mb is not None and mem_mb == part.max_mem_per_node_mb:
        return f"MaxMemPerNode={mem_mb} MB"
    if node.mem_spec_mb:
        return f"RealMemory={node.mem_mb} MB less MemSpecLimit={node.mem_spec_mb} MB"
    return f"RealMemory={mem_mb} MB"


def mem_per_cpu_source(part: Partition, cpus: int) -> str:
    """MaxMemPerCPU times the most CPUs a job has on a node, in Slurm's words."""
    most = f"MaxCPUsPerNode={cpus}" if cpus == part.max_cpus_per_node else f"{cpus} CPUs"
    return f"MaxMemPerCPU={part.max_mem_per_cpu_mb} MB x {most}"


# --- the rules --------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionPair:
    """One partition as the profile describes it (`prof`, in its `site`) and as the
    cluster has it (`part`): what every rule reads."""

    name: str
    prof: Mapping[str, Any]
    site: Mapping[str, Any]
    cluster: Cluster
    part: Partition

    @property
    def key(self) -> str:
        return f"partitions.{self.name}"

    @property
    def on(self) -> str:
        """The partition, in a message."""
        return f"partition {self.name} on cluster {self.cluster.name}"

    @property
    def mem_gb(self) -> float | None:
        """The profile's mem_gb, where it is a number."""
        want = self.prof.get("mem_gb")
        return want if isinstance(want, (int, float)) and not isinstance(want, bool) else None

    def job_mems_mb(self) -> list[int]:
        """The memory a job can have on each node, where known."""
        return [m for m in (self.part.job_mem_mb(n) for n in self.part.nodes) if m is not None]

    def diff(self, sub: str, message: str, fatal: bool) -> Difference:
        """A difference under the partition's key (`sub`: the key within it; "" for the partition)."""
        return Difference(f"{self.key}.{sub}" if sub else self.key, message, fatal, self.name)


# One check: a partition of the profile and of the cluster in, its differences (none or more) out.
Rule = Callable[[PartitionPair], list[Difference]]


def _state(p: PartitionPair) -> list[Difference]:
    state = p.part.state.upper()
    if state in ("INACTIVE", "DRAIN"):
        return [p.diff("", f"{p.on} is {p.part.state}: it takes no new jobs", True)]
    if state == "DOWN":
        return [p.diff("", f"{p.on} is DOWN: jobs queue there but start only once an administrator sets it UP",
                       False)]
    return []


def _no_nodes(p: PartitionPair) -> list[Difference]:
    return [] if p.part.nodes else [p.diff("", f"{p.on} has no nodes", True)]


def _none_usable(p: PartitionPair) -> list[Difference]:
    nodes = p.part.nodes
    if not nodes or any(n.usable for n in nodes):
        return []
    states = ", ".join(sorted({n.state for n in nodes}))
    return [p.diff("", f"no node of {p.on} takes jobs now ({states}); jobs wait until an administrator returns "
                   "them", False)]


def _gpus_per_node(p: PartitionPair) -> list[Difference]:
    want = p.prof.get("gpus_per_node")
    if not isinstance(want, int):
        return []
    counts = sorted(n.gpu_count for n in p.part.nodes)
    if want > counts[-1]:
        have = f"at most {counts[-1]}" if counts[-1] else "no"
        return [p.diff("gpus_per_node", f"the profile says {want}, the nodes of {p.on} have {have} GPUs; jobs "
                       "asking the profile's GPUs are refused", True)]
    if want > counts[0]:
        fit = sum(1 for c in counts if c >= want)
        beyond = f"; jobs on more than {fit} node(s) never start" if fit < p.part.node_limit else ""
        return [p.diff("gpus_per_node", f"the profile says {want}, only {fit} of the {len(counts)} nodes of {p.on} "
                       f"have that many GPUs (the others {counts[0]}); jobs wait for those nodes{beyond}", False)]
    if want < counts[0]:
        return [p.diff("gpus_per_node", f"the profile says {want}, the nodes of {p.on} have {counts[0]} GPUs; jobs "
                       f"use {want} of them", False)]
    return []


def _gpu_type(p: PartitionPair) -> list[Difference]:
    gtype = p.prof.get("gpu_type")
    with_gpus = [n for n in p.part.nodes if n.gpu_count]
    if not gtype:
        cluster_types = sorted({str(t) for n in with_gpus for t in n.gpus if t is not None})
        if not cluster_types:
            return []
        return [p.diff("gpu_type", f"the profile gives none, the GPUs of {p.on} are {', '.join(cluster_types)}",
                       False)]
    if not with_gpus:
        return []
    matches = {t: _gpu_type_matches(gtype, t) for t in {t for n in with_gpus for t in n.gpus}}
    matching = [n for n in with_gpus if any(matches[t] for t in n.gpus)]
    if not matching and all(set(n.gpus) == {None} for n in with_gpus):
        return [p.diff("gpu_type", f"the profile says {gtype}, the GPUs of {p.on} have no type in Slurm "
                       "(Gres=gpu:N); it cannot be confirmed", False)]
    if not matching:
        cluster_types = sorted({str(t) for n in with_gpus for t in n.gpus if t is not None})
        return [p.diff("gpu_type", f"the profile says {gtype}, the GPUs of {p.on} are {', '.join(cluster_types)}; "
                       "jobs would run on other hardware", True)]
    if len(matching) < len(with_gpus):
        other = sorted({str(t) for n in with_gpus if not any(matches[t] for t in n.gpus) for t in n.gpus})
        return [p.diff("gpu_type", f"the profile says {gtype}, {len(with_gpus) - len(matching)} of the "
                       f"{len(with_gpus)} GPU nodes of {p.on} have {', '.join(other)}; jobs may land there unless "
                       f"{p.key}.constraint selects {gtype}", False)]
    return []


def _cpus_per_node(p: PartitionPair) -> list[Difference]:
    want = p.prof.get("cpus_per_node")
    cpus = p.part.job_cpu_counts()
    if not isinstance(want, int) or not cpus:
        return []
    if want > max(cpus):
        return [p.diff("cpus_per_node", f"the profile says {want}, the nodes of {p.on} give a job at most "
                       f"{max(cpus)} CPUs; jobs asking the profile's CPUs are refused", True)]
    if want > min(cpus):
        return [p.diff("cpus_per_node", f"the profile says {want}, some nodes of {p.on} have only {min(cpus)} CPUs; "
                       "jobs wait for the larger nodes", False)]
    if want < min(cpus):
        return [p.diff("cpus_per_node", f"the profile says {want}, the nodes of {p.on} have {min(cpus)} CPUs",
                       False)]
    return []


def _mem_gb(p: PartitionPair) -> list[Difference]:
    want, mems = p.mem_gb, p.job_mems_mb()
    if want is None or not mems:
        return []
    if want * 1024 > max(mems):
        return [p.diff("mem_gb", f"the profile says {want:g} GB, the nodes of {p.on} give a job at most "
                       f"{max(mems) // 1024} GB ({_memory_source(p.part, max(mems))}); jobs asking that much are "
                       "refused", True)]
    if want * 1024 > min(mems):
        return [p.diff("mem_gb", f"the profile says {want:g} GB, some nodes of {p.on} have only "
                       f"{min(mems) // 1024} GB; jobs asking that much wait for the larger nodes", False)]
    if min(mems) // 1024 > want:
        return [p.diff("mem_gb", f"the profile says {want:g} GB, the nodes of {p.on} have {min(mems) // 1024} GB",
                       False)]
    return []


def _mem_per_cpu(p: PartitionPair) -> list[Difference]:
    """MaxMemPerCPU: Slurm raises a job's CPUs to carry its memory, up to what a node gives.
    Memory over what any node has is _mem_gb's to say."""
    want, mems, cpus = p.mem_gb, p.job_mems_mb(), p.part.job_cpu_counts()
    if want is None or not cpus or (mems and want * 1024 > max(mems)):
        return []
    need = p.part.cpus_for_mem(want * 1024)
    if need is None:
        return []
    per_cpu = p.part.max_mem_per_cpu_mb or 0
    asked = p.prof.get("cpus_per_node")
    if need > max(cpus):
        return [p.diff("mem_gb", f"the profile says {want:g} GB, {p.on} gives a job at most "
                       f"{per_cpu * max(cpus) // 1024} GB a node ({mem_per_cpu_source(p.part, max(cpus))}): a job "
                       f"asking that much needs {need} CPUs a node, more than any node gives; {NO_NODE_FITS}", True)]
    if isinstance(asked, int) and need > asked:
        fit = sum(1 for c in cpus if c >= need)
        few = f", which only {fit} of its {len(cpus)} nodes give; jobs wait for them" if fit < len(cpus) else ""
        return [p.diff("mem_gb", f"the profile says {want:g} GB and {asked} CPUs, {p.on} gives {asked} CPUs at most "
                       f"{per_cpu * asked // 1024} GB (MaxMemPerCPU={per_cpu} MB); Slurm raises the CPUs of a job "
                       f"asking that much to {need} a node{few}", False)]
    return []


def _max_time(p: PartitionPair) -> list[Difference]:
    want_t, have_t = p.prof.get("max_time"), p.part.max_time
    want_s, have_s = to_seconds(want_t), to_seconds(have_t)
    if have_s is None:
        return []
    if want_s is None:
        return [p.diff("max_time", f"the profile gives none, {p.on} allows {have_t}; {fate(p.cluster)}", False)]
    if want_s > have_s:
        return [p.diff("max_time", f"the profile says {want_t}, {p.on} allows {have_t}; {fate(p.cluster)}", True)]
    if want_s < have_s:
        return [p.diff("max_time", f"the profile says {want_t}, {p.on} allows {have_t}", False)]
    return []


def _max_nodes(p: PartitionPair) -> list[Difference]:
    part = p.part
    want, have = p.prof.get("max_nodes"), part.node_limit
    limit_word = (f"MaxNodes={part.max_nodes}" if part.max_nodes is not None and part.max_nodes <= part.total_nodes
                  else f"{part.total_nodes} node(s) in all")
    if isinstance(want, int) and want > have:
        return [p.diff("max_nodes", f"the profile says {want}, {p.on} gives a job at most {have} ({limit_word}); "
                       f"{fate(p.cluster)}", True)]
    if want is None:
        return [p.diff("max_nodes", f"the profile gives none, {p.on} gives a job at most {have} ({limit_word})",
                       False)]
    if want < have:
        return [p.diff("max_nodes", f"the profile says {want}, {p.on} gives a job up to {have}", False)]
    return []


def _constraint(p: PartitionPair) -> list[Difference]:
    """The features the profile's constraint asks for."""
    constraint = p.prof.get("constraint")
    if not constraint:
        return []
    features: set[str] = set().union(*(n.features for n in p.part.nodes))
    names, any_one = _constraint_features(str(constraint))
    missing = [f for f in names if f not in features]
    if not missing or (any_one and len(missing) < len(names)):
        return []
    return [p.diff("constraint", f"the profile says {constraint}, no node of {p.on} has feature(s) "
                   f"{', '.join(missing)} (they have: {', '.join(sorted(features)) or 'none'}); jobs never start "
                   "(BadConstraints)", True)]


def _groups(p: PartitionPair) -> list[Difference]:
    """AllowGroups, against the groups of the user the check runs as (root may use any)."""
    allowed, cluster = p.part.allow_groups, p.cluster
    if allowed is None or cluster.groups is None or cluster.user in (None, "root") or allowed & cluster.groups:
        return []
    return [p.diff("", f"user {cluster.user} is in none of the groups {p.on} allows "
                   f"(AllowGroups={','.join(sorted(allowed))}); jobs are refused", True)]


def _account(p: PartitionPair) -> list[Difference]:
    account, part = p.site.get("account"), p.part
    if not account:
        return []
    if part.allow_accounts is not None and account not in part.allow_accounts:
        return [Difference("account", f"the profile says {account}, {p.on} allows only account(s) "
                           f"{', '.join(sorted(part.allow_accounts))}; jobs are refused", True, p.name)]
    if account in part.deny_accounts:
        return [Difference("account", f"the profile says {account}, {p.on} denies it; jobs are refused", True,
                           p.name)]
    return []


def _qos(p: PartitionPair) -> list[Difference]:
    """The QOS the profile names (the partition's own, else the site's), against AllowQos and DenyQos."""
    qos, part = p.prof.get("qos") or p.site.get("qos"), p.part
    if not qos:
        return []
    qkey = f"{p.key}.qos" if p.prof.get("qos") else "qos"
    if part.allow_qos is not None and qos not in part.allow_qos:
        return [Difference(qkey, f"the profile says {qos}, {p.on} allows only QOS {', '.join(sorted(part.allow_qos))}; "
                           "jobs are refused", True, p.name)]
    if qos in part.deny_qos:
        return [Difference(qkey, f"the profile says {qos}, {p.on} denies it; jobs are refused", True, p.name)]
    return []


def _default_qos(p: PartitionPair) -> list[Difference]:
    """No QOS in the profile: jobs run under the association's default one, which AllowQos may refuse."""
    allow_qos = p.part.allow_qos
    if p.prof.get("qos") or p.site.get("qos") or allow_qos is None:
        return []
    default = qos_name(p.site, p.prof, effective_assoc(p.site, p.cluster, p.name))
    allowed = ", ".join(sorted(allow_qos))
    if default is None:
        return [p.diff("qos", f"the profile gives none, {p.on} allows only QOS {allowed}; jobs under another default "
                       "QOS are refused", False)]
    if default not in allow_qos:
        return [p.diff("qos", f"the profile gives none, so jobs run under QOS {default} (the association's "
                       f"default), {p.on} allows only QOS {allowed}; jobs are refused", True)]
    return []


def _preemptible(p: PartitionPair) -> list[Difference]:
    """The profile's flag tells glaunch to expect requeues: jobs here are preempted where
    PreemptMode is on and another partition has a higher PriorityTier."""
    part = p.part
    lower = any(o.priority_tier > part.priority_tier for o in p.cluster.partitions.values() if o.name != p.name)
    preemptible = part.preempt_mode.upper() not in ("OFF", "") and lower
    said = bool(p.prof.get("preemptible"))
    if said == preemptible:
        return []
    return [p.diff("preemptible", f"the profile says {said}, jobs on {p.on} {'can' if preemptible else 'cannot'} "
                   f"be preempted (PreemptMode={part.preempt_mode})", False)]


def _accounting_wall(p: PartitionPair) -> list[Difference]:
    """The profile's max_time against the MaxWall of the QOS and association its jobs run
    under: over it a job never starts."""
    want_t = p.prof.get("max_time")
    want_s = to_seconds(want_t)
    out = []
    for limits in accounting_limits(p.site, p.prof, p.cluster, p.name):
        wall_s = to_seconds(limits.wall)
        if want_s is not None and wall_s is not None and want_s > wall_s:
            out.append(p.diff("max_time", f"the profile says {want_t}, {limits.source} on cluster {p.cluster.name} "
                              f"allows {limits.wall}; jobs over it never start "
                              f"({limits.kind}MaxWallDurationPerJobLimit)", True))
    return out


def _accounting_nodes(p: PartitionPair) -> list[Difference]:
    """The profile's max_nodes against the per-job node limit (MaxTRES node=) of the QOS
    and association its jobs run under."""
    want = p.prof.get("max_nodes")
    out = []
    for limits in accounting_limits(p.site, p.prof, p.cluster, p.name):
        most = parse_int(limits.per_job.get("node"))
        if most is not None and isinstance(want, int) and want > most:
            out.append(p.diff("max_nodes", f"the profile says {want}, {limits.source} on cluster {p.cluster.name} "
                              f"allows {most} node(s) per job; jobs over it never start "
                              f"({limits.kind}MaxNodePerJobLimit)", True))
    return out


# sbatch --segment: a job's nodes in segments of N within a block (topology/block, 24.11+).
SEGMENT_RELEASE = (24, 11)


def _segment(p: PartitionPair) -> list[Difference]:
    """The profile's segment asks for a feature of newer Slurm releases: an older sbatch
    refuses --segment; 24.11 takes it anywhere but places by it only with topology/block."""
    segment = p.prof.get("segment")
    if segment is None:
        return []
    cluster, release = p.cluster, p.cluster.slurm_release
    if release is not None and release < SEGMENT_RELEASE:
        return [p.diff("segment", f"the profile says {segment}: sbatch --segment needs Slurm "
                       f"{'.'.join(map(str, SEGMENT_RELEASE))} or later, cluster {cluster.name} runs Slurm "
                       f"{cluster.slurm_version}; jobs are refused", True)]
    topology = cluster.settings.get("TopologyPlugin")
    if topology and topology != "topology/block":
        return [p.diff("segment", f"the profile says {segment}: sbatch --segment places a job's nodes by "
                       f"topology/block, cluster {cluster.name} has TopologyPlugin={topology}; jobs run without "
                       "block placement", False)]
    return []


# Whether the partition takes jobs at all: for every partition the profile uses.
AVAILABILITY_RULES: tuple[Rule, ...] = (_state, _no_nodes, _none_usable)
# Key by key, for a partition the profile describes and that has nodes to compare with.
PROFILE_RULES: tuple[Rule, ...] = (
    _gpus_per_node, _gpu_type, _cpus_per_node, _mem_gb, _mem_per_cpu, _max_time, _max_nodes, _constraint,
    _groups, _account, _qos, _default_qos, _preemptible, _accounting_wall, _accounting_nodes, _segment,
)


def partition_diffs(pname: str, prof: Mapping[str, Any], site: Mapping[str, Any], cluster: Cluster, *,
                    described: bool) -> list[Difference]:
    """The differences of partition `pname`: the profile's entry for it (`prof`, empty
    unless `described`) against the cluster's, rule by rule."""
    part = cluster.partitions.get(pname)
    if part is None:
        return [_missing(pname, site, cluster, described)]
    pair = PartitionPair(pname, prof, site, cluster, part)
    rules = AVAILABILITY_RULES + (PROFILE_RULES if described and part.nodes else ())
    return [d for rule in rules for d in rule(pair)]


def _missing(pname: str, site: Mapping[str, Any], cluster: Cluster, described: bool) -> Difference:
    """A partition the cluster does not have, under the key that named it."""
    if described:
        where = f"partitions.{pname}"
    else:
        where = "default_partition" if site.get("default_partition") == pname else "resources.partition"
    have = ", ".join(sorted(cluster.partitions)) or "none"
    return Difference(where, f"cluster {cluster.name} has no partition {pname} (it has: {have}); jobs there are "
                      "refused", True, pname)


# --- the QOS and association a job runs under ---------------------------------------------------


def effective_assoc(site: Mapping[str, Any], cluster: Cluster, pname: str | None) -> Association | None:
    """The user's association jobs on `pname` run under: for the profile's account (else
    the first one listed), a partition's own row before the account's general one."""
    if not cluster.associations:
        return None
    account = site.get("account")
    rows = [a for a in cluster.associations if account is None or a.account == account]
    return (next((a for a in rows if a.partition == pname), None)
            or next((a for a in rows if a.partition is None), None))


def qos_name(site: Mapping[str, Any], prof: Mapping[str, Any], assoc: Association | None) -> str | None:
    return prof.get("qos") or site.get("qos") or (assoc.default_qos if assoc else None) or \
        (next(iter(assoc.qos)) if assoc and len(assoc.qos) == 1 else None)


class Limits(NamedTuple):
    source: str                     # who sets them, in words
    wall: str | None                # MaxWall
    per_job: Mapping[str, str]      # MaxTRES
    per_node: Mapping[str, str]     # MaxTRESPerNode
    kind: str                       # the pending reason's prefix: QOS or Assoc


def accounting_limits(site: Mapping[str, Any], prof: Mapping[str, Any], cluster: Cluster, pname: str) -> list[Limits]:
    """The per-job limits a job on `pname` runs under where Slurm enforces them
    (AccountingStorageEnforce=limits): the partition's own QOS, the job's QOS and its
    association."""
    if "limits" not in cluster.enforce or cluster.associations is None:
        return []
    assoc = effective_assoc(site, cluster, pname)
    qname = qos_name(site, prof, assoc)
    known = cluster.qos or {}
    out: list[Limits] = []
    part = cluster.partitions.get(pname)
    part_qos = known.get(part.qos) if part is not None and part.qos else None
    if part_qos is not None:
        out.append(Limits(f"partition {pname}'s QOS {part_qos.name}", part_qos.max_wall, part_qos.max_tres,
                          part_qos.max_tres_per_node, "QOS"))
    qos = known.get(qname) if qname else None
    if qos is not None and qos is not part_qos:
        out.append(Limits(f"QOS {qos.name}", qos.max_wall, qos.max_tres, qos.max_tres_per_node, "QOS"))
    if assoc is not None:
        out.append(Limits(f"the association of account {assoc.account}", assoc.max_wall, assoc.max_tres, {},
                          "Assoc"))
    return out
