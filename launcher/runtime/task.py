"""The function every Slurm task runs (pickled by submitit at submit time).

The pickle holds the run directory only; the task reads the job's task spec from its
task.json (launcher.rundir.taskspec) on the node. It turns the task's place in the
allocation into the standard torch.distributed environment and runs the experiment's
entry point:

- launcher `srun`: one task per rank; the entry point runs in this process, so the
  signals Slurm sends reach the training code directly.
- launcher `torchrun`: one task per node; torchrun's agent runs in this process (so its
  workers cannot outlive it); each worker writes its own log (launch.worker_log_args),
  copied as it grows into the node's task log (launcher.runtime.workerlogs); the warning
  signal and SIGTERM (preemption) are passed on to the workers, which checkpoint, instead
  of making the agent tear them down; so is the watchdog's request for a stack
  (launcher.rundir.rankstacks.DUMP_SIGNAL). Workers that end after such a stop signal end
  the start as stopped (WorkersStopped), not with torchrun's ChildFailedError.

Before the entry point runs, a rank registers its stack dump (faulthandler) and writes its
first heartbeat (state ``starting``): the watchdog on the batch host knows every rank, its
pid and its node before the first step. On a node with GPUs, NCCL's flight recorder is
switched on (unless the site or the experiment set its variables): a collective that times
out leaves each rank's last collectives in ``logs/nccl_trace_rank_RANK``.
"""

from __future__ import annotations

import itertools
import json
import os
import runpy
import signal
import sys
from pathlib import Path
from typing import Any, Mapping

from launcher import shell
from launcher.errors import RunError
from launcher.rundir import envnames, launch, runvalues
from launcher.rundir.files import atomic_write_text, read_json, read_record
from launcher.rundir.layout import RunDir
from launcher.rundir.rankcontext import bare_signal_name, context, node_name
from launcher.rundir.rankstacks import DUMP_SIGNAL
from launcher.rundir.records import RunRecord
from launcher.rundir.taskspec import TaskSpec, read_task_spec
from launcher.runtime import heartbeats, stackdump, workerlogs
from launcher.runtime.stop import early_stop, end_as_without_handler, take_stop_signals

# The signal Slurm sends `requeue.signal_lead_s` before the time limit (see render.py).
WARNING_SIGNAL = signal.SIGUSR2
# ... and for a plain Lightning script, the one its SLURMEnvironment listens for
# (launcher.runner.frameworks).
LIGHTNING_WARNING_SIGNAL = signal.SIGUSR1


