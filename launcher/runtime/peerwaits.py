"""How long a rank waits for its peers inside the training's own collectives.

In synchronous data parallel a rank that is slow in its data, forward or backward pass
holds its peers up inside the gradient collectives, and every rank's step takes as long as
the slowest's. The heartbeats (launcher.runtime.heartbeats) take what is measured here off
each rank's step: its busy time is then its own work, and the slow-node report
(launcher.jobcontrol.watchdog.SlowRanks) names the rank that is slow wherever in its step it
is slow. Nothing is added to the step: no collective and no synchronisation, only a clock
read (CPU) or a CUDA event (GPU, the device's own timing) around collectives the training
makes anyway.

DDP (:func:`time_peer_waits` of a DistributedDataParallel model): a communication hook
(``register_comm_hook``) runs DDP's default all-reduce of each gradient bucket. A rank
hands its buckets over as its backward pass produces them and computes on; it waits only
at the end of its backward pass, for the buckets still in flight. The wait runs from when
it handed over the step's last bucket (its own backward is done) to when the last of the
step's all-reduces completed: on the CPU (gloo) wall time, as the futures complete; on
CUDA, between events on the streams of the training's computation, read at a later beat
once the device has passed them. A slow rank hands its last bucket over last and barely
waits; its peers wait for it.

FSDP2 (:func:`time_peer_waits` of a model ``fully_shard`` sharded;
launcher.runtime.fsdp.shard does it): every FSDP module's all-gather and reduce-scatter go
through ``set_custom_all_gather`` / ``set_custom_reduce_scatter`` with torch's default
collective, timed: on the CPU the wall time of the blocking call, on CUDA events around it
on its own stream. A collective counts whole: the transfer, which every rank has alike, and
the wait for the peers, which only the ranks that came first have. An all-gather the
script makes asynchronous (``unshard(async_op=True)``) counts only its launch.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from typing import Any, Iterator

from launcher.rundir.rankcontext import log
from launcher.runtime import heartbeats


class PeerWaits:
    """This process's waits for its peers, until the next beat takes them (:meth:`take`).
    Collectives complete on other threads: every change holds the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds = 0.0
        self._events: deque[tuple[Any, Any]] = deque()   # CUDA (start, end) pairs not yet read

    def add(self, seconds: float) -> None:
        with self._lock:
            self._seconds += max(0.0, seconds)

    def add_events(self, start: Any, end: Any) -> None:
        with self._lock:
            self._events.append((start, end))

    def take(self) -> float:
        """The seconds waited since the last call: the CPU's, and the CUDA spans the device
        has finished (one it has not stays for a later call)."""
        with self._lock:
            seconds, self._seconds = self._seconds, 0.0
            while self._events and self._events[0][1].query():
                start, end = self._events.popleft()
                seconds += start.elapsed_time(end) / 1000.0
        return seconds

    @contextlib.contextmanager
    def timing(self, tensor: Any) -> Iterator[None]:
        """Around a collective on `tensor`: its wall time on the CPU, events on its stream
        on CUDA."""
        if not getattr(tensor, "is_cuda", False):
            began = time.monotonic()
            try:
                yield
            finally:
                self.add(time.monotonic() - began)
            return
        start, end = _cuda_event(), _cuda_event()
        start.record()
        try:
            yield
        finally:
            end.record()
            self.add_events(start, end)


def _cuda_event() -> Any:
    import torch

    return torch.cuda.Event(enable_timing=True)


_waits: PeerWaits | None = None


def waits() -> PeerWaits:
    """This process's waits, a wait source of its heartbeats from the first call."""
    global _waits
    if _waits is None:
        _waits = PeerWaits()
        heartbeats.current().add_wait_source(_waits.take)
    return _waits


class BucketTail:
    """One DDP model's end-of-backward wait (the module's docstring): the step's buckets in
    flight, and when (CPU: a monotonic time) or where (CUDA: an event) the last one was
    handed over."""

    def __init__(self, group: Any, into: PeerWaits) -> None:
        self.group, self.into = group, into
        self._lock = threading.Lock()
        self._in_flight = 0
        self._tail: Any = None

    def handed_over(self, tensor: Any, *, last: bool) -> None:
        with self._lock:
            self._in_flight += 1
            if last:
                self._tail = _recorded_event() if getattr(tensor, "is_cuda", False) else time.monotonic()

    def completed(self) -> None:
        with self._lock:
            self._in_flight -= 1
            if self._in_flight > 0 or self._tail is None:
                return
            tail, self._tail = self._tail, None
        if isinstance(tail, float):
            self.into.add(time.monotonic() - tail)
        else:
            self.into.add_events(tail, _recorded_event())


def _recorded_event() -> Any:
    event = _cuda_event()
    event.record()
    return event


def ddp_hook(tail, bucket):
    """DDP's communication hook: the default all-reduce of `bucket` (its mean over the
    ranks), its hand-over and completion noted in `tail`. Unannotated: DDP refuses a hook
    whose annotations are not torch's own types."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    tail.handed_over(bucket.buffer(), last=bucket.is_last())
    future = allreduce_hook(tail.group, bucket)

    def done(fut):
        tail.completed()
        return fut.value()

    return future.then(done)


def time_peer_waits(model: Any) -> Any:
    """Measure how long this rank waits for its peers in `model`'s collectives (a
    DistributedDataParallel model, or one with FSDP2 modules), for its busy time; returns
    `model`. Before the first backward pass; a DDP model with a communication hook of its
    own keeps it and is not timed (DDP takes one hook)."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        try:
            model.register_comm_hook(BucketTail(model.process_group, waits()), ddp_hook)
        except RuntimeError as exc:
            log(f"waits for peers not timed: {exc}")
        return model
    _time_fsdp(model)
    return model


def _time_fsdp(model: Any) -> None:
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter
    except ImportError:      # a torch without FSDP2's custom collectives
        log("waits for peers not timed: this torch's FSDP2 takes no custom collectives")
        return
    into = waits()

    class TimedAllGather(DefaultAllGather):
        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, async_op: bool = False) -> Any:
            with into.timing(output_tensor):
                return super().__call__(output_tensor=output_tensor, input_tensor=input_tensor, group=group,
                                        async_op=async_op)

    class TimedReduceScatter(DefaultReduceScatter):
        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any, async_op: bool = False) -> Any:
            with into.timing(output_tensor):
                return super().__call__(output_tensor=output_tensor, input_tensor=input_tensor, group=group, op=op,
                                        async_op=async_op)

    for module in model.modules():
        if isinstance(module, FSDPModule):
            try:
                module.set_custom_all_gather(TimedAllGather())
                module.set_custom_reduce_scatter(TimedReduceScatter())
            except (AttributeError, ValueError) as exc:     # an older torch; several parameter groups
                log(f"waits for peers not timed in {type(module).__name__}: {exc}")
