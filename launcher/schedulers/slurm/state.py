"""Slurm's answers, read: sacct and squeue output parsed, a run's state and starts merged
from them, and sbatch's refusals said in the profile's terms. Pure: text in, values out,
so each decision is tested on recorded output (tests/schedulers/test_slurm_state.py)."""

from __future__ import annotations

import re
from typing import Any, Mapping

from launcher.rundir.records import IN_FLIGHT, LIVE, TERMINAL, RunRecord, State, StartRecord

SACCT_FORMAT = ("JobID", "State", "ExitCode", "Start", "End", "Elapsed", "NodeList", "Reason")
_SACCT_KEYS = ("job_id", "state", "exit_code", "start", "end", "elapsed", "nodes", "reason")

# What a start's scheduler state says about why it ended.
SACCT_REASONS = {"TIMEOUT": "timeout", "PREEMPTED": "preemption", "NODE_FAIL": "node failure",
                 "FAILED": "crash", "OUT_OF_MEMORY": "crash", "CANCELLED": "cancelled"}


def parse_sacct(text: str) -> list[dict[str, str]]:
    """`sacct -n -P -o <SACCT_FORMAT>` -> one dict per row (one per start with -D)."""
    rows = []
    for line in text.strip().splitlines():
        fields = line.split("|")
        if len(fields) >= len(_SACCT_KEYS):
            rows.append(dict(zip(_SACCT_KEYS, fields)))
    return rows


def parse_squeue(text: str) -> str | None:
    """`squeue -h -o %T` (or SQUEUE_FORMAT, `%T|%r`) for one job -> its state, or None when
    squeue no longer lists it."""
    lines = text.strip().splitlines()
    return lines[0].split("|", 1)[0].strip() if lines else None


def squeue_error(stderr: str) -> str | None:
    """squeue's failure (stderr of a nonzero exit) -> None when it says the job is gone
    ("Invalid job id specified": squeue forgets a job MinJobAge after its end), else the
    error in a few words: the controller answered, but not about the job (munge down, no
    permission), so nothing is known of the job's state."""
    lines = [line.strip().removeprefix("squeue: error: ") for line in (stderr or "").splitlines()]
    lines = list(dict.fromkeys(line for line in lines if line and "--num-threads" not in line))
    if not lines or any("invalid job id" in line.lower() for line in lines):
        return None
    # The first line names the cause (munge, permissions), the last what failed.
    text = "; ".join(dict.fromkeys((lines[0], lines[-1])))
    return text if len(text) <= 400 else text[:397] + "..."


def parse_squeue_reason(text: str) -> str | None:
    """`squeue -h -o %T|%r` for one job -> why it is pending (Slurm's Reason), or None."""
    lines = text.strip().splitlines()
    if not lines or "|" not in lines[0]:
        return None
    reason = lines[0].split("|", 1)[1].strip()
    return None if reason in ("", "None", "(null)") else reason


SQUEUE_FORMAT = "%T|%r"
# What squeue says of a job's origin: its batch script, then its comment (glaunch's marker).
ORIGIN_FORMAT = "%o|%k"


def foreign_job(origin: str, run_id: str, run_dir: str) -> str | None:
    """Pure: why the job whose origin squeue gives as `origin` (ORIGIN_FORMAT's one line)
    is not run `run_id`'s (kept in `run_dir`, as the job sees it), or None where it is: its
    comment is the run's marker; or its batch script lies in the run's directory (a job its
    controller queued again at a time limit, one a user queued from a dry run's bundle,
    submitit's script where the profile sets a comment of its own); or, for a sweep's
    element (its directory inside the sweep's), the sweep's array's marker or script.
    The two fields are matched from each end, never split: a path or comment may hold "|"."""
    line = origin.strip("\n").splitlines()[0] if origin.strip() else ""
    own_dir = run_dir.rstrip("/") + "/"
    if line.endswith(f"|glaunch:{run_id}") or line.startswith(own_dir):
        return None
    sweep_dir, _, element = run_dir.rstrip("/").rpartition("/")
    sweep_id = sweep_dir.rpartition("/")[2]
    if sweep_id and element.startswith(f"{sweep_id}-") and (
            re.search(rf"\|glaunch:{re.escape(sweep_id)}:array-[0-9]+$", line)
            or re.match(rf"{re.escape(sweep_dir)}/array-[0-9]+\.sbatch\|", line)):
        return None
    said = "".join(c if c.isprintable() else "?" for c in line)[:300]
    return f"Slurm's record of it is not the run's (batch script and comment: {said!r})"

