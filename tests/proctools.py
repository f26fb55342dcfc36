"""What tests of bounded tools ask of processes: whether one has ended."""

from __future__ import annotations

import time


def gone(pid: int, within_s: float = 5.0) -> bool:
    """Whether process `pid` has ended (a zombie nobody reaped has ended too)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rpartition(b")")[2].split()[0] == b"Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False
