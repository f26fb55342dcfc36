"""`glaunch submit --after RUN[:ok|any]`: start only once other runs (or sweeps) ended.

On Slurm each run waited for becomes a dependency on its job ids (`afterok` / `afterany`;
a sweep's: its array jobs), written into the job script's directives. A run that has
already ended is judged at submit: one that completed (or any end, for `:any`) is no
longer waited for; one that ended otherwise can never satisfy `:ok`, and the submission
is refused, nothing written. One that ends so later leaves the job pending with Slurm's
DependencyNeverSatisfied, which `glaunch status` reports as never starting.

On the local site (no queue) the run waits, polling, until every run it depends on ended.

`parse` and `clause` are pure.
"""

from __future__ import annotations

import time
from os import PathLike, fspath
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from launcher.errors import ConfigError, GlaunchError, RunError
from launcher.rundir import registry
from launcher.rundir.lifecycle import move
from launcher.rundir.records import RunRecord, State
from launcher.runner import lookup, sweeps
from launcher.runner.inputs import items
from launcher.runner.upstream import After, Upstream

if TYPE_CHECKING:
    from launcher.schedulers.base import Echo

OPTION = "--after"
KINDS = ("ok", "any")
POLL_S = 2.0


def parse(items: Sequence[str]) -> list[After]:
    """RUN, RUN:ok, RUN:any -> After (ok by default)."""
    out = []
    for item in items:
        if not isinstance(item, (str, PathLike)):
            raise ConfigError(f"{item!r} is not a run: give a run or sweep id or directory (RUN[:ok|any] text)",
                              file="command line", key=OPTION)
        item = fspath(item)
        if not isinstance(item, str):
            raise ConfigError(f"{item!r} is bytes: give the run as text", file="command line", key=OPTION)
        ref, sep, kind = item.rpartition(":")
        if not sep or kind not in KINDS:
            ref, kind = item, "ok"
        if not ref.strip():
            raise ConfigError(f"{item!r} names no run (RUN[:ok|any])", file="command line", key=OPTION)
        out.append(After(ref, kind))
    return out


def clause(upstreams: Sequence[Upstream]) -> str | None:
    """Slurm's --dependency for the runs still to wait for: `afterok:1:2,afterany:3`
    (every one must hold). Pure."""
    kinds: dict[str, list[str]] = {}
    for up in upstreams:
        if up.ended:
            continue
        for job_id in up.job_ids:
            ids = kinds.setdefault(f"after{up.after.kind}", [])
            if job_id not in ids:
                ids.append(job_id)
    return ",".join(f"{kind}:{':'.join(ids)}" for kind, ids in kinds.items()) or None


def check_for(upstreams: Sequence[Upstream], scheduler: str) -> None:
    """ConfigError (nothing written) for a dependency that cannot hold: a run that ended
    in a way `:ok` excludes, a run Slurm cannot wait for (never submitted, or on another
    scheduler, still running)."""
    for up in upstreams:
        if up.ended:
            if not up.satisfied:
                raise ConfigError(f"{up.after}: {up.describe()}, so this run could never start (use "
                                  f"{up.after.ref}:any to start after whatever end)", file="command line", key=OPTION)
            continue
        if scheduler == "slurm" and (up.scheduler != "slurm" or not up.job_ids):
            where = "has no Slurm job" if not up.job_ids else f"runs on the {up.scheduler} site"
            raise ConfigError(f"{up.after}: {up.name} {where}; a Slurm job can only wait for Slurm jobs",
                              file="command line", key=OPTION)


def record_of(upstream: Upstream) -> dict:
    return {"ref": upstream.after.ref, "kind": upstream.after.kind, "name": upstream.name,
            "job_ids": list(upstream.job_ids)}


