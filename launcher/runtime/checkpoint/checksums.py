"""Shard checksums: CRC32C (the ``crc32c`` package, hardware-accelerated, ~10 GB/s per core)
when it is installed, else SHA-256 (~1.5 GB/s).

A manifest names the algorithm per shard, so either verifies wherever it is available.
:class:`ChecksumWriter` takes the checksum while the bytes are written, so that a
checkpoint is never read back to be checksummed.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from launcher.rundir.files import open_regular
from launcher.runtime.checkpoint.directory import CheckpointError

CHECKSUMS = ("crc32c", "sha256")     # manifest keys a shard's checksum may be under

try:
    import crc32c as _crc32c
except ImportError:   # the train extra installs it; without it shards are SHA-256'd
    _crc32c = None  # type: ignore[assignment]


def checksum_algorithm() -> str:
    """The checksum new shards get: ``"crc32c"`` when the package is installed, else ``"sha256"``."""
    return "crc32c" if _crc32c is not None else "sha256"


def can_checksum(algorithm: str) -> bool:
    """Whether shards checksummed with ``algorithm`` can be re-checked here."""
    return algorithm != "crc32c" or _crc32c is not None


class Checksum:
    """A running checksum with hashlib's ``update``/``hexdigest`` (releases the GIL on large buffers)."""

    def __init__(self, algorithm: str | None = None) -> None:
        self.algorithm = algorithm or checksum_algorithm()
        if self.algorithm == "crc32c":
            if _crc32c is None:
                raise CheckpointError("crc32c checksums need the 'crc32c' package (pip install crc32c)")
            self._crc = 0
            self._hash = None
        elif self.algorithm == "sha256":
            self._hash = hashlib.sha256()
        else:
            raise ValueError(f"unknown checksum {self.algorithm!r}")

    def update(self, data) -> None:
        if self._hash is not None:
            self._hash.update(data)
        else:
            self._crc = _crc32c.crc32c(data, self._crc)

    def hexdigest(self) -> str:
        return self._hash.hexdigest() if self._hash is not None else f"{self._crc:08x}"


def checksum_file(path: str | os.PathLike, algorithm: str | None = None, chunk: int = 1 << 22) -> str:
    """The checksum of a file's bytes, read in chunks."""
    c = Checksum(algorithm)
    buf = bytearray(chunk)
    view = memoryview(buf)
    with os.fdopen(open_regular(path), "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            c.update(view[:n])
    return c.hexdigest()


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    return checksum_file(path, "sha256", chunk)


def shard_checksum(entry: dict) -> tuple[str, str] | None:
    """``(algorithm, hex digest)`` of a manifest or marker file entry, or None if it has none."""
    for algo in CHECKSUMS:
        value = entry.get(algo)
        if isinstance(value, str):
            return algo, value
    return None


class ChecksumWriter:
    """A write-only binary file that checksums every byte as it is written.

    What ``torch.save`` and DCP's file writer need (write, tell, flush, fileno); on
    :meth:`close` the data is fsynced (unless ``sync=False``: the caller fsyncs through
    ``fileno()``), ``size`` / ``digest`` are final, and the file's pages leave the page
    cache: a checkpoint is not read back by the job that wrote it, and keeping it
    cached would only evict what training reads and make the next save reclaim memory.
    Every WRITEBACK_BYTES written are handed to the disk at once (:func:`_drop_cached`
    starts their writeback), so that the disk writes while the rest is still serialised
    and the fsync at the end finds little left to do; the same call evicts the
    WRITEBACK_BYTES handed over the time before, written by now, so that the file leaves
    the page cache as it is written (its pages are reused for the rest of it) and the
    eviction at close, which the end of a save waits for, finds little left to do.
    """

    WRITEBACK_BYTES = 32 << 20

    def __init__(self, path: str | os.PathLike, algorithm: str | None = None, *, sync: bool = True) -> None:
        self.path = Path(path)
        self.checksum = Checksum(algorithm)
        self.size = 0
        self.digest: str | None = None
        self.sync = sync
        # The file system's own error (ENOSPC, EROFS, EIO): torch.save's C++ writer turns it
        # into "unexpected pos ...", so whoever called the framework re-raises this one.
        self.error: OSError | None = None
        self._f = open(self.path, "wb")   # noqa: SIM115 - closed in close()
        self._written_back = 0   # bytes [0, _written_back) were handed to the disk
        self._evicted = 0        # bytes [0, _evicted) were asked to leave the page cache once written

    @property
    def algorithm(self) -> str:
        return self.checksum.algorithm

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        step = self.WRITEBACK_BYTES
        for start in range(0, len(view), step):   # a large write in pieces, each handed to the disk
            piece = view[start:start + step]
            self.checksum.update(piece)
            try:
                self.size += self._f.write(piece)
            except OSError as e:
                self.error = self.error or e
                raise
            if self.size - self._written_back >= step:
                self._write_back()
        return len(view)

    def _write_back(self) -> None:
        """Start the writeback of what was written since the last call, and evict what the call
        before handed to the disk (no waiting for either: pages still being written stay)."""
        try:
            self._f.flush()
        except OSError as e:
            self.error = self.error or e
            raise
        _drop_cached(self._f.fileno(), self._evicted, self.size - self._evicted)
        self._evicted, self._written_back = self._written_back, self.size

    def raise_io_error(self, exc: BaseException) -> None:
        """Raise the file system's error behind ``exc`` (a framework's wrapper of it), if there was one."""
        if self.error is not None and exc is not self.error:
            raise self.error from exc

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self._f.flush()

    def fileno(self) -> int:
        self._f.flush()   # callers fsync through it: nothing may stay in the user-space buffer
        return self._f.fileno()

    @property
    def closed(self) -> bool:
        return self._f.closed

    def close(self) -> None:
        if self._f.closed:
            return
        try:
            try:
                self._f.flush()
            except OSError as e:
                self.error = self.error or e
                raise
            if self.sync:
                os.fsync(self._f.fileno())
            _drop_cached(self._f.fileno())
        finally:
            self._f.close()
        self.digest = self.checksum.hexdigest()

    def __enter__(self) -> ChecksumWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _drop_cached(fd: int, offset: int = 0, length: int = 0) -> None:
    """Evict a written file's clean pages from the page cache; dirty ones have their
    writeback started (Linux), without waiting for it. ``length`` 0: to the end."""
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass
