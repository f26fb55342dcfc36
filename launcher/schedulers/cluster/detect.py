"""`glaunch sites detect`: a site-profile skeleton from the Slurm cluster this runs on.

The parsing is pure (text of `scontrol show partition/node -o` in, a profile mapping
out) and reads the cluster as `glaunch sites check` does (facts.py), so a detected
profile is one the check passes: what a job can have on a node (MaxCPUsPerNode,
MaxMemPerNode and MemSpecLimit taken off), the nodes one job can get (MaxNodes, never
more than there are). :func:`query_cluster` is the only part that runs Slurm's commands.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import yaml

from launcher import shell
from launcher.config.schema import NAME_RULE, partition_name_problem, site_name_problem
from launcher.errors import ConfigError, SchedulerError
from launcher.config import slurmtime
from launcher.schedulers.cluster.facts import (
    Node,
    Partition,
    current_user,
    parse_partitions,
    takes_gpus_per_node,
    user_groups,
)
from launcher.schedulers.cluster.scontrol_text import read_scontrol, said, split_scontrol
from launcher.schedulers.slurm.client import ACCOUNTING_POLICY, Client, Unreachable


@dataclass(frozen=True)
class Detected:
    profile: dict[str, Any]
    notes: tuple[str, ...]      # the partitions left out of the profile and why; choices to review


def _names(names: Iterable[str]) -> str:
    return ",".join(said(n) for n in sorted(names))


def _takes(value: str | None) -> bool:
    """Whether a value from the cluster may stand in the profile as it is: one whose text a
    profile's check (and an #SBATCH line) takes."""
    return value is not None and shell.sbatch_value_problem(value) is None


def _left_out(part: Partition, account: str | None, user: str | None,
              groups: frozenset[str] | None) -> str | None:
    """Why a partition has no place in this user's profile, or None."""
    if partition_name_problem(part.name):
        return f"its name is not one a profile takes ({NAME_RULE})"
    if not part.nodes:
        return "it has no nodes"
    if part.state.upper() == "INACTIVE":
        return "State=INACTIVE: it takes no jobs"
    if part.root_only and user != "root":
        return "RootOnly=YES: only root submits there"
    if part.allow_groups is not None and groups is not None and user != "root" and not part.allow_groups & groups:
        return f"user {said(user)} is in none of its groups (AllowGroups={_names(part.allow_groups)})"
    if account and part.allow_accounts is not None and account not in part.allow_accounts:
        return f"account {said(account)} may not use it (AllowAccounts={_names(part.allow_accounts)})"
    if account and account in part.deny_accounts:
        return f"account {said(account)} may not use it (DenyAccounts)"
    if part.hidden:
        return "Hidden=YES: add it by hand if your jobs go there"
    return None


# A node as a profile sees it: GPU count, its one GPU type (or None), whether every GPU is
# a MIG slice (vacuously, with none), CPUs, memory for jobs. Partitions share nodes, and
# their nodes come in a few shapes: each node is read once, each partition per shape.
_Shape = tuple[int, "str | None", bool, "int | None", "int | None"]


def _shape(node: Node) -> _Shape:
    mig = all(t is not None and _MIG_TYPE.search(t) for t in node.gpus)
    return node.gpu_count, _one_type(node.gpus), mig, node.cpus, node.job_mem_mb


def _entry(part: Partition, partitions: Mapping[str, Partition],
           shapes: dict[int, _Shape]) -> tuple[dict[str, Any], bool]:
    """One partition in profile terms: what every one of its nodes gives a job; and whether
    its GPUs are MIG slices."""
    kinds = set()
    for n in part.nodes:
        shape = shapes.get(id(n))
        if shape is None:
            shape = shapes[id(n)] = _shape(n)
        kinds.add(shape)
    entry: dict[str, Any] = {"gpus_per_node": min(k[0] for k in kinds)}
    mig = bool(entry["gpus_per_node"]) and all(k[2] for k in kinds)
    if mig:
        # CUDA shows a process one MIG slice: more ranks on a node would share the first.
        entry["gpus_per_node"] = 1
    types = {k[1] for k in kinds}
    gtype = types.pop() if len(types) == 1 else None
    if gtype and _takes(gtype):
        entry["gpu_type"] = gtype
    entry["gpu_mem_gb"] = None
    # MaxCPUsPerNode, MaxMemPerNode and MaxMemPerCPU cap every node alike (Partition.job_cpus, job_mem_mb).
    cpus = [k[3] for k in kinds if k[3] is not None]
    if cpus and min(cpus) >= 1:
        entry["cpus_per_node"] = min(min(cpus), part.max_cpus_per_node or min(cpus))
    mems = [k[4] for k in kinds if k[4] is not None]
    if mems and min(mems) >= 1024:     # RealMemory=1 is slurm.conf's "not configured"
        mem_mb = min(min(mems), part.max_mem_per_node_mb or min(mems))
        if part.max_mem_per_cpu_mb and "cpus_per_node" in entry:
            # More would make Slurm raise the job's CPUs past what the profile asks for.
            mem_mb = min(mem_mb, part.max_mem_per_cpu_mb * entry["cpus_per_node"])
        entry["mem_gb"] = mem_mb // 1024
    if part.node_limit >= 1:
        entry["max_nodes"] = part.node_limit
    if part.max_time is not None and _is_time(part.max_time):
        entry["max_time"] = part.max_time
    if part.allow_qos is not None and len(part.allow_qos) == 1 and _takes(next(iter(part.allow_qos))):
        # Jobs under any other QOS (the user's default one, say) are refused there.
        entry["qos"] = next(iter(part.allow_qos))
    lower = any(o.priority_tier > part.priority_tier for o in partitions.values() if o.name != part.name)
    if part.preempt_mode.upper() not in ("OFF", "") and lower:
        entry["preemptible"] = True
    return entry, mig


