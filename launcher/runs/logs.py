"""Per-rank logs of a run: followed as they grow, merged with a rank prefix."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .layout import RunDir


class LogFollower:
    """Hand what a growing file gains, from where we last stopped, to `write`."""

    def __init__(self, path: Path, write: Callable[[str], None]) -> None:
        self.path, self.write, self.offset = path, write, 0

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        if data:
            self.offset += len(data)
            self.write(data.decode(errors="replace"))


class RankLogs:
    """Every task log of a run as whole lines, `[rank]` (stdout) or `[rank!]` (stderr)
    before each; `poll` hands on what is new since the last call."""

    def __init__(self, run_dir: Path, rank: int | None, echo: Callable[[str], None]) -> None:
        self.run_dir, self.rank, self.echo = RunDir(run_dir), rank, echo
        self.offsets: dict[Path, int] = {}
        self.pending: dict[Path, str] = {}

    def poll(self) -> None:
        for _, task, stream, path in self.run_dir.task_logs(self.rank):
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            self.offsets[path] = self.offsets.get(path, 0) + len(data)
            text = self.pending.pop(path, "") + data.decode(errors="replace")
            *complete, rest = text.split("\n")
            if rest:
                self.pending[path] = rest
            tag = f"[{task}]" if stream == "out" else f"[{task}!]"
            for line in complete:
                self.echo(f"{tag} {line}")

    def flush(self) -> None:
        for rest in self.pending.values():
            self.echo(rest)
        self.pending.clear()
