"""Following and managing runs and sweeps after submission: their state (the scheduler's
view folded into run.json), waiting for the end, logs, cancelling, listing. Everything
here returns or reports data; launcher.views makes the text."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from launcher.errors import ConfigError, GlaunchError, SchedulerError
from launcher.rundir.files import json_safe
from launcher.rundir.layout import RunDir
from launcher.rundir.records import IN_FLIGHT, RunRecord, State, is_terminal
from launcher.rundir.taskspec import TaskSpecError, read_placement, read_task_spec
from launcher.runner import sweeps
from launcher.runner.logs import Lines, LogFollower, RankLogs
from launcher.runner.direct import NotRefreshed
from launcher.runner.lookup import find_sweep, refreshed, run_dir_of, sweep_records
from launcher.runner.recent import recent
from launcher.runner.results import RunRef, StateChange
from launcher.runner.road import refresh_copies, road_to
from launcher.runner.status import summarize
from launcher.schedulers.base import Echo, RunConsole

FOLLOW_POLL_S = 2.0
CONSOLE_POLL_S = 0.25       # the console's log and status line, between two scheduler polls
# How long a follower (`--wait`, `wait`) asks again through an outage of its scheduler, or of
# the link to the login node (a VPN's or a Wi-Fi's blip), before it gives up (exit 3): the
# run goes on there either way.
FOLLOW_OUTAGE_S = 300.0

Text = Callable[[str], None]
OnState = Callable[[StateChange], None]


def status(run: RunRef) -> dict[str, Any]:
    """What `glaunch status RUN --json` prints. For a sweep: its elements' table (each one's
    swept values, state, step, result), its arrays and the counts of each state."""

    sweep_dir = find_sweep(run)
    if sweep_dir is not None:
        return json_safe(sweeps.summarize(sweep_dir, sweep_records(sweep_dir)))      # type: ignore[return-value]
    run_dir = run_dir_of(run)
    return json_safe(summarize(run_dir, refreshed(run_dir)))      # type: ignore[return-value]


def wait(run: RunRef, *, on_line: Text | None = None, on_state: OnState | None = None,
         poll_s: float = FOLLOW_POLL_S, console: Echo | None = None) -> str:
    """Follow the run to its end across requeues: rank 0's log to `on_line` as it grows, one
    whole line (without its newline) per call, each change of state to `on_state`; and
    everything to the console `console` makes for the run (launcher.views.console.Console:
    log, status line, requeue events, the outcome), updated several times per scheduler
    poll and taken off the screen on an interrupt. A sweep: each element's change of state.
    Returns the final state."""
    sweep_dir = find_sweep(run)
    if sweep_dir is not None:
        with road_to(sweep_dir).held(sweep_dir):
            return _wait_sweep(sweep_dir, on_state=on_state, poll_s=poll_s)
    run_dir = run_dir_of(run)
    shown = console(run_dir) if console is not None else None
    try:
        with road_to(run_dir).held(run_dir):
            return _follow(run_dir, on_line, on_state, poll_s, shown)
    except KeyboardInterrupt:
        if shown is not None:
            shown.clear()
        raise


class _Rank0Log:
    """Rank 0's log of each job of a run as it grows (the log of the task that runs it:
    under torchrun its node's), as whole lines to `on_line`."""

    def __init__(self, run_dir: Path, on_line: Text) -> None:
        self.run_dir, self.on_line = RunDir(run_dir), on_line
        self.task = read_placement(run_dir).task(0)
        self.followers: dict[str, LogFollower] = {}
        self.lines: dict[str, Lines] = {}

    def poll(self, job_id: str | None) -> None:
        if job_id and job_id not in self.followers:
            self.lines[job_id] = Lines(self.on_line)
            self.followers[job_id] = LogFollower(self.run_dir.task_log(job_id, self.task), self.lines[job_id])
        for follower in self.followers.values():
            follower.poll()

    def finish(self) -> None:
        for follower in self.followers.values():
            follower.poll()
        for unfinished in self.lines.values():
            unfinished.flush()


