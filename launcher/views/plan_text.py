"""The text of `glaunch plan`: each strategy's per-GPU memory on the site, and the
recommendation."""

from __future__ import annotations

from typing import Any

from launcher.resolution.planner import format_plan_table


def format_plan(result: Any) -> str:
    """`result`: a launcher.resolution.planner.PlanResult."""
    return format_plan_table(result)
