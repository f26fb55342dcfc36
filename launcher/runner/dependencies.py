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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from launcher.errors import ConfigError
from launcher.rundir.records import TERMINAL, RunRecord, State

OPTION = "--after"
KINDS = ("ok", "any")
POLL_S = 2.0


@dataclass(frozen=True)
class After:
    ref: str          # a run id or run directory, a sweep id or sweep directory
    kind: str         # ok: it must have completed | any: whatever its end

    def __str__(self) -> str:
        return f"{self.ref}:{self.kind}"


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


@dataclass(frozen=True)
class Upstream:
    """A run or sweep waited for, as it stands now."""

    after: After
    name: str                     # its run or sweep id
    scheduler: str | None
    job_ids: tuple[str, ...]      # the Slurm jobs to depend on (a sweep: its arrays)
    states: tuple[str, ...]       # its state, or each element's
    run_dirs: tuple[Path, ...]

    @property
    def ended(self) -> bool:
        return all(s in TERMINAL for s in self.states)

    @property
    def satisfied(self) -> bool:
        """Ended as `after.kind` asks."""
        return self.ended and (self.after.kind == "any" or all(s == State.COMPLETED.value for s in self.states))

    def describe(self) -> str:
        states = sorted(set(self.states))
        return f"{self.name} ended {'/'.join(states)}"


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
         echo: Callable[[str], None] | None = None, poll_s: float = POLL_S,
         sleep: Callable[[float], None] = time.sleep) -> list[Upstream]:
    """Wait until every upstream ended (the local site's --after); returns them as they
    ended. The caller judges `satisfied`."""
    current = list(upstreams)
    said: set[str] = set()
    while True:
        current = [up if up.ended else refresh(up) for up in current]
        waiting = [up for up in current if not up.ended]
        if not waiting:
            return current
        for up in waiting:
            if echo is not None and up.name not in said:
                said.add(up.name)
                echo(f"[glaunch] waiting for {up.name} to end (--after {up.after})\n")
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