class TrainingTask:
    """What submitit pickles and every task runs: small, and nothing in it but the run
    directory, whose task.json says the rest."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = str(run_dir)

    def __repr__(self) -> str:
        return f"TrainingTask({self.run_dir!r})"

    def __call__(self) -> int:
        import submitit

        job = submitit.JobEnvironment()
        os.environ[envnames.JOB_ID] = str(job.job_id)
        try:
            spec = read_task_spec(self.run_dir)
            os.environ.setdefault(envnames.RUN_DIR, spec.run_dir)
            os.environ.setdefault(envnames.RUN_ID, spec.run_id)
            # ${run:...} in env values, for this start (under torchrun its workers inherit them).
            runvalues.fill_environment(os.environ, spec.run_env)
            for name, value in flight_recorder_environment(spec.run_dir, os.environ).items():
                os.environ.setdefault(name, value)
            if spec.launcher == "torchrun":
                return self._run_torchrun(spec, job)
            return self._run_rank(spec, job)
        except WorkersStopped:
            raise
        except BaseException as exc:
            note_crash(self.run_dir, job, exc)
            raise
        finally:
            ignore_warnings_from_now()

    # --- srun: this process is one rank ---------------------------------------------

    def _run_rank(self, spec: TaskSpec, job: Any) -> int:
        if job.num_tasks != spec.world_size:
            raise RuntimeError(f"glaunch: the allocation has {job.num_tasks} tasks, the plan expects "
                               f"{spec.world_size} ranks")
        os.environ.update(rank_environment(job.global_rank, job.local_rank, job.node,
                                           spec.world_size, spec.ranks_per_node))
        # A warning that comes before the script installs its own handler must still
        # count (not reach submitit's handler, which requeues on its own terms). Not
        # Lightning's USR1 (the warning of a plain Lightning script): its SLURMEnvironment
        # registers its save-and-requeue handler only where USR1 has none.
        take_stop_signals(early_stop_signals(context().stop_signals), early_stop)
        stackdump.arm_stack_dump(spec.run_dir, job.global_rank)
        heartbeats.starting()
        _log(f"rank {job.global_rank}/{spec.world_size} on {node_name()}: "
             f"python {shown_words(launch.entry_words(spec, start_args(spec)))}")
        return run_entry(spec)

    # --- torchrun: this process is the node's agent -----------------------------------

    def _run_torchrun(self, spec: TaskSpec, job: Any) -> int:
        # Before torch's import, which takes seconds (tens on a loaded node): a warning or a
        # preemption may come first, and submitit's handler (or the default action) would end
        # the agent as a crash.
        STOPS_RECEIVED.clear()
        UNPASSED.clear()
        for signum in (WARNING_SIGNAL, LIGHTNING_WARNING_SIGNAL, signal.SIGTERM):
            signal.signal(signum, _stop_before_workers)
        import torch
        from torch.distributed.run import get_args_parser
        from torch.distributed.run import main as torchrun_main

        # The options this node's torch knows, not the submitting machine's (see launch.py).
        accepted = launch.parser_options(get_args_parser())
        args = launch.torchrun_args(
            spec, node_rank=str(job.node), master_addr=os.environ["MASTER_ADDR"],
            master_port=os.environ["MASTER_PORT"], job_id=str(job.job_id), accepted=accepted)
        restart = context().restart
        log_dir = RunDir(spec.run_dir).worker_log_dir(str(job.job_id), restart, int(job.node))
        args += launch.worker_log_args(str(log_dir), accepted)
        if launch.spelling("--signals-to-handle", accepted) is None:
            _log(f"torch {torch.__version__}: torchrun has no --signals-to-handle; on SIGTERM (preemption) "
                 "its agent stops the workers itself, and the start ends as a failure")
        start = start_args(spec)
        os.environ.update(snapshot_environment(spec, os.environ))
        # The workers read this run's task.json (launcher.runtime.worker).
        os.environ[envnames.RUN_DIR] = spec.run_dir
        # The entry point as the user would run it; each worker runs it through WORKER_MODULE.
        _log(f"node {job.node} on {node_name()}: torchrun {shown_words(args + launch.entry_words(spec, start))}")
        entry = worker_entry(spec, start, accepted)
        if STOPS_RECEIVED:
            # Taken before the workers existed: they start with it (torchrun gives them this
            # environment), and the start ends stopped, not crashed, should they fail after it.
            os.environ[envnames.STOPPED_BEFORE_WORKERS] = bare_signal_name(WARNING_SIGNAL.name)
            _log(f"node {job.node}: {WARNING_SIGNAL.name} came before the workers started; they start with a "
                 "stop asked")
        if UNPASSED:
            _log(f"node {job.node}: {LIGHTNING_WARNING_SIGNAL.name} came before the workers started; a handler "
                 "of their script's (Lightning's) does not see it")
        for signum in (WARNING_SIGNAL, LIGHTNING_WARNING_SIGNAL, signal.SIGTERM, DUMP_SIGNAL):
            signal.signal(signum, _forward_to_children)
        _, stop_copying = workerlogs.copying(spec.run_dir, str(job.job_id), restart, int(job.node),
                                             sys.stdout.buffer, sys.stderr.buffer)
        try:
            torchrun_main(args + entry)
        except SystemExit as exc:
            code = _exit_code(exc)
            if code:
                raise stopped_workers(job.node) or RuntimeError(
                    f"glaunch: torchrun exited with status {code}") from None
        except Exception as exc:
            # torchrun's ChildFailedError, with its report of every worker's exit: after a
            # preemption or the time limit's warning, the end of a stop, not a crash.
            raise stopped_workers(job.node) or exc from None
        finally:
            stop_copying()
        return 0


def dump_task(run_dir: str | os.PathLike, path: str | os.PathLike) -> None:
    """At `path`, the pickled task submitit's loader runs: a TrainingTask of `run_dir`."""
    from submitit.core.utils import DelayedSubmission

    DelayedSubmission(TrainingTask(str(run_dir))).dump(Path(path))


