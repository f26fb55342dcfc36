"""run.json's typed records: a run (RunRecord) and each start of its job (StartRecord),
the State names they hold, and the checks every field passes when read back.

run.json is read back by every command and by the job itself; it may have been edited by
hand or damaged. Every field is checked here, so no reader meets a value of the wrong
shape, and a job id reaches a Slurm command only if it has Slurm's shape. Imports the
standard library only (and `files`, which does too): the in-job runtime uses it.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from launcher.rundir.files import json_type


class State(str, enum.Enum):
    """A run's or a start's state. Slurm's job states keep Slurm's names."""

    RENDERED = "RENDERED"          # a dry run: never submitted
    SUBMITTING = "SUBMITTING"
    REFUSED = "REFUSED"            # the scheduler would not take it
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    REQUEUED = "REQUEUED"
    RESTARTED = "RESTARTED"        # a start's end only: a new job step followed in the same allocation
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    PREEMPTED = "PREEMPTED"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    UNKNOWN = "UNKNOWN"            # the scheduler no longer knows the job, and it left no record

    def __str__(self) -> str:
        return self.value


# After these the run will not start again.
TERMINAL = frozenset({State.COMPLETED, State.FAILED, State.CANCELLED, State.TIMEOUT, State.PREEMPTED,
                      State.OUT_OF_MEMORY, State.NODE_FAIL, State.BOOT_FAIL, State.DEADLINE, State.REFUSED,
                      State.RENDERED})
# squeue's states of a job that is still queued or running (Slurm's names). SPECIAL_EXIT is
# a job Slurm requeued held after an exit code in the cluster's RequeueExitHold: not ended.
LIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
                  "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD",
                  "SPECIAL_EXIT"})
# States a run record holds while its job may still be queued or running.
IN_FLIGHT = frozenset({State.SUBMITTING, State.PENDING, State.RUNNING, State.REQUEUED})


def is_terminal(state: str | None) -> bool:
    return state in TERMINAL


_NAMED = frozenset(state.value for state in State)


def is_known_state(state: str | None) -> bool:
    """Whether `state` is one of glaunch's or one Slurm reports of a job still queued or
    running (run.json may hold either). Another name, of the right shape, was written by
    hand: nothing can say whether such a run has ended."""
    return state in _NAMED or state in LIVE


# Slurm's job id: a number, or an array element's NUMBER_INDEX.
JOB_ID = re.compile(r"[0-9]{1,12}(?:_[0-9]{1,12})?")
# A state's name: glaunch's (State) or one Slurm reports that State does not list.
STATE_NAME = re.compile(r"[A-Z][A-Z_]{0,31}")
RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,255}")
# A node's name as Slurm's NodeName takes it (no host list: one node).
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# Ends of a start that point at something wrong with it, and count against crash_retries.
FAILURES = frozenset({"crash", "hang"})
# The reason of a start the watchdog stopped to swap a slow node for a spare (watchdog.slow_node:
# exclude): a graceful stop, not a failure (crash_retries does not count it).
SLOW_NODE = "slow node"
# The reason of a start someone's `scontrol requeue` took back (a user, an administrator, the
# script's framework), which Slurm tells apart from a preemption only in slurmstepd's line.
REQUEUED_BY_HAND = "requeued"
# The reason of a start whose ranks stopped on a SIGTERM that neither its time limit, a
# preemption, a requeue nor a cancel explains (an administrator's `scancel --signal=TERM`, a
# node's shutdown, a stray one): the run goes on as after a time limit, but is not said to
# have met one.
TERMINATED = "terminated"
# Why the watchdog did not watch a start (its run.json entry's `why`): no rank of it reported
# through glaunch's runtime. What such a script resumed from is its own affair.
NOT_WATCHED = "no rank uses glaunch's runtime"
# Ends of a start after which its job starts again: requeued, or restarted in its allocation.
GOES_ON = frozenset({State.REQUEUED.value, State.RESTARTED.value})
# run.json `extra` key: the job `glaunch cancel` was asked to cancel (a job resubmitting the
# run at its time limit then cancels its successor rather than hand the run on).
CANCEL_REQUESTED = "cancel_requested"
# A start's key: the job a resubmitted job's first start follows (its predecessor's id).
RESUBMITTED_AFTER = "resubmitted_after"


class RecordError(ValueError):
    """A record glaunch did not write that way: `key` (dotted, with list indexes) and what
    is wrong with it."""

    def __init__(self, key: str | None, problem: str) -> None:
        super().__init__(f"{key}: {problem}" if key else problem)
        self.key, self.problem = key, problem

    def within(self, prefix: str) -> RecordError:
        return RecordError(f"{prefix}.{self.key}" if self.key else prefix, self.problem)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def is_job_id(value: Any) -> bool:
    return isinstance(value, str) and JOB_ID.fullmatch(value) is not None


def job_id_of(value: Any) -> str:
    """`value` as a job id of Slurm's shape (a number, or NUMBER_INDEX), else RecordError."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        value = str(value)
    if not is_job_id(value):
        raise RecordError(None, f"not a Slurm job id: {_show(value)}")
    return value


