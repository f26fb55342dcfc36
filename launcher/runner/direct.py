"""The direct road: a run whose scheduler answers on this machine (the local site, or Slurm's
commands on PATH), its directory a folder here. Its record is read where it lies, with the
scheduler's current view folded in; its logs are read, and its job cancelled, here. A
submission, sweep or resume on this road runs the pipeline of its runner module (the
`here` each submitting method is given) unchanged. launcher.runner.road picks this road
or the SSH one for a run or a submission."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence, TypeVar

from launcher import schedulers
from launcher.errors import ConfigError, GlaunchError, SchedulerError
from launcher.rundir import registry
from launcher.rundir.lifecycle import ENDS
from launcher.rundir.records import RunRecord, State, is_terminal
from launcher.runner import frameworks, sweeps
from launcher.runner.upstream import Upstream

if TYPE_CHECKING:       # a submission's (the plan, the site): following a run needs neither
    from launcher.config.sites import LoadedSite
    from launcher.resolution.jobplan import JobPlan

P = TypeVar("P")
R = TypeVar("R")
Text = Callable[[str], None]


class NotRefreshed(SchedulerError):
    """The scheduler could not say how a run in flight stands now: why, and the state its
    run.json last recorded (`record`, read again: it says since when it is unreachable)."""

    def __init__(self, cause: SchedulerError, record: RunRecord) -> None:
        super().__init__(f"{cause.message}; {last_recorded(record)}", file=cause.file, key=cause.key)
        self.cause, self.record = cause, record


def last_recorded(record: RunRecord) -> str:
    """The run's state as run.json has it, with its job and where its last start stood."""
    said = [f"job {record.job_id}"] if record.job_id else []
    start = record.starts[-1] if record.starts else None
    if start is not None:
        when = f"ended {start.ended}" if start.ended else f"started {start.started}" if start.started else "not started"
        said.append(f"start {start.restart} {start.state}, {when}")
    return f"run {record.run_id} was last recorded {record.state}" + (f" ({'; '.join(said)})" if said else "")


def copied_from(run_dir: Path, record: RunRecord) -> str | None:
    """The directory the run was submitted in, when `run_dir` is not it (a copy, or the run
    moved): its job, checkpoints and files all name that one. None when it is itself, or
    when the record does not say (written by hand)."""
    recorded = record.run_dir
    if not recorded:
        return None
    try:
        if os.path.samefile(recorded, run_dir):
            return None
    except (OSError, ValueError):
        pass
    return recorded


def refuse_copy(run_dir: Path, record: RunRecord, command: str) -> None:
    """ConfigError when `run_dir` is not the directory its run was submitted in: a command
    that changes the run acts on the run's own directory only."""
    original = copied_from(run_dir, record)
    if original is None:
        return
    try:
        there = registry.read(original).run_id if os.path.isdir(original) else None
    except GlaunchError:
        there = None
    if there == record.run_id:
        why = f"it is a copy of run {record.run_id}, whose run directory is {original}"
        fix = f"glaunch {command} {original}"
    else:
        why = f"run {record.run_id} was submitted in {original}, and was moved or copied here"
        fix = f"move it back to {original}"
    raise ConfigError(f"{run_dir}: {why}; its job, checkpoints and files name that directory ({fix})",
                      file=str(Path(run_dir) / "run.json"), key="run_dir")


def with_conventions(plan: JobPlan) -> JobPlan:
    """The plan with its entry script's conventions (the warning signal), on either road."""
    signal = frameworks.warning_signal(plan.submitted_script)
    return dataclasses.replace(plan, recovery=dataclasses.replace(plan.recovery, warning_signal=signal))


def recorded_elements(sweep_dir: Path) -> dict[str, RunRecord | GlaunchError]:
    """run id -> each element's record as its run.json has it (no scheduler asked)."""
    return sweeps.element_records(sweep_dir, lambda runs: [r for _, r in runs])


def _asks_scheduler(run_dir: Path, record: RunRecord) -> bool:
    if record.scheduler not in schedulers.NAMES or record.dry_run or copied_from(run_dir, record) is not None:
        return False
    return not (record.state in ENDS and schedulers.get(str(record.scheduler)).settled(record))


def _reread(run_dir: Path, record: RunRecord) -> RunRecord:
    try:
        return registry.read(run_dir)
    except GlaunchError:
        return record


