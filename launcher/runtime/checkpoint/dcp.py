"""torch.distributed.checkpoint (DCP) inside glaunch's staging -> commit protocol.

DCP's own ``save`` plans, writes and then gathers every rank's write results with
collectives. glaunch splits that so the writing can run off the main thread with no
collective there:

1. :func:`plan_save` (main thread, collective): DCP's planner on every rank, the
   plans gathered on rank 0, deduplicated (replicated DDP tensors are spread over the
   ranks, each to the rank with the least planned so far), scattered back.
2. :meth:`StagingPlanner.stage` (optional): this rank's planned tensors copied into
   reusable host buffers, so training may go on while they are written.
3. :func:`write_share` (any thread): DCP's file writer writes this rank's
   ``__R_0.distcp`` through :class:`ChecksumFileSystem`, which checksums every byte as
   it goes to the file; the write results travel to rank 0 in the rank's done marker
   (:func:`encode_results`), not through a collective.
4. :func:`write_metadata` (rank 0, at commit, once all markers are in): DCP's
   ``.metadata`` from every rank's results.

The directory is a plain DCP checkpoint: ``dcp.load`` (or DCP's format utilities)
read it, resharding to any world size.
"""

from __future__ import annotations

import base64
import contextlib
import pickle
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint import load as dcp_load
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.planner import SavePlan, WriteItemType

from launcher.rundir.files import fsync_dir
from launcher.runtime.checkpoint.layout import CheckpointError
from launcher.runtime.checkpoint.checksums import ChecksumWriter
from launcher.runtime.rankcontext import RankContext, is_distributed

METADATA_FILE = ".metadata"


class ChecksumFileSystem(FileSystem):
    """DCP's local filesystem, with every file opened for writing checksummed as it is written."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.written: dict[Path, tuple[int, str, str]] = {}   # path -> (size, algorithm, digest)

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        w = ChecksumWriter(path, sync=False)   # DCP fsyncs through fileno() itself
        try:
            yield w
        except Exception as e:
            w.raise_io_error(e)
            raise
        finally:
            w.close()
        with self._lock:
            self.written[Path(path)] = (w.size, w.algorithm, w.checksum.hexdigest())

    def rename(self, path, new_path) -> None:
        super().rename(path, new_path)
        with self._lock:
            if Path(path) in self.written:
                self.written[Path(new_path)] = self.written.pop(Path(path))


class ChecksummingWriter(FileSystemWriter):
    """DCP's FileSystemWriter (one fsynced file per rank and thread) over :class:`ChecksumFileSystem`."""

    def __init__(self, path: str | Path, *, thread_count: int = 1) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=True, thread_count=thread_count,
                         overwrite=True)
        self._checksums = ChecksumFileSystem()
        self.fs = self._checksums

    @property
    def written(self) -> dict[Path, tuple[int, str, str]]:
        return dict(self._checksums.written)


class HostBuffers:
    """Host copies of one rank's planned tensors, kept between saves so that staging is a plain
    copy (no page faults on fresh memory); pinned when the tensors live on a GPU."""

    def __init__(self) -> None:
        self._buffers: dict = {}

    def copy(self, plan_items, resolve) -> dict:
        staged, keep = {}, {}
        cuda = False
        for item in plan_items:
            data = resolve(item)
            if item.type == WriteItemType.BYTE_IO:
                staged[item.index] = data         # already a serialized snapshot (BytesIO)
                continue
            t = data.detach()
            buf = self._buffers.get(item.index)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=t.is_cuda)
            buf.copy_(t, non_blocking=t.is_cuda)
            cuda = cuda or t.is_cuda
            staged[item.index] = keep[item.index] = buf
        if cuda:
            torch.cuda.synchronize()
        self._buffers = keep
        return staged

    def clear(self) -> None:
        self._buffers = {}


class StagingPlanner(DefaultSavePlanner):
    """DCP's default save planner; after :meth:`stage` it serves this rank's data from host copies."""

    def __init__(self) -> None:
        super().__init__()
        self._staged: dict | None = None

    def stage(self, plan: SavePlan, buffers: HostBuffers) -> None:
        self._staged = buffers.copy(plan.items, super().resolve_data)

    def resolve_data(self, write_item):
        if self._staged is not None:
            return self._staged[write_item.index]
        return super().resolve_data(write_item)


@dataclass
class _PlanFailure:
    rank: int
    error: str


