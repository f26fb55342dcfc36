"""Peer recovery (``recovery.peer: true``): a data-parallel rank whose step raises is
restored from a live peer's state in the same job, without reading a checkpoint.

The training loop, with it::

    ctx = rt.init_distributed()                  # under recovery.peer: the group of launcher.runtime.peergroup
    ddp = DDP(model, ...)
    recovery = rt.peer_recovery(ddp, opt)        # off: a plain loop, nothing added
    for step in recovery.steps(start + 1, steps):
        with recovery.step(step):
            train_one_step(step)                 # data derived from (seed, step, rank)
            ...                                  # saves, should_stop: as without it

What happens when the step of a rank raises (the exception reaches ``recovery.step``'s end):

1. That rank closes its connections (:meth:`PeerGroup.disconnect`). Its peers, blocked in
   the step's gradient all-reduce or reaching their next collective, raise at once, and
   do the same: every rank ends up here, each exactly once per failure.
2. Each rank writes its report (:class:`launcher.runtime.peerplan.Report`) to the store
   of the rendezvous: the last step whose optimizer update it completed (an optimizer
   step hook keeps it) and whether its own step failed or it only lost a peer. From all
   reports every rank decides the same plan (:func:`launcher.runtime.peerplan.plan_recovery`).
3. The ranks form the group's next generation (a fresh gloo group over a new prefix of
   the store); DDP's reducer forgets the step in flight, and gradients are dropped.
4. The source (a rank that did not fail, holding the newest update) sends the model's and
   the optimizer's state, and the state of ``extra`` objects (a scheduler, a grad scaler),
   to every receiver, point to point, tensors as they are (bitwise).
5. Every rank's own RNG states go back to where they were when the step to redo began
   (taken at each step's start); the loop goes on at that step. The log names the peer.
6. Once the next step has ended, one rank (the lowest that failed; the source when none
   did) appends the recovery to the run's ledger, ``peer-recoveries.jsonl`` in the run
   directory (:func:`ledger_entry`): the plan, the steps lost, and the seconds from the
   failure to the end of the next step on that rank's clock. ``glaunch status`` and
   goodput read it (:mod:`launcher.runner.goodput`). A ledger that cannot be written is
   logged, never a failure of the run.

A rank whose process is lost (killed, out of memory, ``os._exit``): its peers raise in
their collective with it as above, but its report never comes. REPLACE_AFTER_S into the
wait, the lowest rank that reported asks the job controller to start it again
(:func:`ask_replacement`: a file in the run directory's ``peer-replace/``, with the lost
rank's node and pid from its heartbeat; launcher.jobcontrol.replace serves it under Slurm)
and every rank keeps waiting, up to REPORT_WAIT_S. The new process runs the same script
with the rank's place (``GLAUNCH_PEER_JOIN``: the generation to join): its group serves
the collectives before the loop on its own (launcher.runtime.peergroup), and its
``steps()`` first joins the recovery (:meth:`PeerRecovery.join`): it reports as a failed
rank with no state (``replaced``), receives a live peer's state over the new generation
and goes on at the plan's step. Rank 0 is replaced like any other: the store the ranks meet
through lives in a process of its own (launcher.runtime.peerstore), not in rank 0's.

A rank hung in its own work while its peers wait for it in a collective (nothing raises)
ends its own process after half the hang bound (launcher.runtime.peerhold), and is then
started again as a lost one.

Lost work: the step in flight. Data must follow from the step number (as in the examples),
since the step is the position the runtime keeps. A step that fails again on the same rank
when redone, or a lost rank nobody starts again, is not recovered here: the ranks raise
and the start ends as a crash (the in-allocation restart from a checkpoint). CPU/gloo
only; with another backend the loop runs plainly.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from launcher.processes import process_runs
from launcher.rundir import envnames
from launcher.rundir.files import atomic_write_text, open_regular, read_json
from launcher.rundir.layout import RunDir, read_heartbeat
from launcher.rundir.rankcontext import RankContext, RuntimeConfigError, context, log, node_name
from launcher.rundir.startsummary import iso
from launcher.runtime import heartbeats, stopflag
from launcher.runtime.peerplan import PeerRecoveryImpossible, RecoveryPlan, Report, is_peer_loss, plan_recovery

# How long the ranks wait for each other's reports: a rank that never reports is gone.
REPORT_WAIT_S = 300.0
REPORT_POLL_S = 0.02
REPORT_STOP_GRACE_S = 2.0
REPORT_COLLECT_AFTER_S = 1.0
# A report missing this long into the wait is a lost process's: the lowest rank that reported
# asks for it to be started again (its peers' reports come within milliseconds of theirs, a
# rank busy outside a collective when the failure came reports at its next one).
REPLACE_AFTER_S = 3.0
# A step that fails again on the same rank when redone is not a transient fault.
RETRIES_PER_STEP = 1
REPORT_KEY = "glaunch-peer-report/{generation}/{rank}"


# torchrun's workers meet through their agent's store (torch's env:// rendezvous reads it).
AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"


def enabled() -> bool:
    """Whether the run asked for peer recovery (``recovery.peer: true``)."""
    return os.environ.get(envnames.RECOVERY_PEER) == "1"


def group_backend(backend: str) -> str:
    """The backend :func:`launcher.runtime.init_distributed` starts: the recoverable group's
    under ``recovery.peer`` with gloo, else `backend` as it is."""
    if not enabled():
        return backend
    if backend != "gloo":
        log(f"recovery.peer: not available with the {backend} backend; the run goes on without it")
        return backend
    from launcher.runtime import peergroup

    return peergroup.register()


def peer_store(ctx: RankContext, backend: str, timeout: datetime.timedelta | None) -> Any | None:
    """The rendezvous store of the recoverable group (`backend`, from :func:`group_backend`):
    one in a process of its own (launcher.runtime.peerstore): the job controller's
    (GLAUNCH_PEER_STORE), or else one rank 0 starts unless it takes a lost rank 0's place;
    None for any other group, and under torchrun, whose agent holds the store its workers
    meet through and outlives them (the env:// rendezvous' own)."""
    if not enabled() or os.environ.get(AGENT_STORE) == str(True):
        return None
    import torch.distributed as dist

    from launcher.runtime import peergroup, peerstore

    if backend != peergroup.BACKEND_NAME:
        return None

    served = served_store(os.environ.get(envnames.PEER_STORE, ""))
    if served is not None:
        host, port = served
    else:
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        if ctx.rank == 0 and ctx.peer_join is None:
            peerstore.start(host, port, ctx.world_size)
    return peerstore.connect(host, port, ctx.world_size, timeout or dist.default_pg_timeout)


def served_store(value: str) -> tuple[str, int] | None:
    """Pure: the (host, port) of GLAUNCH_PEER_STORE's "HOST:PORT" (the store the job
    controller serves); None where it names none. RuntimeConfigError for another value."""
    if not value:
        return None
    host, _, port = value.rpartition(":")
    if not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise RuntimeConfigError(f"{envnames.PEER_STORE}={value[:100]!r}: not HOST:PORT")
    return host, int(port)


def peer_finished() -> None:
    """This rank shuts down: the store of :func:`peer_store` ends once every rank has."""
    if "launcher.runtime.peerstore" in sys.modules:
        sys.modules["launcher.runtime.peerstore"].finished()


def peer_recovery(model: Any, optimizer: Any, *, extra: Mapping[str, Any] | None = None,
                  ctx: RankContext | None = None) -> PeerRecovery | PlainSteps:
    """The step loop of the module's docstring for `model` (DDP or a plain module) and
    `optimizer`; `extra` names further objects with ``state_dict``/``load_state_dict``
    (a scheduler, a grad scaler) restored with them. Without ``recovery.peer``, on one
    rank, or with a group that cannot reconnect, a plain loop."""
    ctx = ctx or context()
    if not enabled() or ctx.world_size < 2:
        return PlainSteps()
    from launcher.runtime import peergroup

    group = peergroup.world_group()
    if group is None:
        log("recovery.peer: the process group was not started by rt.init_distributed with gloo; "
            "the run goes on without it")
        return PlainSteps()
    return PeerRecovery(model, optimizer, extra=dict(extra or {}), ctx=ctx, group=group)


class PlainSteps:
    """The loop without recovery: the steps in order, nothing around them."""

    def steps(self, first: int, last: int) -> Iterator[int]:
        return iter(range(first, last + 1))

    def step(self, step: int) -> _Nothing:
        return _Nothing()


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


class PeerRecovery:
    """The step loop with recovery (the module's docstring)."""

    def __init__(self, model: Any, optimizer: Any, *, extra: dict[str, Any], ctx: RankContext, group: Any) -> None:
        self.model, self.optimizer, self.extra = model, optimizer, extra
        self.ctx, self.group = ctx, group
        self.recoveries: list[dict] = []      # one entry per recovery this rank took part in
        self._current: int | None = None
        self._committed = 0
        self._next = 0
        self._rng_at_start: tuple[int, dict] | None = None
        self._own_failures: dict[int, int] = {}
        # This rank's ledger entry of the last recovery, until the next step ends (step 6).
        self._unrecorded: _Unrecorded | None = None
        self._step_began: float | None = None
        optimizer.register_step_post_hook(self._on_optimizer_step)
        if ctx.run_dir and ctx.job_id is not None:
            from launcher.runtime.peerhold import HoldWatch

            HoldWatch(ctx, group, lambda: self._step_began).start()

    def _on_optimizer_step(self, *_: Any) -> None:
        if self._current is not None:
            self._committed = self._current

    def steps(self, first: int, last: int) -> Iterator[int]:
        """``first`` .. ``last``, going back to the step to redo after a recovery."""
        self._committed = first - 1
        step = first
        if self.group.joins is not None:      # a replacement of a lost rank: it joins the recovery first
            self.join()
            step = self._next
        while step <= last:
            self._next = step + 1
            yield step
            step = self._next
        self._record(None)          # a recovery after the last step: no next step to time

    def step(self, step: int) -> _Guard:
        """Around one step: a failure inside it is recovered (the module's docstring)."""
        return _Guard(self, step)

    def begin(self, step: int) -> None:
        from launcher.runtime.torchstate import rng_state

        self._current = step
        self._rng_at_start = (step, rng_state())
        self._step_began = time.monotonic()

    def end(self) -> None:
        self._current = None
        self._step_began = None

    def done(self, step: int | None) -> None:
        """Step `step` ended without an exception: the last recovery's next step (step 6);
        None: the loop ends with an exception no peer recovers."""
        self._record(step)

    def _record(self, next_step: int | None) -> None:
        unrecorded, self._unrecorded = self._unrecorded, None
        if unrecorded is not None:
            append_ledger(self.ctx.run_dir, unrecorded.entry(next_step))

    def recover(self, step: int, exc: BaseException) -> None:
        """Steps 1 to 6 of the module's docstring; PeerRecoveryImpossible when no peer can."""
        self._record(None)          # the step after the last recovery failed too
        began, began_at = time.monotonic(), time.time()
        own = not is_peer_loss([c.__name__ for c in type(exc).__mro__], str(exc))
        if own:
            log(f"peer recovery: step {step} failed on this rank:\n"
                + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip())
            self._own_failures[step] = self._own_failures.get(step, 0) + 1
        self.group.disconnect()
        generation = self.group.generation + 1
        report = Report(rank=self.ctx.rank, committed=self._committed, failed=own, error=_one_line(exc),
                        retry=self._own_failures.get(step, 0) <= RETRIES_PER_STEP)
        reports = exchange(self.group.store, generation, report, self.ctx.world_size, collect=self.group.collect,
                           on_missing=lambda present, missing: ask_replacement(self.ctx, generation, present, missing,
                                                                              began_at))
        plan = plan_recovery(generation, reports, self.ctx.world_size)
        self._carry_out(plan, step, failure_cause(plan, reports, self.ctx), began, began_at)

    def join(self) -> None:
        """A replacement of a lost rank (the module's docstring): report as failed with no
        state, receive a live peer's, go on at the plan's step. PeerRecoveryImpossible when
        it cannot take the rank's place (its old process still runs here, or this model's
        gradient buckets would not match its peers')."""
        began, began_at = time.monotonic(), time.time()
        generation = self.group.joins
        lost_pid = os.environ.get(envnames.PEER_LOST_PID, "")
        if lost_pid.isdigit() and process_runs(int(lost_pid)):     # its own report is still to come
            raise PeerRecoveryImpossible(f"rank {self.ctx.rank}: the process {lost_pid} it was to replace still "
                                         "runs on this node")
        unfit = replacement_unfit(self.model)
        report = Report(rank=self.ctx.rank, committed=-1, failed=True, replaced=True, retry=unfit is None,
                        error="process lost; started again" if unfit is None else f"not started again: {unfit}")
        reports = exchange(self.group.store, generation, report, self.ctx.world_size, collect=lambda: None)
        log(f"peer recovery: rank {self.ctx.rank} started again in place of its lost process; joining its peers "
            f"at generation {generation}")
        plan = plan_recovery(generation, reports, self.ctx.world_size)
        self._carry_out(plan, None, (self.ctx.rank, node_name(), report.error), began, began_at)

    def _carry_out(self, plan: RecoveryPlan, step: int | None, cause: Cause, began: float, began_at: float) -> None:
        """Steps 3 to 5 of the module's docstring, and the log line; `step`: the step in
        flight (None: a replacement, which had none); `cause`: the failure, as the ledger keeps it."""
        heartbeats.current().interrupted()
        self.group.reconnect(plan.generation)
        _forget_step_in_flight(self.model, self.optimizer)
        transfer_state(plan, self.ctx.rank, self.model, self.optimizer, self.extra, self.group)
        rng_restored = self._restore_rng(plan.redo)
        self._committed, self._next = plan.resume_after, plan.redo
        seconds = time.monotonic() - began
        self.recoveries.append({"step": step, "generation": plan.generation, "source": plan.source,
                                "receivers": list(plan.receivers), "failed": list(plan.failed),
                                "resume_after": plan.resume_after, "seconds": round(seconds, 6)})
        if self.ctx.rank == ledger_writer(plan) and step is not None:
            self._unrecorded = _Unrecorded(ledger_entry(plan, step, cause, seconds, began_at, self.ctx), began)
        received = " (received it)" if self.ctx.rank in plan.receivers else ""
        log(f"peer recovery: {plan.describe()}{received}; no checkpoint read; {seconds:.3f} s"
            + ("" if rng_restored else f"; this rank's RNG states are not those of step {plan.redo}'s start "
               "(it had not begun here): its random numbers may differ from an uninterrupted run's"))

    def _restore_rng(self, redo: int) -> bool:
        """This rank's RNG states as they were when step `redo` began, where it began here."""
        from launcher.runtime.torchstate import set_rng_state

        if self._rng_at_start is None or self._rng_at_start[0] != redo:
            return False
        set_rng_state(self._rng_at_start[1])
        return True


class _Guard:
    def __init__(self, recovery: PeerRecovery, step: int) -> None:
        self.recovery, self.step = recovery, step

    def __enter__(self) -> None:
        self.recovery.begin(self.step)

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self.recovery.end()
        if exc is None:
            self.recovery.done(self.step)
            return False
        if not isinstance(exc, Exception) or isinstance(exc, PeerRecoveryImpossible):
            self.recovery.done(None)
            return False
        try:
            self.recovery.recover(self.step, exc)
        except PeerRecoveryImpossible as impossible:
            log(f"peer recovery impossible: {impossible}")
            raise impossible from exc
        return True


def ledger_writer(plan: RecoveryPlan) -> int:
    """The rank that records a recovery: the lowest that failed in its own process (its
    clock saw the failure), else the source (a lost process's replacement saw none)."""
    own = [rank for rank in plan.failed if rank not in plan.replaced]
    return min(own) if own else plan.source


# (rank, node, error) of the failure a recovery records (:func:`failure_cause`).
Cause = tuple[int, "str | None", str]


def failure_cause(plan: RecoveryPlan, reports: list[Report], ctx: RankContext) -> Cause:
    """The failure the ledger names: the lowest rank that failed in its own process (the
    rank that records it: :func:`ledger_writer`), else the lowest whose process was lost,
    as its replacement reported it, on the node its peers asked to start it again on (the
    request in peer-replace/; its peers' own errors are only their loss of it)."""
    by_rank = {report.rank: report for report in reports}
    own = [rank for rank in plan.failed if rank not in plan.replaced]
    rank = min(own) if own else min(plan.replaced, default=ctx.rank)
    if rank == ctx.rank:
        return rank, node_name(), by_rank[rank].error if rank in by_rank else ""
    request = None
    if ctx.job_id is not None:
        request = read_json(RunDir(ctx.run_dir).peer_replace_request(ctx.job_id, ctx.restart, plan.generation, rank))
    node = request.get("node") if isinstance(request, dict) and isinstance(request.get("node"), str) else None
    return rank, node, by_rank[rank].error if rank in by_rank else "process lost"


def ledger_entry(plan: RecoveryPlan, step: int, cause: Cause, recovery_s: float, failed_at: float,
                 ctx: RankContext) -> dict[str, Any]:
    """One recovery as the ledger keeps it, before its next step ended (``next_step``,
    ``next_step_at`` and ``to_next_step_s`` are filled in by :class:`_Unrecorded`).
    ``rank``, ``node``, ``error``: the failure (:func:`failure_cause`). ``lost_steps``: the
    steps done again, at most the one in flight (0 when the failure came after the update:
    the ranks go on at the next one)."""
    rank, node, error = cause
    return {"job_id": ctx.job_id, "restart": ctx.restart, "node": node, "rank": rank,
            "world_size": ctx.world_size, "generation": plan.generation, "step": step,
            "failed": list(plan.failed), "replaced": list(plan.replaced), "source": plan.source,
            "receivers": list(plan.receivers),
            "resume_after": plan.resume_after, "lost_steps": max(0, step - plan.resume_after),
            "error": error, "failed_at": iso(failed_at), "recovery_s": round(recovery_s, 6),
            "checkpoint_read": False}


@dataclass
class _Unrecorded:
    """A recovery this rank records once its next step has ended."""

    partial: dict[str, Any]
    began: float                      # time.monotonic() at the failure

    def entry(self, next_step: int | None) -> dict[str, Any]:
        ended = next_step is not None
        return {**self.partial, "next_step": next_step, "next_step_at": iso(time.time()) if ended else None,
                "to_next_step_s": round(time.monotonic() - self.began, 6) if ended else None}


def append_ledger(run_dir: str | os.PathLike[str], entry: Mapping[str, Any]) -> None:
    """`entry` as one line at the end of the run's ledger, in one write (a reader takes a
    line without its newline for one still being written); a ledger that cannot be
    written is logged."""
    line = (json.dumps(dict(entry), separators=(",", ":"), sort_keys=True) + "\n").encode()
    path = RunDir(run_dir).peer_recovery_file
    try:
        fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError as exc:
        log(f"peer recovery: not recorded in {path}: {exc.strerror or exc}")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


def exchange(store: Any, generation: int, report: Report, world_size: int,
             collect: Callable[[], None] = lambda: None,
             on_missing: Callable[[list[int], list[int]], None] = lambda present, missing: None) -> list[Report]:
    """Write this rank's report for `generation` and read every rank's, once all are there.

    A rank whose process is gone never reports: REPLACE_AFTER_S into the wait
    `on_missing(present, missing)` is called once (the ranks that reported, those that did
    not), and the wait goes on for its replacement's report. Where the launcher stops the
    job instead (its stop signal sets this rank's flag), the wait ends with it rather than
    at REPORT_WAIT_S, so the start ends as the crash it is, for the restart from a checkpoint."""
    store.set(REPORT_KEY.format(generation=generation, rank=report.rank), report.to_json())
    keys = [REPORT_KEY.format(generation=generation, rank=r) for r in range(world_size)]
    began = time.monotonic()
    deadline = began + REPORT_WAIT_S
    collected = asked = False
    while not _all_there(store, keys):
        if not collected and time.monotonic() - began > REPORT_COLLECT_AFTER_S:
            collected = True
            collect()    # a peer may still wait for this rank's old connections to close
        if not asked and time.monotonic() - began > REPLACE_AFTER_S:
            asked = True
            missing = _missing_ranks(store, keys)
            on_missing([r for r in range(world_size) if r not in missing], missing)
        # A stop asked before the failure (the time limit's warning) must not end a
        # recovery whose reports are on their way: only a wait longer than they take.
        if stopflag.raised() and time.monotonic() - began > REPORT_STOP_GRACE_S:
            raise PeerRecoveryImpossible(f"stopped while waiting for the report of {_missing(store, keys)} "
                                         "(its process is gone?)")
        if time.monotonic() > deadline:
            raise PeerRecoveryImpossible(f"no report of {_missing(store, keys)} within {REPORT_WAIT_S:g} s")
        time.sleep(REPORT_POLL_S)
    return [Report.from_json(store.get(key).decode()) for key in keys]


def _missing(store: Any, keys: list[str]) -> str:
    ranks = [str(rank) for rank in _missing_ranks(store, keys)]
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(ranks)


def _missing_ranks(store: Any, keys: list[str]) -> list[int]:
    return [rank for rank, key in enumerate(keys) if not _all_there(store, [key])]


def replacement_request(ctx: RankContext, generation: int, rank: int, seen_at: float) -> dict[str, Any]:
    """What the job controller needs to start rank `rank` again (launcher.jobcontrol.replace):
    the generation it joins, and the node and pid of its lost process, from its heartbeat
    of this start (None where it wrote none)."""
    beat = read_heartbeat(RunDir(ctx.run_dir).heartbeat(rank)) or {}
    own = str(beat.get("job_id")) == str(ctx.job_id) and beat.get("restart") == ctx.restart
    pid = beat.get("pid") if own else None
    return {"job_id": ctx.job_id, "restart": ctx.restart, "generation": generation, "rank": rank,
            "node": beat.get("node") if own else None, "pid": pid if type(pid) is int else None,
            "asked_by": ctx.rank, "lost_at": iso(seen_at), "asked_at": iso(time.time())}


def ask_replacement(ctx: RankContext, generation: int, present: list[int], missing: list[int],
                    seen_at: float) -> None:
    """The lowest rank that reported asks for each missing rank to be started again (the
    module's docstring); a request that cannot be written is logged."""
    if not present or ctx.rank != min(present) or ctx.job_id is None:
        return
    for rank in missing:
        path = RunDir(ctx.run_dir).peer_replace_request(ctx.job_id, ctx.restart, generation, rank)
        request = replacement_request(ctx, generation, rank, seen_at)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(request, sort_keys=True) + "\n")
        except OSError as exc:
            log(f"peer recovery: rank {rank} not asked to start again ({path}: {exc.strerror or exc})")
            continue
        log(f"peer recovery: no report of rank {rank} after {REPLACE_AFTER_S:g} s: its process is lost? "
            f"asked for it to be started again" + (f" on {request['node']}" if request["node"] else ""))


