"""The text of `glaunch plan`: each strategy's per-GPU memory on the site, the
recommendation, and goodput projected at the run's size (and a named one)."""

from __future__ import annotations

from typing import Any

from launcher.resolution.planner import format_plan_table
from launcher.views.goodput_text import projection_lines


def format_plan(result: Any) -> str:
    """`result`: a launcher.resolution.planner.PlanResult."""
    text = format_plan_table(result)
    if result.goodput is not None:
        text += "\n\n" + "\n".join(projection_lines(result.goodput.to_json()))
    return text
