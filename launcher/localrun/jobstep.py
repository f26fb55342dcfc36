"""A stand-in for `srun` on the local site: start the job's tasks on this machine.

    python -m launcher.localrun.jobstep --ntasks=N --time-limit=SECONDS \
        --signal=USR2@LEAD --output=PATTERN --error=PATTERN -- COMMAND...

Like a Slurm job step it gives every task its rank in the environment (submitit's local
variables), sends the warning signal LEAD seconds before the time limit, then SIGTERM
at the limit and SIGKILL after a grace period, and signals whole process groups so a
task's children go with it. When one task fails the others are stopped
(`srun --kill-on-bad-exit`). %j in the patterns is the job id, %t the task's rank.
Beside the tasks it runs the hang watchdog (launcher.jobcontrol.watchdog) on their heartbeats,
with the bounds of the run's task.json: a hang gets every task's stack and ends the step.

With peer recovery (``GLAUNCH_RECOVERY_PEER=1``, launcher srun), a task that fails is not
the step's end at once: when its peers ask for it (a request in the run's peer-replace/, as
on Slurm: launcher.jobcontrol.replace), its process is started again in its place, to join
their group and get a peer's state; a failed task no peer asks for within
replace.UNASKED_LOSS_S ends the step as before.

Exit status: 0 when every task exited 0 (a task started again: its last process); otherwise
the first failing task's status, or 124 when the time limit ended the step. A one-line JSON summary goes to
<output dir>/<job id>_step.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from launcher.rundir import envnames
from launcher.rundir.files import atomic_write_text, open_regular
from launcher.rundir.layout import STEP_SUMMARY
from launcher.jobcontrol import replace, watchdog
from launcher.rundir.rankcontext import bare_signal_name, free_port

KILL_WAIT_S = 10.0
TIMEOUT_STATUS = 124
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        raise SystemExit("localrun: usage: localrun [options] -- COMMAND...")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="localrun")
    parser.add_argument("--ntasks", type=int, required=True)
    parser.add_argument("--time-limit", type=float, required=True, help="seconds")
    parser.add_argument("--signal", default="USR2@0", help="SIG@LEAD_SECONDS")
    parser.add_argument("--output", required=True)
    parser.add_argument("--error", required=True)
    parser.add_argument("--kill-wait", type=float, default=KILL_WAIT_S)
    options = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        raise SystemExit("localrun: no command after --")
    return options, command


class Step:
    def __init__(self, options: argparse.Namespace, command: list[str]) -> None:
        self.options = options
        self.command = command
        self.job_id = os.environ.get(envnames.JOB_ID, str(os.getpid()))
        name, _, lead = options.signal.partition("@")
        self.warning = signal.Signals["SIG" + bare_signal_name(name)]
        self.lead = float(lead or 0)
        self.procs: list[subprocess.Popen] = []
        self.warned = False
        self.timed_out = False
        self.stopping_since: float | None = None
        self.first_bad: int | None = None
        self.first_bad_task: int | None = None
        # env.sh names the run directory, the local scheduler the start.
        run_dir = os.environ.get(envnames.RUN_DIR)
        restart = os.environ.get(envnames.RESTART, "0")
        self.watch = watchdog.Watch(run_dir, self.job_id, int(restart)) if run_dir and restart.isdigit() else None
        self.hung = False
        self.next_watch = 0.0
        self.peers = PeerReplacement.of(run_dir, self.job_id, restart, options.ntasks)
        self.base_env: dict[str, str] = {}

    def _path(self, pattern: str, task: int) -> str:
        return pattern.replace("%j", self.job_id).replace("%t", str(task))

    def start(self) -> None:
        self.base_env = dict(os.environ)
        self.base_env.setdefault("MASTER_ADDR", "127.0.0.1")
        self.base_env.setdefault("MASTER_PORT", str(free_port()))
        for task in range(self.options.ntasks):
            self.procs.append(self._start_task(task, {}))

    def _start_task(self, task: int, more_env: dict[str, str]) -> subprocess.Popen:
        """Task `task`'s process, its output appended to its logs (a process started again
        writes on in the lost one's)."""
        env = dict(self.base_env)
        env.update({
            "SUBMITIT_LOCAL_JOB_ID": self.job_id,
            "SUBMITIT_LOCAL_NTASKS": str(self.options.ntasks),
            "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
            "SUBMITIT_LOCAL_NODEID": "0",
            "SUBMITIT_LOCAL_GLOBALID": str(task),
            "SUBMITIT_LOCAL_LOCALID": str(task),
            **more_env,
        })
        out_path, err_path = self._path(self.options.output, task), self._path(self.options.error, task)
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        append = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
        with os.fdopen(open_regular(out_path, append), "ab") as out, \
                os.fdopen(open_regular(err_path, append), "ab") as err:
            return subprocess.Popen(self.command, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                    start_new_session=True)

    def _first_bad(self, now: float) -> int | None:
        """The failed task that ends the step, if any: the first that exited non-zero; with
        peer recovery, one no peer asked to start again within the bound (those asked for
        are started again here)."""
        bad = [task for task, p in enumerate(self.procs) if p.poll() not in (None, 0)]
        if self.peers is None or not bad:
            return bad[0] if bad else None
        for task, more_env in self.peers.serve(bad, now):
            self.procs[task] = self._start_task(task, more_env)
        if self.peers.capped is not None:       # its peers would wait for it in vain
            return self.peers.capped
        return self.peers.unasked(bad, now)

    def signal_all(self, signum: int) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signum)
                except ProcessLookupError:
                    pass

    def signal(self, signum: int) -> None:
        """The watchdog's request for a stack: to each task itself, not its children."""
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signum)
                except ProcessLookupError:
                    pass

    def end(self) -> None:
        """The watchdog ends the step: a hung task does not stop when asked."""
        self.stopping_since = time.monotonic()
        self.signal_all(signal.SIGKILL)

    def _watch(self, now: float) -> None:
        if self.watch is None or self.stopping_since is not None or now < self.next_watch:
            return
        hang = self.watch.check()
        if self.watch.off and not self.watch.follows_log:
            self.watch = None
        elif hang is not None:
            self.hung = True
            self.watch.act(hang, self)
        else:
            self.next_watch = now + self.watch.poll_s()

    def stop(self) -> None:
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()
            self.signal_all(signal.SIGCONT)
            self.signal_all(signal.SIGTERM)

    def run(self) -> int:
        started = time.monotonic()
        self.next_watch = started
        for signum in FORWARDED:
            signal.signal(signum, self._on_signal)
        self.start()
        while any(p.poll() is None for p in self.procs):
            self._watch(time.monotonic())
            elapsed = time.monotonic() - started
            if not self.warned and self.lead > 0 and elapsed >= self.options.time_limit - self.lead:
                self.warned = True
                self.signal_all(self.warning)
            if not self.timed_out and elapsed >= self.options.time_limit:
                self.timed_out = True
                self.stop()
            bad = self._first_bad(time.monotonic()) if self.stopping_since is None else None
            if self.stopping_since is None and bad is not None:
                # The task that failed first, not one stopped because of it.
                self.first_bad, self.first_bad_task = self.procs[bad].returncode, bad
                self.stop()  # --kill-on-bad-exit
            if self.stopping_since is not None and time.monotonic() - self.stopping_since > self.options.kill_wait:
                self.signal_all(signal.SIGKILL)
            time.sleep(0.1)
        if self.watch is not None:
            self.watch.follow_log()      # the lines the tasks printed since the last poll
        # Like Slurm's end of step: nothing of the step survives it.
        self.signal_all(signal.SIGKILL)
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        codes = [p.returncode for p in self.procs]
        first = self.first_bad if self.first_bad is not None else next((c for c in codes if c), 0)
        status = TIMEOUT_STATUS if self.timed_out else _status(first)
        self._summary(codes, status, time.monotonic() - started)
        return status

    def _on_signal(self, signum: int, _frame) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self.stop()
        else:
            self.signal_all(signum)

    def _summary(self, codes: list[int], status: int, seconds: float) -> None:
        summary = {"job_id": self.job_id, "exit_codes": codes, "status": status, "timed_out": self.timed_out,
                   "warned": self.warned, "hung": self.hung, "first_failed_task": self.first_bad_task,
                   "seconds": round(seconds, 3)}
        if self.peers is not None and self.peers.started:
            summary["started_again"] = {str(task): n for task, n in sorted(self.peers.started.items())}
        path = Path(self._path(self.options.output, 0)).parent / STEP_SUMMARY.format(job_id=self.job_id)
        atomic_write_text(path, json.dumps(summary) + "\n")


