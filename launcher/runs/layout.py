"""The run directory: the name of every file in it, and the records kept there.

One run directory per run (DESIGN.md "The run bundle")::

    job.sbatch  env.sh  ds_config.json  resolved.yaml      written at submit
    hparams.json                                            the experiment's hparams (GLAUNCH_HPARAMS)
    code/  code.patch                                       the code snapshot (a sweep's elements: the sweep's)
    run.json                                                the run record (RunRecord)
    result.json  stop.json  resume.json  crash.json         written by the ranks / the task
    logs/JOB_TASK_log.out|err  logs/JOB_batch.log  logs/JOB_step.json
    logs/JOB_gpu_NODE.csv                                   GPU utilisation and memory, sampled per node
    heartbeats/rank-RANK.json                               each rank's last step and when (overwritten)
    telemetry/JOB_RESTART_RANK.json                         each rank's peak memory and step times, per start
    checkpoints/                                            unless checkpoint.dir points elsewhere
    tensorboard/  wandb/                                    experiment trackers (launcher.runtime.trackers)

Both sides use this module: the submit side (bundle, registry, status, schedulers) and
the in-job runtime (task, jobend, checkpoints, the local stand-in for srun). It imports
the standard library only (and `files`, which does too).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import re
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .files import json_type, open_regular

RUN_FILE = "run.json"
JOB_SCRIPT = "job.sbatch"
ENV_FILE = "env.sh"
DS_CONFIG_FILE = "ds_config.json"
RESOLVED_FILE = "resolved.yaml"
HPARAMS_FILE = "hparams.json"
CODE_DIR = "code"                 # the code snapshot every start runs from (launcher.runs.snapshot)
CODE_PATCH = "code.patch"         # a dirty work tree's changes against its commit
SWEEP_FILE = "sweep.json"         # a sweep's directory: its record (launcher.runs.sweeps)
RESULT_FILE = "result.json"
STOP_FILE = "stop.json"
RESUME_FILE = "resume.json"
CRASH_FILE = "crash.json"
LOCK_FILE = ".run.lock"
# Held (flock) by a local job for as long as it runs: a run whose job lock nobody holds has
# no process left to cancel, whatever pid run.json names.
JOB_LOCK_FILE = ".job.lock"
LOG_DIR = "logs"
CHECKPOINT_DIR = "checkpoints"
HEARTBEAT_DIR = "heartbeats"
TELEMETRY_DIR = "telemetry"
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
# Where a script run by hand, outside any launcher, keeps its run files.
STANDALONE_RUN_DIR = "glaunch-run"

# A task's log, as srun's --output/--error patterns name it (%j job id, %t task id).
TASK_LOG_PATTERN = "%j_%t_log.{stream}"
BATCH_LOG_PATTERN = "%j_batch.log"
STEP_SUMMARY = "{job_id}_step.json"      # the local stand-in for srun's account of a step
# A sweep's element on Slurm is a task of an array job: its job id is ARRAYJOB_TASK.
TASK_LOG = re.compile(r"(?P<job>\d+(?:_\d+)?)_(?P<task>\d+)_log\.(?P<stream>out|err)$")
GPU_SAMPLES = "{job_id}_gpu_{node}.csv"
HEARTBEAT_FILE = "rank-{rank:05d}.json"
HEARTBEAT = re.compile(r"rank-(?P<rank>\d+)\.json$")
TELEMETRY_FILE = "{job_id}_{restart}_{rank}.json"
HEARTBEAT_BYTES = 1024        # a heartbeat's size in its file (more only for a record that needs it)
HEARTBEAT_READ_LIMIT = 64 * 1024
# What goes into a file name from a job id or a node name: a job id of Slurm's shape passes as is.
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def name_part(value: object) -> str:
    """`value` made safe as part of a file name (a node or a job id from the environment)."""
    return _NAME_UNSAFE.sub("_", str(value))[:100] or "_"


def heartbeat_bytes(record: Mapping[str, Any], size: int = 0) -> bytes:
    """A heartbeat as its rank writes it, over the previous one in place (no new file, no
    rename: no metadata operation on a shared filesystem, and no flush that ext4 forces
    on a rename over a file): the JSON on one line, its CRC-32 on the next, spaces to a
    fixed size (at least `size`, the file's). A read that raced the write fails the CRC."""
    payload = json.dumps(dict(record), separators=(",", ":"))      # ASCII: one byte a character
    text = f"{payload}\n{zlib.crc32(payload.encode()):08x}\n".encode()
    size = max(size, HEARTBEAT_BYTES)
    while size < len(text):
        size *= 2
    return text.ljust(size, b" ")


def read_heartbeat(path: str | os.PathLike, attempts: int = 3) -> dict[str, Any] | None:
    """A heartbeat file's record; None when it is missing, damaged, or still torn after
    `attempts` reads (each a few milliseconds apart)."""
    for attempt in range(attempts):
        try:
            fd = open_regular(path)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            data = f.read(HEARTBEAT_READ_LIMIT)
        payload, _, rest = data.partition(b"\n")
        if rest[:8] == f"{zlib.crc32(payload):08x}".encode():
            try:
                record = json.loads(payload)
            except (ValueError, RecursionError):
                return None
            return record if isinstance(record, dict) else None
        if attempt + 1 < attempts:
            time.sleep(0.005)
    return None


@dataclass(frozen=True)
class RunDir:
    """Every path of one run directory (as submitit's JobPaths does for a job)."""

    path: Path

    def __init__(self, path: str | os.PathLike) -> None:
        object.__setattr__(self, "path", Path(path))

    @property
    def run_file(self) -> Path:
        return self.path / RUN_FILE

    @property
    def lock_file(self) -> Path:
        return self.path / LOCK_FILE

    @property
    def job_lock(self) -> Path:
        return self.path / JOB_LOCK_FILE

    @property
    def job_script(self) -> Path:
        return self.path / JOB_SCRIPT

    @property
    def env_file(self) -> Path:
        return self.path / ENV_FILE

    @property
    def ds_config(self) -> Path:
        return self.path / DS_CONFIG_FILE

    @property
    def result_file(self) -> Path:
        return self.path / RESULT_FILE

    @property
    def stop_file(self) -> Path:
        return self.path / STOP_FILE

    @property
    def resume_file(self) -> Path:
        return self.path / RESUME_FILE

    @property
    def crash_file(self) -> Path:
        return self.path / CRASH_FILE

    @property
    def log_dir(self) -> Path:
        return self.path / LOG_DIR

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / CHECKPOINT_DIR

    def task_log(self, job_id: str, task: int, stream: str = "out") -> Path:
        return self.log_dir / TASK_LOG_PATTERN.replace("%j", str(job_id)).replace("%t", str(task)).format(
            stream=stream)

    def task_log_pattern(self, stream: str) -> str:
        """srun's --output/--error for every task of every start."""
        return os.path.join(self.log_dir, TASK_LOG_PATTERN.format(stream=stream))

    def batch_log(self, job_id: str) -> Path:
        return self.log_dir / BATCH_LOG_PATTERN.replace("%j", str(job_id))

    def batch_log_pattern(self) -> str:
        return os.path.join(self.log_dir, BATCH_LOG_PATTERN)

    def step_summary(self, job_id: str) -> Path:
        """What the local stand-in for srun says about a step it ran."""
        return self.log_dir / STEP_SUMMARY.format(job_id=job_id)

    def gpu_samples(self, job_id: str, node: str) -> Path:
        """GPU utilisation and memory of one node, sampled through a start (CSV)."""
        return self.log_dir / GPU_SAMPLES.format(job_id=name_part(job_id), node=name_part(node))

    @property
    def heartbeat_dir(self) -> Path:
        return self.path / HEARTBEAT_DIR

    def heartbeat(self, rank: int) -> Path:
        """Rank `rank`'s last step and when it reached it (launcher.runtime.heartbeats)."""
        return self.heartbeat_dir / HEARTBEAT_FILE.format(rank=rank)

    def heartbeats(self) -> list[tuple[int, Path]]:
        """(rank, path) of every heartbeat file, in rank order."""
        try:
            names = os.listdir(self.heartbeat_dir)
        except OSError:
            return []
        found = [(int(m["rank"]), self.heartbeat_dir / name) for name in names if (m := HEARTBEAT.match(name))]
        return sorted(found)

    @property
    def telemetry_dir(self) -> Path:
        return self.path / TELEMETRY_DIR

    def telemetry(self, job_id: str, restart: int, rank: int) -> Path:
        """What rank `rank` measured in one start (launcher.runtime.telemetry)."""
        return self.telemetry_dir / TELEMETRY_FILE.format(job_id=name_part(job_id), restart=restart, rank=rank)

    def telemetry_files(self, job_id: str, restart: int) -> list[Path]:
        """Every rank's telemetry of one start."""
        prefix = f"{name_part(job_id)}_{restart}_"
        try:
            names = os.listdir(self.telemetry_dir)
        except OSError:
            return []
        return sorted(self.telemetry_dir / n for n in names
                      if n.startswith(prefix) and n.endswith(".json") and n[len(prefix):-5].isdigit())

    @property
    def tensorboard_dir(self) -> Path:
        return self.path / TENSORBOARD_DIR

    @property
    def wandb_dir(self) -> Path:
        return self.path / WANDB_DIR

    def task_logs(self, task: int | None = None) -> list[tuple[str, int, str, Path]]:
        """(job id, task, stream, path) of every task log, in job then task order."""
        found = []
        for path in self.log_dir.glob("*_log.*"):
            m = TASK_LOG.match(path.name)
            if m and (task is None or int(m["task"]) == task):
                found.append((m["job"], int(m["task"]), m["stream"], path))
        return sorted(found, key=lambda f: (tuple(int(x) for x in f[0].split("_")), f[1], f[2]))


class State(str, enum.Enum):
    """A run's or a start's state. Slurm's job states keep Slurm's names."""

    RENDERED = "RENDERED"          # a dry run: never submitted
    SUBMITTING = "SUBMITTING"
    REFUSED = "REFUSED"            # the scheduler would not take it
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    REQUEUED = "REQUEUED"
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
# squeue's states of a job that is still queued or running (Slurm's names).
LIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
                  "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"})
