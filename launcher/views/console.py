"""The console of a run followed to its end (`glaunch submit` on the local site, `glaunch
submit --wait` on Slurm): rank 0's log as it grows (under torchrun, its node's: the
agent's and its workers' output), one status line (state, step/total, rate, ETA, last
checkpoint), one event line per requeue::

    [glaunch] start 0: time limit at step 120 -> requeued -> resumed from 120

and at the end the outcome; on a failure its reason, the first failing rank (under
torchrun, node) and the end of its error log. Of a resumed run (`glaunch resume`) it
follows the current job only, the one the last resume started: its first event says so
(``resumed (resume 1) from step 120``).

On a terminal the status line stays below the log and is redrawn in place (carriage
return, erase line), fitted to the terminal's width so it never wraps: whole parts are
left out (the last checkpoint first, then the ETA, the rate, then from the end), never
cut mid-word. Elsewhere (a pipe, a file) it is a plain line, printed when its phase changes
(the state, the start, the first step known, a stall) and at most every PLAIN_STATUS_S
seconds otherwise. submitit's INFO lines in rank 0's log are not shown (they stay in the log
file), nor its ERROR line that a job raised (the reason and the first failing rank say more).

Everything comes from the run directory: run.json, the heartbeats, resume.json,
crash.json and the checkpoint directory's ``latest``; nothing here talks to a scheduler.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Callable

from launcher.runner import goodput
from launcher.rundir.files import read_json, read_text
from launcher.runner.goodput import epoch, number, step_of
from launcher.rundir.layout import REMOTE_FILE, RunDir, read_heartbeat
from launcher.rundir.records import GOES_ON, NOT_WATCHED, RunRecord, StartRecord, State, is_terminal
from launcher.rundir.startsummary import first_failure
from launcher.rundir.taskspec import Placement, TaskSpecError, read_placement, read_task_spec
from launcher.runner.logs import LogFollower, read_tail
from launcher.views.text import duration, printable
from launcher.runner.status import resolved_values

PLAIN_STATUS_S = 60.0
FAILED_LOG_LINES = 8
# submitit's log format: "submitit INFO (2024-01-01 00:00:00,000) - ...". Its INFO lines, its
# warning about the SIGCONT that a stop sends with SIGTERM (as Slurm does), and its ERROR line
# that the job raised (the outcome's reason and first failing rank say more) say nothing.
SUBMITIT_LINE = re.compile(r"^submitit (DEBUG|INFO) \(|^submitit WARNING \(.*\) - Bypassing signal SIGCONT$"
                           r"|^submitit ERROR \(.*\) - Submitted job triggered an exception$")
LATEST_STEP = re.compile(r"step-0*(\d+)$")
CLEAR_LINE = "\r\x1b[K"

REASONS = {"timeout": "time limit", "preemption": "preempted", "requeued": "requeued (scontrol requeue)",
           "slow node": "stopped for a slow node",
           "terminated": "stopped by a SIGTERM (no time limit, preemption or cancel)",
           "crash": "crashed", "hang": "hung",
           "node failure": "node failure", "cancelled": "cancelled"}


class Console:
    """Follows one run: call `observe(record)` with each run.json read, `pump()` often
    (a few times a second), `finish(record)` at the end. Also an Echo: called with text,
    it shows it as log text."""

    def __init__(self, run_dir: str | Path, write: Callable[[str], None], *, live: bool,
                 clock: Callable[[], float] = time.time) -> None:
        self.run_dir = RunDir(run_dir)
        self.write, self.live, self.clock = write, live, clock
        self.followers: dict[str, LogFollower] = {}
        self.partial = ""
        self.shown = ""                 # the status line on screen (live), or last printed (plain)
        self.shown_phase: tuple[str, ...] = ()
        self.shown_at = 0.0
        self.record: RunRecord | None = None
        self.said: set[int] = set()     # restarts whose requeue event was printed
        self.said_resume = False
        self.began = clock()
        self.placement = read_placement(self.run_dir.path)
        self.checkpoint_dir = checkpoint_dir_read(self.run_dir)

    # --- input ---------------------------------------------------------------------------

    def __call__(self, text: str) -> None:
        self.log(text)

    def log(self, text: str) -> None:
        """Log text (any chunk): shown as whole lines above the status line."""
        *lines, self.partial = (self.partial + text).split("\n")
        shown = [line for line in lines if not SUBMITIT_LINE.match(line)]
        if shown:
            self._print("".join(line + "\n" for line in shown))

    def observe(self, record: RunRecord) -> None:
        """A fresh run.json: follow each start's log of the task that runs global rank 0
        (under torchrun its node's), print requeue events."""
        self.record = record
        task = self.placement.task(0)
        for start in job_starts(record)[1]:
            if start.job_id not in self.followers:
                self.followers[start.job_id] = LogFollower(self.run_dir.task_log(start.job_id, task), self.log)
        self._events(final=False)

    def pump(self) -> None:
        for follower in list(self.followers.values()):
            follower.poll()
        if self.record is not None:
            self._events(final=False)
            self._status()

    def event(self, text: str) -> None:
        """A line of glaunch's own (an interrupt, a warning)."""
        self._print(f"[glaunch] {text}\n")

    def finish(self, record: RunRecord) -> None:
        """The run ended: the rest of the log, pending events, then the outcome."""
        self.observe(record)
        for follower in list(self.followers.values()):
            follower.poll()
        if self.partial and not SUBMITIT_LINE.match(self.partial):
            self._print(self.partial + "\n")
        self.partial = ""
        self._events(final=True)
        self.clear()
        self.shown = ""
        for line in outcome_lines(self.run_dir, record, self.clock()):
            self.write(line + "\n")

    # --- output --------------------------------------------------------------------------

    def _print(self, text: str) -> None:
        if self.live and self.shown:
            self.write(CLEAR_LINE + text + self.shown)
        else:
            self.write(text)

    def clear(self) -> None:
        """Take the status line off the screen (before other output below it)."""
        if self.live and self.shown:
            self.write(CLEAR_LINE)

    def _status(self) -> None:
        record = self.record
        if record is None:
            return
        now = self.clock()
        parts = status_parts(self.run_dir, record, now, self.checkpoint_dir)
        if self.live:
            width = max(20, shutil.get_terminal_size((100, 24)).columns - 1)
            text = SEPARATOR.join(t for _, t in fit(parts, width))
            if text != self.shown:
                self.write(CLEAR_LINE + text)
                self.shown = text
            return
        text, phase = SEPARATOR.join(t for _, t in parts), plain_phase(parts)
        if phase != self.shown_phase or (text != self.shown and now - self.shown_at >= PLAIN_STATUS_S):
            self.write(text + "\n")
            self.shown, self.shown_phase, self.shown_at = text, phase, now

    def _events(self, *, final: bool) -> None:
        record = self.record
        if record is None:
            return
        resume, starts = job_starts(record)
        if resume is not None and not self.said_resume:
            line = resume_event(self.run_dir, resume, starts, final=final)
            if line is None:
                return              # the resume is said first
            self.said_resume = True
            self._print(f"[glaunch] {line}\n")
        for start in starts:
            if start.restart in self.said or start.state not in GOES_ON:
                continue
            line = requeue_event(self.run_dir, starts, start, final=final)
            if line is not None:
                self.said.add(start.restart)
                self._print(f"[glaunch] {line}\n")


# --- pure-ish pieces (they read the run directory, never write) ----------------------------------


def job_starts(record: RunRecord) -> tuple[dict | None, list[StartRecord]]:
    """(the last resume's entry, or None for a run never resumed; the starts of the job it
    started, or of the submitted job): the job the console follows."""
    resumes = goodput.resumes(record)
    if not resumes:
        return None, record.starts
    return resumes[-1], record.starts[resumes[-1]["first_start"]:]


def _heartbeat(run_dir: RunDir, rank: int = 0) -> dict | None:
    return read_heartbeat(run_dir.heartbeat(rank))


def checkpoint_dir_read(run_dir: RunDir) -> Path:
    """The checkpoint directory whose `latest` the console reads: checkpoint.dir as the run
    resolved it; for a run kept on a cluster (its record here holds remote.json), the copy
    in that record: such a run keeps its checkpoints in its run directory there, whose path
    the resolved values name, and `latest` is copied here with the rest."""
    if (run_dir.path / REMOTE_FILE).is_file():
        return run_dir.checkpoint_dir
    derived = resolved_values(run_dir.path).get("derived")
    directory = derived.get("checkpoint_dir") if isinstance(derived, dict) else None
    return Path(directory) if isinstance(directory, str) else run_dir.checkpoint_dir


def latest_checkpoint(checkpoint_dir: Path) -> int | None:
    """The step of the checkpoint directory's ``latest`` (as written, not verified)."""
    try:
        text = read_text(checkpoint_dir / "latest", limit=4096).strip()
    except (OSError, ValueError):
        return None
    match = LATEST_STEP.search(text)
    return int(match.group(1)) if match else None


# The parts of the status line left out first when it is too wide, in this order; then the
# others from the end (never the state).
DROPPED_FIRST = ("checkpoint", "eta", "rate")
SEPARATOR = " | "


def status_line(run_dir: RunDir, record: RunRecord, now: float, checkpoint_dir: Path,
                width: int | None = None) -> str:
    """[glaunch] RUNNING | start 1 | step 120/400 | 3.2 steps/s | ETA 1m27s | checkpoint 100;
    with `width`, whole parts left out until it fits (DROPPED_FIRST)."""
    parts = status_parts(run_dir, record, now, checkpoint_dir)
    if width is not None:
        parts = fit(parts, width)
    return SEPARATOR.join(text for _, text in parts)


def status_parts(run_dir: RunDir, record: RunRecord, now: float, checkpoint_dir: Path) -> list[tuple[str, str]]:
    """The status line's parts, (kind, text), in order."""
    state = str(record.state)
    parts = [("state", f"[glaunch] {printable(state)}")]
    resume, starts = job_starts(record)
    last = starts[-1] if starts else None
    restart = 0 if last is None else last.restart + (1 if last.state in GOES_ON else 0)
    if resume is not None:
        parts.append(("resume", f"resume {resume['number']}"))
    if restart:
        parts.append(("start", f"start {restart}"))
    if state == State.PENDING.value and record.extra.get("pending_reason"):
        parts.append(("waiting", f"waiting: {printable(record.extra['pending_reason'])}"))
    beat = _heartbeat(run_dir)
    if beat is not None and beat.get("restart") == restart and step_of(beat.get("step")) is not None:
        total = step_of(beat.get("total"))
        parts.append(("step", f"step {beat['step']}" + (f"/{total}" if total else "")))
        seconds = number(beat.get("step_s"))
        if seconds:
            parts.append(("rate", f"{1 / seconds:.3g} steps/s"))
            if total and total > beat["step"]:
                parts.append(("eta", f"ETA {duration((total - beat['step']) * seconds)}"))
        when = number(beat.get("time"))
        if when is not None and now - when > 60:
            parts.append(("stalled", f"no step for {duration(now - when)}"))
    elif state == State.RUNNING.value:
        parts.append(("starting", "starting"))
    checkpoint = latest_checkpoint(checkpoint_dir)
    if checkpoint is not None:
        parts.append(("checkpoint", f"checkpoint {checkpoint}"))
    return parts


# What makes a plain status line worth printing at once: the state, the resume or start it
# is in, a reason it waits for, the first step known (a run stepping, not starting) and a
# stall. The step, rate, ETA and checkpoint change all the time: at most every PLAIN_STATUS_S.
PHASE_TEXT = ("state", "resume", "start", "waiting")
PHASE_KIND = ("starting", "step", "stalled")


def plain_phase(parts: list[tuple[str, str]]) -> tuple[str, ...]:
    """Pure: the status line's phase (PHASE_TEXT's parts whole, PHASE_KIND's by kind)."""
    return tuple(text if kind in PHASE_TEXT else kind for kind, text in parts if kind in PHASE_TEXT + PHASE_KIND)


def fit(parts: list[tuple[str, str]], width: int) -> list[tuple[str, str]]:
    """`parts` less whole parts until they fit `width` joined: DROPPED_FIRST, then from the
    end; the first part alone, too wide, is cut after its last whole word that fits."""
    parts = list(parts)
    while len(parts) > 1 and len(SEPARATOR.join(t for _, t in parts)) > width:
        kinds = [kind for kind, _ in parts]
        drop = next((kinds.index(k) for k in DROPPED_FIRST if k in kinds[1:]), len(parts) - 1)
        del parts[drop]
    kind, text = parts[0]
    if len(text) > width:
        cut = text[:width + 1].rsplit(" ", 1)[0]
        parts[0] = (kind, cut if 0 < len(cut) <= width else text[:width])
    return parts


def _where(start: StartRecord) -> str:
    step = step_of(start.stopped_at)
    if step is None:
        step = step_of(start.get("last_step"))
    return "" if step is None else f" at step {step}"


# Where a start of a script that does not use glaunch's runtime went on from: its own
# affair (its own checkpoint, or none), which glaunch does not see.
ITS_OWN = "went on as its script does (glaunch sees no checkpoint of its own)"


def _resumed(run_dir: RunDir, starts: list[StartRecord], restart: int) -> tuple[bool, int | str | None]:
    """(known, step) of where start `restart` of the job of `starts` resumed: run.json once
    it recorded the start, else resume.json or the start's first heartbeat while it runs.
    A script without the runtime (entrypoint.progress) says so in its own log lines: the
    first step it logged in the start (when past 0) is where it went on at. Of one that
    neither uses the runtime nor logs its steps, nothing is known: ITS_OWN."""
    later = next((s for s in starts if s.restart == restart), None)
    if later is not None and (later.resumed_from is not None or is_terminal(later.state)
                              or later.state in GOES_ON):
        if later.resumed_from is None:
            logged = _logged_resume(run_dir, later.get("first_step"))
            if logged is None and (later.get("watchdog") or {}).get("why") == NOT_WATCHED:
                return True, ITS_OWN
            return True, logged
        return True, later.resumed_from
    resume = read_json(run_dir.resume_file)
    if resume is not None and resume.get("restart") == restart:
        return True, step_of(resume.get("step"))
    beat = _heartbeat(run_dir)
    # Its first step (not the record a rank writes as it starts, before it resumes).
    if beat is not None and beat.get("restart") == restart and step_of(beat.get("step")) is not None:
        return True, _logged_resume(run_dir, beat.get("first_step")) if beat.get("source") == "log" else None
    return False, None


def _logged_resume(run_dir: RunDir, first_step: object) -> str | None:
    """Where a start of a run with entrypoint.progress went on, as its log said ("went on at
    step N (its log)"); None for 0, for none, or for a run whose steps come from the runtime."""
    step = step_of(first_step)
    if not step:
        return None
    try:
        logged = read_task_spec(run_dir.path).progress_pattern is not None
    except TaskSpecError:
        return None
    return f"went on at step {step} (its log)" if logged else None


def resume_event(run_dir: RunDir, resume: dict, starts: list[StartRecord], *, final: bool) -> str | None:
    """"resumed (resume 1) from step 120" once the resumed job's first start said where it
    resumed (or, with `final`, with what is known)."""
    head = f"resumed (resume {resume['number']})"
    known, step = _resumed(run_dir, starts, 0)
    if not known:
        return head if final else None
    if isinstance(step, str):
        return f"{head}: {step}"
    return head + (f" from step {step}" if step is not None else ": began again from step 0 (no checkpoint)")


def requeue_event(run_dir: RunDir, starts: list[StartRecord], start: StartRecord, *, final: bool) -> str | None:
    """"start 0: time limit at step 120 -> requeued -> resumed from 120" once the next
    start of the job of `starts` said where it resumed (or, with `final`, with what is
    known)."""
    why = REASONS.get(start.reason or "", printable(start.reason or "stopped"))
    head = f"start {start.restart}: {why}{_where(start)}"
    if start.reason in ("crash", "hang") and start.detail:
        head += f" ({printable(start.detail)})"
    known, step = _resumed(run_dir, starts, start.restart + 1)
    if not known and not final:
        return None
    then = "requeued" if start.state == State.REQUEUED.value else "restarted in its allocation"
    if start.left_out:
        then += f" without {printable(start.left_out)}"
    if not known:
        return f"{head} -> {then}"
    return f"{head} -> {then} -> " + (step if isinstance(step, str) else f"resumed from {step}" if step is not None
                                         else "began again from step 0 (no checkpoint)")


def failing_task(placement: Placement, task: int) -> str:
    """``first failing rank: 3`` (srun), ``first failing node: node1 r2-3`` (torchrun)."""
    if placement.per_node:
        return f"first failing node: {placement.label(task)}"
    return f"first failing rank: {task}"


def outcome_lines(run_dir: RunDir, record: RunRecord, now: float) -> list[str]:
    p = printable
    state = str(record.state)
    steps = ""
    last = record.starts[-1] if record.starts else None
    result = read_json(run_dir.result_file)
    if result is not None and step_of(result.get("final_step")) is not None:
        steps = f" at step {result['final_step']}"
    elif last is not None and _where(last):
        steps = _where(last)
    resume, starts = job_starts(record)
    began = epoch(starts[0].started) if starts else None
    took = f" in {duration(now - began)}" if began is not None else ""
    job = f" of resume {resume['number']}" if resume is not None else ""
    lines = [f"[glaunch] run {p(record.run_id)} {p(state)}{steps} after {len(starts)} start(s){job}{took}"]
    if state != State.COMPLETED.value:
        why = "; ".join(p(x) for x in (record.reason, record.detail) if x)
        if why:
            lines.append(f"[glaunch] reason: {why}")
    if len(record.starts) > 1:
        good = goodput.summarize(record, now)["goodput"]
        if good.get("ettr") is not None:
            lines.append(f"[glaunch] goodput: ETTR {good['ettr']:.2f}, {good['lost_steps']} step(s) lost; "
                         f"glaunch status {p(record.run_id)} for more")
    if state in (State.FAILED.value, State.OUT_OF_MEMORY.value, State.NODE_FAIL.value):
        task, node, error = first_failure(run_dir, record)
        if task is not None and last is not None:
            log = run_dir.task_log(last.job_id, task, "err")
            failing = failing_task(read_placement(run_dir.path), task)
            lines.append(f"[glaunch] {failing}" + (f" on {p(node)}" if node else "")
                         + (f": {p(error)}" if error else "") + f"; its log: {p(log)}")
            tail = [line for line in read_tail(log).decode(errors="replace").splitlines()
                    if line.strip() and not SUBMITIT_LINE.match(line)][-FAILED_LOG_LINES:]
            lines += [f"    {p(line)}" for line in tail]
    for warning in goodput.checkpoint_warnings(record):
        lines.append(f"[glaunch] warning: {p(warning)}")
    return lines
