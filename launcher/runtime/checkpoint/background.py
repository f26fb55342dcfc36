"""Background checkpoint saves: at most one in flight per process.

``save_torch_state(..., blocking=False)`` plans the save (a collective, main thread),
copies this rank's share to host memory and hands the rest to one thread: writing
and checksumming the files, the done marker, and on rank 0 the commit, which waits
for the other ranks' markers *as files* in the staging dir. That thread makes no
collective call (gloo and NCCL are not safe to drive from two threads on one process
group), so the ranks agree on the outcome in :func:`wait_checkpoints`, on the main
thread: called by the next save, by a stop, or by the script.

The thread is not a daemon: a script that returns while its last save is still being
written exits only once the files are written and, on rank 0, committed. It never
writes the rank's heartbeat (its writer is the main thread's): while it writes, the
loop's steps beat, and only waiting for it is a save to the watchdog.
"""

from __future__ import annotations

import threading
from pathlib import Path

from launcher.rundir.rankcontext import RankContext, context, log
from launcher.runtime import heartbeats
from launcher.runtime.checkpoint.commit import agree, discard_staging
from launcher.runtime.checkpoint.directory import Checkpoint, CheckpointError
from launcher.runtime.checkpoint.verify import read_manifest
from launcher.runtime.distributed import is_distributed

_lock = threading.Lock()
_pending: PendingCheckpoint | None = None


class PendingCheckpoint:
    """A save running in the background. ``path`` is where it will be once committed.

    :func:`wait_checkpoints` (collective) is how every rank learns that it was committed;
    :meth:`result` waits for this rank's own part only.
    """

    def __init__(self, step: int, path: Path, work) -> None:
        self.step = step
        self.path = path
        self.error: str | None = None
        self._work = work
        self._thread = threading.Thread(target=self._run, name=f"glaunch-checkpoint-{step}", daemon=False)

    def __repr__(self) -> str:
        return f"PendingCheckpoint(step={self.step}, path={str(self.path)!r}, done={self.done()})"

    def _run(self) -> None:
        try:
            self.error = self._work()
        except BaseException as e:   # reported at the next wait
            self.error = f"{type(e).__name__}: {e}"
        if self.error is not None:
            log(f"background checkpoint of step {self.step} failed: {self.error}")

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float | None = None) -> Checkpoint:
        """Wait for this rank's part (no collective); the checkpoint once rank 0 committed it."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the checkpoint of step {self.step} is still being written")
        if self.error is not None:
            raise CheckpointError(f"step {self.step}: {self.error}")
        manifest, why = read_manifest(self.path)
        if manifest is None:
            raise CheckpointError(f"step {self.step}: {self.path} is not committed ({why})")
        return Checkpoint(step=self.step, path=self.path, manifest=manifest)


def start(step: int, path: Path, work) -> PendingCheckpoint:
    """Run ``work()`` (returns None, or this rank's error as text) in the background slot."""
    global _pending
    with _lock:
        if _pending is not None:
            raise CheckpointError(f"the checkpoint of step {_pending.step} is still in flight; "
                                  "wait_checkpoints() first")
        job = PendingCheckpoint(step, path, work)
        _pending = job
    job._thread.start()
    return job


def in_flight() -> PendingCheckpoint | None:
    """The background save not yet waited for, if any."""
    return _pending


def wait_checkpoints(ctx: RankContext | None = None) -> Checkpoint | None:
    """Collective: wait for the background save in flight, if any, and agree on its outcome.

    Returns the committed :class:`Checkpoint` on every rank, or None when nothing was in
    flight; raises :class:`CheckpointError` on every rank when any rank's part or the
    commit failed. Call it on every rank (the next save and a stop call it for you).
    Once torch.distributed is shut down it only waits for this rank's part. The
    heartbeat says ``saving`` meanwhile: the loop waits for the save.
    """
    global _pending
    with _lock:
        job, _pending = _pending, None
    if job is None:
        return None
    ctx = ctx or context()
    with heartbeats.saving(job.step):
        job._thread.join()
        if ctx.world_size > 1 and is_distributed():
            return agree(ctx, job.step, job.path, job.error)
        try:
            return job.result()
        except CheckpointError:
            if ctx.world_size == 1:   # else other ranks may still be writing into it
                discard_staging(ctx, job.path.parent, job.step)
            raise