def _text(value: Any) -> Any:
    if value is not None and not isinstance(value, str):
        raise RecordError(None, f"not text: {_show(value)}")
    return value


def _integer(value: Any) -> Any:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise RecordError(None, f"not an integer: {_show(value)}")
    return value


def _count(value: Any) -> Any:
    if _integer(value) is not None and value < 0:
        raise RecordError(None, f"negative: {value}")
    return value


def _required_count(value: Any) -> Any:
    if value is None:
        raise RecordError(None, "missing")
    return _count(value)


def _flag(value: Any) -> Any:
    if not isinstance(value, bool):
        raise RecordError(None, f"not true or false: {_show(value)}")
    return value


def _state(value: Any) -> Any:
    if value is not None and not (isinstance(value, str) and STATE_NAME.fullmatch(value)):
        raise RecordError(None, f"not a state: {_show(value)}")
    return value


def _run_id(value: Any) -> Any:
    if not (isinstance(value, str) and RUN_ID.fullmatch(value)):
        raise RecordError(None, f"not a run id: {_show(value)}")
    return value


def _optional_job_id(value: Any) -> Any:
    return None if value is None else job_id_of(value)


def _object(value: Any) -> Any:
    if value is not None and not isinstance(value, Mapping):
        raise RecordError(None, f"a JSON {json_type(value)}, not an object")
    return value


def is_node_name(value: Any) -> bool:
    return isinstance(value, str) and NODE_NAME.fullmatch(value) is not None


def node_list(text: str) -> list[str]:
    """Comma-separated node names as a batch script passes them; anything else is dropped."""
    return [n for n in text.split(",") if is_node_name(n)]


def free_spares(allocation: Iterable[str], in_use: Iterable[str], left_out: Iterable[str]) -> list[str]:
    """Pure: the allocation's nodes in no step and left out by no restart, in its order: the
    spares a restart in the allocation (or the watchdog's swap of a slow node) may take."""
    off = set(in_use) | set(left_out)
    return [n for n in allocation if n not in off]


def _node(value: Any) -> Any:
    if value is not None and not is_node_name(value):
        raise RecordError(None, f"not a node name: {_show(value)}")
    return value


def _nodes(value: Any) -> Any:
    """A list of node names (an empty list for none)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise RecordError(None, f"a JSON {json_type(value)}, not a list")
    for index, name in enumerate(value):
        if not is_node_name(name):
            raise RecordError(None, f"item {index}: not a node name: {_show(name)}")
    return list(value)


_START_FIELDS = {
    "job_id": job_id_of, "restart": _required_count, "submitted": _text, "started": _text, "ended": _text,
    "state": _state, "reason": _text, "detail": _text, "exit_code": _integer, "resumed_from": _integer,
    "stopped_at": _integer, "hang": _object, "bad_node": _node, "exclusion": _text,
    "excluded_nodes": _nodes, "spare_nodes": _count, "left_out": _node,
}
# Values a start takes from files the ranks or the watchdog write (stop.json, resume.json,
# crash.json, hang.json) or from the job's exit: whatever those hold, a record keeps only
# what it can read back.
_OBSERVED = frozenset({"exit_code", "resumed_from", "stopped_at", "hang", "bad_node", "exclusion",
                       "excluded_nodes", "spare_nodes", "left_out"})
# Kept out of run.json while empty: most starts neither hang, exclude a node nor hold spares.
_SPARSE = frozenset({"hang", "bad_node", "exclusion", "excluded_nodes", "spare_nodes", "left_out"})


def _amount(value: Any) -> Any:
    """A finite number of 0 or more (seconds, GB)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise RecordError(None, f"not a finite number of 0 or more: {_show(value)}")
    return value


