"""torch.distributed.checkpoint (DCP) inside glaunch's staging -> commit protocol.

DCP's own ``save`` plans, writes and then gathers every rank's write results with
collectives. glaunch splits that so the writing can run off the main thread with no
collective there:

1. :func:`plan_save` (main thread, collective): DCP's planner on every rank, the
   plans gathered on rank 0, deduplicated (replicated DDP tensors are spread over the
   ranks, each to the rank with the least planned so far), scattered back; or, when no
   rank's local plan changed since the last planning, that planning again (one all_reduce).
2. :meth:`StagingPlanner.stage` (optional): this rank's planned tensors copied into
   reusable host buffers, so training may go on while they are written.
3. :func:`write_share` (any thread): DCP's file writer writes this rank's
   ``__R_0.distcp`` (``__R_0`` to ``__R_{N-1}``, in N threads: :func:`io_threads`, the
   rank's share of the node's cores, at most MAX_IO_THREADS) through
   :class:`ChecksumFileSystem`, which checksums every byte as it goes to the file; the
   write results travel to rank 0 in the rank's done marker
   (:func:`encode_results`), not through a collective.
4. :func:`write_metadata` (rank 0, at commit, once all markers are in): DCP's
   ``.metadata`` from every rank's results.

The directory is a plain DCP checkpoint: ``dcp.load`` (or DCP's format utilities)
read it, resharding to any world size.

Loading on resume (:class:`VerifyingReader`) reads each data file once: the bytes
``torch.load`` decodes are checksummed as they arrive, what it skips or reads out of
order (zip headers, a few hundred bytes a tensor) is read again in order, and no tensor
reaches the state dict before every file read, on every rank, matched its manifest
checksum. A rank reads its files in parallel, in as many threads as it writes them.
Files no rank needed are re-checksummed, spread over the ranks.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import io
import os
import pickle
import threading
import warnings
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import torch
import torch.distributed as dist
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint import load as dcp_load
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.planner import LoadItemType, SavePlan, WriteItemType

from launcher.rundir.files import open_regular
from launcher.rundir.rankcontext import RankContext, log
from launcher.runtime.checkpoint import checksums
from launcher.runtime.checkpoint.directory import CheckpointDamaged, CheckpointError
from launcher.runtime.checkpoint.checksums import ChecksumWriter
from launcher.runtime.checkpoint.verify import verify_share
from launcher.runtime.distributed import all_reduce_max, is_distributed

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


# A rank writes its share as this many files, in as many threads, and reads them back in
# parallel: its share of the node's cores, at most MAX_IO_THREADS.
MAX_IO_THREADS = 4


def io_threads(ctx: RankContext) -> int:
    """The files (and threads) a rank writes its share of a checkpoint as: the cores it is
    bound to (Slurm's --cpus-per-task), or its share of the node's when it is bound to all."""
    node = os.cpu_count() or 1
    mine = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else node
    cores = mine // max(1, ctx.local_world_size) if mine >= node else mine
    return max(1, min(MAX_IO_THREADS, cores))


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


@dataclass
class _Planned:
    """A planning all ranks went through together: this rank's local plan, the final plan it
    got back and, on rank 0, the global metadata."""

    rank: int
    world_size: int
    local: SavePlan
    final: SavePlan
    metadata: Any


# The last planning that succeeded (every rank keeps its own): reused while no rank's local
# plan differs from the one it sent then, since the global plan is made from those alone.
_last_planned: _Planned | None = None


def plan_save(state_dict: dict, writer: ChecksummingWriter, planner: StagingPlanner, ctx: RankContext,
              local_error: BaseException | None = None):
    """Collective: DCP's save planning. Returns ``(this rank's final plan, global metadata or None)``.

    The metadata is rank 0's only. A failure on any rank (``local_error`` included) raises
    :class:`CheckpointError` on every rank. When every rank's local plan equals the one it
    sent at the last planning (the same tensors, shapes and dtypes: a training loop's saves),
    one all_reduce says so and the final plans and metadata of then are used again; only
    otherwise do the plans travel to rank 0 and back (several collectives each way).
    """
    global _last_planned
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
    last = _last_planned
    same = (last is not None and (last.rank, last.world_size) == (ctx.rank, ctx.world_size)
            and isinstance(mine, SavePlan) and mine == last.local)
    if distributed:
        same = all_reduce_max([0 if same else 1])[0] == 0
    if same and last is not None:
        # writer.finish sets fields of the metadata: the kept one stays as planned
        return planner.finish_plan(last.final), copy.copy(last.metadata) if is_main else None
    _last_planned = None
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
    if isinstance(mine, SavePlan):   # no rank failed, so neither did this one
        _last_planned = _Planned(ctx.rank, ctx.world_size, mine, reply, metadata)
    return planner.finish_plan(reply), copy.copy(metadata)


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
    """Rank 0: DCP's ``.metadata`` from every rank's write results; ``(path, (size, algo, digest))``.

    Not fsynced here: the commit makes it durable together with the manifest."""
    writer.sync_files = False   # the data files are written by now; this is for the .metadata only
    writer.finish(metadata=metadata, results=all_results)
    path = Path(writer.path) / METADATA_FILE
    try:
        return path, writer.written[path]
    except KeyError:
        raise CheckpointError(f"DCP wrote no {path}") from None


class FillingLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, told which tensors of the state dict are uninitialised
    placeholders (``replaceable``): :meth:`take` puts a tensor read whole in the state dict
    in place of such a one instead of copying it there, which saves a copy of its bytes and
    the first touch of the placeholder's fresh memory (as much time as reading them).
    :class:`VerifyingReader` asks it; a shard of a placeholder, a DTensor or a tensor of
    another dtype or device is copied as usual."""

    def __init__(self, replaceable: Collection = (), **kwargs) -> None:
        super().__init__(**kwargs)
        self._replaceable = {id(t): t for t in replaceable}   # held: their ids stay theirs

    def take(self, read_item, value: torch.Tensor) -> bool:
        """Whether ``value`` (what ``read_item`` read) took its target's place in the state dict."""
        target = self.lookup_tensor(read_item.dest_index)
        if (id(target) not in self._replaceable or type(target) is not torch.Tensor
                or type(value) is not torch.Tensor or any(read_item.dest_offsets)
                or (value.shape, value.dtype, value.device) != (target.shape, target.dtype, target.device)):
            return False
        fqn = read_item.dest_index.fqn
        self.state_dict[fqn] = value
        if self.flatten_state_dict:   # the nested dict the caller holds, by the flattened key's path
            *parents, last = self.mappings[fqn]
            container: Any = self.original_state_dict   # dicts and lists along the path
            for key in parents:
                container = container[key]
            container[last] = value
        return True


def load(state_dict: dict, path: str | Path, ctx: RankContext, *, allow_partial: bool = False,
         reader: FileSystemReader | None = None, replaceable: Collection = ()) -> None:
    """``dcp.load`` into ``state_dict`` in place (collective when distributed), resharding as needed.

    ``replaceable``: tensors of ``state_dict`` that are uninitialised placeholders, which a
    :class:`VerifyingReader` replaces rather than fills where it reads them whole
    (:class:`FillingLoadPlanner`). :class:`CheckpointDamaged` on every rank when a
    :class:`VerifyingReader` refused the files.
    """
    no_dist = not (ctx.world_size > 1 and is_distributed())
    with warnings.catch_warnings():
        if no_dist:   # DCP warns that it assumes a single process: that is what was asked for
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        try:
            dcp_load(state_dict, storage_reader=reader or FileSystemReader(path),
                     planner=FillingLoadPlanner(replaceable, allow_partial_load=allow_partial), no_dist=no_dist)
        except CheckpointException as e:   # DCP's wrapper of every rank's error (a BaseException)
            if isinstance(reader, VerifyingReader) and reader.refused is not None:
                raise CheckpointDamaged(f"{Path(path).parent}: {reader.refused}") from e
            raise


def _read_ahead(fd: int, size: int) -> None:
    """Ask the kernel to read the whole file in, in the background: ``torch.load`` of each
    item reads its zip directory at the item's end before its data at the start, a jump
    back that ends the kernel's own sequential read-ahead at every item."""
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, size, os.POSIX_FADV_WILLNEED)


