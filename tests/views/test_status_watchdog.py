"""What `glaunch status` says of a start's watch: the bound in force (the first step's until
a rank stepped, then the step's), or that the watchdog is off or does not watch and why;
never a configured bound that is not enforced."""

from __future__ import annotations

import pytest

from launcher.views.status_text import _watchdog_lines

STALL = {"stall_s": "auto", "bound_s": 600, "save_bound_s": 1800, "basis": "initial"}


@pytest.mark.parametrize("entry,expected", [
    ({"state": "off", "why": "watchdog.stall_s is 0", "slow": []}, ["    watchdog: off: watchdog.stall_s is 0"]),
    ({"state": "not watched", "why": "no rank uses glaunch's runtime", "slow": []},
     ["    watchdog: not watched: no rank uses glaunch's runtime"]),
    ({"state": "watching", "in_force": "first_step", "first_step_s": 1800,
      "watched_since": "2026-12-05T10:00:00.000+00:00", **STALL},
     ["    watchdog: hang if no rank steps within 30m00s of the runtime's start (2026-12-05T10:00:00.000+00:00); "
      "then hang after 10m00s without a step (auto, before warm-up), 30m00s for a save"]),
    ({"state": "watching", "in_force": "first_step", "first_step_s": 0, **STALL},
     ["    watchdog: no bound before the first step; then hang after 10m00s without a step (auto, before warm-up), "
      "30m00s for a save"]),
    ({"state": "watching", "in_force": "stall", "first_step_s": 1800, **STALL},
     ["    watchdog: hang after 10m00s without a step (auto, before warm-up), 30m00s for a save"]),
    # Written before the watch had a state: it had bounds.
    ({"stall_s": 60, "bound_s": 60, "save_bound_s": 1800, "basis": "fixed"},
     ["    watchdog: hang after 1m00s without a step (fixed), 30m00s for a save"]),
    ({"state": "watching", "in_force": "stall", "first_step_s": 1800, "stall_s": "auto", "bound_s": 60,
      "save_bound_s": 1800, "basis": "early", "step_p99_s": 0.12},
     ["    watchdog: hang after 1m00s without a step (auto, early: slowest of the first steps 0.1 s), "
      "30m00s for a save"]),
    ({"state": "not watched", "why": ["not", "text"]}, ["    watchdog: not watched"]),
], ids=["off", "not-watched", "first-step", "first-step-off", "stepping", "older-entry", "early", "damaged-why"])
def test_status_shows_the_bound_in_force_or_why_there_is_none(entry, expected):
    assert _watchdog_lines({"watchdog": entry}) == expected