def wait(upstreams: Sequence[Upstream], refresh: Callable[[Upstream], Upstream], *,
         say: Callable[[str], None] | None = None, poll_s: float = POLL_S,
         sleep: Callable[[float], None] = time.sleep) -> list[Upstream]:
    """Wait until every upstream ended (the local site's --after); returns them as they
    ended. The caller judges `satisfied`. `say` gets one event per upstream waited for."""
    current = list(upstreams)
    said: set[str] = set()
    while True:
        current = [up if up.ended else refresh(up) for up in current]
        waiting = [up for up in current if not up.ended]
        if not waiting:
            return current
        for up in waiting:
            if say is not None and up.name not in said:
                said.add(up.name)
                say(f"waiting for {up.name} to end (--after {up.after})")
        sleep(poll_s)


def never_satisfied(upstreams: Sequence[Upstream]) -> str | None:
    """Why the run can never start, once its upstreams ended; None when it may."""
    failed = [up for up in upstreams if up.ended and not up.satisfied]
    if not failed:
        return None
    return "; ".join(f"--after {up.after}: {up.describe()}" for up in failed)


def upstream_of_run(after: After, record: RunRecord, run_dir: Path) -> Upstream:
    job_ids = (record.job_id,) if record.job_id and not record.dry_run else ()
    return Upstream(after, record.run_id, record.scheduler, job_ids, (record.state,), (run_dir,))


# --- the runs a submission names -----------------------------------------------------------------


def upstreams_of(after: Sequence[str], scheduler: str, *, refresh: bool) -> list[Upstream]:
    """The runs and sweeps `--after` names (`after`: items as the API takes them), as they
    stand now (refreshed from their scheduler unless not `refresh`); ConfigError for one
    that can never be waited for."""
    if not after:
        return []
    upstreams = [upstream(item, refresh) for item in parse(items(after, "after"))]
    check_for(upstreams, scheduler)
    return upstreams


def upstream(after: After, refresh: bool) -> Upstream:
    """The run or sweep `after` names as it stands now; ConfigError naming OPTION when
    there is none or its record is damaged."""

    sweep_dir = lookup.find_sweep(after.ref)
    try:
        if sweep_dir is None:
            run_dir = registry.find_run(after.ref)
            record = lookup.refreshed(run_dir) if refresh else registry.read(run_dir)
            return upstream_of_run(after, record, run_dir)
    except (RunError, ConfigError) as exc:      # no such run (said as RUN's), or its record is damaged (its file)
        what = exc.message if isinstance(exc, ConfigError) else str(exc)
        raise ConfigError(f"{after}: {what}", file="command line", key=OPTION) from None
    sweep = sweeps.read(sweep_dir)
    records = lookup.sweep_records(sweep_dir, refresh=refresh)
    states = tuple(r.state if not isinstance(r, GlaunchError) else State.UNKNOWN.value for r in records.values())
    job_ids = tuple(a.job_id for a in sweep.arrays if a.job_id)
    if not job_ids:       # elements submitted one by one (or not at all)
        job_ids = tuple(r.job_id for r in records.values() if not isinstance(r, GlaunchError) and r.job_id)
    return Upstream(after, sweep.sweep_id, sweep.scheduler, job_ids, states,
                    tuple(Path(e.run_dir) for e in sweep.elements))


def dependency_clause(upstreams: Sequence[Upstream], scheduler: str) -> str | None:
    """What the job script's --dependency says (Slurm only)."""
    if not upstreams or scheduler != "slurm":
        return None
    return clause(upstreams)


def wait_before_start(upstreams: Sequence[Upstream], run_dir: Path, echo: Echo | None) -> str | None:
    """The local site's --after: wait until every run waited for ended. None when this run
    may start; else its state, recorded with the reason it never starts. The console
    `echo` makes for the run is told what it waits for."""

    say = echo(run_dir).event if echo is not None else None
    ended = wait(upstreams, lambda up: upstream(up.after, True), say=say)
    why = never_satisfied(ended)
    if why is None:
        return None
    with registry.updating(run_dir) as record:
        move(record, State.CANCELLED.value, reason="never starts", detail=why)
    if say is not None:
        say(f"run {record.run_id} never starts: {why}")
    return record.state