# States a run record holds while its job may still be queued or running.
IN_FLIGHT = frozenset({State.SUBMITTING, State.PENDING, State.RUNNING, State.REQUEUED})


def is_terminal(state: str | None) -> bool:
    return state in TERMINAL


# --- reading records --------------------------------------------------------------------
# run.json is read back by every command and by the job itself; it may have been edited by
# hand or damaged. Every field is checked here, so no reader meets a value of the wrong
# shape, and a job id reaches a Slurm command only if it has Slurm's shape.

# Slurm's job id: a number, or an array element's NUMBER_INDEX.
JOB_ID = re.compile(r"[0-9]{1,12}(?:_[0-9]{1,12})?")
# A state's name: glaunch's (State) or one Slurm reports that State does not list.
STATE_NAME = re.compile(r"[A-Z][A-Z_]{0,31}")
RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,255}")


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


_START_FIELDS = {
    "job_id": job_id_of, "restart": _required_count, "submitted": _text, "started": _text, "ended": _text,
    "state": _state, "reason": _text, "detail": _text, "exit_code": _integer, "resumed_from": _integer,
    "stopped_at": _integer,
}
# Values a start takes from files the ranks write (stop.json, resume.json) or from the
# job's exit: whatever those hold, a record keeps only what it can read back.
_OBSERVED = frozenset({"exit_code", "resumed_from", "stopped_at"})


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