def place_task(run_dir: str | os.PathLike, job_id: str) -> None:
    """The pickled task submitit's loader reads for job `job_id` (in the run's logs), written
    where it is not there yet: a job found or started without glaunch's submission having
    put it in place."""
    from submitit.core.utils import JobPaths

    path = JobPaths(RunDir(run_dir).log_dir, job_id=job_id).submitted_pickle
    if not path.exists():
        dump_task(run_dir, path)


# What each torchrun worker runs: launcher.runtime.worker, then the entry point.
WORKER_MODULE = "launcher.runtime.worker"


def worker_entry(spec: TaskSpec, args: list[str], accepted: frozenset[str]) -> list[str]:
    """torchrun's words for the workers' program: the entry point through WORKER_MODULE,
    which takes the stop signals before it runs (a script without glaunch's runtime is not
    ended by the warning this agent passes on); the worker reads the entry point from the
    run's task.json."""
    return [launch.spelling("--module", accepted) or "-m", WORKER_MODULE, *args]


def early_stop_signals(signals: tuple[str, ...]) -> tuple[str, ...]:
    """Pure: the stop signals a rank takes before its script runs: all but Lightning's own,
    and, for a plain Lightning script (whose plan has Lightning's warning signal), not
    SIGTERM either: Lightning's handler of it ends the fit gracefully (its loggers flushed,
    its callbacks told), then calls the one it found, which would end the process at once
    (stop.early_stop)."""
    lightning = bare_signal_name(LIGHTNING_WARNING_SIGNAL.name)
    names = [bare_signal_name(name) for name in signals]
    left = {lightning, "TERM"} if lightning in names else {lightning}
    return tuple(name for name, bare in zip(signals, names) if bare not in left)


def rank_environment(rank: int, local_rank: int, node: int, world_size: int, ranks_per_node: int) -> dict[str, str]:
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(ranks_per_node),
        "GROUP_RANK": str(node),
        "NODE_RANK": str(node),
    }


# NCCL's flight recorder (PyTorch 2.3+): the last collectives of each rank, written when a
# collective times out. A rank's ring of entries costs a few MB of host memory.
FLIGHT_RECORDER_ENTRIES = 2000
# The torch that named the recorder's variables TORCH_FR_* (the TORCH_NCCL_* names still
# read, with a deprecation warning on every rank).
FLIGHT_RECORDER_RENAMED = (2, 9)


