"""Progress read from rank 0's output, for a script that does not use glaunch's runtime.

`entrypoint.progress: {pattern: '^iter (\\d+):', total: 5000}`: the batch host follows
rank 0's log (what the script prints, as it prints it) and, for every line the pattern
matches, takes its first group as the step rank 0 has reached. It writes that into rank
0's heartbeat (launcher.runtime.heartbeats' record, the same file and format), as if the
rank had beaten: so the console's status line, `glaunch status`, its ETA, and the
watchdog read a script's own log lines exactly as they read the runtime's beats. The
record says where it came from (``source: "log"``) and announces the rank
(``announced_at``): a line that matched is evidence that the script reports its steps.

Where the script does use the runtime, its own beats win: a heartbeat that the rank
announced itself is never written over.

What the script prints is untrusted: the follower reads a bounded amount per poll, cuts
lines at MAX_LINE characters before matching, and takes a step only from digits.
Standard library only.
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from launcher.rundir.files import open_regular
from launcher.rundir.layout import heartbeat_bytes, read_heartbeat

MAX_LINE = 4096                 # characters of a line the pattern sees
READ_PER_POLL = 1 << 20         # bytes read from the log per poll: a flood is caught up over polls
MAX_STEP = 2**63 - 1
RECENT_STEPS = 200             # as the runtime's heartbeats


@dataclass
class LogProgress:
    """Follows one log file from where it last read; `poll` returns the newest step seen."""

    path: Path
    pattern: re.Pattern[str]
    offset: int = 0
    partial: bytes = b""
    step: int | None = None
    step_time: float | None = None
    first_step: int | None = None
    first_time: float | None = None
    # Seconds a step, between two polls that saw the step advance: what the watchdog's
    # `stall_s: auto` fits its bound to, as it does the runtime's own step times.
    step_times: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))
    steps_timed: int = 0

    @classmethod
    def following(cls, path: str | os.PathLike[str], pattern: str) -> LogProgress:
        """From the log's end as it is now: a requeued job appends its next start's lines to
        the same file, and what came before them is an earlier start's."""
        follower = cls(Path(path), re.compile(pattern))
        try:
            follower.offset = os.stat(path).st_size
        except OSError:
            pass
        return follower

    def poll(self, now: float | None = None) -> int | None:
        """Read what the log gained since the last poll; the newest step any of its lines
        gives (None while none has)."""
        now = time.time() if now is None else now
        chunk = self._read()
        if not chunk:
            return self.step
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()[-MAX_LINE:]
        steps = [step for raw in lines
                 if (step := step_of(raw.decode("utf-8", errors="replace")[:MAX_LINE], self.pattern)) is not None]
        self._take(steps, now)
        return self.step

    def _take(self, steps: list[int], now: float) -> None:
        """The steps one poll read, in order. Every line of one read arrives at the same
        `now`: the newest step is timed against the step of the poll before (a line against
        the one before it would time nothing, and the first line against the last poll would
        give one step the whole interval between polls). A step lower than the one before
        begins a new count (a restart's first lines), untimed."""
        if not steps:
            return
        if self.first_step is None:
            self.first_step, self.first_time = steps[0], now
        base_step, base_time = self.step, self.step_time
        newest = base_step
        for step in steps:
            if newest is not None and step < newest:
                base_step, base_time, newest = step, now, step
            elif newest is None or step > newest:
                newest = step
        if newest is None or newest == self.step:
            return
        if base_step is not None and base_time is not None and newest > base_step and now > base_time:
            self.step_times.append((now - base_time) / (newest - base_step))
            self.steps_timed += newest - base_step
        self.step, self.step_time = newest, now

    def step_p99_s(self) -> float | None:
        if not self.step_times:
            return None
        ordered = sorted(self.step_times)
        return round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 6)

    def _read(self) -> bytes:
        try:
            fd = open_regular(self.path)
        except OSError:
            return b""
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < self.offset:            # the log was replaced: read the new one from its start
                self.offset, self.partial = 0, b""
            f.seek(self.offset)
            data = f.read(READ_PER_POLL)
        self.offset += len(data)
        return data


def step_of(line: str, pattern: re.Pattern[str]) -> int | None:
    """The step a line gives: the pattern's first group, when it is a whole number."""
    match = pattern.search(line)
    if match is None or pattern.groups < 1:
        return None
    text = (match.group(1) or "").strip()
    if not text.isascii() or not text.isdigit() or len(text) > 19:
        return None
    step = int(text)
    return step if step <= MAX_STEP else None


def beat_from_log(heartbeat: Path, progress: LogProgress, total: int | None, now: float | None = None,
                  start: Mapping[str, Any] | None = None) -> bool:
    """Write rank 0's heartbeat from the log's progress, over the task's `starting` record
    (keeping who the rank is: its pid and node), as a beat of `start` (its job_id, restart
    and world_size). Nothing when no step was seen yet or the rank announced itself
    through the runtime. Whether it wrote."""
    if progress.step is None:
        return False
    record = read_heartbeat(heartbeat) or {}
    if record.get("announced_at") is not None and record.get("source") != "log":
        return False
    now = time.time() if now is None else now
    if start is not None and any(record.get(k) != v for k, v in start.items() if k in ("job_id", "restart")):
        record = {}                   # an earlier start's record: nothing of it is this start's
    record.update(start or {})
    record.update(log_record(progress, total, now))
    try:
        # Under torchrun no rank of a script without the runtime writes a heartbeat: the
        # folder may not be there yet.
        heartbeat.parent.mkdir(parents=True, exist_ok=True)
        fd = open_regular(heartbeat, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW)
    except OSError:
        return False
    with os.fdopen(fd, "r+b") as f:
        data = heartbeat_bytes(record, os.fstat(f.fileno()).st_size)
        os.pwrite(f.fileno(), data, 0)
    return True


def log_record(progress: LogProgress, total: int | None, now: float) -> dict[str, Any]:
    return {"rank": 0, "state": "running", "source": "log", "step": progress.step, "total": total,
            "time": progress.step_time, "first_step": progress.first_step, "first_time": progress.first_time,
            "announced_at": progress.first_time, "written": now, "step_p99_s": progress.step_p99_s(),
            "steps_timed": progress.steps_timed}