_MIG_TYPE = re.compile(r"(?:^|[_-])\d+g\.\d+gb$", re.I)


def _one_type(kinds: Mapping[str | None, int]) -> str | None:
    types = [t for t, count in kinds.items() if count]
    return types[0] if len(types) == 1 else None


def _is_time(text: str) -> bool:
    try:
        slurmtime.parse(text)
    except ValueError:
        return False
    return True


def _entry_notes(part: Partition, entry: Mapping[str, Any], mig: bool) -> list[str]:
    """What to review about a partition the profile keeps."""
    notes = []
    key = f"partitions.{part.name}"
    if mig:
        notes.append(f"partition {part.name} has MIG slices: gpus_per_node is 1, as CUDA shows a process "
                     "one slice (a job's ranks on a node would all share the first)")
    qos = sorted(part.allow_qos or ())
    if len(qos) > 1 or (qos and "qos" not in entry):
        notes.append(f"partition {part.name} takes only QOS {', '.join(said(q) for q in qos)} "
                     f"(AllowQos): set {key}.qos to the one your jobs use")
    types = {t for n in part.nodes for t, count in n.gpus.items() if count and t is not None}
    if "gpu_type" not in entry and len(types) == 1 and not _takes(next(iter(types))):
        notes.append(f"partition {part.name}'s GPU type {said(next(iter(types)))} is no text a profile takes: "
                     f"set {key}.gpu_type by hand")
    return notes


def detect_profile(name: str, partitions_text: str, nodes_text: str, *, settings: Mapping[str, str] | None = None,
                   account: str | None = None, user: str | None = None,
                   groups: frozenset[str] | None = None) -> Detected:
    """The profile mapping for the cluster described by scontrol's one-line records, with
    the partitions this user cannot use (by account or group, RootOnly, Hidden, INACTIVE, no nodes)
    left out and said why."""
    partitions = parse_partitions(partitions_text, nodes_text, settings or {})
    notes, profile_parts = [], {}
    shapes: dict[int, _Shape] = {}
    for part in partitions.values():
        why = _left_out(part, account, user, groups)
        if why:
            notes.append(f"partition {said(part.name)} left out: {why}")
        else:
            profile_parts[part.name], mig = _entry(part, partitions, shapes)
            notes += _entry_notes(part, profile_parts[part.name], mig)
    if partitions and not profile_parts:
        raise SchedulerError(f"no partition of the cluster takes this user's jobs: {'; '.join(notes)}")
    kept = [partitions[p] for p in profile_parts]
    default = next((p.name for p in kept if p.default), None) \
        or next((p.name for p in kept if p.state.upper() == "UP"), None) \
        or (kept[0].name if kept else None)
    any_gpus = any(e["gpus_per_node"] for e in profile_parts.values())
    return Detected({
        "name": name,
        "extends": "base-slurm",
        "scheduler": "slurm",
        "account": account,
        # --gpus-per-node needs select/cons_tres; older selectors only honour --gres.
        "gpu_directive": "gres" if any_gpus and not takes_gpus_per_node(settings or {}) else "gpus-per-node",
        "default_partition": default,
        "partitions": profile_parts,
    }, tuple(notes))


class _Dumper(yaml.SafeDumper):
    """Quotes strings with a ':' so no YAML 1.1 reader takes "02:00:00" for a number."""


