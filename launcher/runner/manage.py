"""Following and managing runs and sweeps after submission: their state (the scheduler's
view folded into run.json), waiting for the end, logs, cancelling, listing."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Mapping

from launcher import schedulers
from launcher.errors import ConfigError, GlaunchError, SchedulerError
from launcher.rundir.layout import RunDir
from launcher.rundir.records import RunRecord, State, is_terminal
from launcher.runner.submission import Echo, Run, RunRef
from launcher.runner.sweep_submission import Sweep

FOLLOW_POLL_S = 2.0
CONSOLE_POLL_S = 0.25       # the console's log and status line, between two scheduler polls


def sweep_records(sweep_dir: Path, *, refresh: bool = True) -> dict:
    """run id -> each element's record (refreshed together by its scheduler), or the error
    reading it."""
    from launcher.runner import sweeps

    record = sweeps.read(sweep_dir)
    if refresh and not record.dry_run and record.scheduler in schedulers.NAMES:
        return sweeps.element_records(sweep_dir, schedulers.get(record.scheduler).refresh_many)
    return sweeps.element_records(sweep_dir, lambda runs: [r for _, r in runs])


def find_sweep(ref: Any) -> Path | None:
    """The sweep directory `ref` (a sweep id or directory, or a Sweep) names; None for a run."""
    from launcher.runner import sweeps

    if isinstance(ref, Sweep):
        return ref.sweep_dir
    if isinstance(ref, Run):
        return None
    return sweeps.find_sweep(ref)


def run_dir_of(run: RunRef) -> Path:
    from launcher.rundir.registry import find_run

    if isinstance(run, Run):
        return run.run_dir
    if isinstance(run, Sweep):
        raise ConfigError(f"{run.sweep_id} is a sweep, not a run", file="command line", key="RUN")
    return find_run(os.fspath(run))


def refreshed(run_dir: Path):
    """run.json with the scheduler's current view folded in."""
    from launcher.rundir import registry

    record = registry.read(run_dir)
    if record.scheduler in schedulers.NAMES and not record.dry_run:
        record = schedulers.get(record.scheduler).refresh(run_dir, record)
    return record


def status(run: RunRef) -> dict[str, Any]:
    """What `glaunch status RUN --json` prints. For a sweep: its elements' table (each one's
    swept values, state, step, result), its arrays and the counts of each state."""
    from launcher.runner import sweeps
    from launcher.rundir.files import json_safe
    from launcher.runner.status import summarize

    sweep_dir = find_sweep(run)
    if sweep_dir is not None:
        return json_safe(sweeps.summarize(sweep_dir, sweep_records(sweep_dir)))      # type: ignore[return-value]
    run_dir = run_dir_of(run)
    return json_safe(summarize(run_dir, refreshed(run_dir)))      # type: ignore[return-value]


def format_status(summary: Mapping[str, Any]) -> str:
    from launcher.runner import sweeps
    from launcher.views.status_text import format_status as fmt

    if "sweep_id" in summary:
        return sweeps.format_status(summary)
    return fmt(dict(summary))


def wait(run: RunRef, *, on_line: Echo | None = None,
         on_state: Echo | None = None, poll_s: float = FOLLOW_POLL_S, console: Any = None) -> str:
    """Follow the run to its end across requeues: rank 0's log to `on_line` as it grows, one
    whole line (without its newline) per call,
    each change of state to `on_state`; or everything to `console`
    (launcher.views.console.Console: log, status line, requeue events, the outcome), which
    is updated several times per scheduler poll. Returns the final state."""
    from launcher.runner.logs import Lines, LogFollower

    sweep_dir = find_sweep(run)
    if sweep_dir is not None:
        return _wait_sweep(sweep_dir, on_state=on_state, poll_s=poll_s)
    run_dir = run_dir_of(run)
    followers: dict[str, LogFollower] = {}
    lines: dict[str, Lines] = {}
    last = None
    while True:
        record = refreshed(run_dir)
        state = record.state
        if record.extra.get("blocked"):
            # A pending reason that never clears by itself (launcher.schedulers.slurm.state).
            raise SchedulerError(f"run {record.run_id}: {record.detail}")
        if console is not None:
            console.observe(record)
        if on_line is not None:
            if record.job_id and record.job_id not in followers:
                lines[record.job_id] = Lines(on_line)
                followers[record.job_id] = LogFollower(RunDir(run_dir).task_log(record.job_id, 0),
                                                       lines[record.job_id])
            for follower in followers.values():
                follower.poll()
        if state != last and on_state is not None:
            on_state(f"[glaunch] job {record.job_id}: {state}")
        last = state
        if is_terminal(state) or state == State.UNKNOWN:
            for follower in followers.values():
                follower.poll()
            for unfinished in lines.values():
                unfinished.flush()
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


