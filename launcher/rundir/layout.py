"""The run directory: the name of every file in it, and the records kept there.

One run directory per run (DESIGN.md "The run bundle")::

    job.sbatch  env.sh  ds_config.json  resolved.yaml      written at submit
    task.json                                               what every task of the job needs (launcher.rundir.taskspec)
    hparams.json                                            the experiment's hparams (GLAUNCH_HPARAMS)
    code/  code.patch                                       the code snapshot (a sweep's elements: the sweep's)
    lib/                                                    the job side of glaunch and submitit, first on the
                                                            nodes' PYTHONPATH (launcher.runner.carried)
    run.json                                                the run record (RunRecord)
    result.json  stop.json  resume.json  crash.json         written by the ranks / the task
    hang.json                                               written by the watchdog (launcher.jobcontrol.watchdog)
    peer-recoveries.jsonl                                   one line per peer recovery (launcher.runtime.peer),
                                                            read by goodput (launcher.runner.goodput)
    peer-replace/JOB_RESTART_GEN_RANK.json                  a lost rank's process to start again (recovery.peer):
                                                            asked by a surviving rank, served by the job controller
                                                            (launcher.jobcontrol.replace)
    logs/JOB_TASK_log.out|err  logs/JOB_batch.log  logs/JOB_step.json
    logs/workers/JOB_RESTART_NODE/                          torchrun's --log-dir for one node's agent: each
                                                            worker's own output (WORKER_LOG)
    logs/JOB_gpu_NODE.csv                                   GPU utilisation and memory, sampled per node
    logs/stack-JOB_RESTART_RANK.txt                         each rank's Python stack when its start hung
    heartbeats/rank-RANK.json                               each rank's last step and when (overwritten)
    stack-dumps/rank-RANK.txt                               where a rank's faulthandler writes its stack
    telemetry/JOB_RESTART_RANK.json                         each rank's peak memory and step times, per start
    checkpoints/                                            unless checkpoint.dir points elsewhere
    checkpoints/universal/step-N/                           DeepSpeed's universal copy of step N, made when a
                                                            ZeRO checkpoint loads at another world size
    resumes/N/                                              what `glaunch resume` number N moved aside: the
                                                            previous submission's files and what its last start
                                                            left for the next (result, stop, resume, crash, heartbeats/)
    tensorboard/  wandb/                                    experiment trackers (launcher.runtime.trackers)

run.json's ``resumes`` list has one entry per `glaunch resume` (launcher.runner.resume):
``number`` (N of resumes/N/), ``at`` (when), ``overrides``, ``previous_files`` (resumes/N),
``ended`` (how the run had ended: state, reason, detail, job_id, nodes, world_size,
partition, scheduler_history), the new shape (nodes, world_size, partition) and
``first_start``: the index in ``starts`` of the resumed job's first start (its starts are
numbered from restart 0 again, after the earlier job's).

The typed run.json records live in `records` and are named here too, so both sides use
this one module: the submit side (bundle, registry, status, schedulers) and the in-job
runtime (task, jobend, watchdog, checkpoints, the local stand-in for srun). It imports the
standard library only (and `files` and `records`, which do too).
"""

from __future__ import annotations

import json
import os
import re
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from launcher.rundir.files import open_regular