_Dumper.add_representer(str, lambda d, v: d.represent_scalar(
    "tag:yaml.org,2002:str", v, style='"' if ":" in v else None))


def render_profile(profile: Mapping[str, Any], cluster: str, notes: Iterable[str] = ()) -> str:
    stamp = dt.date.today().isoformat()
    fill = "container." if "runs_root" in profile else "container, runs_root."
    head = (f"# {profile['name']} -- detected from Slurm cluster {cluster!r} by `glaunch sites detect` on {stamp}.\n"
            "# Fill in what Slurm does not know: gpu_mem_gb (for `glaunch plan`), modules, env\n"
            f"# (NCCL/network), setup (the Python environment on the nodes), {fill}\n")
    head += "".join(f"# Review: {note}\n" for note in notes)
    return head + yaml.dump(dict(profile), Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def query_cluster(client: Client, name: str | None, *, login: Any = None) -> tuple[str, str]:
    """(profile name, profile text) for the cluster Slurm's commands reach through `client`
    (this machine's, or over SSH the one of `login`, a launcher.config.login.Login the
    profile then names)."""
    if name is not None:
        problem = site_name_problem(name)
        if problem:
            raise ConfigError(problem, key="--name")
    partitions_text, nodes_text, settings = split_scontrol(read_scontrol(client, "glaunch sites detect"))
    cluster = settings.get("ClusterName", "cluster")
    if name is None:
        # The profile's name, and its file's: a cluster's name must not write elsewhere.
        problem = site_name_problem(cluster)
        if problem:
            raise ConfigError(f"Slurm's ClusterName cannot name a profile: {problem}; give the profile a name "
                              "with --name", key="--name")
    user = current_user(client)
    account = None
    if client.has_command("sacctmgr"):
        try:
            proc = client.call("sacctmgr", "-n", "-P", "show", "user", user, "format=defaultaccount",
                               policy=ACCOUNTING_POLICY, controller=False)
        except Unreachable:
            proc = None     # no accounting answer: the skeleton leaves the account to fill in
        if proc is not None and proc.returncode == 0 and proc.stdout.strip() and _takes(proc.stdout.split()[0]):
            account = proc.stdout.split()[0]
    detected = detect_profile(name or cluster, partitions_text, nodes_text, settings=settings, account=account,
                              user=user, groups=user_groups(client, user))
    profile = dict(detected.profile)
    notes = detected.notes
    if login is not None:
        head = {key: profile.pop(key) for key in ("name", "extends", "scheduler")}
        python = login_python(client)
        if python is None:
            notes += ("the login shell has no python3 on its PATH: set python: to the nodes' interpreter (one with "
                      "torch)",)
        profile = {**head, **reached_over(login), **({"python": python} if python else {}), **profile}
    return profile["name"], render_profile(profile, cluster, notes)


# The line the login shell's answer is read from: what its profile prints around it is not.
PYTHON_MARK = "GLAUNCH-PYTHON3 "
# A login shell (-l), as a user's own session has it: its profile may load a module or
# activate an environment that puts another python3 first on PATH. The line starts on a
# line of its own, whatever the profile printed last without ending its line.
FIND_PYTHON = f'printf "\\n{PYTHON_MARK}%s\\n" "$(command -v python3)"'


def login_python(client: Client) -> str | None:
    """The interpreter the login shell where `client` runs Slurm's commands calls python3
    (the nodes' interpreter on clusters whose nodes share the login node's software), or
    None when it has none or does not say."""
    try:
        proc = client.call("bash", "-lc", FIND_PYTHON, policy=ACCOUNTING_POLICY, controller=False)
    except Unreachable:
        return None
    return read_python(proc.stdout) if proc.returncode == 0 else None


def read_python(stdout: str) -> str | None:
    """The path FIND_PYTHON printed: an absolute path of visible characters, else None."""
    found = [line[len(PYTHON_MARK):] for line in stdout.splitlines() if line.startswith(PYTHON_MARK)]
    path = found[-1] if found else ""
    if not path.startswith("/") or len(path) > 4096 or shell.hidden_characters(path) or path != path.strip():
        return None
    return path


# Where a profile detected over SSH keeps its runs on the cluster: the account's home is the
# one folder every cluster has; a platform team moves it to scratch.
REMOTE_RUNS_ROOT = "~/glaunch-runs"


def reached_over(login: Any) -> dict[str, Any]:
    """The keys of a profile detected over SSH: its login (the fields given) and runs_root."""
    fields = {key: getattr(login, key) for key in ("host", "user", "port", "identity_file", "jump")}
    return {"login": {key: value for key, value in fields.items() if value is not None},
            "runs_root": REMOTE_RUNS_ROOT}
