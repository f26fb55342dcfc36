"""A site profile against the live Slurm cluster (`glaunch sites check S`, and `submit`
before its preflight): every difference said in the profile's terms.

A difference that would get a job refused, leave it pending forever or run it on other
hardware is fatal (exit 3, nothing queued); one that is harmless (the profile more
conservative than the cluster, a partition it does not describe) is a warning.

`compare` is pure: the profile (a mapping shaped like config.schema.Site) and the
cluster's facts, parsed from one `scontrol` call (partitions, nodes, settings) and, where
slurmdbd answers, `sacctmgr` (associations, QOS). `check_site` is the thin part that
asks Slurm.
"""

from __future__ import annotations

import dataclasses
import getpass
import re
import shutil
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ..errors import SchedulerError
from ..resolution import slurmtime
from .detect import gpu_kinds, parse_records, read_scontrol, split_scontrol
from .slurm_client import ACCOUNTING_POLICY, Unreachable, run_command

ASSOC_FORMAT = ("Account", "Partition", "QOS", "DefaultQOS", "MaxWall", "MaxTRES")
QOS_FORMAT = ("Name", "MaxWall", "MaxTRES", "MaxTRESPerNode")
# Node states in which a node takes no job now (scontrol writes e.g. IDLE+DRAIN, DOWN*).
UNUSABLE = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "FUTURE", "POWERED_DOWN", "INVAL")


# --- the cluster's facts ------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    name: str
    gpus: Mapping[str | None, int]      # per GPU type (None: untyped)
    cpus: int | None                    # CPUEfctv (22.05+: without specialized cores), else CPUTot
    mem_mb: int | None                  # RealMemory
    features: frozenset[str]
    state: str
    partitions: tuple[str, ...]

    @property
    def gpu_count(self) -> int:
        return sum(self.gpus.values())

    @property
    def usable(self) -> bool:
        return not any(s in self.state.upper() for s in UNUSABLE)


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

    @property
    def node_limit(self) -> int:
        """The most nodes one job can get: MaxNodes, and never more than the partition has."""
        return min(self.max_nodes, self.total_nodes) if self.max_nodes is not None else self.total_nodes


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


def _limit(value: str | None) -> str | None:
    return None if value in (None, "", "UNLIMITED", "NONE", "INFINITE", "(null)", "N/A") else value


def _int(value: str | None) -> int | None:
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
        nodes.append(Node(r["NodeName"], gpu_kinds(r.get("Gres", "")), _int(cpus), _int(r.get("RealMemory")),
                          frozenset(features.split(",")) if features else frozenset(), r.get("State", ""),
                          tuple(p for p in r.get("Partitions", "").split(",") if p)))
    return nodes


def parse_cluster(scontrol_text: str, *, assoc_text: str | None = None, qos_text: str | None = None,
                  user: str | None = None, accounting_note: str | None = None) -> Cluster:
    """The facts `compare` reads: scontrol's answer to detect.SCONTROL_COMMANDS, and
    sacctmgr's `-n -P` rows in ASSOC_FORMAT and QOS_FORMAT (None: not reachable)."""
    parts_text, nodes_text, settings = split_scontrol(scontrol_text)
    nodes = parse_nodes(nodes_text)
    partitions = {}
    for r in parse_records(parts_text):
        name = r["PartitionName"]
        members = tuple(n for n in nodes if name in n.partitions)
        mem = _limit(r.get("MaxMemPerNode"))
        partitions[name] = Partition(
            name=name, default=r.get("Default") == "YES", state=r.get("State", "UP"),
            max_time=_limit(r.get("MaxTime")), max_nodes=_int(r.get("MaxNodes")),
            total_nodes=_int(r.get("TotalNodes")) or len(members), nodes=members,
            allow_accounts=_names(r.get("AllowAccounts")), deny_accounts=_names(r.get("DenyAccounts")) or frozenset(),
            allow_qos=_names(r.get("AllowQos")), deny_qos=_names(r.get("DenyQos")) or frozenset(),
            max_cpus_per_node=_int(r.get("MaxCPUsPerNode")),
            max_mem_per_node_mb=int(mem) if mem and mem.isdigit() else None,
            preempt_mode=r.get("PreemptMode", "OFF"), priority_tier=_int(r.get("PriorityTier")) or 1)
    assocs = None if assoc_text is None else tuple(parse_associations(assoc_text))
    qos = None if qos_text is None else {q.name: q for q in parse_qos(qos_text)}
    return Cluster(settings.get("ClusterName", "cluster"), settings, partitions, user, assocs, qos, accounting_note)


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