def plan_save(state_dict: dict, writer: ChecksummingWriter, planner: StagingPlanner, ctx: RankContext,
              local_error: BaseException | None = None):
    """Collective: DCP's save planning. Returns ``(this rank's final plan, global metadata or None)``.

    The metadata is rank 0's only. A failure on any rank (``local_error`` included) raises
    :class:`CheckpointError` on every rank.
    """
    is_main = ctx.rank == 0
    mine: object
    if local_error is not None:
        mine = _PlanFailure(ctx.rank, f"{type(local_error).__name__}: {local_error}")
    else:
        try:
            planner.set_up_planner(state_dict=state_dict, storage_meta=writer.storage_meta(),
                                   is_coordinator=is_main)
            writer.set_up_storage_writer(is_main, rank=ctx.rank, use_collectives=True)
            mine = writer.prepare_local_plan(planner.create_local_plan())
        except Exception as e:   # every rank must learn about it
            mine = _PlanFailure(ctx.rank, f"{type(e).__name__}: {e}")
    distributed = ctx.world_size > 1 and is_distributed()
    gathered: list = [None] * ctx.world_size if is_main else []
    if distributed:
        dist.gather_object(mine, gathered if is_main else None, dst=0)
    else:
        gathered = [mine]
    replies: list = []
    metadata = None
    if is_main:
        failed = [g for g in gathered if isinstance(g, _PlanFailure)]
        if failed:
            replies = [failed[0]] * ctx.world_size
        else:
            try:
                plans, metadata = planner.create_global_plan(gathered)
                replies = writer.prepare_global_plan(plans)
            except Exception as e:   # sent to every rank instead of a plan
                replies = [_PlanFailure(0, f"{type(e).__name__}: {e}")] * ctx.world_size
    if distributed:
        out: list = [None]
        dist.scatter_object_list(out, replies if is_main else None, src=0)
        reply = out[0]
    else:
        reply = replies[0]
    if isinstance(reply, _PlanFailure):
        raise CheckpointError(f"planning the checkpoint failed on rank {reply.rank}: {reply.error}")
    return planner.finish_plan(reply), metadata


def write_share(plan: SavePlan, planner: StagingPlanner, writer: ChecksummingWriter, *,
                skip_zip_crc32: bool = False) -> list:
    """Write this rank's planned items (no collective); returns DCP's write results.

    DCP stores each tensor with ``torch.save``, whose zip records carry a CRC-32 that
    costs several times the write itself on the CPU; the CRC32C taken while writing
    already covers every byte. ``skip_zip_crc32`` turns torch's off for the duration
    (``torch.serialization.set_crc32_options``, a process-wide switch, so only where no
    other thread may be saving: the blocking path). ``torch.load`` reads either.
    """
    previous = torch.serialization.get_crc32_options()
    if skip_zip_crc32:
        torch.serialization.set_crc32_options(False)
    try:
        fut = writer.write_data(plan, planner)
        fut.wait()
        return fut.value()
    finally:
        if skip_zip_crc32:
            torch.serialization.set_crc32_options(previous)


def encode_results(results: list) -> str:
    """DCP's write results of one rank, as text for its done marker (rank 0 reads them at commit)."""
    return base64.b64encode(pickle.dumps(results, protocol=pickle.HIGHEST_PROTOCOL)).decode("ascii")


def decode_results(text: str) -> list:
    return pickle.loads(base64.b64decode(text.encode("ascii")))


def write_metadata(writer: ChecksummingWriter, metadata, all_results: list[list]) -> tuple[Path, tuple]:
    """Rank 0: DCP's ``.metadata`` from every rank's write results; ``(path, (size, algo, digest))``."""
    writer.finish(metadata=metadata, results=all_results)
    path = Path(writer.path) / METADATA_FILE
    fsync_dir(writer.path)
    try:
        return path, writer.written[path]
    except KeyError:
        raise CheckpointError(f"DCP wrote no {path}") from None


def load(state_dict: dict, path: str | Path, ctx: RankContext, *, allow_partial: bool = False) -> None:
    """``dcp.load`` into ``state_dict`` in place (collective when distributed), resharding as needed."""
    no_dist = not (ctx.world_size > 1 and is_distributed())
    with warnings.catch_warnings():
        if no_dist:   # DCP warns that it assumes a single process: that is what was asked for
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp_load(state_dict, storage_reader=FileSystemReader(path),
                 planner=DefaultLoadPlanner(allow_partial_load=allow_partial), no_dist=no_dist)


def saved_keys(path: str | Path) -> set[str]:
    """The top-level keys of the state dict saved in a DCP directory (``{"model", "optimizer", ...}``)."""
    md = FileSystemReader(path).read_metadata()
    return {k.split(".", 1)[0] for k in md.state_dict_metadata}
