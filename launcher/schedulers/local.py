"""The local scheduler: run job.sbatch with bash on this machine, follow it to its end,
and requeue on a time limit or a stop request as Slurm would (one node only).

Ctrl-C (SIGINT to the process running the loop) asks the ranks to stop as a preemption
would: SIGINT to the job's process group, where bash waits for its command and localrun
turns it into the ranks' stop signal; the loop waits for their checkpoint and the start's
record, records the run CANCELLED with the step it stopped at, and returns
INTERRUPTED_STATUS. A second Ctrl-C kills the job and every process it started."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from launcher.errors import ConfigError, RunError
from launcher import shell
from launcher.rendering.render import JobShell, submitit_command, task_log_patterns
from launcher.resolution.jobplan import JobPlan
from launcher.rundir import envnames
from launcher.rundir.files import lock_held, open_regular, read_json
from launcher.rundir.lifecycle import move
from launcher.rundir.records import IN_FLIGHT, RunRecord, State
from launcher.rundir.layout import RunDir
from launcher.schedulers.base import Echo, Launched, RunConsole, Scheduler, console_of

# The registry, the runtime and the task spec are imported where a run starts or is
# cancelled: rendering (a dry run) needs none of them.

POLL_S = 0.2
# What the local scheduler returns for a run the user interrupted (the shell's 128 + SIGINT).
INTERRUPTED_STATUS = 130


class LocalScheduler(Scheduler):
    name = "local"
    runs_to_completion = True

    def check(self, plan: JobPlan) -> None:
        if plan.allocation.nodes != 1:
            raise ConfigError(f"site {plan.site_name!r} runs on this machine: one node only",
                              file=plan.experiment_file, key="resources.nodes")
        if plan.allocation.spare_nodes:
            raise ConfigError(f"site {plan.site_name!r} runs on this machine: no spare nodes",
                              file=plan.experiment_file, key="resources.spare_nodes")

    def job_shell(self, plan: JobPlan) -> JobShell:
        out, err = task_log_patterns(plan)
        words = [*plan.launch.python, "-u", "-m", "launcher.localrun.jobstep",
                 f"--ntasks={plan.allocation.tasks_per_node}", f"--time-limit={plan.allocation.time_seconds}",
                 f"--signal={plan.recovery.warning_signal}@{plan.recovery.signal_lead_s}",
                 f"--output={out}", f"--error={err}", "--"]
        return JobShell(
            directives=("# scheduler: local -- run with bash on this machine by `glaunch submit`",),
            launch=shell.join(words) + " " + submitit_command(plan),
            launch_template="local.launch.sh.j2", launch_context={},
            rendezvous_template="local.rendezvous.sh.j2", rendezvous_context={},
            submitit_executor="local", node_rank="0", job_id=f"${envnames.JOB_ID}")

    def launch(self, plan: JobPlan, run_dir: Path, *, check: bool, echo: Echo | None) -> Launched:
        from launcher.rundir import registry

        status = run(plan, echo=echo)
        record = registry.read(run_dir)
        return Launched(record.job_id, record.state, status)

    def cancel(self, run_dir: Path, record: RunRecord) -> str:
        """Signal the job's process group, only once the recorded pid is proven to be this
        run's live job; otherwise signal nothing."""
        pid, why_not = _job_process(run_dir, record)
        if pid is None:
            return f"run {record.run_id}: nothing to cancel ({why_not})"
        asked = record.extra.get(CANCEL_KEY)
        if isinstance(asked, dict) and asked.get("job_id") == record.job_id:
            kill_job(pid)       # a second cancel: the ranks are not waited for again
            return f"run {record.run_id}: killed job {record.job_id} (a cancel was already asked)"
        from launcher.rundir import registry

        with registry.updating(run_dir) as rec:
            # The mark is written before the signal: the loop running the job reads it when
            # the job ends, which a job stopping at once may do before a mark written after
            # the signal. The ranks stop and save first: the run ends CANCELLED when the job
            # has gone, recorded by that loop or, without one, by the next command reading
            # the record (`refresh`). Until then it is in flight, and cancel applies again.
            rec.extra[CANCEL_KEY] = {"at": registry.now(), "job_id": record.job_id}
        try:
            os.killpg(pid, signal.SIGTERM)
        except OSError as exc:
            with registry.updating(run_dir) as rec:
                if rec.job_id == record.job_id:
                    rec.extra.pop(CANCEL_KEY, None)
            if isinstance(exc, ProcessLookupError):
                return f"run {record.run_id}: nothing to cancel (job {record.job_id} has just ended)"
            raise RunError(f"run {record.run_id}: cannot signal job {record.job_id} (process group {pid}): "
                           f"{exc.strerror or exc}") from None
        return f"run {record.run_id}: cancelled job {record.job_id} (its ranks stop and save first)"

    def job_still_there(self, run_dir: Path, record: RunRecord) -> str | None:
        if job_lock_held(RunDir(run_dir)):
            job = f"job {record.job_id}" if record.job_id else "job"
            return f"its {job} is still ending (its ranks may be saving a checkpoint)"
        return None

    def refresh(self, run_dir: Path, record: RunRecord) -> RunRecord:
        """A record in flight whose job has gone (nobody holds its job lock: `glaunch
        submit` and the job were killed, or the job ended with nobody left to record it)
        is brought to its end: COMPLETED when the run left its result, CANCELLED when a
        cancel was asked, else FAILED (lost)."""
        if record.state not in IN_FLIGHT or job_lock_held(RunDir(run_dir)):
            return record
        from launcher.rundir import registry

        with registry.updating(run_dir) as rec:
            if rec.state in IN_FLIGHT and not job_lock_held(RunDir(run_dir)) and not _submitting_now(run_dir, rec):
                settle_lost(RunDir(run_dir), rec)
        return rec