# --- the request of one job (submit) -------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """What one job asks, for the checks only a job has: a limit the profile does not state."""

    partition: str | None
    nodes: int
    time_s: int
    gpus_per_node: int

    @classmethod
    def of_plan(cls, plan: Any) -> Request:
        return cls(plan.partition, plan.nodes, plan.time_seconds, plan.gpus_per_node)


# --- the comparison ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    key: str            # the profile's dotted key (or the experiment's, for a job's request)
    message: str
    fatal: bool
    partition: str | None = None

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


@dataclass
class CheckReport:
    site: str
    cluster: str
    fatal: list[Difference] = field(default_factory=list)
    warnings: list[Difference] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"site": self.site, "cluster": self.cluster, "ok": not self.fatal,
                "fatal": [dataclasses.asdict(d) for d in self.fatal],
                "warnings": [dataclasses.asdict(d) for d in self.warnings], "notes": list(self.notes)}

    def format(self) -> str:
        """What `glaunch sites check` prints."""
        if not self.fatal and not self.warnings:
            head = f"site {self.site} matches Slurm cluster {self.cluster}"
        else:
            head = (f"site {self.site} against Slurm cluster {self.cluster}: {len(self.fatal)} fatal "
                    f"difference(s), {len(self.warnings)} warning(s)")
        lines = [head]
        lines += [f"  FATAL    {d}" for d in self.fatal]
        lines += [f"  warning  {d}" for d in self.warnings]
        lines += [f"  note     {n}" for n in self.notes]
        return "\n".join(lines)

    def error(self, site_file: str | None = None) -> SchedulerError:
        """The refusal `submit` raises: every fatal difference, and what to do."""
        lines = [f"site {self.site} does not match Slurm cluster {self.cluster}; nothing was submitted:"]
        lines += [f"  {d}" for d in self.fatal]
        lines.append(f"fix the profile (`glaunch sites check {self.site}` lists every difference)")
        return SchedulerError("\n".join(lines), file=site_file)