def replacement_unfit(model: Any) -> str | None:
    """Why a new process cannot take a lost rank's place with `model`, or None: a DDP that
    rebuilds its gradient buckets after its first step does (its peers did long ago: the
    broadcast of its new buckets would meet none of theirs)."""
    if hasattr(model, "reducer") and not getattr(model, "find_unused_parameters", True):
        return ("its DDP model rebuilds its gradient buckets after its first step, its peers' are rebuilt "
                "(DDP(find_unused_parameters=True) keeps them as first laid out)")
    return None


def _all_there(store: Any, keys: list[str]) -> bool:
    try:
        return bool(store.check(keys))
    except Exception as exc:   # the store's process (launcher.runtime.peerstore) is gone
        raise PeerRecoveryImpossible(f"the rendezvous store cannot be reached: {exc}") from exc


def _forget_step_in_flight(model: Any, optimizer: Any) -> None:
    """DDP's reducer and the gradients as if the failed step had not begun."""
    reducer = getattr(model, "reducer", None)
    if reducer is not None:
        reducer._reset_state()     # DDP's own reset for a backward that did not finish
    optimizer.zero_grad(set_to_none=True)


@dataclass(frozen=True)
class TensorSpec:
    """A tensor's place in a state sent between ranks: its index among the tensors sent."""

    index: int
    shape: tuple[int, ...]
    dtype: str
    device: str