def _object(value: Any) -> Any:
    if value is not None and not isinstance(value, Mapping):
        raise RecordError(None, f"a JSON {json_type(value)}, not an object")
    return value


# What a start records of what its ranks measured (launcher.runtime.telemetry.start_summary).
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
}
_RUN_FIELDS = {
    "run_id": _run_id, "name": _text, "site": _text, "scheduler": _text, "run_dir": _text,
    "experiment_file": _text, "created": _text, "dry_run": _flag, "nodes": _count, "world_size": _count,
    "partition": _text, "requeue_max": _required_count, "crash_retries": _required_count, "state": _state,
    "job_id": _optional_job_id, "reason": _text, "detail": _text,
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
    """One start of a job: the first submission, then one per requeue."""

    job_id: str
    restart: int
    submitted: str | None = None
    started: str | None = None
    ended: str | None = None
    state: str = State.PENDING.value
    reason: str | None = None       # timeout | preemption | node failure | crash | cancelled
    detail: str | None = None
    exit_code: int | None = None
    resumed_from: int | None = None  # the checkpoint step this start loaded
    stopped_at: int | None = None    # the step it saved when told to stop
    # nodes, pid, scheduler_state, ...; and what the ranks measured (TELEMETRY_FIELDS)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StartRecord:
        """RecordError when a field does not have its type (or job_id Slurm's shape)."""
        known, extra = _known(cls, _checked(data, _START_FIELDS, ("job_id",)))
        known.setdefault("restart", 0)
        return cls(**known, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
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
                value = None
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
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            out[f.name] = [s.to_dict() for s in value] if f.name == "starts" else value
        out["state"] = str(self.state) if self.state is not None else None
        out.update(self.extra)
        return out

    def start(self, job_id: str, restart: int) -> StartRecord | None:
        return next((s for s in self.starts if s.restart == restart and s.job_id == str(job_id)), None)

    def start_of(self, restart: int) -> StartRecord | None:
        return next((s for s in self.starts if s.restart == restart), None)

    def record_start(self, job_id: str, restart: int, **values: Any) -> StartRecord:
        """The entry of `restart` of job `job_id`, created if nobody has made it yet: a start
        after a requeue was never submitted as such, it went back to the queue."""
        entry = self.start(job_id, restart)
        if entry is None:
            entry = StartRecord(job_id=str(job_id), restart=restart)
            self.starts.append(entry)
        entry.update(**values)
        return entry

    def crash_count(self, *, before: int | None = None) -> int:
        """Starts that ended in a crash (before restart `before`, when given)."""
        return sum(1 for s in self.starts if s.reason == "crash" and (before is None or s.restart < before))
