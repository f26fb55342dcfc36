"""Per-rank logs of a run: followed as they grow, merged with a rank prefix."""

from __future__ import annotations

import codecs
import os
from pathlib import Path
from typing import Callable

from launcher.rundir.files import NotARegularFile, open_regular
from launcher.rundir.layout import RunDir
from launcher.rundir.taskspec import Placement, read_placement


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
    """Hand what a growing file gains, from where we last stopped, to `write`; the name is
    followed as tail -F follows one. A file that shrank (truncated in place) or another
    file at the path (replaced, or gone and back) is read from its beginning: the line
    the change cut short is ended first, and `notice`, when given, is told why in a few
    words. Anything but a regular file at the path is never read (a FIFO would block):
    told once, then waited out."""

    def __init__(self, path: Path, write: Callable[[str], None],
                 notice: Callable[[str], None] | None = None) -> None:
        self.path, self.write, self.notice = path, write, notice
        self.offset = 0
        self.identity: tuple[int, int] | None = None     # (device, inode) of the file read
        self.lost = False           # the file read is no longer at the path
        self.unreadable = False     # the path holds something that is not a regular file
        self.line_open = False      # what was handed on ends inside a line
        self.decoder = _decoder()

    def poll(self) -> None:
        try:
            fd = open_regular(self.path)
        except NotARegularFile:
            if not self.unreadable:
                self.unreadable = True
                self._tell("not a regular file now (a FIFO, a device or a folder): not read until a file is back")
            self.lost = self.identity is not None
            return
        except OSError:
            self.lost = self.identity is not None
            return
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(fd)
            identity = (info.st_dev, info.st_ino)
            if self.identity is not None and (self.lost or identity != self.identity):
                self._restart("replaced; following the new file from its start")
            elif info.st_size < self.offset:
                self._restart("file truncated; following it from its start")
            self.identity, self.lost, self.unreadable = identity, False, False
            f.seek(self.offset)
            data = f.read()
        if data:
            self.offset += len(data)
            self._hand_on(self.decoder.decode(data))

    def finish(self) -> None:
        """Hand on the rest of a character cut short at the end of the file."""
        self._hand_on(self.decoder.decode(b"", final=True))

    def _restart(self, why: str) -> None:
        self.finish()
        if self.line_open:
            self._hand_on("\n")        # never glued to the new content
        self.offset = 0
        self.decoder = _decoder()
        self._tell(why)

    def _hand_on(self, text: str) -> None:
        if text:
            self.write(text)
            self.line_open = not text.endswith("\n")

    def _tell(self, why: str) -> None:
        if self.notice is not None:
            self.notice(why)


def task_tag(placement: Placement, task: int, stream: str) -> str:
    """What goes before each line of a task's log: its ranks (``[r2]``; ``[node1 r2-3]``
    for a torchrun node), ``!`` for stderr."""
    return f"[{placement.label(task)}{'!' if stream == 'err' else ''}]"


def rank_tag(rank: int, stream: str) -> str:
    """What goes before each line of one worker's own log: ``[r2]``, ``[r2!]`` for stderr."""
    return f"[r{rank}{'!' if stream == 'err' else ''}]"


class RankLogs:
    """Every task log of a run as whole lines, each tagged with the task's ranks
    (:func:`task_tag`); `rank`, when given, keeps that global rank's lines: under torchrun
    its worker's own log (:func:`rank_tag`; a node's task log holds all its workers'
    lines, launcher.runtime.workerlogs), else, and for a run that has none (a torchrun
    without --log-dir), the log of the task that runs it. `poll` hands on what is new
    since the last call. A log truncated or replaced is shown again from its start after
    one `[glaunch] LOG: why` line."""

    def __init__(self, run_dir: Path, rank: int | None, echo: Callable[[str], None]) -> None:
        self.run_dir, self.echo, self.rank = RunDir(run_dir), echo, rank
        self.placement = read_placement(run_dir)
        self.task = None if rank is None else self.placement.task(rank)
        self.followers: dict[Path, LogFollower] = {}
        self.lines: dict[Path, Lines] = {}

    def _logs(self) -> list[tuple[str, Path]]:
        """(tag, path) of every log shown, in the order read."""
        if self.rank is not None and self.placement.per_node:
            own = [(rank_tag(self.rank, w.stream), w.path) for w in self.run_dir.worker_logs()
                   if self.placement.rank(w.node, w.local_rank) == self.rank]
            if own:
                return own
        return [(task_tag(self.placement, task, stream), path)
                for _, task, stream, path in self.run_dir.task_logs(self.task)]

    def poll(self) -> None:
        listed = set()
        for tag, path in self._logs():
            listed.add(path)
            if path not in self.followers:
                self.lines[path] = Lines(self._tagged(tag))
                self.followers[path] = LogFollower(path, self.lines[path], self._notice(path))
            self.followers[path].poll()
        for path, follower in self.followers.items():
            if path not in listed:
                follower.poll()         # gone for now: what comes back is another file

    def _tagged(self, tag: str) -> Callable[[str], None]:
        return lambda line: self.echo(f"{tag} {line}")

    def _notice(self, path: Path) -> Callable[[str], None]:
        return lambda why: self.echo(f"[glaunch] {path.name}: {why}")

    def flush(self) -> None:
        """Hand on each log's unfinished last line, with its rank's tag."""
        for path, follower in self.followers.items():
            follower.finish()
            self.lines[path].flush()