RUN_FILE = "run.json"
JOB_SCRIPT = "job.sbatch"
ENV_FILE = "env.sh"
DS_CONFIG_FILE = "ds_config.json"
RESOLVED_FILE = "resolved.yaml"
HPARAMS_FILE = "hparams.json"
TASK_FILE = "task.json"           # the job's task spec (launcher.rundir.taskspec), read on the nodes
CODE_DIR = "code"                 # the code snapshot every start runs from (launcher.runner.snapshot)
CODE_PATCH = "code.patch"         # a dirty work tree's changes against its commit
LIB_DIR = "lib"                   # the packages the job imports, as the submitter has them (launcher.runner.carried)
SWEEP_FILE = "sweep.json"         # a sweep's directory: its record (launcher.runner.sweeps)
RESULT_FILE = "result.json"
# The jobs `glaunch cancel` asked to end, one id a line: appended where the run lives (on a
# cluster reached over SSH too, where run.json's lock cannot be taken), read by the job
# controller, which then ends the start as cancelled rather than requeue it.
CANCEL_FILE = "cancel-requested"
STOP_FILE = "stop.json"
RESUME_FILE = "resume.json"
CRASH_FILE = "crash.json"
HANG_FILE = "hang.json"
PEER_RECOVERY_FILE = "peer-recoveries.jsonl"
PEER_REPLACE_DIR = "peer-replace"
PEER_REPLACE_FILE = "{job_id}_{restart}_{generation}_{rank}.json"
# Written by the job controller when a lost rank's new process could not be started (srun
# refused its step): the start's end names it.
PEER_NOT_STARTED_FILE = "peer-not-started.json"
PEER_WAIT_DIR = "peer-wait"
PEER_WAIT_FILE = "{job_id}_{restart}_{rank}.json"
LOCK_FILE = ".run.lock"
# Held (flock) by a local job for as long as it runs: a run whose job lock nobody holds has
# no process left to cancel, whatever pid run.json names.
JOB_LOCK_FILE = ".job.lock"
RESUMES_DIR = "resumes"           # resumes/N/: the files `glaunch resume` number N moved aside
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
# A sweep's array task's own log, in the sweep's logs/ (its sbatch --output; %A array job,
# %a task): array.sbatch's line each time the task runs, and slurmstepd's lines about the
# task (a cancel, a requeue); the task then writes into its element's own logs.
ARRAY_TASK_LOG_PATTERN = "%A_%a.log"
STEP_SUMMARY = "{job_id}_step.json"      # the local stand-in for srun's account of a step
# A sweep's element on Slurm is a task of an array job: its job id is ARRAYJOB_TASK.
# In the local record of a run that lives on a cluster reached over SSH: where it lives.
REMOTE_FILE = "remote.json"
TASK_LOG = re.compile(r"(?P<job>\d+(?:_\d+)?)_(?P<task>\d+)_log\.(?P<stream>out|err)$")
GPU_SAMPLES = "{job_id}_gpu_{node}.csv"
# Under torchrun each node's agent writes every worker's output to files of its own
# (--log-dir, --redirects): the directory glaunch names per start and node, and inside it
# torchrun's layout (torch.distributed.elastic's DefaultLogsSpecs, torch 2.2 and later),
# RDZVID_RANDOM/attempt_N/LOCAL_RANK/stdout.log|stderr.log.
WORKER_LOG_DIR = "workers"
WORKER_LOG_DIR_NAME = "{job_id}_{restart}_{node}"
WORKER_LOG = re.compile(r"(?P<job>\d+(?:_\d+)?)_(?P<restart>\d+)_(?P<node>\d+)/[^/]+/attempt_\d+/"
                        r"(?P<local>\d+)/std(?P<stream>out|err)\.log$")
HEARTBEAT_FILE = "rank-{rank:05d}.json"
# HEARTBEAT_FILE's names only (ASCII digits, one name per rank).
HEARTBEAT = re.compile(r"rank-(?P<rank>[0-9]{5}|[1-9][0-9]{5,8})\.json$")
TELEMETRY_FILE = "{job_id}_{restart}_{rank}.json"
VERSIONS_FILE = "versions_{job_id}_{restart}_{node}.json"
STACK_FILE = "stack-{job_id}_{restart}_{rank}.txt"
STACK = re.compile(r"stack-(?P<job>[A-Za-z0-9._-]+)_(?P<restart>\d+)_(?P<rank>\d+)\.txt$")
STACK_DUMP_DIR = "stack-dumps"
STACK_DUMP_FILE = "rank-{rank:05d}.txt"
HEARTBEAT_BYTES = 1024        # a heartbeat's size in its file (more only for a record that needs it)
HEARTBEAT_READ_LIMIT = 64 * 1024
@dataclass(frozen=True)
class WorkerLog:
    """One stream of one torchrun worker's output (WORKER_LOG)."""

    job_id: str
    restart: int
    node: int
    local_rank: int
    stream: str          # out | err
    path: Path


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


def read_heartbeat(path: str | os.PathLike[str], attempts: int = 3) -> dict[str, Any] | None:
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


def array_task_log(sweep_dir: str | os.PathLike[str], array_job: str, task: str) -> Path:
    """The log of task `task` of array job `array_job` (ARRAY_TASK_LOG_PATTERN)."""
    return Path(sweep_dir) / LOG_DIR / ARRAY_TASK_LOG_PATTERN.replace("%A", array_job).replace("%a", task)