def _seconds(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return slurmtime.parse(text)
    except ValueError:
        return None


def _fate(cluster: Cluster) -> str:
    """What happens to a job over a partition limit."""
    mode = cluster.enforce_part_limits
    if mode in ("NO", ""):
        return "jobs over it would pend forever (EnforcePartLimits=NO)"
    return f"jobs over it are refused at submission (EnforcePartLimits={mode})"


def _gpu_type_matches(profile_type: str, cluster_type: str | None) -> bool:
    """`a100` matches `a100` and Slurm's autodetected `nvidia_a100-sxm4-80gb`."""
    if cluster_type is None:
        return False
    words = re.split(r"[^a-z0-9]+", cluster_type.lower())
    return profile_type.lower() == cluster_type.lower() or profile_type.lower() in words


def _constraint_features(expr: str) -> tuple[list[str], bool]:
    """The feature names of a --constraint expression, and whether any one of them is
    enough (an OR expression)."""
    names = [w for w in re.findall(r"[A-Za-z_][\w.-]*", expr)]
    return names, "|" in expr


def compare(site: Mapping[str, Any], cluster: Cluster, *, partition: str | None = None,
            request: Request | None = None) -> CheckReport:
    """Every difference between the profile and the cluster. With `partition` (submit),
    only that partition's differences and the site-wide ones are reported, and with
    `request` the job's own asks are checked against limits the profile does not state."""
    site_name = str(site.get("name") or "site")
    report = CheckReport(site_name, cluster.name)
    parts: Mapping[str, Mapping[str, Any]] = site.get("partitions") or {}
    diffs: list[Difference] = []

    scope = [partition] if partition is not None else list(parts)
    for pname in scope:
        diffs += _partition_diffs(pname, parts.get(pname) or {}, site, cluster, described=pname in parts)
    diffs += _site_diffs(site, cluster, scope, submit=partition is not None)
    if request is not None and request.partition is not None and request.partition in cluster.partitions:
        diffs += _request_diffs(request, parts.get(request.partition) or {}, site, cluster, diffs)

    if partition is None:
        extra = sorted(set(cluster.partitions) - set(parts))
        if extra:
            diffs.append(Difference("partitions", f"cluster {cluster.name} also has partition(s) "
                                    f"{', '.join(extra)}, which the profile does not describe", False))
    if cluster.associations is None and cluster.accounting_note:
        report.notes.append(cluster.accounting_note)

    for d in diffs:
        (report.fatal if d.fatal else report.warnings).append(d)
    return report


def _partition_diffs(pname: str, prof: Mapping[str, Any], site: Mapping[str, Any], cluster: Cluster, *,
                     described: bool) -> list[Difference]:
    key = f"partitions.{pname}"
    part = cluster.partitions.get(pname)
    on = f"partition {pname} on cluster {cluster.name}"
    if part is None:
        where = key if described else ("default_partition" if site.get("default_partition") == pname
                                       else "resources.partition")
        have = ", ".join(sorted(cluster.partitions)) or "none"
        return [Difference(where, f"cluster {cluster.name} has no partition {pname} (it has: {have}); "
                                  "jobs there are refused", True, pname)]
    out: list[Difference] = []

    def add(sub: str, message: str, fatal: bool) -> None:
        out.append(Difference(f"{key}.{sub}" if sub else key, message, fatal, pname))

    state = part.state.upper()
    if state in ("INACTIVE", "DRAIN"):
        add("", f"{on} is {part.state}: it takes no new jobs", True)
    elif state == "DOWN":
        add("", f"{on} is DOWN: jobs queue there but start only once an administrator sets it UP", False)
    if not part.nodes:
        add("", f"{on} has no nodes", True)
        return out
    if not described:
        return out

    # GPUs per node, and their type.
    counts = sorted(n.gpu_count for n in part.nodes)
    want = prof.get("gpus_per_node")
    if isinstance(want, int):
        if want > counts[-1]:
            have = f"at most {counts[-1]}" if counts[-1] else "no"
            add("gpus_per_node", f"the profile says {want}, the nodes of {on} have {have} GPUs; jobs asking "
                "the profile's GPUs are refused", True)
        elif want > counts[0]:
            fit = sum(1 for c in counts if c >= want)
            add("gpus_per_node", f"the profile says {want}, only {fit} of the {len(counts)} nodes of {on} have "
                f"that many GPUs (the others {counts[0]}); jobs wait for those nodes", False)
        elif want < counts[0]:
            add("gpus_per_node", f"the profile says {want}, the nodes of {on} have {counts[0]} GPUs; jobs use "
                f"{want} of them", False)
    gtype = prof.get("gpu_type")
    with_gpus = [n for n in part.nodes if n.gpu_count]
    cluster_types = sorted({str(t) for n in with_gpus for t in n.gpus if t is not None})
    if gtype and with_gpus:
        matching = [n for n in with_gpus if any(_gpu_type_matches(gtype, t) for t in n.gpus)]
        untyped = [n for n in with_gpus if set(n.gpus) == {None}]
        if not matching and len(untyped) == len(with_gpus):
            add("gpu_type", f"the profile says {gtype}, the GPUs of {on} have no type in Slurm (Gres=gpu:N); "
                "it cannot be confirmed", False)
        elif not matching:
            add("gpu_type", f"the profile says {gtype}, the GPUs of {on} are {', '.join(cluster_types)}; jobs "
                "would run on other hardware", True)
        elif len(matching) < len(with_gpus):
            other = sorted({str(t) for n in with_gpus if n not in matching for t in n.gpus})
            add("gpu_type", f"the profile says {gtype}, {len(with_gpus) - len(matching)} of the {len(with_gpus)} "
                f"GPU nodes of {on} have {', '.join(other)}; jobs may land there unless "
                f"{key}.constraint selects {gtype}", False)
    elif not gtype and cluster_types:
        add("gpu_type", f"the profile gives none, the GPUs of {on} are {', '.join(cluster_types)}", False)

    # CPUs and memory per node: what one job's node can have.
    cpus = [min(n.cpus, part.max_cpus_per_node or n.cpus) for n in part.nodes if n.cpus is not None]
    want = prof.get("cpus_per_node")
    if isinstance(want, int) and cpus:
        if want > max(cpus):
            add("cpus_per_node", f"the profile says {want}, the nodes of {on} give a job at most {max(cpus)} "
                "CPUs; jobs asking the profile's CPUs are refused", True)
        elif want > min(cpus):
            add("cpus_per_node", f"the profile says {want}, some nodes of {on} have only {min(cpus)} CPUs; jobs "
                "wait for the larger nodes", False)
        elif want < min(cpus):
            add("cpus_per_node", f"the profile says {want}, the nodes of {on} have {min(cpus)} CPUs", False)
    mems = [min(n.mem_mb, part.max_mem_per_node_mb or n.mem_mb) for n in part.nodes if n.mem_mb is not None]
    want = prof.get("mem_gb")
    if isinstance(want, (int, float)) and not isinstance(want, bool) and mems:
        if want * 1024 > max(mems):
            add("mem_gb", f"the profile says {want:g} GB, the nodes of {on} give a job at most "
                f"{max(mems) // 1024} GB (RealMemory={max(mems)} MB); jobs asking that much are refused", True)
        elif want * 1024 > min(mems):
            add("mem_gb", f"the profile says {want:g} GB, some nodes of {on} have only {min(mems) // 1024} GB; "
                "jobs asking that much wait for the larger nodes", False)
        elif min(mems) // 1024 > want:
            add("mem_gb", f"the profile says {want:g} GB, the nodes of {on} have {min(mems) // 1024} GB", False)

    # Time and node limits.
    want_t, have_t = prof.get("max_time"), part.max_time
    want_s, have_s = _seconds(want_t), _seconds(have_t)
    if want_s is not None and have_s is not None and want_s > have_s:
        add("max_time", f"the profile says {want_t}, {on} allows {have_t}; {_fate(cluster)}", True)
    elif want_s is None and have_s is not None:
        add("max_time", f"the profile gives none, {on} allows {have_t}; {_fate(cluster)}", False)
    elif want_s is not None and have_s is not None and want_s < have_s:
        add("max_time", f"the profile says {want_t}, {on} allows {have_t}", False)
    want_n, have_n = prof.get("max_nodes"), part.node_limit
    limit_word = f"MaxNodes={part.max_nodes}" if part.max_nodes is not None and part.max_nodes <= part.total_nodes \
        else f"{part.total_nodes} node(s) in all"
    if isinstance(want_n, int) and want_n > have_n:
        add("max_nodes", f"the profile says {want_n}, {on} gives a job at most {have_n} ({limit_word}); "
            f"{_fate(cluster)}", True)
    elif want_n is None:
        add("max_nodes", f"the profile gives none, {on} gives a job at most {have_n} ({limit_word})", False)
    elif want_n < have_n:
        add("max_nodes", f"the profile says {want_n}, {on} gives a job up to {have_n}", False)

    # Features the profile's constraint asks for.
    constraint = prof.get("constraint")
    if constraint:
        features = set().union(*(n.features for n in part.nodes))
        names, any_one = _constraint_features(str(constraint))
        missing = [f for f in names if f not in features]
        if missing and (not any_one or len(missing) == len(names)):
            add("constraint", f"the profile says {constraint}, no node of {on} has feature(s) "
                f"{', '.join(missing)} (they have: {', '.join(sorted(features)) or 'none'}); jobs never start "
                "(BadConstraints)", True)

    # Who may use it.
    account = site.get("account")
    if account and part.allow_accounts is not None and account not in part.allow_accounts:
        out.append(Difference("account", f"the profile says {account}, {on} allows only account(s) "
                              f"{', '.join(sorted(part.allow_accounts))}; jobs are refused", True, pname))
    elif account and account in part.deny_accounts:
        out.append(Difference("account", f"the profile says {account}, {on} denies it; jobs are refused",
                              True, pname))
    qos = prof.get("qos") or site.get("qos")
    qkey = f"{key}.qos" if prof.get("qos") else "qos"
    if qos and part.allow_qos is not None and qos not in part.allow_qos:
        out.append(Difference(qkey, f"the profile says {qos}, {on} allows only QOS "
                              f"{', '.join(sorted(part.allow_qos))}; jobs are refused", True, pname))
    elif qos and qos in part.deny_qos:
        out.append(Difference(qkey, f"the profile says {qos}, {on} denies it; jobs are refused", True, pname))

    # Preemption: the profile's flag tells glaunch to expect requeues.
    lower = any(o.priority_tier > part.priority_tier for o in cluster.partitions.values() if o.name != pname)
    preemptible = part.preempt_mode.upper() not in ("OFF", "") and lower
    if bool(prof.get("preemptible")) != preemptible:
        add("preemptible", f"the profile says {bool(prof.get('preemptible'))}, jobs on {on} "
            f"{'can' if preemptible else 'cannot'} be preempted (PreemptMode={part.preempt_mode})", False)

    out += _accounting_limit_diffs(pname, prof, site, cluster)
    return out


def _effective_assoc(site: Mapping[str, Any], cluster: Cluster, pname: str | None) -> Association | None:
    """The user's association jobs on `pname` run under: for the profile's account (else
    the first one listed), a partition's own row before the account's general one."""
    if not cluster.associations:
        return None
    account = site.get("account")
    rows = [a for a in cluster.associations if account is None or a.account == account]
    return (next((a for a in rows if a.partition == pname), None)
            or next((a for a in rows if a.partition is None), None))


def _qos_name(site: Mapping[str, Any], prof: Mapping[str, Any], assoc: Association | None) -> str | None:
    return prof.get("qos") or site.get("qos") or (assoc.default_qos if assoc else None) or \
        (next(iter(assoc.qos)) if assoc and len(assoc.qos) == 1 else None)


def _accounting_limit_diffs(pname: str, prof: Mapping[str, Any], site: Mapping[str, Any],
                            cluster: Cluster) -> list[Difference]:
    """Per-job wall and node limits of the QOS and association the profile's jobs run
    under, against the profile's max_time and max_nodes: over them a job never starts."""
    if "limits" not in cluster.enforce or cluster.associations is None:
        return []
    assoc = _effective_assoc(site, cluster, pname)
    qname = _qos_name(site, prof, assoc)
    qos = (cluster.qos or {}).get(qname) if qname else None
    out = []
    want_t = prof.get("max_time")
    for source, wall, reason in ((f"QOS {qname}", qos.max_wall if qos else None, "QOSMaxWallDurationPerJobLimit"),
                                 (f"the association of account {assoc.account}" if assoc else "", assoc.max_wall
                                  if assoc else None, "AssocMaxWallDurationPerJobLimit")):
        want_s, wall_s = _seconds(want_t), _seconds(wall)
        if want_s is not None and wall_s is not None and want_s > wall_s:
            out.append(Difference(f"partitions.{pname}.max_time", f"the profile says {want_t}, {source} on "
                                  f"cluster {cluster.name} allows {wall}; jobs over it never start ({reason})",
                                  True, pname))
    want_n = prof.get("max_nodes")
    for source, tres, reason in ((f"QOS {qname}", qos.max_tres if qos else {}, "QOSMaxNodePerJobLimit"),
                                 (f"the association of account {assoc.account}" if assoc else "",
                                  assoc.max_tres if assoc else {}, "AssocMaxNodePerJobLimit")):
        limit = _int(tres.get("node"))
        if limit is not None and isinstance(want_n, int) and want_n > limit:
            out.append(Difference(f"partitions.{pname}.max_nodes", f"the profile says {want_n}, {source} on "
                                  f"cluster {cluster.name} allows {limit} node(s) per job; jobs over it never "
                                  f"start ({reason})", True, pname))
    return out


def _site_diffs(site: Mapping[str, Any], cluster: Cluster, scope: Iterable[str], *,
                submit: bool) -> list[Difference]:
    out = []
    scope = list(scope)
    # --gpus-per-node needs select/cons_tres.
    select = cluster.settings.get("SelectType", "")
    gpus_in_scope = any(int((site.get("partitions") or {}).get(p, {}).get("gpus_per_node") or 0) > 0
                        for p in scope)
    if site.get("gpu_directive", "gpus-per-node") == "gpus-per-node" and gpus_in_scope and select \
            and "cons_tres" not in select:
        out.append(Difference("gpu_directive", f"the profile says gpus-per-node, cluster {cluster.name} runs "
                              f"{select}, which takes GPUs only as --gres; jobs are refused (set gpu_directive: "
                              "gres)", True))
    # The default partition: glaunch always names one, so a different default is harmless.
    mine, theirs = site.get("default_partition"), cluster.default_partition
    if submit:
        pass
    elif mine and theirs and mine != theirs and mine in cluster.partitions:
        out.append(Difference("default_partition", f"the profile says {mine}, cluster {cluster.name}'s default is "
                              f"{theirs}; glaunch names the partition, so jobs go to {mine}", False))
    elif not mine and theirs and len(site.get("partitions") or {}) != 1:
        out.append(Difference("default_partition", f"the profile gives none, cluster {cluster.name}'s default is "
                              f"{theirs}", False))
    if cluster.associations is None:
        return out
    # Account and QOS against the user's associations.
    user = cluster.user or "this user"
    enforced = "associations" in cluster.enforce
    account = site.get("account")
    accounts = sorted({a.account for a in cluster.associations})
    if not cluster.associations:
        out.append(Difference("account", f"user {user} has no association on cluster {cluster.name}"
                              + ("; every job is refused (AccountingStorageEnforce=associations)" if enforced
                                 else ""), enforced))
    elif account and account not in accounts:
        out.append(Difference("account", f"the profile says {account}, user {user} has no association with it on "
                              f"cluster {cluster.name} (accounts: {', '.join(accounts)})"
                              + ("; jobs are refused (InvalidAccount)" if enforced else ""), enforced))
    parts = site.get("partitions") or {}
    seen: set[tuple[str, str]] = set()
    for pname in scope:
        prof = parts.get(pname) or {}
        qos = prof.get("qos") or site.get("qos")
        if not qos:
            continue
        qkey = f"partitions.{pname}.qos" if prof.get("qos") else "qos"
        if (qkey, qos) in seen:
            continue
        seen.add((qkey, qos))
        if cluster.qos is not None and qos not in cluster.qos:
            out.append(Difference(qkey, f"the profile says {qos}, cluster {cluster.name} has no such QOS (it has: "
                                  f"{', '.join(sorted(cluster.qos)) or 'none'}); jobs are refused (InvalidQOS)",
                                  "qos" in cluster.enforce or enforced, pname if prof.get("qos") else None))
            continue
        assoc = _effective_assoc(site, cluster, pname)
        if assoc is not None and assoc.qos and qos not in assoc.qos:
            out.append(Difference(qkey, f"the profile says {qos}, the association of user {user} with account "
                                  f"{assoc.account} on cluster {cluster.name} allows QOS "
                                  f"{', '.join(sorted(assoc.qos))}; jobs are refused (InvalidQOS)",
                                  "qos" in cluster.enforce or enforced, pname if prof.get("qos") else None))
    return out


def _request_diffs(request: Request, prof: Mapping[str, Any], site: Mapping[str, Any], cluster: Cluster,
                   found: list[Difference]) -> list[Difference]:
    """The job's time and nodes against the limits the profile leaves unstated: with the
    profile's own limits right, resolution has already kept the job within them."""
    part = cluster.partitions[str(request.partition)]
    on = f"partition {part.name} on cluster {cluster.name}"
    flagged = {d.key for d in found if d.fatal}
    out = []
    limit = _seconds(part.max_time)
    if limit is not None and request.time_s > limit and f"partitions.{part.name}.max_time" not in flagged:
        out.append(Difference("resources.time", f"{slurmtime.format(request.time_s)} asked, {on} allows "
                              f"{part.max_time} (the profile gives no partitions.{part.name}.max_time); "
                              f"{_fate(cluster).replace('jobs over it', 'this job')}", True, part.name))
    if request.nodes > part.node_limit and f"partitions.{part.name}.max_nodes" not in flagged:
        out.append(Difference("resources.nodes", f"{request.nodes} asked, {on} gives a job at most "
                              f"{part.node_limit}; {_fate(cluster).replace('jobs over it', 'this job')}", True,
                              part.name))
    if "limits" in cluster.enforce and cluster.associations is not None:
        assoc = _effective_assoc(site, cluster, part.name)
        qname = _qos_name(site, prof, assoc)
        qos = (cluster.qos or {}).get(qname) if qname else None
        for source, wall, tres, kind in ((f"QOS {qname}", qos.max_wall if qos else None,
                                          qos.max_tres if qos else {}, "QOS"),
                                         ("the association of account " + (assoc.account if assoc else ""),
                                          assoc.max_wall if assoc else None, assoc.max_tres if assoc else {},
                                          "Assoc")):
            wall_s = _seconds(wall)
            if wall_s is not None and request.time_s > wall_s and \
                    f"partitions.{part.name}.max_time" not in flagged:
                out.append(Difference("resources.time", f"{slurmtime.format(request.time_s)} asked, {source} on "
                                      f"cluster {cluster.name} allows {wall}; this job would never start "
                                      f"({kind}MaxWallDurationPerJobLimit)", True, part.name))
            nodes = _int(tres.get("node"))
            if nodes is not None and request.nodes > nodes and f"partitions.{part.name}.max_nodes" not in flagged:
                out.append(Difference("resources.nodes", f"{request.nodes} asked, {source} on cluster "
                                      f"{cluster.name} allows {nodes} per job; this job would never start "
                                      f"({kind}MaxNodePerJobLimit)", True, part.name))
    return out


# --- asking the cluster ---------------------------------------------------------------------------


def read_cluster(command: str = "glaunch sites check") -> Cluster:
    """The live cluster's facts: one scontrol call, and sacctmgr where slurmdbd answers."""
    text = read_scontrol(command)
    _, _, settings = split_scontrol(text)
    cluster_name = settings.get("ClusterName", "")
    user = getpass.getuser()
    assoc_text = qos_text = None
    note = None
    if shutil.which("sacctmgr") is None:
        note = "account and QOS not checked: sacctmgr is not on PATH"
    else:
        try:
            where = [f"user={user}"] + ([f"cluster={cluster_name}"] if cluster_name else [])
            assoc = run_command("sacctmgr", "-n", "-P", "show", "assoc", "where", *where,
                                "format=" + ",".join(ASSOC_FORMAT), policy=ACCOUNTING_POLICY, controller=False)
            qos = run_command("sacctmgr", "-n", "-P", "show", "qos", "format=" + ",".join(QOS_FORMAT),
                              policy=ACCOUNTING_POLICY, controller=False)
            if assoc.returncode == 0 and qos.returncode == 0:
                assoc_text, qos_text = assoc.stdout, qos.stdout
            else:
                said = (assoc.stderr or qos.stderr or "").strip().splitlines()
                note = f"account and QOS not checked: sacctmgr said: {said[-1] if said else 'nothing'}"
        except Unreachable as exc:
            note = f"account and QOS not checked: {exc.message}"
    return parse_cluster(text, assoc_text=assoc_text, qos_text=qos_text, user=user, accounting_note=note)


def site_mapping(site_config: Any) -> Mapping[str, Any]:
    """A config.schema.Site (or the mapping a JobPlan keeps of it) as a mapping."""
    if dataclasses.is_dataclass(site_config) and not isinstance(site_config, type):
        return dataclasses.asdict(site_config)
    return site_config


def check_site(site_config: Any, partition: str | None = None, request: Request | None = None, *,
               cluster: Cluster | None = None) -> CheckReport:
    """The profile against the live cluster (or `cluster`, already read)."""
    facts = cluster if cluster is not None else read_cluster()
    return compare(site_mapping(site_config), facts, partition=partition, request=request)