# A local submission goes from SUBMITTING to its job (holding the job lock) in well under a
# second; a record SUBMITTING this long, with the lock free, was left by a killed submit.
SUBMIT_GRACE_S = 30.0
# run.json: a cancel asked while the job ran (when, and of which job).
CANCEL_KEY = "cancel_requested"


def _submitting_now(run_dir: Path, record: RunRecord) -> bool:
    if record.state != State.SUBMITTING:
        return False
    try:
        written = RunDir(run_dir).run_file.stat().st_mtime
    except OSError:
        return False
    return time.time() - written < SUBMIT_GRACE_S


def settle_lost(run_dir: RunDir, record: RunRecord) -> None:
    """The end of a run whose job is gone without recording it: its last start and the run."""
    from launcher.rundir.startsummary import iso

    cancelled = CANCEL_KEY in record.extra
    if run_dir.result_file.exists():
        state, reason, detail = State.COMPLETED.value, None, None
    elif cancelled:
        state, reason, detail = State.CANCELLED.value, "cancelled", None
    else:
        job = f"job {record.job_id}" if record.job_id else "its job"
        state, reason = State.FAILED.value, "lost"
        detail = (f"{job} is gone and nothing recorded its end (the glaunch process running it was killed); "
                  "its last checkpoint is kept: glaunch resume continues from it")
    last = record.starts[-1] if record.starts else None
    if last is not None and last.job_id == record.job_id and not last.ended:
        last.update(state=state, reason=reason, ended=iso(time.time()), detail=detail)
    move(record, state, reason=reason, detail=detail, why="the job has gone")
    record.extra.pop(CANCEL_KEY, None)


def _job_process(run_dir: Path, record: RunRecord) -> tuple[int | None, str]:
    """(pid, "") when the process run.json names is this run's live job, else (None, why
    not): the run is in flight, its job lock is held, and the pid leads its own process
    group and started when the job did (a pid reused by another process has another start
    time)."""
    if record.state not in IN_FLIGHT or not record.starts:
        return None, str(record.state)
    start = record.starts[-1]
    pid, started = start.get("pid"), start.get("pid_start")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1:
        return None, f"no process recorded for job {record.job_id}"
    if isinstance(started, bool) or not isinstance(started, int):
        return None, f"process {pid} cannot be proven to be job {record.job_id}: no start time recorded"
    if not job_lock_held(RunDir(run_dir)):
        return None, f"job {record.job_id} is no longer running"
    if process_start_time(pid) != started:
        return None, f"process {pid} is no longer job {record.job_id}"
    try:
        if os.getpgid(pid) != pid:
            return None, f"process {pid} does not lead its process group"
    except OSError:
        return None, f"job {record.job_id} is no longer running"
    return pid, ""