def _wait_sweep(sweep_dir: Path, *, on_state: Echo | None, poll_s: float) -> str:
    """Follow every element of a sweep to its end; the sweep's state. SchedulerError when
    the elements still waiting can never start."""
    from launcher.runner import sweeps

    index = {e.run_id: e.index for e in sweeps.read(sweep_dir).elements}
    last: dict[str, str] = {}
    while True:
        records = sweep_records(sweep_dir)
        states = []
        blocked = []
        for run_id, record in records.items():
            state = record.state if not isinstance(record, GlaunchError) else State.UNKNOWN.value
            states.append(state)
            if not isinstance(record, GlaunchError) and record.extra.get("blocked"):
                blocked.append(f"element {index.get(run_id)}: {record.detail}")
            if on_state is not None and last.get(run_id) != state:
                job = record.job_id if not isinstance(record, GlaunchError) else None
                on_state(f"[glaunch] element {index.get(run_id)} (job {job}): {state}")
            last[run_id] = state
        waiting = [s for s in states if not (is_terminal(s) or s == State.UNKNOWN)]
        if not waiting:
            return sweeps.sweep_state(states)
        if blocked and len(blocked) == len(waiting):
            raise SchedulerError(f"sweep {sweep_dir.name}: " + "; ".join(blocked))
        time.sleep(poll_s)


def logs(run: RunRef, *, rank: int | None = None, follow: bool = False,
         echo: Echo = print, poll_s: float = 1.0) -> None:
    """Per-rank logs of the run with a rank prefix, across requeues; with `follow`, until it
    ends. A sweep's: every element's, `[ELEMENT]` before the rank."""
    from launcher.runner import sweeps
    from launcher.runner.logs import RankLogs

    sweep_dir = find_sweep(run)
    if sweep_dir is not None:
        elements = sweeps.read(sweep_dir).elements
        readers = [RankLogs(Path(e.run_dir), rank, prefixed(echo, f"[{e.index}]")) for e in elements]
        while True:
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
    run_dir = run_dir_of(run)
    reader = RankLogs(run_dir, rank, echo)
    while True:
        reader.poll()
        if not follow:
            reader.flush()
            return
        state = refreshed(run_dir).state
        if is_terminal(state) or state == State.UNKNOWN:
            follow = False
        time.sleep(poll_s)


def cancel(run: RunRef) -> str:
    """Cancel the run's job; a sentence saying what was done. A sweep's: every element's
    (on Slurm, its array jobs, with one scancel)."""
    from launcher.rundir import registry
    from launcher.runner import sweeps

    sweep_dir = find_sweep(run)
    if sweep_dir is not None:
        sweep = sweeps.read(sweep_dir)
        records = sweep_records(sweep_dir, refresh=False)
        live = [(Path(e.run_dir), r) for e in sweep.elements
                if isinstance(r := records.get(e.run_id), RunRecord) and r.job_id
                and not is_terminal(r.state)]
        if sweep.dry_run or sweep.scheduler not in schedulers.NAMES or not live:
            return f"sweep {sweep.sweep_id}: nothing to cancel"
        arrays = [a.job_id for a in sweep.arrays if a.job_id]
        done = schedulers.get(sweep.scheduler).cancel_many(live, arrays)
        return f"sweep {sweep.sweep_id}: " + "; ".join(done)
    run_dir = run_dir_of(run)
    record = registry.read(run_dir)
    if not record.job_id or record.scheduler not in schedulers.NAMES or is_terminal(record.state):
        return f"run {record.run_id}: nothing to cancel ({record.state})"
    return schedulers.get(record.scheduler).cancel(run_dir, record)


def list_runs(limit: int = 20, sweep: Any = None) -> list[dict[str, Any]]:
    """The newest runs: id, state, site, nodes, age, run directory (a sweep is one row,
    its elements are not listed). A run whose record is damaged, and bad lines of the run
    index, come as rows with `error` (the file and what is wrong) instead of stopping the
    listing. With `sweep` (its id or directory): its elements' rows, as `status` has them."""
    from launcher.views.listing import recent

    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigError(f"how many runs to list: 1 or more, got {limit!r}", file="command line", key="-n")
    if sweep is not None:
        sweep_dir = find_sweep(sweep)
        if sweep_dir is None:
            raise ConfigError(f"no sweep {sweep!r} (`glaunch list` shows runs and sweeps)", file="command line",
                              key="SWEEP")
        return list(status(sweep_dir)["elements"])
    return recent(limit)


def prefixed(echo: Echo, prefix: str) -> Echo:
    """`echo` with `prefix` before every line (a sweep element's index)."""
    return lambda line: echo(f"{prefix}{line}")
