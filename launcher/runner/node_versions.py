"""Which Python, torch and frameworks a run's nodes actually imported, against what the run
was submitted with: `status` warns when a node's differ from the submitting environment's
(run.json `provenance`: which torch a rank imports depends on the nodes' environment, the
profile's python:, modules, venv or container, not on the machine that submitted) or from
another node's. Pure: reads the record only."""

from __future__ import annotations

from typing import Any, Mapping

from launcher.rundir.records import RunRecord

# Compared with the submitting environment: what decides what the ranks compute.
PLANNED = ("python", "torch", "deepspeed", "lightning", "pytorch-lightning")
# Compared between nodes: those, and what torch was built with.
BETWEEN_NODES = (*PLANNED, "cuda", "nccl")


def newest_versions(record: RunRecord) -> dict[str, dict[str, str]]:
    """node -> what its ranks imported, as the newest start that recorded it says."""
    for start in reversed(record.starts):
        found = start.get("versions")
        if isinstance(found, Mapping) and found:
            return {str(node): {str(k): v for k, v in items.items() if isinstance(v, str)}
                    for node, items in found.items() if isinstance(items, Mapping)}
    return {}


def planned_versions(record: RunRecord) -> dict[str, str]:
    """What the submitting environment had: run.json's provenance (python, packages)."""
    origin = record.extra.get("provenance")
    if not isinstance(origin, Mapping):
        return {}
    packages = origin.get("packages")
    planned = {str(name): value for name, value in (packages.items() if isinstance(packages, Mapping) else ())
               if isinstance(value, str)}
    if isinstance(origin.get("python"), str):
        planned["python"] = origin["python"]
    return planned


def version_warnings(record: RunRecord) -> list[str]:
    """A sentence for each difference: between nodes, and of the nodes from the submitting
    environment (only for what the nodes imported)."""
    nodes = newest_versions(record)
    if not nodes:
        return []
    out = []
    for name in BETWEEN_NODES:
        seen = _by_value(nodes, name)
        if len(seen) > 1:
            out.append(f"the nodes import different {name}: " + "; ".join(
                f"{value} on {', '.join(where)}" for value, where in sorted(seen.items())))
    planned = planned_versions(record)
    for name in PLANNED:
        seen = _by_value(nodes, name)
        wanted = planned.get(name)
        if wanted is None or not seen or set(seen) == {wanted}:
            continue
        other = {value: where for value, where in seen.items() if value != wanted}
        if name == "python" and all(patch_only(value, wanted) for value in other):
            continue        # `sites check` names it once, as a note; every status would repeat it
        out.append(f"the ranks import {name} " + "; ".join(
            f"{value} on {', '.join(where)}" for value, where in sorted(other.items()))
            + f", not the {wanted} the run was submitted with: the nodes' environment (the profile's python:, "
              "modules, venv or container) decides which one a rank imports")
    return out


def environment_warnings(planned: Mapping[str, str | None], found: Mapping[str, str]) -> list[str]:
    """A sentence for each difference between what a profile's environment gives (the
    login node's answer to `sites check`) and the submitting environment; a torch the
    environment cannot import (`found` without one) is a difference too. A Python that
    differs only in its patch version is no warning (environment_notes says it)."""
    out = []
    for name in ("python", "torch"):
        wanted, got = planned.get(name), found.get(name)
        if wanted is None or got == wanted or (name == "python" and patch_only(got, wanted)):
            continue
        gives = f"gives {name} {got}" if got is not None else f"gives no {name}"
        out.append(f"the profile's environment {gives}, not the {wanted} this machine submits with: the nodes' "
                   "environment (the profile's python:, modules, venv or container) decides which one a rank "
                   "imports")
    return out


def environment_notes(planned: Mapping[str, str | None], found: Mapping[str, str]) -> list[str]:
    """One quiet line for a Python of the profile's environment that differs from the
    submitting one only in its patch version: the same language and C API, so nothing to
    change."""
    wanted, got = planned.get("python"), found.get("python")
    if not patch_only(got, wanted):
        return []
    return [f"python {got} on the nodes, {wanted} here: only the patch version differs"]


def patch_only(a: str | None, b: str | None) -> bool:
    """Whether versions `a` and `b` differ, and only after their major.minor (3.11.2 and
    3.11.7)."""
    if a is None or b is None or a == b:
        return False
    return a.split(".")[:2] == b.split(".")[:2] and len(a.split(".")) > 2 and len(b.split(".")) > 2


def _by_value(nodes: Mapping[str, Mapping[str, Any]], name: str) -> dict[str, list[str]]:
    seen: dict[str, list[str]] = {}
    for node, versions in sorted(nodes.items()):
        value = versions.get(name)
        if isinstance(value, str):
            seen.setdefault(value, []).append(node)
    return seen