def _amounts(value: Any) -> Any:
    """A mapping of names to amounts ({"median": 0.41, "p90": 0.52})."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise RecordError(None, f"a JSON {json_type(value)}, not an object")
    return {str(k): _amount(v) for k, v in value.items()}


# What a start records of what its ranks measured (launcher.rundir.startsummary.start_summary).
# Checked when set, like _OBSERVED: a value of the wrong shape is recorded as null. Readers
# (goodput, status) still check what they use: run.json may have been edited by hand.
TELEMETRY_FIELDS: dict[str, Any] = {
    "peak_memory_gb": _amount,        # the largest peak of any rank (GPU when there is one, else host RSS)
    "memory": _object,                # {"kind": "cuda" | "host_rss", "ranks": [{"rank", "node", "peak_gb", ...}]}
    "step_time_s": _amounts,          # {"median", "p90"} over the ranks' step times
    "save_s": _amounts,               # checkpoint saves seen from the loop: {"median", "max", "count"}
    "first_step": _count, "last_step": _count, "steps_timed": _count,
    "first_step_at": _text, "last_step_at": _text,          # ISO 8601, milliseconds
    "resume_at": _text, "resume_load_s": _amount,
    "stop_requested_at": _text, "stop_saved_at": _text, "stop_checkpoint": _text,
    "versions": _object,              # node -> {"python", "torch", "cuda", "nccl", ...}: what its ranks imported
}
_RUN_FIELDS = {
    "run_id": _run_id, "name": _text, "site": _text, "scheduler": _text, "transport": _text, "run_dir": _text,
    "experiment_file": _text, "created": _text, "dry_run": _flag, "nodes": _count, "world_size": _count,
    "partition": _text, "requeue_max": _required_count, "crash_retries": _required_count, "state": _state,
    "job_id": _optional_job_id, "reason": _text, "detail": _text, "excluded_nodes": _nodes,
}


def _checked(data: Any, checks: Mapping[str, Any], required: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise RecordError(None, f"a JSON {json_type(data)}, not an object")
    for key in required:
        if key not in data:
            raise RecordError(key, "missing")
    out = dict(data)
    for key, check in checks.items():
        if key in out:
            try:
                out[key] = check(out[key])
            except RecordError as exc:
                raise RecordError(key, exc.problem) from None
    return out


def _known(cls: type, data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
    return ({k: v for k, v in data.items() if k in names},
            {k: v for k, v in data.items() if k not in names})


@dataclass
class StartRecord:
    """One start of a job: the first submission, then one per requeue and one per job step
    started again in the same allocation (state RESTARTED: the same job id, a new step)."""

    job_id: str
    restart: int
    submitted: str | None = None
    started: str | None = None
    ended: str | None = None
    state: str = State.PENDING.value
    reason: str | None = None       # timeout | preemption | node failure | crash | hang | cancelled
    detail: str | None = None
    exit_code: int | None = None
    resumed_from: int | None = None  # the checkpoint step this start loaded
    stopped_at: int | None = None    # the step it saved when told to stop
    # What the watchdog found (launcher.jobcontrol.watchdog): {"kind", "detected_at", "bound_s",
    # "silent": [{"rank", "node", "step", "last_step_at"}], "stacks": [paths], "node"}
    hang: dict[str, Any] | None = None
    bad_node: str | None = None      # the node this start's crash or hang points at
    exclusion: str | None = None     # what became of bad_node: excluded from later starts, or why not
    excluded_nodes: list[str] = field(default_factory=list)   # the nodes this start was kept off
    spare_nodes: int | None = None   # nodes of the allocation this start's step left idle
    left_out: str | None = None      # RESTARTED: bad_node, left out of the allocation's next step
    # nodes, pid, scheduler_state, ...; and what the ranks measured (TELEMETRY_FIELDS)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StartRecord:
        """RecordError when a field does not have its type (or job_id Slurm's shape)."""
        known, extra = _known(cls, _checked(data, _START_FIELDS, ("job_id",)))
        known.setdefault("restart", 0)
        return cls(**known, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "extra" and not (f.name in _SPARSE and not getattr(self, f.name))}
        out["state"] = str(self.state) if self.state is not None else None
        out.update(self.extra)
        return out

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.extra:
            return self.extra[key]
        return getattr(self, key, default) if key != "extra" else default

    def set(self, key: str, value: Any) -> None:
        if key in _OBSERVED or key in TELEMETRY_FIELDS:
            try:
                value = (_START_FIELDS.get(key) or TELEMETRY_FIELDS[key])(value)
            except RecordError:
                value = [] if key == "excluded_nodes" else None
        if key != "extra" and key in {f.name for f in dataclasses.fields(self)}:
            setattr(self, key, value)
        else:
            self.extra[key] = value

    def update(self, **values: Any) -> None:
        for key, value in values.items():
            self.set(key, value)


@dataclass
class RunRecord:
    """run.json: the run, and every start of its job."""

    run_id: str
    name: str | None = None
    site: str | None = None
    scheduler: str | None = None
    transport: str | None = None      # how its commands reach the scheduler (Transport.name)
    run_dir: str | None = None
    experiment_file: str | None = None
    created: str | None = None
    dry_run: bool = False
    nodes: int | None = None
    world_size: int | None = None
    partition: str | None = None
    requeue_max: int = 0
    crash_retries: int = 0
    state: str = State.SUBMITTING.value
    job_id: str | None = None
    starts: list[StartRecord] = field(default_factory=list)
    reason: str | None = None
    detail: str | None = None
    # Nodes every later start of the job is kept off (requeue.exclude_bad_nodes).
    excluded_nodes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)   # accounting, scheduler_history, ...

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunRecord:
        """RecordError naming the first field that is missing, of the wrong type, or (job
        ids) not of Slurm's shape."""
        known, extra = _known(cls, _checked(data, _RUN_FIELDS, ("run_id",)))
        starts = known.pop("starts", None)
        if starts is None:
            starts = []
        if not isinstance(starts, list):
            raise RecordError("starts", f"a JSON {json_type(starts)}, not a list")
        records = []
        for index, start in enumerate(starts):
            try:
                records.append(StartRecord.from_dict(start))
            except RecordError as exc:
                raise exc.within(f"starts[{index}]") from None
        return cls(**known, starts=records, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or (f.name == "excluded_nodes" and not value):
                continue
            out[f.name] = [s.to_dict() for s in value] if f.name == "starts" else value
        out["state"] = str(self.state) if self.state is not None else None
        out.update(self.extra)
        return out

    def start(self, job_id: str, restart: int) -> StartRecord | None:
        return next((s for s in self.starts if s.restart == restart and s.job_id == str(job_id)), None)

    def record_start(self, job_id: str, restart: int, **values: Any) -> StartRecord:
        """The entry of `restart` of job `job_id`, created if nobody has made it yet: a start
        after a requeue was never submitted as such, it went back to the queue."""
        entry = self.start(job_id, restart)
        if entry is None:
            entry = StartRecord(job_id=str(job_id), restart=restart)
            self.starts.append(entry)
        entry.update(**values)
        return entry

    def requeues_before(self, job_id: str, restart: int) -> int:
        """Starts of job `job_id`, and of the jobs it was resubmitted after, before `restart`
        that ended in a requeue or a resubmission (requeue.max counts these; a job step
        started again in the same allocation is no requeue)."""
        jobs = self.resubmission_chain(str(job_id))
        return sum(1 for s in self.starts if s.job_id in jobs and s.restart < restart
                   and s.state == State.REQUEUED.value)

    def resubmission_chain(self, job_id: str) -> set[str]:
        """Job `job_id` and every job before it that handed the run on by resubmission."""
        chain: set[str] = set()
        job: str | None = str(job_id)
        while job is not None and job not in chain:
            chain.add(job)
            before = next((s.get(RESUBMITTED_AFTER) for s in self.starts
                           if s.job_id == job and s.get(RESUBMITTED_AFTER)), None)
            job = str(before) if before is not None else None
        return chain

    def next_restart(self, job_id: str, requeues: int) -> int:
        """The number of the start a batch script of job `job_id` begins, Slurm having requeued
        the job `requeues` times: past every start of the job already ended (steps restarted in
        the allocation took numbers of their own)."""
        return max([self.first_restart(job_id) + requeues]
                   + [s.restart + 1 for s in self.starts if s.job_id == str(job_id) and s.ended])

    def allocation_start(self, job_id: str, index: int) -> int:
        """The number of the first start in allocation `index` of job `job_id` (sacct's row
        `index`): each start the job recorded RESTARTED kept its allocation for the next."""
        first = self.first_restart(job_id) + index
        for restarted in sorted(s.restart for s in self.starts
                                if s.job_id == str(job_id) and s.state == State.RESTARTED.value):
            if restarted >= first:
                break
            first += 1
        return first

    def left_out_in_allocation(self, job_id: str, restart: int) -> list[str]:
        """The nodes the restarts since this allocation began left out (job `job_id`'s
        starts just before `restart` that ended RESTARTED)."""
        nodes = []
        for start in sorted((s for s in self.starts if s.job_id == str(job_id) and s.restart < restart),
                            key=lambda s: -s.restart):
            if start.state != State.RESTARTED.value:
                break
            if start.left_out:
                nodes.append(start.left_out)
        return nodes

    def first_restart(self, job_id: str | None) -> int:
        """The restart number of job `job_id`'s first start: 0, or for a job resubmitted after
        the time limit (its start marked RESUBMITTED_AFTER) one more than its predecessor's:
        its starts go on counting."""
        return next((s.restart for s in self.starts if s.job_id == str(job_id) and s.get(RESUBMITTED_AFTER)), 0)

    def crash_count(self, *, job_id: str | None = None, before: int | None = None) -> int:
        """Starts that ended in a crash or a hang (of job `job_id` and the jobs it was
        resubmitted after, and before restart `before`, when given: a resumed run's new job
        gets the whole crash_retries budget again)."""
        jobs = None if job_id is None else self.resubmission_chain(str(job_id))
        return sum(1 for s in self.starts if s.reason in FAILURES and (jobs is None or s.job_id in jobs)
                   and (before is None or s.restart < before))
