"""The text of a goodput projection (launcher.resolution.goodput_projection), as `glaunch
plan` and `glaunch status` show it, from its JSON form."""

from __future__ import annotations

from typing import Any, Mapping

from launcher.runner.goodput import number
from launcher.views.text import duration, printable

ROAD_NAMES = {"requeue": "requeue", "in_allocation": "in-allocation restart", "spares": "spare nodes",
              "peer": "peer recovery (recovery.peer)"}
COST_NAMES = (("save_s", "save stall"), ("startup_s", "start-up"), ("load_s", "resume load"),
              ("queue_wait_s", "queue wait after requeue"), ("step_s", "step"))


def _ettr(value: Any) -> str:
    value = number(value)
    return f"{value:.3f}" if value is not None else "-"


def _costs_line(costs: Mapping[str, Any]) -> str:
    defaults = set(costs.get("defaults") or ())
    parts = [f"{label} {duration(costs.get(key))}" + (" (default)" if key in defaults else "")
             for key, label in COST_NAMES]
    if costs.get("in_allocation_measured"):
        parts.append(f"restart in the allocation {duration(costs.get('in_allocation_s'))}")
    line = "  costs: " + ", ".join(parts)
    if costs.get("every_steps"):
        line += f"; checkpoint every {costs['every_steps']} steps = {duration(costs.get('interval_s'))}"
    return line


# A size's figures that may not be computable (its `not_computable` keys), as the text names them.
NOT_COMPUTABLE_NAMES = {"mtbf_s": "job MTBF", "optimal_interval_s": "Young-Daly interval",
                        "optimal_every_steps": "Young-Daly checkpoint.every_steps", "ettr_configured": "ETTR now",
                        "ettr_optimal": "ETTR at Young-Daly", "spares": "spare nodes"}


def _size_lines(size: Mapping[str, Any]) -> list[str]:
    every = size.get("optimal_every_steps")
    lines = [f"  at {size.get('gpus')} GPUs ({size.get('nodes')} node(s) x {size.get('gpus_per_node')}): job MTBF "
             f"{duration(size.get('mtbf_s'))}; Young-Daly checkpoint interval "
             f"{duration(size.get('optimal_interval_s'))}"
             f" (checkpoint.every_steps={every if isinstance(every, int) else '?'})",
             f"    {'road':30s} {'restart':>9s} {'ETTR now':>9s} {'at Young-Daly':>14s}"]
    for road in [r for r in size.get("roads") or () if isinstance(r, Mapping)]:
        name = ROAD_NAMES.get(str(road.get("road")), printable(road.get("road")))
        share = number(road.get("requeue_share"))
        if road.get("road") == "spares" and share is not None:
            name += f" ({road.get('spare_nodes')}, {100 * share:.0f}% requeue)"
        lines.append(f"    {name:30s} {duration(road.get('restart_s')):>9s} {_ettr(road.get('ettr_configured')):>9s} "
                     f"{_ettr(road.get('ettr_optimal')):>14s}")
    return lines + _not_computable_lines(size.get("not_computable"))


def _not_computable_lines(reasons: Any) -> list[str]:
    """One line per reason: the figures it leaves out, and why."""
    by_reason: dict[str, list[str]] = {}
    for key, why in (reasons.items() if isinstance(reasons, Mapping) else ()):
        by_reason.setdefault(printable(why), []).append(NOT_COMPUTABLE_NAMES.get(key, printable(key)))
    return [f"    {', '.join(names)}: not computable: {why}" for why, names in by_reason.items()]


def projection_lines(projection: Any) -> list[str]:
    """The projection's lines; none when there is none."""
    if not isinstance(projection, Mapping):
        return []
    rate = number(projection.get("failures_per_node_hour"))
    lines = [f"goodput projected (ETTR, first order): {rate:.3g} failures per node-hour" if rate is not None
             else "goodput projected (ETTR, first order): failure rate ?",
             f"  rate: {printable(projection.get('rate_source'))}",
             _costs_line(projection.get("costs") or {})]
    for size in projection.get("sizes") or ():
        if isinstance(size, Mapping):
            lines += _size_lines(size)
    lines.append("  ETTR = 1 - (save/interval + (interval/2 + restart)/MTBF); spare nodes: the best number for a "
                 f"{duration(projection.get('allocation_s'))} allocation, their idle share counted")
    return lines + saving_only_lines(projection)


def saving_only_lines(projection: Mapping[str, Any]) -> list[str]:
    """Why ETTR now is 0 where the save stall is as long as the checkpoint interval or longer
    (the run would do nothing but save), and what to set; none otherwise."""
    found = projection.get("costs")
    costs: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    save, interval = number(costs.get("save_s")), number(costs.get("interval_s"))
    if save is None or interval is None or save < interval:
        return []
    sizes = [s for s in projection.get("sizes") or () if isinstance(s, Mapping)]
    every = next((s.get("optimal_every_steps") for s in sizes if isinstance(s.get("optimal_every_steps"), int)), None)
    where = " (a default: measure it with a run, or give it)" if "save_s" in set(costs.get("defaults") or ()) else ""
    advice = (f"set checkpoint.every_steps to {every} (the Young-Daly interval) or near it" if every is not None
              else "save less often (checkpoint.every_steps) or faster (a background save)")
    return [f"  ETTR now 0: a save stall of {duration(save)}{where} is as long as the checkpoint interval or longer "
            f"({duration(interval)}): the run would only save; {advice}"]