def split_tensors(obj: Any, tensors: list) -> Any:
    """`obj` with each tensor replaced by a :class:`TensorSpec`, the tensors appended to `tensors`."""
    import torch

    if isinstance(obj, torch.Tensor):
        tensors.append(obj.detach())
        return TensorSpec(len(tensors) - 1, tuple(obj.shape), str(obj.dtype).removeprefix("torch."),
                          str(obj.device))
    if isinstance(obj, dict):
        return {k: split_tensors(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(split_tensors(v, tensors) for v in obj)
    return obj


def join_tensors(obj: Any, tensors: list) -> Any:
    """:func:`split_tensors` undone."""
    if isinstance(obj, TensorSpec):
        return tensors[obj.index]
    if isinstance(obj, dict):
        return {k: join_tensors(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(join_tensors(v, tensors) for v in obj)
    return obj


def tensor_specs(obj: Any) -> list[TensorSpec]:
    """The specs in `obj`, by index."""
    found: list[TensorSpec] = []

    def walk(o: Any) -> None:
        if isinstance(o, TensorSpec):
            found.append(o)
        elif isinstance(o, dict):
            for v in o.values():
                walk(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)

    walk(obj)
    return sorted(found, key=lambda s: s.index)


def transfer_state(plan: RecoveryPlan, rank: int, model: Any, optimizer: Any, extra: Mapping[str, Any],
                   group: Any) -> None:
    """Step 4 of the module's docstring: the source sends, each receiver loads; the other
    ranks take no part. The state's structure goes as one object, its tensors as one flat
    buffer per dtype (a message each, not one per tensor)."""
    import torch.distributed as dist

    from launcher.runtime.torchstate import unwrap

    if rank == plan.source:
        state = {"model": unwrap(model).state_dict(), "optimizer": optimizer.state_dict(),
                 "extra": {name: obj.state_dict() for name, obj in extra.items()}}
        tensors: list = []
        skeleton = split_tensors(state, tensors)
        buffers = flat_buffers(tensors)
        for receiver in plan.receivers:
            dist.send_object_list([skeleton], dst=receiver, group=group)
            for dtype in sorted(buffers):
                dist.send(buffers[dtype], dst=receiver, group=group)
        return
    if rank not in plan.receivers:
        return
    got: list = [None]
    dist.recv_object_list(got, src=plan.source, group=group)
    skeleton = got[0]
    specs = tensor_specs(skeleton)
    buffers = empty_flat_buffers(specs)
    for dtype in sorted(buffers):
        dist.recv(buffers[dtype], src=plan.source, group=group)
    state = join_tensors(skeleton, unflatten(specs, buffers))
    unwrap(model).load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    for name, obj in extra.items():
        if state["extra"].get(name):
            obj.load_state_dict(state["extra"][name])


def flat_buffers(tensors: list) -> dict:
    """dtype name -> the tensors of that dtype one after the other, flat, in index order."""
    import torch

    by_dtype: dict[str, list] = {}
    for tensor in tensors:
        by_dtype.setdefault(str(tensor.dtype).removeprefix("torch."), []).append(tensor.reshape(-1).cpu())
    return {dtype: torch.cat(parts) for dtype, parts in by_dtype.items()}


def empty_flat_buffers(specs: list[TensorSpec]) -> dict:
    """The buffers :func:`flat_buffers` sends, allocated from the specs."""
    import torch

    sizes: dict[str, int] = {}
    for spec in specs:
        sizes[spec.dtype] = sizes.get(spec.dtype, 0) + math.prod(spec.shape)
    return {dtype: torch.empty(size, dtype=getattr(torch, dtype)) for dtype, size in sizes.items()}


def unflatten(specs: list[TensorSpec], buffers: dict) -> list:
    """The tensors by index, cut out of the received buffers."""
    offsets = dict.fromkeys(buffers, 0)
    tensors = []
    for spec in specs:
        size, at = math.prod(spec.shape), offsets[spec.dtype]
        offsets[spec.dtype] = at + size
        tensors.append(buffers[spec.dtype][at:at + size].reshape(spec.shape).to(spec.device))
    return tensors