def flight_recorder_environment(run_dir: str, environ: Mapping[str, str],
                                torch_version: str | None = None) -> dict[str, str]:
    """NCCL's flight recorder variables for a node with GPUs (none elsewhere), in the
    spelling of the torch this node imports (`torch_version`; default: its installed one)."""
    gpus = environ.get("SLURM_GPUS_ON_NODE") or environ.get("SLURM_JOB_GPUS") or ""
    visible = environ.get("CUDA_VISIBLE_DEVICES", "")
    if not (gpus.strip() not in ("", "0") or visible.strip() not in ("", "-1", "NoDevFiles")):
        return {}
    dump_to = os.path.join(RunDir(run_dir).log_dir, "nccl_trace_rank_")
    if version_tuple(torch_version if torch_version is not None else installed_version("torch")) \
            >= FLIGHT_RECORDER_RENAMED:
        return {"TORCH_FR_BUFFER_SIZE": str(FLIGHT_RECORDER_ENTRIES), "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                "TORCH_FR_DUMP_TEMP_FILE": dump_to}
    return {"TORCH_NCCL_TRACE_BUFFER_SIZE": str(FLIGHT_RECORDER_ENTRIES), "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": dump_to}


def installed_version(distribution: str) -> str | None:
    """The version of an installed distribution (its metadata; nothing imported), or None."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def version_tuple(version: str | None) -> tuple[int, ...]:
    """(major, minor) of `2.13.0+cpu` and the like; () for none or an unreadable one."""
    parts = []
    for piece in (version or "").split("+")[0].split(".")[:2]:
        digits = "".join(itertools.takewhile(str.isdigit, piece))
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def snapshot_environment(spec: TaskSpec, environ: Mapping[str, str]) -> dict[str, str]:
    """What torchrun's workers need to import from the code snapshot: its copy of the
    working directory on PYTHONPATH (after the glaunch the run carries, where env.sh put it
    first: a project's own `launcher` must not stand in for the workers' glaunch); for a
    module, also PYTHONSAFEPATH (Python 3.11+), without which `python -m` puts the working
    directory itself first."""
    code_path = spec.code_path
    if not code_path:
        return {}
    raw = environ.get("PYTHONPATH")
    rest = raw.split(os.pathsep) if raw else []
    carried = rest[:1] if rest[:1] == [str(RunDir(spec.run_dir).lib_dir)] else []
    out = {"PYTHONPATH": os.pathsep.join([*carried, code_path, *rest[len(carried):]])}
    if spec.module is not None:
        out["PYTHONSAFEPATH"] = "1"
    return out


def start_args(spec: TaskSpec) -> list[str]:
    """The entry point's arguments for this start: its run-scoped values filled in, and
    `resume_args` after the run's first start (launcher.rundir.runvalues)."""
    values = runvalues.start_values(os.environ)
    return runvalues.start_args(spec.args, spec.resume_args, values,
                                follows_earlier_start(spec.run_dir, os.environ))


def follows_earlier_start(run_dir: str, environ: Mapping[str, str]) -> bool:
    """Whether an earlier start of the run came before this one: a restart, requeue or
    resubmission (a start number above 0), or a `glaunch resume`, whose first start is
    number 0 of a new job, after the starts run.json already holds."""
    if environ.get(envnames.RESTART, "0") != "0":
        return True
    try:
        record = read_record(RunDir(run_dir).run_file, RunRecord.from_dict, "run record")
    except RunError:
        return False
    this_job = environ.get(envnames.JOB_ID)
    return any(start.job_id != this_job or start.restart != 0 for start in record.starts)


def run_entry(spec: TaskSpec) -> int:
    """Run the script or module as `__main__` in this process, with its own argv."""
    try:
        run_as_main(spec, start_args(spec))
    except SystemExit as exc:
        code = _exit_code(exc)
        if code:
            raise RuntimeError(f"glaunch: the entry point exited with status {code}") from None
    return 0


def run_as_main(spec: TaskSpec, args: list[str]) -> None:
    """The spec's script or module as `__main__` in this process, with `args` as its argv,
    as `python` would run it; its SystemExit passes through."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    # With a code snapshot its copy of the working directory is searched first, so no
    # module edited in the work tree after submit is imported.
    code_path = spec.code_path
    try:
        if spec.module is not None:
            sys.argv = [spec.module, *args]
            sys.path[:0] = [code_path] if code_path else [os.getcwd()]
            runpy.run_module(spec.module, run_name="__main__", alter_sys=True)
        else:
            script = str(spec.script)
            sys.argv = [script, *args]
            sys.path[:0] = [os.path.dirname(script)] + ([code_path] if code_path else [])
            runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv, sys.path = saved_argv, saved_path


def note_crash(run_dir: str, job: Any, exc: BaseException) -> None:
    """<run_dir>/crash.json: the first failure this start saw, for `glaunch status`."""
    restart = context().restart
    path = RunDir(run_dir).crash_file
    if (read_json(path) or {}).get("restart") == restart:
        return
    message = (str(exc).strip().splitlines() or [""])[0][:300]
    record = {"restart": restart, "job_id": str(job.job_id), "task": job.global_rank, "node": node_name(),
              "error": f"{type(exc).__name__}: {message}" if message else type(exc).__name__}
    try:
        atomic_write_text(path, json.dumps(record) + "\n")
    except OSError:
        pass


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


# The stop signals (the time limit's warning, SIGTERM) this node's agent passed on to its
# workers in this start, first first.
STOPS_RECEIVED: list[int] = []
UNPASSED: list[int] = []       # signals that came before the workers and that they cannot take


class WorkersStopped(SystemExit):
    """A torchrun node whose workers ended after a stop signal reached the agent: the
    task exits with 128 + that signal, as a rank the signal ended would under srun, so the
    job's end reads it with the scheduler's account (a preemption, the time limit, or a
    signal nobody asked for), and no crash.json or traceback says it crashed."""


def stopped_workers(node: int) -> WorkersStopped | None:
    """The exit for a start whose workers failed after a stop signal; None without one."""
    if not STOPS_RECEIVED:
        return None
    signum = STOPS_RECEIVED[0]
    _log(f"node {node}: the workers ended after {signal.Signals(signum).name} (a preemption, the time limit "
         "or a cancel); torchrun's report of their exit is left out")
    return WorkersStopped(128 + signum)


def ignore_warnings_from_now() -> None:
    """The time limit's warnings (glaunch's and Lightning's) ignored once the task's work is
    done: as Python shuts down it puts back the default action of every signal it handled,
    and a warning that came in that moment ended a task that had finished (a torchrun agent
    whose workers had completed: "a rank killed by SIGUSR2", a crash)."""
    for signum in (WARNING_SIGNAL, LIGHTNING_WARNING_SIGNAL):
        try:
            signal.signal(signum, signal.SIG_IGN)
        except ValueError:
            return      # not the main thread: nothing of ours holds the signal there


def _stop_before_workers(signum: int, _frame: Any) -> None:
    """The agent's handler until it starts torchrun: a warning is noted for the workers to
    come; SIGTERM (a cancel, a preemption, the time limit) ends the agent at once, as it
    would end a rank whose script has not started (runtime.stop.early_stop)."""
    if signum == signal.SIGTERM:
        end_as_without_handler(signum)
        return
    # A worker takes only the warning before its script runs (worker_stop_signals); Lightning's
    # USR1 is its script's own, which it can no longer get.
    noted = STOPS_RECEIVED if signum == WARNING_SIGNAL else UNPASSED
    if signum not in noted:
        noted.append(signum)


def _forward_to_children(signum: int, _frame: Any) -> None:
    if signum != DUMP_SIGNAL and signum not in STOPS_RECEIVED:
        STOPS_RECEIVED.append(signum)
    if signum == WARNING_SIGNAL:
        # Workers torchrun starts from now on (its rendezvous may not have started any yet)
        # start with the stop asked: it copies this environment for each.
        os.environ.setdefault(envnames.STOPPED_BEFORE_WORKERS, bare_signal_name(WARNING_SIGNAL.name))
    for pid in child_pids(os.getpid()):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def child_pids(parent: int) -> list[int]:
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # The command name may hold spaces and parentheses: split after the last ')'.
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 1 and fields[1] == str(parent):
            children.append(int(entry))
    return children


def shown_words(words: list[str]) -> str:
    """A command's words as a shell reads them back (an argument with a space, a newline or
    nothing in it stays one word, on one line); repr where no shell word carries one."""
    try:
        return shell.join(words)
    except shell.ShellTextError:
        return " ".join(repr(word) for word in words)


def _log(message: str) -> None:
    print(f"glaunch: {message}", file=sys.stderr, flush=True)