# Held states whose job never starts until someone releases it, in words.
HELD = {
    "RESV_DEL_HOLD": "the reservation it asked for was deleted and Slurm holds it (an administrator's "
                     "`scontrol release` lets it start)",
    "SPECIAL_EXIT": "it exited with a code in the cluster's RequeueExitHold and Slurm requeued it held "
                    "(`scontrol release {job_id}` lets it start)",
}


# --- pending reasons that never clear by themselves ------------------------------------------

# Slurm 22.05's Reason codes of a job that will not start until someone changes the job,
# the limits or the nodes, each in the profile's terms. The others (Priority, Resources,
# BeginTime, Dependency, JobHeldUser, the group and per-user limits ...) clear as the
# queue moves. {fields} come from the job's request (request_values).
NEVER_STARTS = {
    "PartitionTimeLimit": "resources.time {time} is over the time limit of partition {partition} on the cluster "
                          "(the profile's partitions.{partition}.max_time: {max_time})",
    "PartitionNodeLimit": "resources.nodes {nodes} is outside the node limits of partition {partition} on the "
                          "cluster, or more than it has (the profile's partitions.{partition}.max_nodes: "
                          "{max_nodes})",
    "PartitionDown": "partition {partition} is DOWN on the cluster: it starts no job until an administrator "
                     "sets it UP",
    "PartitionInactive": "partition {partition} is INACTIVE on the cluster: it starts no job",
    "PartitionConfig": "the request (resources.nodes {nodes}, resources.time {time}) is outside what partition "
                       "{partition} allows on the cluster (the profile's partitions.{partition}.max_nodes: "
                       "{max_nodes}, max_time: {max_time})",
    "InvalidAccount": "account {account} is not valid for this user on the cluster (the site's account)",
    "InvalidQOS": "QOS {qos} is not valid for this user and account on the cluster (the site's qos, "
                  "partitions.{partition}.qos)",
    "AccountNotAllowed": "account {account} may not use partition {partition} on the cluster (the site's account)",
    "QOSNotAllowed": "QOS {qos} may not be used on partition {partition} (the site's qos, "
                     "partitions.{partition}.qos)",
    "BadConstraints": "no node of partition {partition} has the features asked (partitions.{partition}.constraint: "
                      "{constraint})",
    "DependencyNeverSatisfied": "the run it waits for ended in a way its dependency excludes (--after)",
    "NodeDown": "a node the job needs is down",
    "ReservationDeleted": "the reservation the job asked for was deleted",
    "JobHeldAdmin": "an administrator holds it (scontrol release, by an administrator, lets it start)",
    "JobHoldMaxRequeue": "Slurm held it after too many requeues (scontrol release lets it start)",
    # `scontrol requeuehold`, or an exit code the cluster's RequeueExitHold names: held until released.
    "job_requeued_in_held_state": "it was requeued held (scontrol requeuehold, or the cluster's RequeueExitHold): "
                                  "scontrol release lets it start",
    "AssociationTimeLimit": "resources.time {time} is over the time limit of the association of account "
                            "{account}",
    "QOSTimeLimit": "resources.time {time} is over the time limit of QOS {qos}",
}
# Per-job limits of a QOS (QOSMax...PerJob..., QOSMin...) or an association (AssocMax...):
# what the request asks too much (or too little) of.
_PER_JOB = re.compile(r"^(?P<who>QOS|Assoc)(?P<kind>Max|Min)(?P<what>[A-Za-z]+?)"
                      r"(?P<per>PerJob|PerNode|MinutesPerJob|NotSatisfied)?(?:Limit)?$")
_PER_JOB_KEYS = {"Wall": "resources.time {time}", "WallDuration": "resources.time {time}",
                 "Node": "resources.nodes {nodes}", "Nodes": "resources.nodes {nodes}",
                 "GRES": "resources.gpus_per_node {gpus_per_node} x resources.nodes {nodes}",
                 "Cpu": "resources.cpus_per_task", "Mem": "resources.mem_gb", "Memory": "resources.mem_gb"}


def pending_verdict(reason: str | None, values: Mapping[str, Any]) -> str | None:
    """A pending job's Reason -> why it will never start, in the profile's terms; None when
    the reason clears by itself (Priority, Resources, BeginTime, Dependency, JobHeldUser,
    group and per-user limits, ...)."""
    if not reason:
        return None
    values = _Defaulted(values)
    code, _, detail = reason.partition(",")
    code = code.strip()
    if code == "ReqNodeNotAvail":
        nodes = re.search(r"UnavailableNodes:(\S+)", detail)
        if nodes is None:        # e.g. "Reserved for maintenance": ends with the reservation
            return None
        return (f"node(s) {nodes.group(1)} it needs are down, drained or reserved, and partition "
                f"{values['partition']} has not enough others (Reason={reason}); an administrator must "
                "return them")
    if code in NEVER_STARTS:
        return f"{NEVER_STARTS[code].format_map(values)} (Reason={code})"
    m = _PER_JOB.match(code)
    if m and (m["per"] in ("PerJob", "PerNode", "MinutesPerJob") or m["kind"] == "Min"):
        owner = f"QOS {values['qos']}" if m["who"] == "QOS" else f"the association of account {values['account']}"
        what = m["what"].removesuffix("Duration")
        if m["per"] == "PerNode" and what == "GRES":
            key = "resources.gpus_per_node {gpus_per_node}"
        else:
            key = _PER_JOB_KEYS.get(what, "the request")
        if m["per"] == "MinutesPerJob":
            key += " x resources.time {time}"
        scope = "per-node" if m["per"] == "PerNode" else "per-job"
        side = "over a {scope} maximum" if m["kind"] == "Max" else "under a {scope} minimum"
        return f"{key.format_map(values)} is {side.format(scope=scope)} of {owner} on the cluster (Reason={code})"
    return None


class _Defaulted(dict[str, Any]):
    def __init__(self, values: Mapping[str, Any]) -> None:
        super().__init__({k: v for k, v in values.items() if v is not None})

    def __missing__(self, key: str) -> str:
        return "(not set)" if key in ("max_time", "max_nodes", "constraint", "qos", "account") else "?"


def base_state(state: str) -> str:
    """sacct writes "CANCELLED by 0": the state is the first word."""
    return state.split()[0] if state.strip() else state


def current_state(recorded: str | None, live: str | None, history: list[dict[str, str]] | None) -> str:
    """The run's state now: the job's own terminal record, else squeue, else sacct."""
    if recorded in TERMINAL and recorded != State.RENDERED:
        return str(recorded)
    if live in LIVE:
        return str(live)
    if history:
        return base_state(history[-1]["state"])
    if live:
        return live
    return State.UNKNOWN.value if recorded is None or recorded in IN_FLIGHT else recorded


# How long squeue may not list a job whose last start accounting still shows queued or
# running: slurmdbd records an end within seconds, so past this the controller has lost
# the job (a runaway job in accounting), and the run's state is UNKNOWN, not RUNNING.
UNLISTED_GRACE_S = 300.0


def unlisted_verdict(job_id: str, history: list[dict[str, str]] | None, unlisted_s: float | None) -> str | None:
    """squeue no longer lists the job (for `unlisted_s` seconds; None while it does):
    why its state is UNKNOWN, or None while accounting may still tell (it says how the
    job ended, or lags for less than UNLISTED_GRACE_S)."""
    if unlisted_s is None:
        return None
    if history is None:
        return (f"Slurm no longer lists job {job_id} (squeue), the job left no record of its end, and this "
                "cluster has no accounting (sacct) to tell how it ended")
    if not history:
        # Neither knows the job: so it goes where these commands reach another cluster.
        return (f"Slurm no longer lists job {job_id} (squeue), the job left no record of its end, and accounting "
                "(sacct) has no record of it: it is lost, or these Slurm commands reach another cluster than the "
                "one the run was submitted to (SLURM_CONF)")
    last = base_state(history[-1]["state"])
    if last in LIVE and unlisted_s >= UNLISTED_GRACE_S:
        return (f"Slurm no longer lists job {job_id} (squeue, for {unlisted_s:.0f} s), yet accounting (sacct) still "
                f"shows it {last}: the controller lost it (`sacctmgr show runawayjobs` lists such jobs)")
    return None


# sacct's states of a start (one row) that has not ended yet: a job's live states, but for
# REQUEUED, which in `sacct -D` is a start that ended in a requeue.
ROW_LIVE = LIVE - {"REQUEUED"}