class _Outage:
    """A follower's refreshes through an outage: while the scheduler cannot be asked, the
    record as last known here, for up to FOLLOW_OUTAGE_S; the outage's start and end said
    once each on the console."""

    def __init__(self, console: RunConsole | None) -> None:
        self.console = console
        self.since: float | None = None         # when the refreshes began to fail

    def refreshed(self, run_dir: Path) -> RunRecord:
        try:
            record = refreshed(run_dir)
        except NotRefreshed as exc:
            self._failed(exc, exc.cause.message)
            return exc.record
        self._answered()
        return record

    def sweep_records(self, sweep_dir: Path, last: dict[str, RunRecord | GlaunchError] | None
                      ) -> dict[str, RunRecord | GlaunchError]:
        """A sweep's elements' records; through an outage, `last` (the records last asked)."""
        try:
            records = sweep_records(sweep_dir)
        except SchedulerError as exc:
            if last is None:
                raise
            self._failed(exc, exc.message)
            return last
        self._answered()
        return records

    def _failed(self, exc: SchedulerError, why: str) -> None:
        """An ask that failed: the outage's start said; `exc` raised once it outlasts the bound."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
            self._say(f"the run's state cannot be asked now ({why}); asking again for up to {FOLLOW_OUTAGE_S:g} s: "
                      "the run goes on meanwhile")
        if now - self.since >= FOLLOW_OUTAGE_S:
            raise exc

    def _answered(self) -> None:
        if self.since is not None:
            self._say(f"the run's state can be asked again, after {time.monotonic() - self.since:.0f} s")
            self.since = None

    def _say(self, text: str) -> None:
        if self.console is not None:
            self.console.event(text)


def _follow(run_dir: Path, on_line: Text | None, on_state: OnState | None, poll_s: float,
            console: RunConsole | None) -> str:
    log = _Rank0Log(run_dir, on_line) if on_line is not None else None
    last = None
    outage = _Outage(console)
    while True:
        record = outage.refreshed(run_dir)
        state = record.state
        if record.extra.get("blocked"):
            # A pending reason that never clears by itself (launcher.schedulers.slurm.state).
            raise SchedulerError(f"run {record.run_id}: {record.detail}")
        if console is not None:
            console.observe(record)
        if log is not None:
            log.poll(record.job_id)
        if state != last and on_state is not None:
            on_state(StateChange(state, record.job_id))
        last = state
        if is_terminal(state) or state == State.UNKNOWN:
            if log is not None:
                log.finish()
            if console is not None:
                console.finish(record)
            return str(state)
        if console is None:
            time.sleep(poll_s)
            continue
        until = time.monotonic() + poll_s
        while time.monotonic() < until:
            console.pump()
            time.sleep(CONSOLE_POLL_S)


def _wait_sweep(sweep_dir: Path, *, on_state: OnState | None, poll_s: float) -> str:
    """Follow every element of a sweep to its end; the sweep's state. SchedulerError when
    the elements still waiting can never start."""
    index = {e.run_id: e.index for e in sweeps.read(sweep_dir).elements}
    last: dict[str, str] = {}
    outage, records = _Outage(None), None
    while True:
        records = outage.sweep_records(sweep_dir, records)
        states = []
        blocked = []
        for run_id, record in records.items():
            state = record.state if not isinstance(record, GlaunchError) else State.UNKNOWN.value
            states.append(state)
            if not isinstance(record, GlaunchError) and record.extra.get("blocked"):
                blocked.append(f"element {index.get(run_id)}: {record.detail}")
            if on_state is not None and last.get(run_id) != state:
                job = record.job_id if not isinstance(record, GlaunchError) else None
                on_state(StateChange(state, job, sweep=True, element=index.get(run_id)))
            last[run_id] = state
        waiting = [s for s in states if not (is_terminal(s) or s == State.UNKNOWN)]
        if not waiting:
            return sweeps.sweep_state(states)
        if blocked and len(blocked) == len(waiting):
            raise SchedulerError(f"sweep {sweep_dir.name}: " + "; ".join(blocked))
        time.sleep(poll_s)


def logs(run: RunRef, *, rank: int | None = None, follow: bool = False,
         echo: Text = print, poll_s: float = 1.0) -> None:
    """Per-rank logs of the run with a rank prefix, across requeues; with `follow`, until it
    ends. A sweep's: every element's, `[ELEMENT]` before the rank."""

    sweep_dir = find_sweep(run)
    if sweep_dir is not None:
        for element in sweeps.read(sweep_dir).elements:
            _check_rank(Path(element.run_dir), rank)
        with road_to(sweep_dir).held(sweep_dir):
            return _sweep_logs(sweep_dir, rank=rank, follow=follow, echo=echo, poll_s=poll_s)
    run_dir = run_dir_of(run)
    _check_rank(run_dir, rank)
    road_to(run_dir).logs(run_dir, rank=rank, follow=follow, echo=echo, poll_s=poll_s)


def _check_rank(run_dir: Path, rank: int | None) -> None:
    """ConfigError (exit 2) for a --rank the run does not have: its logs would show nothing."""
    if rank is None:
        return
    try:
        world = read_task_spec(run_dir).world_size
    except TaskSpecError:
        return          # task.json unreadable: every task's logs are still shown, by task
    if rank >= world:
        raise ConfigError(f"run {run_dir.name} has {world} rank(s), 0 to {world - 1}: it has no rank {rank}",
                          file="command line", key="--rank")


def _sweep_logs(sweep_dir: Path, *, rank: int | None, follow: bool, echo: Text, poll_s: float) -> None:
    """Every element's logs, `[ELEMENT]` before the rank; with `follow`, until all ended."""
    elements = sweeps.read(sweep_dir).elements
    readers = [RankLogs(Path(e.run_dir), rank, prefixed(echo, f"[{e.index}]")) for e in elements]
    road = road_to(sweep_dir)
    while True:
        road.mirror_sweep_logs(sweep_dir)
        for reader in readers:
            reader.poll()
        if not follow:
            for reader in readers:
                reader.flush()
            return
        states = [r.state if not isinstance(r, GlaunchError) else State.UNKNOWN.value
                  for r in sweep_records(sweep_dir).values()]
        if all(is_terminal(s) or s == State.UNKNOWN for s in states):
            follow = False
        time.sleep(poll_s)


