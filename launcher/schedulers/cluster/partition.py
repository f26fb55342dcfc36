"""One partition of a site profile against the same partition of the live cluster: its
state, GPUs (count and type), CPUs, memory, time and node limits, features, who may use
it, preemption, and the per-job limits of the QOS and association its jobs run under.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, NamedTuple

from launcher.config import slurmtime
from launcher.schedulers.cluster.report import Difference
from launcher.schedulers.cluster.facts import Association, Cluster, Partition, parse_int


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
    names = [w for w in re.findall(r"[A-Za-z_][\w.-]*", expr)]
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


def partition_diffs(pname: str, prof: Mapping[str, Any], site: Mapping[str, Any], cluster: Cluster, *,
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
    if not any(n.usable for n in part.nodes):
        states = ", ".join(sorted({n.state for n in part.nodes}))
        add("", f"no node of {on} takes jobs now ({states}); jobs wait until an administrator returns them", False)
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
            beyond = (f"; jobs on more than {fit} node(s) never start" if fit < part.node_limit else "")
            add("gpus_per_node", f"the profile says {want}, only {fit} of the {len(counts)} nodes of {on} have "
                f"that many GPUs (the others {counts[0]}); jobs wait for those nodes{beyond}", False)
        elif want < counts[0]:
            add("gpus_per_node", f"the profile says {want}, the nodes of {on} have {counts[0]} GPUs; jobs use "
                f"{want} of them", False)
    gtype = prof.get("gpu_type")
    with_gpus = [n for n in part.nodes if n.gpu_count]
    cluster_types = sorted({str(t) for n in with_gpus for t in n.gpus if t is not None})
    if gtype and with_gpus:
        matches = {t: _gpu_type_matches(gtype, t) for t in {t for n in with_gpus for t in n.gpus}}
        matching = [n for n in with_gpus if any(matches[t] for t in n.gpus)]
        untyped = [n for n in with_gpus if set(n.gpus) == {None}]
        if not matching and len(untyped) == len(with_gpus):
            add("gpu_type", f"the profile says {gtype}, the GPUs of {on} have no type in Slurm (Gres=gpu:N); "
                "it cannot be confirmed", False)
        elif not matching:
            add("gpu_type", f"the profile says {gtype}, the GPUs of {on} are {', '.join(cluster_types)}; jobs "
                "would run on other hardware", True)
        elif len(matching) < len(with_gpus):
            other = sorted({str(t) for n in with_gpus if not any(matches[t] for t in n.gpus) for t in n.gpus})
            add("gpu_type", f"the profile says {gtype}, {len(with_gpus) - len(matching)} of the {len(with_gpus)} "
                f"GPU nodes of {on} have {', '.join(other)}; jobs may land there unless "
                f"{key}.constraint selects {gtype}", False)
    elif not gtype and cluster_types:
        add("gpu_type", f"the profile gives none, the GPUs of {on} are {', '.join(cluster_types)}", False)

    # CPUs and memory per node: what one job's node can have.
    cpus = part.job_cpu_counts()
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
    mems = [m for m in (part.job_mem_mb(n) for n in part.nodes) if m is not None]
    want = prof.get("mem_gb")
    if isinstance(want, (int, float)) and not isinstance(want, bool) and mems:
        if want * 1024 > max(mems):
            add("mem_gb", f"the profile says {want:g} GB, the nodes of {on} give a job at most "
                f"{max(mems) // 1024} GB ({_memory_source(part, max(mems))}); jobs asking that much are refused",
                True)
        elif want * 1024 > min(mems):
            add("mem_gb", f"the profile says {want:g} GB, some nodes of {on} have only {min(mems) // 1024} GB; "
                "jobs asking that much wait for the larger nodes", False)
        elif min(mems) // 1024 > want:
            add("mem_gb", f"the profile says {want:g} GB, the nodes of {on} have {min(mems) // 1024} GB", False)
    asked = prof.get("cpus_per_node")
    want_mb = want * 1024 if isinstance(want, (int, float)) and not isinstance(want, bool) else None
    need = part.cpus_for_mem(want_mb) if want_mb is not None and not (mems and want_mb > max(mems)) else None
    if need is not None and cpus:
        # MaxMemPerCPU: Slurm raises a job's CPUs to carry its memory, up to what a node gives.
        per_cpu = part.max_mem_per_cpu_mb or 0
        if need > max(cpus):
            add("mem_gb", f"the profile says {want:g} GB, {on} gives a job at most {per_cpu * max(cpus) // 1024} GB "
                f"a node ({mem_per_cpu_source(part, max(cpus))}): a job asking that much needs {need} CPUs a "
                f"node, more than any node gives; {NO_NODE_FITS}", True)
        elif isinstance(asked, int) and need > asked:
            fit = sum(1 for c in cpus if c >= need)
            few = f", which only {fit} of its {len(cpus)} nodes give; jobs wait for them" if fit < len(cpus) else ""
            add("mem_gb", f"the profile says {want:g} GB and {asked} CPUs, {on} gives {asked} CPUs at most "
                f"{per_cpu * asked // 1024} GB (MaxMemPerCPU={per_cpu} MB); Slurm raises the CPUs of a job asking "
                f"that much to {need} a node{few}", False)

    # Time and node limits.
    want_t, have_t = prof.get("max_time"), part.max_time
    want_s, have_s = to_seconds(want_t), to_seconds(have_t)
    if want_s is not None and have_s is not None and want_s > have_s:
        add("max_time", f"the profile says {want_t}, {on} allows {have_t}; {fate(cluster)}", True)
    elif want_s is None and have_s is not None:
        add("max_time", f"the profile gives none, {on} allows {have_t}; {fate(cluster)}", False)
    elif want_s is not None and have_s is not None and want_s < have_s:
        add("max_time", f"the profile says {want_t}, {on} allows {have_t}", False)
    want_n, have_n = prof.get("max_nodes"), part.node_limit
    limit_word = f"MaxNodes={part.max_nodes}" if part.max_nodes is not None and part.max_nodes <= part.total_nodes \
        else f"{part.total_nodes} node(s) in all"
    if isinstance(want_n, int) and want_n > have_n:
        add("max_nodes", f"the profile says {want_n}, {on} gives a job at most {have_n} ({limit_word}); "
            f"{fate(cluster)}", True)
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
    allowed_groups = part.allow_groups
    if allowed_groups is not None and cluster.groups is not None and cluster.user not in (None, "root") \
            and not allowed_groups & cluster.groups:
        out.append(Difference(key, f"user {cluster.user} is in none of the groups {on} allows "
                              f"(AllowGroups={','.join(sorted(allowed_groups))}); jobs are refused", True, pname))
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
    elif not qos and part.allow_qos is not None:
        assoc = effective_assoc(site, cluster, pname)
        default = qos_name(site, prof, assoc)
        allowed = ", ".join(sorted(part.allow_qos))
        if default is None:
            add("qos", f"the profile gives none, {on} allows only QOS {allowed}; jobs under another default QOS "
                "are refused", False)
        elif default not in part.allow_qos:
            add("qos", f"the profile gives none, so jobs run under QOS {default} (the association's default), "
                f"{on} allows only QOS {allowed}; jobs are refused", True)

    # Preemption: the profile's flag tells glaunch to expect requeues.
    lower = any(o.priority_tier > part.priority_tier for o in cluster.partitions.values() if o.name != pname)
    preemptible = part.preempt_mode.upper() not in ("OFF", "") and lower
    if bool(prof.get("preemptible")) != preemptible:
        add("preemptible", f"the profile says {bool(prof.get('preemptible'))}, jobs on {on} "
            f"{'can' if preemptible else 'cannot'} be preempted (PreemptMode={part.preempt_mode})", False)

    out += _accounting_limit_diffs(pname, prof, site, cluster)
    return out


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


def _accounting_limit_diffs(pname: str, prof: Mapping[str, Any], site: Mapping[str, Any],
                            cluster: Cluster) -> list[Difference]:
    """Per-job wall and node limits of the QOS and association the profile's jobs run
    under, against the profile's max_time and max_nodes: over them a job never starts."""
    out = []
    want_t, want_n = prof.get("max_time"), prof.get("max_nodes")
    limits = accounting_limits(site, prof, cluster, pname)
    for source, wall, _, _, kind in limits:
        want_s, wall_s = to_seconds(want_t), to_seconds(wall)
        if want_s is not None and wall_s is not None and want_s > wall_s:
            out.append(Difference(f"partitions.{pname}.max_time", f"the profile says {want_t}, {source} on "
                                  f"cluster {cluster.name} allows {wall}; jobs over it never start "
                                  f"({kind}MaxWallDurationPerJobLimit)", True, pname))
    for source, _, tres, _, kind in limits:
        limit = parse_int(tres.get("node"))
        if limit is not None and isinstance(want_n, int) and want_n > limit:
            out.append(Difference(f"partitions.{pname}.max_nodes", f"the profile says {want_n}, {source} on "
                                  f"cluster {cluster.name} allows {limit} node(s) per job; jobs over it never "
                                  f"start ({kind}MaxNodePerJobLimit)", True, pname))
    return out
