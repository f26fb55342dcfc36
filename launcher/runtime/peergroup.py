"""The process group of a run with peer recovery (``recovery.peer: true``): one torch
``ProcessGroup`` whose connections a rank can close and form again while DDP, the default
group and everything else that holds the group keep holding the same object.

Why its own group: a gloo collective blocked on a peer ends only when that peer's
connections close, and gloo closes them only when its context is destroyed (in torch 2.13
``abort()`` and ``shutdown()`` of a gloo group leave them open). A rank whose step raised
must close its connections so that its peers stop waiting for it; a DDP model and the
work it keeps from its last collectives would keep the context alive. So the collectives
of this group run on an inner gloo group that only this object holds, and each
collective's work is handed out as a work made from its future (:class:`FutureWork`),
which holds nothing of the inner group: dropping the inner group (:meth:`PeerGroup.disconnect`) closes the
connections at once, a peer blocked in a collective with this rank raises at once, and
:meth:`PeerGroup.reconnect` forms the next generation's inner group over a fresh prefix
of the same store.

The store is the one the default group was created with: the TCPStore of
launcher.runtime.peerstore, in a process of its own, which outlives any rank's.

A process started to replace a lost rank (``GLAUNCH_PEER_JOIN``: the generation it joins;
launcher.jobcontrol.replace) forms no connection when it is created: its peers are in a
recovery, not in generation 0. Until it joins (:meth:`PeerGroup.reconnect`, from
:meth:`launcher.runtime.peer.PeerRecovery.steps`), the collectives the script makes before
its loop are served here, on this rank alone (:func:`_served_here`): DDP's constructor
verifies its parameters' shapes (an all-gather: every rank's shapes are this rank's) and
broadcasts the module's state from rank 0 (left as it is: the state a live peer sends
replaces it). What needs another rank's values (a point-to-point message, a gather to
another rank) cannot be served and raises.

Imported only when ``recovery.peer`` is on (it imports torch): :mod:`launcher.runtime.peer`.
"""

from __future__ import annotations

import datetime
import gc
import threading
import time
from typing import Any

import torch.distributed as dist

from launcher.rundir.rankcontext import context

BACKEND_NAME = "glaunch_peer"
# The collectives a ProcessGroup offers that gloo implements; each one is passed on.
COLLECTIVES = ("allreduce", "allreduce_coalesced", "allgather", "_allgather_base", "allgather_coalesced",
               "allgather_into_tensor_coalesced", "broadcast", "barrier", "gather", "scatter", "reduce",
               "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "alltoall",
               "alltoall_base", "send", "recv", "recv_anysource")


class PeerGroup(dist.ProcessGroup):
    """A world of ``size`` ranks whose gloo connections are formed per generation."""

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta,
                 joins: int | None = None) -> None:
        super().__init__(rank, size)   # type: ignore[call-arg]  # torch's stubs know only (store, rank, size)
        self.store = store
        self.timeout = timeout
        self._rank, self._size = rank, size
        # A replacement of a lost rank: the generation it joins; None once it has (or for any other rank).
        self.joins = joins
        self.generation = 0 if joins is None else joins - 1
        self._inner: Any = self._connect() if joins is None else None
        # The collectives passed on and not yet completed: when each was issued (monotonic).
        self._pending: dict[int, float] = {}
        self._pending_lock = threading.Lock()
        self._issued = 0

    def _connect(self) -> Any:
        prefix = dist.PrefixStore(f"glaunch-peer/{self.generation}/", self.store)
        return dist.ProcessGroupGloo(prefix, self._rank, self._size, self.timeout)

    def disconnect(self) -> None:
        """Close this rank's connections (its peers' collectives with it raise): the inner
        group goes with its last reference (see :meth:`collect`)."""
        self._inner = None
        with self._pending_lock:
            self._pending.clear()       # they end with the connections, raising

    @staticmethod
    def collect() -> None:
        """A full garbage collection, for an inner group a reference cycle still holds (a
        traceback's frames): slow (tenths of a second with torch loaded), so only when the
        peers do not answer at once."""
        gc.collect()

    def reconnect(self, generation: int) -> None:
        """Form generation `generation`'s connections: every rank of the world, collective."""
        self.generation = generation
        self._inner = self._connect()
        self.joins = None

    def size(self) -> int:
        return self._size

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def _pass_on(self, name: str, args: tuple, kwargs: dict) -> Any:
        inner = self._inner
        if inner is None and self.joins is not None:
            return _served_here(name, self._rank, self._size, self.joins, args)
        if inner is None:
            raise RuntimeError("glaunch peer group: disconnected for a recovery (Connection closed by peer)")
        return self._tracked(_detached(getattr(inner, name)(*args, **kwargs)))

    def _tracked(self, work: Any) -> Any:
        """`work`, counted as pending until its future completes (a work without a future,
        gloo's send and recv, is not counted)."""
        try:
            future = work.get_future()
        except RuntimeError:
            return work
        with self._pending_lock:
            self._issued += 1
            key = self._issued
            self._pending[key] = time.monotonic()

        def completed(_: Any) -> None:
            with self._pending_lock:
                self._pending.pop(key, None)

        future.add_done_callback(completed)
        return work

    def waiting_since(self) -> float | None:
        """Since when (time.monotonic()) this rank's oldest pending collective has waited;
        None when none is pending."""
        with self._pending_lock:
            return min(self._pending.values(), default=None)