def cancel(run: RunRef) -> str:
    """Cancel the run's job; a sentence saying what was done. A sweep's: every element's
    (on Slurm, its array jobs, with one scancel)."""

    sweep_dir = find_sweep(run)
    if sweep_dir is not None:
        return road_to(sweep_dir).cancel_sweep(sweep_dir)
    run_dir = run_dir_of(run)
    return road_to(run_dir).cancel(run_dir)


def list_runs(limit: int = 20, sweep: RunRef | None = None) -> list[dict[str, Any]]:
    """The newest runs: id, state, site, nodes, age, run directory (a sweep is one row,
    its elements are not listed). A run whose record is damaged, and bad lines of the run
    index, come as rows with `error` (the file and what is wrong) instead of stopping the
    listing. With `sweep` (its id or directory): its elements' rows, as `status` has them."""

    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigError(f"how many runs to list: 1 or more, got {limit!r}", file="command line", key="-n")
    if sweep is not None:
        sweep_dir = find_sweep(sweep)
        if sweep_dir is None:
            raise ConfigError(f"no sweep {sweep!r} (`glaunch list` shows runs and sweeps)", file="command line",
                              key="SWEEP")
        return list(status(sweep_dir)["elements"])
    rows = recent(limit)
    # A run's record here is a copy when its job writes run.json elsewhere (over SSH).
    in_flight = [Path(row["run_dir"]) for row in rows
                 if row.get("run_dir") and row.get("state") in {s.value for s in IN_FLIGHT}]
    refreshed, unanswered = refresh_copies(in_flight)
    rows = recent(limit) if refreshed else rows
    for row in rows:
        why = unanswered.get(str(row.get("run_dir")))
        if why is not None:
            row["stale"] = f"as last recorded: {why}"
    return rows


def prefixed(echo: Text, prefix: str) -> Text:
    """`echo` with `prefix` before every line (a sweep element's index)."""
    return lambda line: echo(f"{prefix}{line}")
