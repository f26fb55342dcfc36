"""Lost ranks started again, beside a job step of a run with peer recovery (``recovery.peer:
true``, launcher srun: one task per rank).

A rank whose process is lost (killed, out of memory) leaves its peers waiting for its
report in their recovery (launcher.runtime.peer); the lowest that reported writes a
request into the run directory (``peer-replace/JOB_RESTART_GEN_RANK.json``: the rank, the
generation of the process group it is to join, the node and pid its heartbeat gave). The
job controller's thread (:func:`serve`, from the start of each step to its end) starts, for
each request of this start, one more job step inside the allocation (on the lost rank's
node; on a spare node of the allocation when the rank was started again there already and
was lost again, :func:`node_for`)::

    srun --overlap --nodes=1 --ntasks=1 --nodelist=NODE --mem=0 --immediate=60 --output=..._RANK_log.out ... \\
         env SLURM_PROCID=RANK SLURM_NTASKS=WORLD SLURM_LOCALID=L SLURM_NODEID=N \\
             GLAUNCH_PEER_JOIN=GEN GLAUNCH_PEER_LOST_PID=PID  TASK_WORDS

``--overlap``: the running step holds the node's CPUs; ``--mem=0``: and, where Slurm counts
memory (SelectTypeParameters=CR_*_Memory), all of the job's memory on the node, which a
step asking for any would not get (the new process takes the lost one's share);
``--immediate``: a step Slurm cannot create now (its nodes busy) is refused after
STEP_CREATE_WAIT_S instead of waiting, silently, while its peers wait for it to the end of
their own bound (launcher.runtime.peer.REPORT_WAIT_S). The task's words are the
step's own (submitit's loader of the same pickled task); ``env`` gives it the lost rank's
place in the step (submitit's JobEnvironment reads it from Slurm's variables, which srun
sets for its single task to 0 and 1), so it runs the script as that rank, writing on in
that rank's log. The step itself runs with ``--kill-on-bad-exit=0`` for such a run
(launcher.schedulers.slurm.script), so the loss of one task does not end the others.

A new process whose srun fails before its task runs (the step refused, the task not
executed: :func:`not_started`, from that srun's own lines) ends the step at once, its
peers waiting for it in vain; what srun said is kept for the start's end
(RunDir.peer_not_started_file).

The step's end (:func:`step_status`): srun's status is that of its worst task, the lost
one's; where every task srun names as failed was started again and each new process
exited 0, the step's status is 0. The decisions are pure (:func:`replacement_for`,
:func:`replacement_words`, :func:`step_status`, :func:`not_started`); no torch.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, MutableMapping, Sequence

from launcher.jobcontrol.jobend import crash_in, this_start
from launcher.rundir import envnames
from launcher.rundir.files import atomic_write_text, read_json
from launcher.rundir.layout import RunDir
from launcher.rundir.records import is_node_name

POLL_S = 0.5
# A task srun says failed that no surviving rank asks to start again within this bound (a
# rank lost before or after the step loop, where its peers are in no recovery): the step
# is ended, as srun's --kill-on-bad-exit would have done at once, and the start ends as
# the crash it is. Long enough for the survivors of a loss inside a long step to reach
# their next collective and ask.
UNASKED_LOSS_S = 60.0
LOG_POLL_S = 2.0
# At most this many processes started again in one start: a rank lost again and again (its
# step kills it each time) ends as the crash it is, once its peers' wait for it ends.
MAX_REPLACEMENTS = 4
CAPPED = f"{MAX_REPLACEMENTS} processes were already started again in this start (recovery.peer's bound)"
END_WAIT_S = 60.0          # a started process after the step ended: its ranks have finished
TERM_WAIT_S = 10.0
# The words of the step that name its tasks, its logs and how a failed task ends it: the
# new step's own take their place.
STEP_OWN = ("--output=", "--error=", "--nodes=", "--ntasks=", "--ntasks-per-node=", "--kill-on-bad-exit=",
            "--nodelist=", "--mem=", "--mem-per-cpu=", "--mem-per-gpu=", "--immediate", "-I")
# How long a new step may wait for Slurm to create it (srun --immediate: "Unable to create
# step for job N: Requested nodes are busy" after it, read as any refusal); well within the
# peers' wait for the new process (launcher.runtime.peer.REPORT_WAIT_S).
STEP_CREATE_WAIT_S = 60
# srun's line for failed tasks, as the batch log has it ("srun: error: n2: task 3: Exited
# with exit code 3"; "tasks 2-3: Killed").
SRUN_FAILED = re.compile(r"srun: error: [A-Za-z0-9][A-Za-z0-9._-]{0,99}: tasks? ([0-9][0-9,-]{0,200}): ")
# srun's lines about a step it could not create ("srun: error: Unable to create step for job
# 12: Requested node configuration is not available"): every error line of srun's but its
# tasks' ends (SRUN_FAILED's); and slurmstepd's about a task it could not execute
# ("slurmstepd-n2: error: execve(): python: No such file or directory"), not its other
# errors, which come from a task that ran (an OOM kill).
STEP_ERROR = re.compile(r"^(?:srun: error: .{1,300}|slurmstepd(?:-[A-Za-z0-9._-]{1,100})?: error: execve\(\).{0,300})$",
                        re.MULTILINE)
OWN_LINES_READ = 64 * 1024     # the most of the log read for one new step's own lines


@dataclass(frozen=True)
class Replacement:
    """A lost rank to start again: where, and its place in the step."""

    rank: int
    generation: int
    node: str
    node_index: int
    local_rank: int
    lost_pid: int | None


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def replacement_for(request: Mapping[str, Any], *, job_id: str, restart: int, world_size: int,
                    ranks_per_node: int, step_nodes: Sequence[str]) -> Replacement | None:
    """Pure: the process a request of this start asks for (None: not one of this start's, or
    not as the ranks write it). The node: the request's, where it is one of the step's,
    else the rank's under srun's block distribution."""
    rank, generation, pid = _count(request.get("rank")), _count(request.get("generation")), request.get("pid")
    if (str(request.get("job_id")) != str(job_id) or request.get("restart") != restart or type(restart) is not int
            or rank is None or not rank < world_size or not generation or ranks_per_node < 1):
        return None
    index = rank // ranks_per_node
    asked = request.get("node")
    node = asked if is_node_name(asked) and asked in step_nodes else (
        step_nodes[index] if index < len(step_nodes) else None)
    if node is None:
        return None
    return Replacement(rank, generation, node, index, rank % ranks_per_node,
                       pid if type(pid) is int and pid > 0 else None)


def replacement_words(srun: Sequence[str], task: Sequence[str], new: Replacement, world_size: int) -> list[str]:
    """Pure: the command of the step that starts `new` (the module's docstring), from the
    job step's srun words and task words."""
    words = [srun[0], "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={new.node}", "--mem=0",
             f"--immediate={STEP_CREATE_WAIT_S}"]
    for word in srun[1:]:
        if word.startswith(("--output=", "--error=")):
            words.append(word.replace("%t", str(new.rank)))     # %t: 0, the new step's only task
        elif not word.startswith(STEP_OWN):
            words.append(word)
    place = {"SLURM_PROCID": new.rank, "SLURM_NTASKS": world_size, "SLURM_LOCALID": new.local_rank,
             "SLURM_NODEID": new.node_index, envnames.PEER_JOIN: new.generation}
    if new.lost_pid is not None:
        place[envnames.PEER_LOST_PID] = new.lost_pid
    return [*words, "env", *(f"{name}={value}" for name, value in place.items()), *task]


def failed_tasks(batch_log: str) -> set[int] | None:
    """Pure: the tasks srun says failed, in this start's part of the batch log (after the
    last "glaunch: start " line); None when a line names them in a form not read here."""
    tasks: set[int] = set()
    for match in SRUN_FAILED.finditer(this_start(batch_log)):
        for piece in match.group(1).split(","):
            low, _, high = piece.partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                return None
            tasks.update(range(int(low), int(high or low) + 1))
    return tasks


def step_status(status: int, failed: set[int] | None, started: Mapping[int, int | None]) -> int:
    """Pure: the step's status once lost ranks were started again: 0 where srun's status
    comes from tasks that were all started again (`failed`, from its lines) and each new
    process exited 0 (`started`: rank -> the status of its last new process, None while it
    ran on); else srun's own."""
    if status == 0 or not failed or not started:
        return status
    return 0 if all(started.get(task) == 0 for task in failed) else status


def not_started(output: str) -> str | None:
    """Pure: why srun could not start a new step's task, from that srun's own lines (its
    last error line that is not a task's end; srun's refusal to create the step first, as
    the one that says why), or None where they name no such error."""
    errors = [m.group(0) for m in STEP_ERROR.finditer(output) if not SRUN_FAILED.match(m.group(0))]
    refused = [line for line in errors if "Unable to create step" in line]
    chosen = refused or errors
    return "".join(c if c.isprintable() else "?" for c in chosen[-1]) if chosen else None


def unasked_losses(failed: set[int] | None, asked: set[int], seen: dict[int, float], now: float,
                   bound_s: float = UNASKED_LOSS_S) -> set[int]:
    """Pure: the failed tasks (srun's lines) no rank asked to start again within `bound_s`
    of their failure being seen; `seen` (task -> when first seen failed) is kept up to date.
    A failure srun names in a form not read here (None) counts as none."""
    for task in (failed or set()) - asked:
        seen.setdefault(task, now)
    return {task for task, at in seen.items() if task not in asked and now - at >= bound_s}


def node_for(new: Replacement, started_on: Sequence[str], spares: Sequence[str]) -> Replacement:
    """Pure: where to start `new`. On the lost rank's node, unless the rank was started again
    there before in this start and was lost again (`started_on`: the nodes its earlier new
    processes ran on): that node is suspect, and the first of the allocation's spare nodes
    (`spares`: not in the step) that none of them ran on takes it, if any."""
    if new.node not in started_on:
        return new
    spare = next((node for node in spares if node not in started_on), None)
    return new if spare is None else dataclasses.replace(new, node=spare)


class Requests:
    """The requests of one start in the run's peer-replace/, as every job step serves them
    (Slurm's, beside srun; the local site's stand-in for srun): each file read until served;
    per rank only the newest (an older one is stale); one for a rank whose process still
    runs waits, unserved, until it ends (its peers may ask before its late report comes)."""

    def __init__(self, run_dir: str | Path, *, job_id: str, restart: int, world_size: int, ranks_per_node: int,
                 step_nodes: Sequence[str]) -> None:
        self.folder = RunDir(run_dir).peer_replace_dir
        self.job_id, self.restart, self.world_size = job_id, restart, world_size
        self.ranks_per_node, self.step_nodes = ranks_per_node, tuple(step_nodes)
        self.served: set[Path] = set()
        self.asked: set[int] = set()    # the ranks some request of this start asked for

    def due(self, ended: Callable[[int], bool]) -> list[Replacement]:
        """The processes to start now: per rank the newest request not served yet, where
        `ended(rank)` says the rank's process no longer runs; each is then served."""
        try:
            paths = sorted(p for p in self.folder.iterdir() if p.suffix == ".json" and p not in self.served)
        except OSError:
            return []
        newest: dict[int, tuple[Path, Replacement]] = {}
        for path in paths:
            request = read_json(path)
            new = None if request is None else replacement_for(
                request, job_id=self.job_id, restart=self.restart, world_size=self.world_size,
                ranks_per_node=self.ranks_per_node, step_nodes=self.step_nodes)
            if new is None:
                self.served.add(path)       # not this start's, or not as the ranks write it
                continue
            self.asked.add(new.rank)
            older = newest.get(new.rank)
            if older is not None and older[1].generation >= new.generation:
                self.served.add(path)
                continue
            if older is not None:
                self.served.add(older[0])
            newest[new.rank] = (path, new)
        due = [(path, new) for path, new in newest.values() if ended(new.rank)]
        self.served.update(path for path, _ in due)
        return [new for _, new in due]


class Replacements:
    """The processes this step started again, and the requests already served."""

    def __init__(self, start: Callable[[list[str], Path | None], Any], spares: Sequence[str] = (),
                 logs: Callable[[int, int], Path] | None = None) -> None:
        self.start = start              # (words, its log) -> a process (subprocess.Popen), or None when it could not
        self.spares = tuple(spares)     # the allocation's nodes outside the step
        self.logs = logs                # (rank, its n-th new process) -> the log of that srun's own lines
        self.started_on: dict[int, list[str]] = {}
        self.procs: dict[int, list[Any]] = {}
        self.log_of: dict[int, Path] = {}         # id of a process -> its own log
        self.capped: tuple[int, str] | None = None   # (rank, node) of a request past MAX_REPLACEMENTS
        self.requests: Requests | None = None      # read from the first serve_once on
        self.failed_seen: dict[int, float] = {}

    def statuses(self) -> dict[int, int | None]:
        """rank -> the status of its last new process (None: still running)."""
        return {rank: procs[-1].poll() for rank, procs in self.procs.items() if procs}

    def ended(self, rank: int, failed: set[int] | None) -> bool:
        """Whether rank `rank`'s process no longer runs: srun says its task ended (`failed`,
        from the step's lines) and no process started again for it still runs."""
        procs = self.procs.get(rank)
        return rank in (failed or set()) and (not procs or procs[-1].poll() is not None)

    def serve_once(self, run_dir: Path, *, job_id: str, restart: int, world_size: int, ranks_per_node: int,
                   step_nodes: Sequence[str], srun: Sequence[str], task: Sequence[str],
                   failed: set[int] | None = None, check_ended: bool = False) -> None:
        """Serve the new requests of this start (Requests.due). With `check_ended`, a request
        waits until srun says its rank's task ended (`ended`)."""
        if self.requests is None:
            self.requests = Requests(run_dir, job_id=job_id, restart=restart, world_size=world_size,
                                     ranks_per_node=ranks_per_node, step_nodes=step_nodes)
        for new in self.requests.due(lambda rank: not check_ended or self.ended(rank, failed)):
            self._start_again(new, srun, task, world_size)

    @property
    def asked(self) -> set[int]:
        """The ranks some request of this start asked for."""
        return self.requests.asked if self.requests is not None else set()

    def _start_again(self, new: Replacement, srun: Sequence[str], task: Sequence[str], world_size: int) -> None:
        if sum(len(p) for p in self.procs.values()) >= MAX_REPLACEMENTS:
            say(f"rank {new.rank} not started again: {CAPPED}")
            self.capped = (new.rank, new.node)
            return
        earlier = self.started_on.setdefault(new.rank, [])
        moved = node_for(new, earlier, self.spares)
        where = (f"on the spare node {moved.node} (it was lost again on {new.node})" if moved.node != new.node
                 else f"on {new.node}")
        say(f"rank {new.rank}'s process is lost: starting it again {where} to join generation "
            f"{new.generation} of its peers' group")
        earlier.append(moved.node)
        log = self.logs(new.rank, len(earlier)) if self.logs is not None else None
        proc = self.start(replacement_words(srun, task, moved, world_size), log)
        if proc is not None:
            self.procs.setdefault(new.rank, []).append(proc)
            if log is not None:
                self.log_of[id(proc)] = log

    def not_started(self) -> tuple[int, str, str] | None:
        """(rank, node, why) of a lost rank that was not started again: past MAX_REPLACEMENTS,
        or its new process's srun ended in failure before its task ran (:func:`not_started`,
        on that srun's own log: its first OWN_LINES_READ bytes); None when there is none."""
        if self.capped is not None:
            return (*self.capped, CAPPED)
        for rank, procs in self.procs.items():
            proc = procs[-1]
            log_path = self.log_of.get(id(proc))
            if proc.poll() in (None, 0) or log_path is None:
                continue
            try:
                with open(log_path, "rb") as log:
                    output = log.read(OWN_LINES_READ).decode("utf-8", "replace")
            except OSError:
                continue
            why = not_started(output)
            if why is not None:
                return rank, self.started_on[rank][-1], why
        return None

    def end(self, wait_s: float = END_WAIT_S) -> None:
        """After the step: each process started again, waited for (its ranks have ended),
        then ended."""
        deadline = time.monotonic() + wait_s
        for proc in (p for procs in self.procs.values() for p in procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(timeout=TERM_WAIT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=TERM_WAIT_S)


def serve(run_dir: Path, replacements: Replacements, *, stop: Callable[[], bool], job_id: str, restart: int,
          step_nodes: Sequence[str], srun: Sequence[str], task: Sequence[str],
          batch_log: Callable[[], str] = lambda: "", end_step: Callable[[], None] = lambda: None) -> None:
    """Start lost ranks again until `stop()` (the step's end); the task spec gives the world.
    A task srun says failed (`batch_log()`, this start's part) that no rank asks for within
    UNASKED_LOSS_S ends the step (`end_step()`, once)."""
    from launcher.rundir.taskspec import TaskSpecError, read_task_spec

    try:
        spec = read_task_spec(run_dir)
    except TaskSpecError as exc:
        say(f"lost ranks are not started again: {exc}")
        return
    if spec.launcher != "srun":
        return
    log_read_at, ended = 0.0, False
    while not stop():
        if not ended:
            ended = _end_if_not_started(run_dir, replacements, job_id, restart, end_step)
        # A rank is started again only once srun says its task ended: a peer may ask for a
        # rank whose report is late on a busy machine, while its process still runs.
        failed = failed_tasks(batch_log())
        replacements.serve_once(run_dir, job_id=job_id, restart=restart, world_size=spec.world_size,
                                ranks_per_node=spec.ranks_per_node, step_nodes=step_nodes, srun=srun, task=task,
                                failed=failed, check_ended=True)
        now = time.monotonic()
        if not ended and now - log_read_at >= LOG_POLL_S:
            log_read_at = now
            unasked = unasked_losses(failed, replacements.asked, replacements.failed_seen, now,
                                     UNASKED_LOSS_S)
            if unasked:
                say(f"task(s) {', '.join(map(str, sorted(unasked)))} ended and no rank asked to start them again "
                    f"within {UNASKED_LOSS_S:g} s: the step ends")
                end_step()
                ended = True
        time.sleep(POLL_S)


def _end_if_not_started(run_dir: Path, replacements: Replacements, job_id: str, restart: int,
                        end_step: Callable[[], None]) -> bool:
    """End the step (`end_step`) when a lost rank's new process could not be started: its
    peers would wait for it to the watchdog's bound, and the start then ended as a hang.
    What srun said is kept for the start's end (RunDir.peer_not_started_file). Whether it ended."""
    found = replacements.not_started()
    if found is None:
        return False
    rank, node, why = found
    say(f"rank {rank} could not be started again on {node} ({why}): the step ends")
    if crash_in(run_dir, restart) is None:
        # Else a task's own failure came first (the step may be ending for it already, and
        # Slurm then refuses new steps): crash.json names it.
        note_not_started(run_dir, job_id, restart, rank, node, why)
    end_step()
    return True


def note_not_started(run_dir: str | Path, job_id: str, restart: int, rank: int, node: str, why: str) -> None:
    """Keep, for the start's end, why a lost rank was not started again (launcher.jobcontrol.jobend)."""
    record = {"job_id": job_id, "restart": restart, "rank": rank, "node": node, "error": why}
    try:
        atomic_write_text(RunDir(run_dir).peer_not_started_file, json.dumps(record) + "\n")
    except OSError as exc:
        say(f"cannot write {RunDir(run_dir).peer_not_started_file}: {exc}")


def popen_starter(env: MutableMapping[str, str]) -> Callable[[list[str], Path | None], Any]:
    """Start words as a process with `env` (the step's): a Popen, or None, said, when it cannot.
    What the process itself prints (srun's own lines about its one task, "task 0") goes to
    its `log`, not to the batch log, whose srun lines are the job step's."""
    def start(words: list[str], log: Path | None) -> Any:
        try:
            if log is None:
                return subprocess.Popen(words, env=dict(env))
            with open(log, "ab") as out:
                return subprocess.Popen(words, env=dict(env), stdout=out, stderr=subprocess.STDOUT)
        except OSError as exc:
            say(f"{words[0]}: {exc}")
            return None
    return start


def say(line: str) -> None:
    print(f"glaunch: {line}", file=sys.stderr, flush=True)