@dataclass(frozen=True)
class RunDir:
    """Every path of one run directory (as submitit's JobPaths does for a job)."""

    path: Path

    def __init__(self, path: str | os.PathLike[str]) -> None:
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
    def task_file(self) -> Path:
        return self.path / TASK_FILE

    @property
    def ds_config(self) -> Path:
        return self.path / DS_CONFIG_FILE

    @property
    def result_file(self) -> Path:
        return self.path / RESULT_FILE

    @property
    def cancel_file(self) -> Path:
        return self.path / CANCEL_FILE

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
    def hang_file(self) -> Path:
        return self.path / HANG_FILE

    @property
    def peer_recovery_file(self) -> Path:
        """The ledger of peer recoveries (``recovery.peer``): one JSON object a line."""
        return self.path / PEER_RECOVERY_FILE

    @property
    def peer_not_started_file(self) -> Path:
        """Why a lost rank's new process could not be started, in the last start that tried."""
        return self.path / PEER_NOT_STARTED_FILE

    @property
    def peer_replace_dir(self) -> Path:
        """Where the ranks ask the job controller to start a lost rank's process again."""
        return self.path / PEER_REPLACE_DIR

    def peer_replace_request(self, job_id: str, restart: int, generation: int, rank: int) -> Path:
        """The request to start rank `rank` again, to join the group's generation `generation`."""
        return self.peer_replace_dir / PEER_REPLACE_FILE.format(job_id=name_part(job_id), restart=int(restart),
                                                                 generation=int(generation), rank=int(rank))

    def peer_wait(self, job_id: str, restart: int, rank: int) -> Path:
        """Rank `rank`'s mark, while a collective of its has waited long for its peers
        (launcher.runtime.peerhold)."""
        return self.path / PEER_WAIT_DIR / PEER_WAIT_FILE.format(job_id=name_part(job_id), restart=int(restart),
                                                                 rank=int(rank))

    @property
    def log_dir(self) -> Path:
        return self.path / LOG_DIR

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / CHECKPOINT_DIR

    @property
    def lib_dir(self) -> Path:
        """What env.sh puts first on the nodes' PYTHONPATH: glaunch's job side and submitit."""
        return self.path / LIB_DIR

    def task_log(self, job_id: str, task: int, stream: str = "out") -> Path:
        return self.log_dir / TASK_LOG_PATTERN.replace("%j", str(job_id)).replace("%t", str(task)).format(
            stream=stream)

    def worker_log_dir(self, job_id: str, restart: int, node: int) -> Path:
        """torchrun's --log-dir for the agent of node `node` in one start."""
        return self.log_dir / WORKER_LOG_DIR / WORKER_LOG_DIR_NAME.format(
            job_id=name_part(job_id), restart=restart, node=node)

    def worker_logs(self) -> list[WorkerLog]:
        """Every worker's own log torchrun wrote, in job, start, node, worker, stream order."""
        root = self.log_dir / WORKER_LOG_DIR
        found = []
        for path in root.glob("*/*/attempt_*/*/std*.log"):
            m = WORKER_LOG.match(path.relative_to(root).as_posix())
            if m:
                found.append(WorkerLog(m["job"], int(m["restart"]), int(m["node"]), int(m["local"]),
                                       m["stream"], path))
        return sorted(found, key=lambda w: (tuple(int(x) for x in w.job_id.split("_")), w.restart, w.node,
                                            w.local_rank, w.stream))

    def worker_log(self, job_id: str, restart: int, node: int, local_rank: int,
                   stream: str = "out") -> Path | None:
        """One worker's own log in one start, once its agent has made it; else None."""
        root = self.worker_log_dir(job_id, restart, node)
        for path in sorted(root.glob(f"*/attempt_*/{local_rank}/std{stream}.log")):
            return path
        return None

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

    def stack_file(self, job_id: str, restart: int, rank: int) -> Path:
        """Rank `rank`'s Python stack, written when its start hung (launcher.jobcontrol.watchdog)."""
        return self.log_dir / STACK_FILE.format(job_id=name_part(job_id), restart=restart, rank=rank)

    def stack_files(self, job_id: str, restart: int) -> list[Path]:
        """The stacks written when one start hung, in rank order."""
        try:
            names = os.listdir(self.log_dir)
        except OSError:
            return []
        found = [(int(m["rank"]), self.log_dir / n) for n in names if (m := STACK.match(n))
                 and m["job"] == name_part(job_id) and int(m["restart"]) == restart]
        return [path for _, path in sorted(found)]

    def stack_dump(self, rank: int) -> Path:
        """Where rank `rank`'s faulthandler writes its stack when asked (opened at its start)."""
        return self.path / STACK_DUMP_DIR / STACK_DUMP_FILE.format(rank=rank)

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
        return self._numbered_telemetry(f"{name_part(job_id)}_{restart}_")

    def _numbered_telemetry(self, prefix: str) -> list[Path]:
        """The files of telemetry/ named PREFIX + a number + .json."""
        try:
            names = os.listdir(self.telemetry_dir)
        except OSError:
            return []
        return sorted(self.telemetry_dir / n for n in names
                      if n.startswith(prefix) and n.endswith(".json") and n[len(prefix):-5].isdigit())

    def versions(self, job_id: str, restart: int, node: int) -> Path:
        """What node `node` (its index in the start) imported (launcher.runtime.versions)."""
        return self.telemetry_dir / VERSIONS_FILE.format(job_id=name_part(job_id), restart=restart, node=node)

    def versions_files(self, job_id: str, restart: int) -> list[Path]:
        """Every node's versions of one start."""
        return self._numbered_telemetry(f"versions_{name_part(job_id)}_{restart}_")

    @property
    def resumes_dir(self) -> Path:
        return self.path / RESUMES_DIR

    def previous_files(self, number: int) -> Path:
        """resumes/N/: the previous submission's files, moved aside by resume `number`."""
        return self.resumes_dir / str(number)

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