class FutureWork(dist.Work):
    """A work that is its future: waiting on it raises what the collective raised (a peer
    gone: the connection closed). torch's own work made from a future
    (``_create_work_from_future``) returns from ``wait()`` as if the collective had
    succeeded, and a synchronous collective (``dist.all_reduce(t)``) would then go on with
    this rank's values alone."""

    def __init__(self, future: Any) -> None:
        super().__init__()
        self._future = future

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        self._future.wait()
        return True

    def get_future(self) -> Any:
        return self._future

    def is_completed(self) -> bool:
        return bool(self._future.done())


def _detached(work: Any) -> Any:
    """A work that ends with `work` but holds no reference to its group's context."""
    try:
        future = work.get_future()
    except RuntimeError:   # a work without a future (gloo's send and recv): kept as it is
        return work
    return FutureWork(future)


# What a rank that has not joined yet serves alone: the tensors stay as they are (a reduction
# over this rank, a broadcast whose state a peer's replaces) or take this rank's values.
SERVED_AS_THEY_ARE = frozenset({"allreduce", "allreduce_coalesced", "broadcast", "barrier", "reduce"})
SERVED_AS_OWN = frozenset({"allgather", "_allgather_base", "allgather_coalesced", "allgather_into_tensor_coalesced"})


def _served_here(name: str, rank: int, size: int, joins: int, args: tuple) -> Any:
    """A collective of a replacement that has not joined yet, on this rank alone (the
    module's docstring): a completed work; a RuntimeError for one that needs another rank."""
    import torch

    if name in SERVED_AS_THEY_ARE:
        result = args[0] if args and isinstance(args[0], list) else []
    elif name in ("allgather", "allgather_coalesced"):
        outputs, inputs = args[0], args[1]
        for slots, tensor in zip(outputs, inputs):
            for slot in slots:
                slot.copy_(tensor)
        result = outputs
    elif name in SERVED_AS_OWN:
        pairs = zip(args[0], args[1]) if isinstance(args[0], list) else [(args[0], args[1])]
        for output, tensor in pairs:
            output.view(size, -1).copy_(tensor.reshape(1, -1).expand(size, -1))
        result = args[0] if isinstance(args[0], list) else [args[0]]
    else:
        raise RuntimeError(f"glaunch peer group: rank {rank} replaces a lost rank and joins its peers at their "
                           f"recovery (generation {joins}), in the step loop; a {name} before it needs another "
                           "rank and cannot be served")
    future: Any = torch.futures.Future()
    future.set_result(result)
    return FutureWork(future)


def _passing_on(name: str) -> Any:
    def collective(self: PeerGroup, *args: Any, **kwargs: Any) -> Any:
        return self._pass_on(name, args, kwargs)

    collective.__name__ = name
    return collective


for _name in COLLECTIVES:
    if hasattr(dist.ProcessGroupGloo, _name):
        setattr(PeerGroup, _name, _passing_on(_name))


def _create(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> PeerGroup:
    return PeerGroup(store, rank, size, timeout, joins=context().peer_join)


def register() -> str:
    """Make ``init_process_group(backend=BACKEND_NAME)`` create a :class:`PeerGroup`; its name."""
    if BACKEND_NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu"])
    return BACKEND_NAME


def world_group() -> PeerGroup | None:
    """The default group when it is a :class:`PeerGroup`, else None."""
    if not dist.is_initialized():
        return None
    group = dist.group.WORLD
    return group if isinstance(group, PeerGroup) else None