class _OnceReadFile:
    """A data file read once, in order, for its checksum: the large reads ``torch.load``
    makes into its tensors' memory are checksummed there; every byte before them that was
    not (headers, gaps between items, the rest of the file) is read again for it."""

    LARGE = 1 << 16   # smaller reads are re-read when the checksum reaches them

    def __init__(self, fd: int, algorithm: str | None) -> None:
        self.fd = fd
        self.checksum = checksums.Checksum(algorithm) if algorithm else None
        self.done = 0   # bytes [0, done) are in the checksum
        self._buf = memoryview(bytearray(1 << 20))

    def readinto_at(self, pos: int, b) -> int:
        view = memoryview(b).cast("B")
        n = os.preadv(self.fd, [view], pos)
        if self.checksum is not None and n >= self.LARGE and pos + n > self.done:
            self.catch_up(pos)
            self.checksum.update(view[self.done - pos:n])
            self.done = pos + n
        return n

    def catch_up(self, pos: int) -> None:
        """Checksum [done, pos), read from the file."""
        while self.checksum is not None and self.done < pos:
            n = os.preadv(self.fd, [self._buf[:min(len(self._buf), pos - self.done)]], self.done)
            if n <= 0:
                raise CheckpointError(f"file ended at byte {self.done}, before {pos}")
            self.checksum.update(self._buf[:n])
            self.done += n


