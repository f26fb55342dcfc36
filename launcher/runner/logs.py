"""Per-rank logs of a run: followed as they grow, merged with a rank prefix."""

from __future__ import annotations

import codecs
import os
from pathlib import Path
from typing import Callable

from launcher.rundir.files import open_regular
from launcher.rundir.layout import RunDir


def read_from(path: Path, offset: int) -> bytes:
    """What `path` holds past `offset`; nothing when it is missing or not a regular file
    (a FIFO or device put in a run directory never blocks or floods the reader)."""
    try:
        fd = open_regular(path)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        f.seek(offset)
        return f.read()


def read_tail(path: Path, limit: int = 64 * 1024) -> bytes:
    """The last `limit` bytes of `path` (from the start of a line when cut); nothing when it
    is missing or not a regular file."""
    try:
        fd = open_regular(path)
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size <= limit:
            return f.read(limit)
        f.seek(size - limit)
        return f.read(limit).partition(b"\n")[2]


def _decoder() -> codecs.IncrementalDecoder:
    """UTF-8 read in pieces: a character cut between two reads is decoded whole."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace")


class Lines:
    """Text handed on in pieces -> whole lines, without their newline, to `echo`; `flush`
    hands on an unfinished last line."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self.echo, self.rest = echo, ""

    def __call__(self, text: str) -> None:
        *complete, self.rest = (self.rest + text).split("\n")
        for line in complete:
            self.echo(line)

    def flush(self) -> None:
        if self.rest:
            rest, self.rest = self.rest, ""
            self.echo(rest)


class LogFollower:
    """Hand what a growing file gains, from where we last stopped, to `write`. A file
    that shrank (truncated, replaced) is read again from its beginning."""

    def __init__(self, path: Path, write: Callable[[str], None]) -> None:
        self.path, self.write, self.offset = path, write, 0
        self.decoder = _decoder()

    def poll(self) -> None:
        try:
            if self.offset and os.stat(self.path).st_size < self.offset:
                self.offset = 0
                self.decoder = _decoder()
        except OSError:
            return
        data = read_from(self.path, self.offset)
        if data:
            self.offset += len(data)
            text = self.decoder.decode(data)
            if text:
                self.write(text)


class RankLogs:
    """Every task log of a run as whole lines, `[rank]` (stdout) or `[rank!]` (stderr)
    before each; `poll` hands on what is new since the last call."""

    def __init__(self, run_dir: Path, rank: int | None, echo: Callable[[str], None]) -> None:
        self.run_dir, self.rank, self.echo = RunDir(run_dir), rank, echo
        self.offsets: dict[Path, int] = {}
        self.decoders: dict[Path, codecs.IncrementalDecoder] = {}
        self.lines: dict[Path, Lines] = {}

    def poll(self) -> None:
        for _, task, stream, path in self.run_dir.task_logs(self.rank):
            data = read_from(path, self.offsets.get(path, 0))
            self.offsets[path] = self.offsets.get(path, 0) + len(data)
            if path not in self.lines:
                tag = f"[{task}]" if stream == "out" else f"[{task}!]"
                self.lines[path] = Lines(self._tagged(tag))
                self.decoders[path] = _decoder()
            self.lines[path](self.decoders[path].decode(data))

    def _tagged(self, tag: str) -> Callable[[str], None]:
        return lambda line: self.echo(f"{tag} {line}")

    def flush(self) -> None:
        """Hand on each log's unfinished last line, with its rank's tag."""
        for path, lines in self.lines.items():
            lines(self.decoders[path].decode(b"", final=True))
            lines.flush()
