"""Slurm's answers, read: sacct and squeue output parsed, a run's state and starts merged
from them, and sbatch's refusals said in the profile's terms. Pure: text in, values out,
so each decision is tested on recorded output (tests/test_slurm_state.py)."""

from __future__ import annotations

import re
from typing import Any, Mapping

from ..runs.layout import IN_FLIGHT, LIVE, TERMINAL, RunRecord, State, StartRecord

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
    """`squeue -h -o %T` for one job -> its state, or None when squeue no longer lists it."""
    lines = text.strip().splitlines()
    return lines[0].strip() if lines else None


def base_state(state: str) -> str:
    """sacct writes "CANCELLED by 0": the state is the first word."""
    return state.split()[0] if state.strip() else state


def current_state(recorded: str | None, live: str | None, history: list[dict] | None) -> str:
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


def merge_history(record: RunRecord, history: list[dict]) -> None:
    """sacct lists one row per start (with -D): fill in what the starts' own records lack.
    The job's record of a start (launcher.runtime.jobend) wins over sacct's."""
    for restart, row in enumerate(history):
        entry = record.start_of(restart)
        if entry is None:
            entry = StartRecord(job_id=row["job_id"], restart=restart)
            record.starts.append(entry)
        state = base_state(row["state"])
        for key, value in (("started", row["start"]), ("ended", row["end"]), ("nodes", row["nodes"])):
            if not entry.get(key) and value not in ("", "Unknown", "None"):
                entry.set(key, value)
        if entry.state in (None, State.PENDING, State.RUNNING) or entry.ended is None:
            entry.state = state
            if entry.reason is None:
                entry.reason = SACCT_REASONS.get(state)
        entry.set("scheduler_state", state)
    record.starts.sort(key=lambda s: s.restart)


# sbatch's refusals (Slurm 22.05 wording, matched loosely) in the profile's terms.
PREFLIGHT_HINTS = (
    (r"invalid partition", "partition {partition!r} does not exist on this cluster (resources.partition / "
                           "the site's default_partition)"),
    (r"invalid generic resource|invalid gres|gres.*invalid",
     "the cluster refused the GPU request ({gpus} per node as --{directive}): check the site's "
     "gpu_directive and partitions.{partition}.gpus_per_node"),
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