class Direct:
    """This machine's road. Stateless: one instance, DIRECT, serves every run."""


    # --- following a run or sweep ---------------------------------------------------------

    def refreshed(self, run_dir: Path) -> RunRecord:
        """run.json with the scheduler's current view folded in. Read as it is: a copy of a
        run directory (the job it names is another directory's), and an ended run whose
        record holds all its scheduler could add (its record is authoritative: no scheduler
        is asked, so it answers at once with the controller down). NotRefreshed (exit 3) for
        a run whose scheduler cannot be reached, naming the state last recorded."""
        record = registry.read(run_dir)
        if not _asks_scheduler(run_dir, record):
            return record
        try:
            return schedulers.get(str(record.scheduler)).refresh(run_dir, record)
        except NotRefreshed:
            raise
        except SchedulerError as exc:
            raise NotRefreshed(exc, _reread(run_dir, record)) from None

    def sweep_records(self, sweep_dir: Path) -> dict[str, RunRecord | GlaunchError]:
        """run id -> each element's record (those the scheduler may still add to refreshed
        together by it, as `refreshed` says), or the error reading it."""
        record = sweeps.read(sweep_dir)
        if record.dry_run or record.scheduler not in schedulers.NAMES:
            return recorded_elements(sweep_dir)
        scheduler = schedulers.get(record.scheduler)

        def refresh_asked(runs: list[tuple[Path, RunRecord]]) -> list[RunRecord]:
            asks = [_asks_scheduler(d, r) for d, r in runs]
            asked = [run for run, ask in zip(runs, asks) if ask]
            try:
                fresh = iter(scheduler.refresh_many(asked) if asked else [])
            except SchedulerError as exc:
                states = Counter(str(r.state) for _, r in asked)
                last = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
                raise SchedulerError(f"{exc.message}; sweep {sweep_dir.name}: its elements in flight were last "
                                     f"recorded {last}") from None
            return [next(fresh) if ask else r for (_, r), ask in zip(runs, asks)]

        return sweeps.element_records(sweep_dir, refresh_asked)

    @contextlib.contextmanager
    def held(self, run_dir: Path) -> Iterator[None]:
        """Nothing to hold open here across the polls of a block."""
        yield

    def logs(self, run_dir: Path, *, rank: int | None, follow: bool, echo: Text, poll_s: float) -> None:
        """The run's per-rank logs; with `follow`, until it ends."""
        from launcher.runner.logs import RankLogs

        reader = RankLogs(run_dir, rank, echo)
        while True:
            reader.poll()
            if not follow:
                reader.flush()
                return
            state = self.refreshed(run_dir).state
            if is_terminal(state) or state == State.UNKNOWN:
                follow = False
            time.sleep(poll_s)

    def mirror_sweep_logs(self, sweep_dir: Path) -> None:
        """The elements' logs are read where they are written: nothing to copy."""

    def cancel(self, run_dir: Path) -> str:
        refuse_copy(run_dir, registry.read(run_dir), "cancel")
        record = self.refreshed(run_dir)       # a record whose job has gone is brought to its end first
        if not record.job_id or record.scheduler not in schedulers.NAMES or is_terminal(record.state):
            return f"run {record.run_id}: nothing to cancel ({record.state})"
        return schedulers.get(record.scheduler).cancel(run_dir, record)

    def cancel_sweep(self, sweep_dir: Path) -> str:
        """Every element's job (on Slurm, its array jobs, with one scancel)."""
        sweep = sweeps.read(sweep_dir)
        records = recorded_elements(sweep_dir)
        live = [(Path(e.run_dir), r) for e in sweep.elements
                if isinstance(r := records.get(e.run_id), RunRecord) and r.job_id
                and not is_terminal(r.state)]
        if sweep.dry_run or sweep.scheduler not in schedulers.NAMES or not live:
            return f"sweep {sweep.sweep_id}: nothing to cancel"
        arrays = [a.job_id for a in sweep.arrays if a.job_id]
        done = schedulers.get(sweep.scheduler).cancel_many(live, arrays)
        return f"sweep {sweep.sweep_id}: " + "; ".join(done)

    # --- submitting -----------------------------------------------------------------------

    def environ(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The environment paths are expanded with: this machine's."""
        return dict(environ)

    def plan(self, plan: JobPlan) -> JobPlan:
        """The plan with its entry script's conventions, its Slurm commands run here (what
        its record names: a profile's `login:` is not used where Slurm answers here)."""
        from launcher.resolution.jobplan import Transport

        return dataclasses.replace(with_conventions(plan), transport=Transport(login=None))

    def files(self, files: Mapping[str, str]) -> dict[str, str]:
        return dict(files)

    def check_upstreams(self, upstreams: Sequence[Upstream]) -> None:
        """Any run waited for (--after) is one Slurm here or the local site can wait for."""

    def python_warning(self, loaded_site: LoadedSite, plan: JobPlan) -> str | None:
        """The nodes run this machine's interpreter, which exists here: nothing to say."""
        return None

    def launch(self, prepared: P, *, dry_run: bool, check: bool, here: Callable[[P], R]) -> R:
        """Written and queued by this machine's pipeline, `here`."""
        return here(prepared)

    def launch_sweep(self, prepared: P, *, dry_run: bool, check: bool, here: Callable[[P, P], R]) -> R:
        """`here` writes the sweep where its jobs see it."""
        return here(prepared, prepared)

    def prepare_resume(self, run_dir: Path, overrides: Sequence[str], dry_run: bool,
                       here: Callable[[Path, Sequence[str], bool], R]) -> R:
        """Prepared by this machine's pipeline, `here`."""
        return here(run_dir, overrides, dry_run)

    def launch_resume(self, prepared: P, *, check: bool, here: Callable[[P], R]) -> R:
        return here(prepared)

    def close(self) -> None:
        """No connection to close."""


DIRECT = Direct()
