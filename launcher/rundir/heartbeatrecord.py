"""A rank's heartbeat record as a reader takes it: every field it uses, checked.

The ranks write ``heartbeats/rank-RRRRR.json`` (launcher.runtime.heartbeats: what each field
means; layout.heartbeat_bytes and layout.read_heartbeat: its bytes and its checksum); the
batch host's watchdog (launcher.jobcontrol.watchdog) reads them. What another process wrote
is checked before use (:func:`checked_heartbeat`): its types, its bounds, a known state.
The bounds both sides hold to live here too: how seldom a rank may write, after how many
timed steps the watchdog's early bound holds, over how many busy times ``busy_s`` is taken.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from launcher.rundir import taskspec

# A rank writes at least this often: a longer interval would hide a hang from the watchdog
# for that long, and a record that claims more is not one a rank wrote.
MAX_INTERVAL_S = 3600.0
BUSY_WINDOW = 20          # the busy times busy_s is the median of
# The timed steps after which the watchdog's early bound holds (watchdog.bounds_in_force):
# the beat that times the last of them is written at once, so that a rank that hangs soon
# after has left the times the bound is taken from.
EARLY_STEPS = 3
# What a rank writes while a checkpoint save holds up its loop (a stop's save included).
SAVING_STATES = frozenset({"saving", "stopping"})


STATES = frozenset({"starting", "running", "saving", "stopping", "stopped", "finished"})
MAX_WORLD_SIZE = taskspec.MAX_WORLD_SIZE   # the task spec's own bound on ranks
MAX_STEP = 2**63 - 1
MAX_PID = 2**31 - 1
# How far ahead of the reader's clock a rank's clock may run: a time further on would keep
# that rank looking alive for as long.
CLOCK_SKEW_S = 600.0
MAX_TEXT = 255
MIN_STEP_S, MAX_STEP_S = 1e-6, 1e9


def _shown(value: object) -> str:
    try:
        text = repr(value)
    except ValueError:          # an int too long to print
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def _whole(low: int, high: int) -> Callable[[object], str | None]:
    def check(value: object) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return "not a whole number"
        return None if low <= value <= high else f"not within {low}..{high}"
    return check


def _time(now: float | None) -> Callable[[object], str | None]:
    def check(value: object) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "not a number"
        if not 0 <= value < math.inf:
            return "not a finite time"
        if now is not None and value > now + CLOCK_SKEW_S:
            return f"{value - now:.0f} s ahead of this host's clock"
        return None
    return check


def _seconds_within(high: float) -> Callable[[object], str | None]:
    def check(value: object) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "not a number"
        return None if 0 <= value <= high else f"not within 0..{high:g}"
    return check


def _step_time(value: object) -> str | None:
    # Written rounded to microseconds: 0, or at least MIN_STEP_S.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "not a number"
    if value == 0 or MIN_STEP_S <= value <= MAX_STEP_S:
        return None
    return f"not 0 or within {MIN_STEP_S:g}..{MAX_STEP_S:g}"


def _text(value: object) -> str | None:
    return None if isinstance(value, str) and len(value) <= MAX_TEXT else f"not a text of at most {MAX_TEXT} characters"


def _state(value: object) -> str | None:
    return None if isinstance(value, str) and value in STATES else f"not one of {', '.join(sorted(STATES))}"


def _checks(world_size: int, now: float | None) -> dict[str, tuple[bool, Callable[[object], str | None]]]:
    """Each field a reader uses: (may be null, its check)."""
    step, when = _whole(-MAX_STEP, MAX_STEP), _time(now)
    return {
        "rank": (False, _whole(0, world_size - 1)), "restart": (False, _whole(0, MAX_STEP)),
        "state": (False, _state), "job_id": (True, _text), "world_size": (True, _whole(1, world_size)),
        "local_rank": (True, _whole(0, world_size - 1)), "node": (True, _text), "host": (True, _text),
        "pid": (True, _whole(1, MAX_PID)), "job_step": (True, _text),
        "step": (True, step), "total": (True, step), "first_step": (True, step), "checkpoint_step": (True, step),
        "time": (True, when), "first_time": (True, when), "written": (True, when), "saving_since": (True, when),
        "save_ended": (True, when), "announced_at": (True, when), "exited": (True, when),
        "interval_s": (True, _seconds_within(MAX_INTERVAL_S)),
        "step_s": (True, _step_time), "step_p99_s": (True, _step_time), "busy_s": (True, _step_time),
        "steps_timed": (True, _whole(0, MAX_STEP)), "busy_count": (True, _whole(0, MAX_STEP)),
        "save_s": (True, _seconds_within(MAX_STEP_S)),
        "source": (True, _source),
    }


def _source(value: object) -> str | None:
    """Where a beat came from when not from the rank itself: "log" (launcher.jobcontrol.logprogress)."""
    return None if value == "log" else "not a source of beats glaunch writes"


def checked_heartbeat(record: Mapping[str, Any], *, world_size: int | None = None,
                      now: float | None = None) -> dict[str, Any]:
    """The fields of a heartbeat a reader uses, each checked: its type, its bounds (ranks
    and world size within the run's `world_size`, times finite and not ahead of `now` by
    more than CLOCK_SKEW_S), a known state. ValueError naming the first field that is wrong
    and its value; fields no reader uses are left out."""
    bound = world_size if world_size is not None and 0 < world_size <= MAX_WORLD_SIZE else MAX_WORLD_SIZE
    out: dict[str, Any] = {}
    for name, (nullable, check) in _checks(bound, now).items():
        value = record.get(name)
        problem = None if value is None and nullable else "missing" if value is None else check(value)
        if problem is not None:
            raise ValueError(f"{name} {_shown(value)}: {problem}" if value is not None else f"{name}: missing")
        out[name] = value
    return out