def merge_history(record: RunRecord, history: list[dict[str, str]]) -> None:
    """sacct lists one row per start (with -D): fill in what the starts' own records lack.
    The job's record of a start (launcher.jobcontrol.jobend) wins over sacct's."""
    # A resumed run holds the starts of earlier jobs too: a start is its job's id and restart.
    for index, row in enumerate(history):
        restart = record.allocation_start(row["job_id"], index)
        first = record.start(row["job_id"], restart)
        if first is None:
            first = StartRecord(job_id=row["job_id"], restart=restart)
            record.starts.append(first)
        if not first.get("started") and row["start"] not in ("", "Unknown", "None"):
            first.set("started", row["start"])
        # The allocation's row ends with its last start: the steps before it that the job
        # restarted in the allocation recorded their own ends (RESTARTED).
        entry = first
        while entry.state == State.RESTARTED.value:
            following = record.start(row["job_id"], entry.restart + 1)
            if following is None:
                break
            entry = following
        state = base_state(row["state"])
        # Asked before sacct fills in `ended`: did the job itself record how this start ended?
        unrecorded = entry.state in (None, State.PENDING, State.RUNNING) or entry.ended is None
        for key, value in (("started", row["start"]), ("ended", row["end"]), ("nodes", row["nodes"])):
            if not entry.get(key) and value not in ("", "Unknown", "None", "None assigned"):
                entry.set(key, value)
        if unrecorded:
            entry.state = state
            if entry.reason is None:
                entry.reason = SACCT_REASONS.get(state)
            by = re.fullmatch(r"CANCELLED by (\d+)", row["state"].strip())
            if by and entry.detail is None:     # who: uid 0 is root, an administrator or Slurm itself
                root = " (root: an administrator or Slurm)" if by[1] == "0" else ""
                entry.detail = f"cancelled by uid {by[1]}{root}"
        # How accounting says the start ended; not a live state, which a later read may
        # never replace (a job that records its own ends is not asked about again).
        if state in ROW_LIVE:
            entry.extra.pop("scheduler_state", None)
        else:
            entry.set("scheduler_state", state)
    jobs: dict[str, int] = {}
    for start in record.starts:
        jobs.setdefault(start.job_id, len(jobs))
    record.starts.sort(key=lambda s: (jobs[s.job_id], s.restart))     # jobs in the order they came


# sbatch's refusals (Slurm 22.05 wording, matched loosely) in the profile's terms.
PREFLIGHT_HINTS = (
    (r"invalid partition", "partition {partition!r} does not exist on this cluster (resources.partition / "
                           "the site's default_partition)"),
    (r"invalid generic resource|invalid gres|gres.*invalid",
     "the cluster refused the GPU request ({gpus} per node as --{directive}): check the site's "
     "gpu_directive and partitions.{partition}.gpus_per_node"),
    # Before "time limit": this refusal's wording ends in "time limits" but names no partition.
    (r"accounting/qos policy|qos(?:max|min)\w*limit|assoc\w*limit",
     "the job breaks a limit of QOS {qos!r} or of account {account!r}'s association on the cluster: too many "
     "jobs queued or running, or its size or time over a per-user or per-job limit (`sacctmgr show qos`, "
     "`sacctmgr show assoc` name the limits; the site's account and qos)"),
    (r"time limit", "time {time} is over the limit of partition {partition!r} on the cluster (resources.time, "
                    "partitions.{partition}.max_time)"),
    (r"invalid account", "account {account!r} is not valid here, or not on partition {partition!r} "
                         "(the site's account)"),
    (r"invalid qos", "QOS {qos!r} is not valid here (the site's qos, partitions.{partition}.qos)"),
    (r"node count specification invalid|node count|more processors requested than permitted",
     "partition {partition!r} cannot give {nodes} node(s) of {tasks} task(s) x {cpus} CPU(s) "
     "(resources.nodes, partitions.{partition}.max_nodes, cpus_per_node)"),
    (r"requested node configuration is not available",
     "no node of partition {partition!r} has what one node of this job asks: {gpus} GPU(s), {tasks} task(s) "
     "x {cpus} CPU(s), memory {mem} (resources.gpus_per_node, cpus_per_task, mem_gb; "
     "partitions.{partition}.gpus_per_node, cpus_per_node, mem_gb)"),
)


def preflight_message(raw: str, values: Mapping[str, Any]) -> str:
    """sbatch --test-only's refusal `raw` -> what to tell the user, in profile terms."""
    for pattern, message in PREFLIGHT_HINTS:
        if re.search(pattern, raw, re.IGNORECASE):
            return f"preflight: {message.format(**values)}\n  sbatch said: {raw}"
    return f"preflight: sbatch --test-only refused the job\n  sbatch said: {raw}"
