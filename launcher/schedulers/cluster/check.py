"""A site profile against the live Slurm cluster (`glaunch sites check S`, and `submit`
before its preflight): every difference said in the profile's terms.

A difference that would get a job refused, leave it pending forever or run it on other
hardware is fatal (exit 3, nothing queued); one that is harmless (the profile more
conservative than the cluster, a partition it does not describe) is a warning.

`compare` is pure: the profile (a mapping shaped like config.schema.Site) and the
cluster's facts, parsed from one `scontrol` call (partitions, nodes, settings) and, where
slurmdbd answers, `sacctmgr` (associations, QOS). `check_site` is the thin part that
asks Slurm.

Here: the site-wide checks and a job's own request. The cluster's facts are read and
parsed in facts.py, one partition is compared in partition.py, and report.py holds the
differences and their wording.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from launcher.config import slurmtime
from launcher.resolution.jobplan import JobPlan
from launcher.schedulers.cluster.partition import (
    Limits,
    accounting_limits,
    effective_assoc,
    fate,
    has_features,
    mem_per_cpu_source,
    partition_diffs,
    to_seconds,
)
from launcher.schedulers.cluster.report import CheckReport, Difference
from launcher.schedulers.cluster.facts import Cluster, Node, Partition, parse_int


# --- the request of one job (submit) -------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """What one job asks, for the checks only a job has: a limit the profile does not state."""

    partition: str | None
    nodes: int
    time_s: int
    gpus_per_node: int
    cpus_per_node: int | None = None    # None: Slurm's default
    mem_mb: int | None = None
    constraint: str | None = None

    @classmethod
    def of_plan(cls, plan: JobPlan) -> Request:
        alloc = plan.allocation
        cpus = alloc.cpus_per_task * alloc.tasks_per_node if alloc.cpus_per_task else None
        mem = math.ceil(alloc.mem_gb * 1024) if alloc.mem_gb is not None else None
        return cls(alloc.partition, alloc.allocated_nodes, alloc.time_seconds, alloc.gpus_per_node, cpus, mem,
                   alloc.constraint)

    def cpus_on(self, part: Partition) -> int | None:
        """The CPUs a node of this job gets in `part`: its own ask, raised where MaxMemPerCPU
        needs more to carry its memory (None: Slurm's default)."""
        need = part.cpus_for_mem(self.mem_mb) if self.mem_mb else None
        return max(self.cpus_per_node or 0, need or 0) or None

    def fits(self, part: Partition, node: Node) -> bool:
        """Whether `node` can be one of this job's nodes in `part`."""
        cpus, mem, want = part.job_cpus(node), part.job_mem_mb(node), self.cpus_on(part)
        return (node.gpu_count >= self.gpus_per_node
                and (want is None or cpus is None or cpus >= want)
                and (self.mem_mb is None or mem is None or mem >= self.mem_mb)
                and has_features(self.constraint, node.features))

    def per_node(self) -> str:
        """The per-node ask, in words."""
        words = [f"{self.gpus_per_node} GPU(s)"] if self.gpus_per_node else []
        if self.cpus_per_node:
            words.append(f"{self.cpus_per_node} CPUs")
        if self.mem_mb is not None:
            words.append(f"{self.mem_mb} MB of memory")
        if self.constraint:
            words.append(f"feature(s) {self.constraint}")
        return ", ".join(words) or "a node"


def compare(site: Mapping[str, Any], cluster: Cluster, *, partition: str | None = None,
            request: Request | None = None) -> CheckReport:
    """Every difference between the profile and the cluster. With `partition` (submit),
    only that partition's differences and the site-wide ones are reported, and with
    `request` the job's own asks are checked against limits the profile does not state."""
    site_name = str(site.get("name") or "site")
    report = CheckReport(site_name, cluster.name, slurm_version=cluster.slurm_version)
    parts: Mapping[str, Mapping[str, Any]] = site.get("partitions") or {}
    diffs: list[Difference] = []

    scope = [partition] if partition is not None else list(parts)
    for pname in scope:
        diffs += partition_diffs(pname, parts.get(pname) or {}, site, cluster, described=pname in parts)
    diffs += _site_diffs(site, cluster, scope, submit=partition is not None)
    if request is not None and request.partition is None and cluster.default_partition is not None:
        # No partition named: sbatch sends the job to the cluster's default one.
        request = dataclasses.replace(request, partition=cluster.default_partition)
    if request is not None and request.partition is not None and request.partition in cluster.partitions:
        diffs += _request_diffs(request, parts.get(request.partition) or {}, site, cluster, diffs)

    if partition is None:
        extra = sorted(set(cluster.partitions) - set(parts))
        if extra:
            diffs.append(Difference("partitions", f"cluster {cluster.name} also has partition(s) "
                                    f"{', '.join(extra)}, which the profile does not describe", False))
    if cluster.associations is None and cluster.accounting_note:
        report.notes.append(cluster.accounting_note)
    report.notes += unknown_state_notes(cluster)

    for d in diffs:
        (report.fatal if d.fatal else report.warnings).append(d)
    return report


def unknown_state_notes(cluster: Cluster) -> list[str]:
    """A line per node whose state has words glaunch does not know: what it read past."""
    nodes = {n.name: n for part in cluster.partitions.values() for n in part.nodes}
    return [f"node {name}: state {node.state} has word(s) glaunch does not know "
            f"({', '.join(node.unknown_state_words)}): read as taking jobs"
            for name, node in nodes.items() if node.unknown_state_words]


def _site_diffs(site: Mapping[str, Any], cluster: Cluster, scope: Iterable[str], *,
                submit: bool) -> list[Difference]:
    out = []
    scope = list(scope)
    # --gpus-per-node needs select/cons_tres.
    select = cluster.settings.get("SelectType", "")
    gpus_in_scope = any(int((site.get("partitions") or {}).get(p, {}).get("gpus_per_node") or 0) > 0
                        for p in scope)
    if site.get("gpu_directive", "gpus-per-node") == "gpus-per-node" and gpus_in_scope \
            and not cluster.takes_gpus_per_node:
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
        assoc = effective_assoc(site, cluster, pname)
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
    limit = to_seconds(part.max_time)
    if limit is not None and request.time_s > limit and f"partitions.{part.name}.max_time" not in flagged:
        out.append(Difference("resources.time", f"{slurmtime.format(request.time_s)} asked, {on} allows "
                              f"{part.max_time} (the profile gives no partitions.{part.name}.max_time); "
                              f"{fate(cluster, this_job=True)}", True, part.name))
    if request.nodes > part.node_limit and f"partitions.{part.name}.max_nodes" not in flagged:
        out.append(Difference("resources.nodes", f"{request.nodes} asked, {on} gives a job at most "
                              f"{part.node_limit}; {fate(cluster, this_job=True)}", True,
                              part.name))
    elif part.nodes and request.nodes <= part.node_limit:
        per_cpu, never = _mem_per_cpu_diffs(request, prof, part, cluster, on)
        out += per_cpu if never else per_cpu + _fit_diffs(request, part, on)
    for limits in accounting_limits(site, prof, cluster, part.name):
        out += _limit_diffs(request, limits, cluster, part.name, flagged)
    return out


def _mem_per_cpu_diffs(request: Request, prof: Mapping[str, Any], part: Partition, cluster: Cluster,
                       on: str) -> tuple[list[Difference], bool]:
    """The job's memory against MaxMemPerCPU, and whether it can never run: Slurm raises a
    job's CPUs to carry its memory, never past what a node gives. Left unsaid where the
    profile's check said it of the same memory and CPUs."""
    cpus = part.job_cpu_counts()
    need = part.cpus_for_mem(request.mem_mb) if request.mem_mb else None
    if need is None or not cpus:
        return [], False
    per_cpu = part.max_mem_per_cpu_mb or 0
    mem_gb = prof.get("mem_gb")
    profile_said = isinstance(mem_gb, (int, float)) and math.ceil(mem_gb * 1024) == request.mem_mb
    if need > max(cpus):
        if profile_said:
            return [], True
        return [Difference("resources.mem_gb", f"{request.mem_mb} MB a node asked, {on} gives a job at most "
                           f"{per_cpu * max(cpus)} MB a node ({mem_per_cpu_source(part, max(cpus))}): this job "
                           f"needs {need} CPUs a node, more than any node gives; this job is refused at submission "
                           "(Requested node configuration is not available)", True, part.name)], True
    asked = request.cpus_per_node
    if asked and need > asked and not (profile_said and prof.get("cpus_per_node") == asked):
        return [Difference("resources.mem_gb", f"{request.mem_mb} MB a node asked with {asked} CPUs, {on} gives "
                           f"{asked} CPUs at most {per_cpu * asked} MB (MaxMemPerCPU={per_cpu} MB); Slurm raises "
                           f"this job's CPUs to {need} a node", False, part.name)], False
    return [], False


def _limit_diffs(request: Request, limits: Limits, cluster: Cluster, pname: str,
                 flagged: set[str]) -> list[Difference]:
    """The job against one QOS's or association's per-job and per-node limits."""
    out = []
    never = f"this job would never start ({limits.kind}"
    by = f"{limits.source} on cluster {cluster.name} allows"
    wall_s = to_seconds(limits.wall)
    if wall_s is not None and request.time_s > wall_s and f"partitions.{pname}.max_time" not in flagged:
        out.append(Difference("resources.time", f"{slurmtime.format(request.time_s)} asked, {by} {limits.wall}; "
                              f"{never}MaxWallDurationPerJobLimit)", True, pname))
    nodes = parse_int(limits.per_job.get("node"))
    if nodes is not None and request.nodes > nodes and f"partitions.{pname}.max_nodes" not in flagged:
        out.append(Difference("resources.nodes", f"{request.nodes} asked, {by} {nodes} per job; "
                              f"{never}MaxNodePerJobLimit)", True, pname))
    gpus = request.nodes * request.gpus_per_node
    most = parse_int(limits.per_job.get("gres/gpu"))
    if most is not None and gpus > most:
        out.append(Difference("resources.gpus_per_node", f"{request.nodes} node(s) x {request.gpus_per_node} GPU(s) "
                              f"= {gpus} asked, {by} {most} GPU(s) per job; {never}MaxGRESPerJob)", True, pname))
    most = parse_int(limits.per_node.get("gres/gpu"))
    if most is not None and request.gpus_per_node > most:
        out.append(Difference("resources.gpus_per_node", f"{request.gpus_per_node} asked, {by} {most} per node; "
                              f"{never}MaxGRESPerNode)", True, pname))
    if request.cpus_per_node:
        cpus = request.nodes * request.cpus_per_node
        most = parse_int(limits.per_job.get("cpu"))
        if most is not None and cpus > most:
            out.append(Difference("resources.cpus_per_task", f"{request.nodes} node(s) x {request.cpus_per_node} "
                                  f"CPUs = {cpus} asked, {by} {most} CPUs per job; {never}MaxCpuPerJobLimit)",
                                  True, pname))
        most = parse_int(limits.per_node.get("cpu"))
        if most is not None and request.cpus_per_node > most:
            out.append(Difference("resources.cpus_per_task", f"{request.cpus_per_node} CPUs a node asked, {by} "
                                  f"{most} per node; {never}MaxCpuPerNode)", True, pname))
    return out


def _fit_diffs(request: Request, part: Partition, on: str) -> list[Difference]:
    """Enough nodes that can each hold the per-node ask: in a partition of nodes of several
    sizes, a job on more nodes than have its GPUs, CPUs, memory and features never starts."""
    fit = [n for n in part.nodes if request.fits(part, n)]
    if len(fit) < request.nodes:
        have = f"only {len(fit)} of its {len(part.nodes)} nodes" if fit else f"none of its {len(part.nodes)} nodes"
        return [Difference("resources.nodes", f"{request.nodes} node(s) with {request.per_node()} asked, {on} has "
                           f"{have} with that much; this job can never start (Requested node configuration is not "
                           "available)", True, part.name)]
    up = sum(1 for n in fit if n.usable)
    if up < request.nodes:
        return [Difference("resources.nodes", f"{request.nodes} node(s) asked, {on} has {len(fit)} that fit, of "
                           f"which {up} take jobs now (the others are down or drained); this job waits for them",
                           False, part.name)]
    return []


def site_mapping(site_config: Any) -> Mapping[str, Any]:
    """A config.schema.Site (or the mapping a JobPlan keeps of it) as a mapping."""
    if dataclasses.is_dataclass(site_config) and not isinstance(site_config, type):
        return dataclasses.asdict(site_config)
    return site_config


def check_site(site_config: Any, cluster: Cluster, partition: str | None = None,
               request: Request | None = None) -> CheckReport:
    """The profile against the live cluster's facts (facts.read_cluster)."""
    return compare(site_mapping(site_config), cluster, partition=partition, request=request)