class PeerReplacement:
    """With peer recovery: which failed tasks to start again (their peers asked, in the
    run's peer-replace/: replace.Requests, as under Slurm), and which failed task no peer
    asked for in time."""

    def __init__(self, run_dir: str, job_id: str, restart: int, ntasks: int) -> None:
        self.requests = replace.Requests(run_dir, job_id=job_id, restart=restart, world_size=ntasks,
                                         ranks_per_node=ntasks, step_nodes=["localhost"])
        self.run_dir, self.job_id, self.restart = run_dir, job_id, restart
        self.failed_since: dict[int, float] = {}    # task -> when its current process was seen failed
        self.started: dict[int, int] = {}           # task -> processes started again for it
        self.capped: int | None = None              # a task asked for past replace.MAX_REPLACEMENTS

    @classmethod
    def of(cls, run_dir: str | None, job_id: str, restart: str, ntasks: int) -> PeerReplacement | None:
        """For a run with recovery.peer whose tasks are its ranks (launcher srun); else None."""
        from launcher.rundir.taskspec import TaskSpecError, read_task_spec

        if os.environ.get(envnames.RECOVERY_PEER) != "1" or not run_dir or not restart.isdigit():
            return None
        try:
            spec = read_task_spec(Path(run_dir))
        except TaskSpecError:
            return None
        return cls(run_dir, job_id, int(restart), ntasks) if spec.launcher == "srun" else None

    def serve(self, bad: list[int], now: float) -> list[tuple[int, dict[str, str]]]:
        """The failed tasks a new request asks for, each with what its new process is told
        (the generation of its peers' group to join, the pid of the process it replaces)."""
        for task in bad:
            self.failed_since.setdefault(task, now)
        out: list[tuple[int, dict[str, str]]] = []
        for new in self.requests.due(lambda rank: rank in bad):
            if sum(self.started.values()) >= replace.MAX_REPLACEMENTS:
                replace.say(f"rank {new.rank} not started again: {replace.CAPPED}: the step ends")
                replace.note_not_started(self.run_dir, self.job_id, self.restart, new.rank, new.node,
                                         replace.CAPPED)
                self.capped = new.rank
                continue
            replace.say(f"rank {new.rank}'s process is lost: starting it again to join generation "
                        f"{new.generation} of its peers' group")
            more = {envnames.PEER_JOIN: str(new.generation)}
            if new.lost_pid is not None:
                more[envnames.PEER_LOST_PID] = str(new.lost_pid)
            self.started[new.rank] = self.started.get(new.rank, 0) + 1
            self.failed_since.pop(new.rank, None)
            out.append((new.rank, more))
        return out

    def unasked(self, bad: list[int], now: float) -> int | None:
        """The first failed task whose peers have not asked for it within the bound."""
        late = [task for task in bad
                if task in self.failed_since and now - self.failed_since[task] >= replace.UNASKED_LOSS_S]
        if late:
            replace.say(f"task(s) {', '.join(map(str, late))} ended and no rank asked to start them again "
                        f"within {replace.UNASKED_LOSS_S:g} s: the step ends")
        return late[0] if late else None


def _status(code: int) -> int:
    return 128 - code if code < 0 else code


def main(argv: list[str] | None = None) -> int:
    options, command = _parse(sys.argv[1:] if argv is None else argv)
    return Step(options, command).run()


if __name__ == "__main__":
    sys.exit(main())