def process_start_time(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/PID/stat field 22); None
    when there is no such process (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        # The command name (field 2) is in parentheses and may hold spaces or ')'.
        fields = stat[stat.rindex(b")") + 2:].split()
        return int(fields[22 - 3])
    except (OSError, ValueError, IndexError):
        return None


def job_lock_held(run_dir: RunDir) -> bool:
    """Whether some process (the local job, or the loop running it) holds the run's job lock."""
    return lock_held(run_dir.job_lock)


def hold_job_lock(run_dir: RunDir) -> int:
    """The run's job lock, taken: a descriptor that each start's job inherits, so the lock
    stays held while the job runs, even if this process is gone."""
    try:
        fd = open_regular(run_dir.job_lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW)
    except OSError as exc:
        raise RunError(f"cannot create the job lock: {exc.strerror or exc}", file=str(run_dir.job_lock)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise RunError("another process is running this run's job", file=str(run_dir.job_lock)) from None
    return fd


def next_job_id() -> str:
    from launcher.rundir import registry

    fd = registry.state_file("local_job_counter")
    with os.fdopen(fd, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read(32).strip()
        value = int(text) + 1 if text.isdigit() else 1000
        f.seek(0)
        f.truncate()
        f.write(str(value))
    return str(value)


def dump_task(plan: JobPlan, job_id: str) -> None:
    """The start's pickled task: it reads the run's task.json (written with the bundle)."""
    from submitit.core.utils import DelayedSubmission, JobPaths

    from launcher.runtime.task import TrainingTask

    paths = JobPaths(plan.log_dir, job_id=job_id)
    DelayedSubmission(TrainingTask(plan.run_dir)).dump(paths.submitted_pickle)


def start(plan: JobPlan, job_id: str, restart: int, job_lock: int) -> subprocess.Popen:
    env = {**os.environ, envnames.JOB_ID: job_id, envnames.RESTART: str(restart)}
    env.pop("MASTER_PORT", None)
    run_dir = RunDir(plan.run_dir)
    with open(run_dir.batch_log(job_id), "ab") as batch_log:
        return subprocess.Popen(["bash", str(run_dir.job_script)], cwd=plan.workdir, env=env,
                                stdin=subprocess.DEVNULL, stdout=batch_log, stderr=subprocess.STDOUT,
                                start_new_session=True, pass_fds=(job_lock,))


def run(plan: JobPlan, *, echo: Echo | None = None) -> int:
    """Run the job to its end, requeueing on time limit or stop request like Slurm would,
    reported to the console `echo` makes (none without it). Returns 0 (completed), 1
    (failed, cancelled, out of requeues) or INTERRUPTED_STATUS (Ctrl-C)."""
    run_dir = RunDir(plan.run_dir)
    console = console_of(echo, run_dir.path)
    job_lock = hold_job_lock(run_dir)
    interrupts = Interrupts()
    try:
        return _run(plan, run_dir, job_lock, console, interrupts)
    finally:
        interrupts.restore()
        os.close(job_lock)


class Interrupts:
    """Counts SIGINT while the loop runs (in the main thread only: elsewhere Python
    delivers no signal), instead of a KeyboardInterrupt at any line of the loop."""

    def __init__(self) -> None:
        self.count = 0
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, _signum: int, _frame) -> None:
        self.count += 1

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            self.previous = None


def kill_job(pid: int) -> None:
    """SIGKILL the job's process group and the group of every process under it (localrun
    starts each task in a session of its own)."""
    from launcher.runtime.task import child_pids

    groups, todo, seen = {pid}, [pid], set()
    while todo:
        parent = todo.pop()
        for child in child_pids(parent):
            if child not in seen:
                seen.add(child)
                todo.append(child)
                try:
                    groups.add(os.getpgid(child))
                except OSError:
                    pass
    own = os.getpgrp()
    for group in groups:
        if group > 1 and group != own:
            try:
                os.killpg(group, signal.SIGKILL)
            except OSError:
                pass


def _run(plan: JobPlan, run_dir: RunDir, job_lock: int, console: RunConsole, interrupts: Interrupts) -> int:
    from launcher.jobcontrol import end_of_local_start
    from launcher.rundir import registry
    from launcher.rundir.rankcontext import node_name
    from launcher.rundir.startsummary import iso

    restart = 0
    # Crashes count from this submission's first start (each start is a job of its own here).
    first_start = len(registry.read(run_dir.path).starts)
    while True:
        if interrupts.count:          # between two starts: start nothing more
            with registry.updating(run_dir.path) as record:
                move(record, State.CANCELLED.value, reason="cancelled",
                     detail=f"interrupted (Ctrl-C) before start {restart}")
            console.finish(record)
            return INTERRUPTED_STATUS
        job_id = next_job_id()
        dump_task(plan, job_id)
        with registry.updating(run_dir.path) as record:
            move(record, State.RUNNING.value, reason=None, detail=None)
            record.job_id = job_id
            record.starts.append(registry.new_start(job_id, restart, started=iso(time.time()),
                                                    state=State.RUNNING.value, nodes=node_name()))
        proc = start(plan, job_id, restart, job_lock)
        with registry.updating(run_dir.path) as record:
            # The pid and its start time: `cancel` signals only a process that has both.
            record.starts[-1].update(pid=proc.pid, pid_start=process_start_time(proc.pid))
        console.observe(record)
        interrupted = killed = False
        while proc.poll() is None:
            if interrupts.count and not interrupted:
                interrupted = True
                console.event("interrupted: the ranks stop and save a checkpoint (Ctrl-C again kills them)")
                try:
                    os.killpg(proc.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
            if interrupts.count > 1 and not killed:
                killed = True
                console.event("killing the job")
                kill_job(proc.pid)
            console.pump()
            time.sleep(POLL_S)
        status = proc.returncode
        ended = registry.read(run_dir.path)
        end = end_of_local_start(run_dir, ended, job_id=job_id, restart=restart, status=status,
                                 summary=read_json(run_dir.step_summary(job_id)) or {},
                                 requeue_max=plan.recovery.requeue_max, crash_retries=plan.recovery.crash_retries,
                                 first_start=first_start, interrupted=interrupted, cancelled=CANCEL_KEY in ended.extra)
        outcome = end.outcome
        with registry.updating(run_dir.path) as record:
            record.record_start(job_id, restart, ended=iso(time.time()), exit_code=status, state=outcome.state,
                                reason=outcome.reason, detail=outcome.detail, **end.fields)
            move(record, outcome.state, reason=outcome.reason, detail=outcome.detail)
            record.extra.pop(CANCEL_KEY, None)
        if not outcome.requeue:
            console.finish(record)
            if interrupted:
                return INTERRUPTED_STATUS
            return 0 if outcome.state == State.COMPLETED else 1
        console.observe(record)
        restart += 1