class _ItemView(io.RawIOBase):
    """One item's byte range of a :class:`_OnceReadFile`, as the seekable file ``torch.load`` wants."""

    def __init__(self, file: _OnceReadFile, offset: int, length: int) -> None:
        super().__init__()
        self.file, self.offset, self.length, self.pos = file, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.length}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readall(self) -> bytes:
        buf = bytearray(max(0, self.length - self.pos))
        return bytes(buf[:self.readinto(buf)])

    def readinto(self, b) -> int:
        view = memoryview(b).cast("B")[:max(0, self.length - self.pos)]
        got = 0
        while got < len(view):
            n = self.file.readinto_at(self.offset + self.pos + got, view[got:])
            if n <= 0:
                break
            got += n
        self.pos += got
        return got


class VerifyingReader(FileSystemReader):
    """DCP's FileSystemReader that checks each data file it reads against its manifest
    checksum while reading it once (see the module docstring).

    ``expected`` maps a data file's name inside the DCP dir to its manifest entry (``path``
    relative to the checkpoint, ``size``, checksum); other files are read unchecked (their
    checksums were checked before, or cannot be here). A file is read whole even where the
    rank needs part of it (resharding). The decoded tensors are held, as ``torch.load`` of
    the whole state holds them, until the ranks agree (two small all_reduces, inside the
    read step every rank takes) that every expected file matched; otherwise ``refused``
    says why, :func:`load` raises :class:`CheckpointDamaged` on every rank, and the state
    dict is untouched.
    """

    def __init__(self, path: str | Path, expected: dict[str, dict], ctx: RankContext) -> None:
        super().__init__(path)
        self.expected = expected
        self.ctx = ctx
        self.refused: str | None = None

    def read_data(self, plan, planner):
        staged: list = []
        read: set[str] = set()
        why = None
        try:
            per_file: dict[str, list] = {}
            for item in plan.items:
                per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
            # The files in parallel, in this rank's share of the node's cores (io_threads),
            # each read once, in order, for its own checksum.
            with ThreadPoolExecutor(max_workers=max(1, min(io_threads(self.ctx), len(per_file)))) as pool:
                done = list(pool.map(lambda file: self._read_file(*file), per_file.items()))
            for rel, (why_not, decoded) in zip(per_file, done):
                why = why or why_not
                if why_not is None:
                    read.add(rel)
                    staged.extend(decoded)
        except Exception as e:   # every rank must learn about it before anything is committed
            why = f"{type(e).__name__}: {e}"
        names = sorted(self.expected)
        distributed = self.ctx.world_size > 1 and is_distributed()
        seen = all_reduce_max([int(n in read) for n in names]) if distributed else [int(n in read) for n in names]
        if why is None:
            why = self._check_unread([n for n, s in zip(names, seen) if not s], distributed)
        bad = all_reduce_max([int(why is not None)])[0] if distributed else int(why is not None)
        if bad:
            if why is not None:
                log(f"checkpoint {Path(self.path).parent}: {why}")
            self.refused = why or "a data file failed on another rank"
            raise CheckpointError(self.refused)
        for item, value in staged:
            if item.type == LoadItemType.BYTE_IO:
                planner.load_bytes(item, value)
                continue
            if isinstance(planner, FillingLoadPlanner) and planner.take(item, value):
                continue
            target = planner.resolve_tensor(item).detach()
            if target.size() != value.size():
                raise CheckpointError(f"item {item.storage_index}: size {tuple(value.size())} in the checkpoint, "
                                      f"{tuple(target.size())} in the state dict")
            target.copy_(value)
            planner.commit_tensor(item, target)
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(None)
        return fut

    def _read_file(self, rel: str, items: list) -> tuple[str | None, list]:
        """(why the file does not match its entry, or None; ``items`` of the file decoded)."""
        staged: list = []
        entry = self.expected.get(rel)   # None: checked before the load, or not checkable here
        fd = open_regular(Path(self.path) / rel)
        try:
            size, (algo, digest) = os.fstat(fd).st_size, (None, "")
            _read_ahead(fd, size)
            if entry is not None:
                if size != int(entry["size"]):
                    return f"shard {entry['path']} has {size} bytes, manifest says {entry['size']}", staged
                algo, digest = checksums.shard_checksum(entry) or ("", "")
            f = _OnceReadFile(fd, algo)
            try:
                self._decode(f, rel, items, staged)
            except Exception:
                # Bytes that do not decode: a damaged file says so by its checksum.
                if entry is not None and algo and checksums.checksum_file(Path(self.path) / rel, algo) != digest:
                    return f"shard {entry['path']} {algo} mismatch", staged
                raise
            f.catch_up(size)
            if entry is not None and f.checksum is not None and f.checksum.hexdigest() != digest:
                return f"shard {entry['path']} {f.checksum.algorithm} mismatch", staged
        finally:
            os.close(fd)
        return None, staged

    def _decode(self, f: _OnceReadFile, rel: str, items: list, staged: list) -> None:
        """``items`` of one file, in the file's order, decoded into ``staged``."""
        for item in sorted(items, key=lambda i: self.storage_data[i.storage_index].offset):
            info = self.storage_data[item.storage_index]
            if info.transform_descriptors:
                raise CheckpointError(f"{rel}: stream transforms {info.transform_descriptors} are not supported")
            view = _ItemView(f, info.offset, info.length)
            if item.type == LoadItemType.BYTE_IO:
                staged.append((item, io.BytesIO(view.read())))
            else:
                tensor = torch.load(cast(IO[bytes], view), map_location="cpu", weights_only=True)
                staged.append((item, narrow_tensor_by_index(tensor, item.storage_offsets, item.lengths)))
            f.catch_up(info.offset + info.length)

    def _check_unread(self, names: list[str], distributed: bool) -> str | None:
        """Re-checksum this rank's share of the expected files no rank read."""
        entries = [dict(self.expected[n], name=n) for n in names]
        mine = verify_share(entries, self.ctx.rank, self.ctx.world_size) if distributed else entries
        for entry in mine:
            algo, digest = checksums.shard_checksum(entry) or ("", "")
            try:
                if checksums.checksum_file(Path(self.path) / entry["name"], algo) != digest:
                    return f"shard {entry['path']} {algo} mismatch"
            except OSError as e:
                return f"shard {entry['path']} unreadable ({e.strerror or e})"
        return None


def read_metadata(path: str | Path):
    """DCP's ``.metadata`` of a DCP directory: every saved entry with its shape and dtype."""
    return FileSystemReader(path).read_metadata()


def saved_keys(metadata) -> set[str]:
    """The top-level keys of the state dict saved (``{"model", "optimizer", ...}``), from :func:`read_metadata`."""
    return {k.split(".", 1)[0] for k in metadata.state_dict_metadata}
