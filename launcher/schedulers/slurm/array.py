"""A sweep on Slurm: its elements as job arrays, one array per allocation shape.

Elements that ask the same allocation (the same #SBATCH directives but the per-run log
path: nodes, GPUs, CPUs, memory, time, partition, account, dependency, ...) share one
array: `--array=0-K%N` (N: --max-parallel), with no more tasks than Slurm's MaxArraySize
allows in one array (more make more arrays of that shape). The array script
(`<sweep dir>/array-NUMBER.sbatch`, the exact bytes sbatch receives) maps each task to its
element and runs the element's own job.sbatch, so each element keeps its run directory,
env.sh, logs, checkpoints, starts and requeues (`scontrol requeue ARRAYJOB_TASK`).

Grouping and rendering are pure; submit.py's `submit_array` runs sbatch through client.py.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from launcher.errors import SchedulerError
from launcher import shell
from launcher.rendering.render import lines, template
from launcher.resolution.jobplan import JobPlan
from launcher.rundir.layout import ARRAY_TASK_LOG_PATTERN, LOG_DIR
from launcher.schedulers.slurm.script import sbatch_directives

ARRAY_SCRIPT = "array-{number}.sbatch"
# Slurm's default MaxArraySize: the largest task index is one less.
DEFAULT_MAX_ARRAY_SIZE = 1001
# Directives that differ from element to element without changing the allocation: its log,
# and its folder (over SSH without a code snapshot each element carries its code in its own
# run directory, its working folder there): each task goes to its element's (render_array).
_PER_ELEMENT = ("--output=", "--chdir=")


@dataclass(frozen=True)
class ArrayGroup:
    """One array: the elements (their indices in the sweep) its tasks 0..K run, in order."""

    number: int
    shape: tuple[str, ...]          # the #SBATCH lines its elements share
    elements: tuple[int, ...]

    def spec(self, max_parallel: int | None) -> str:
        """--array's value: 0-K, with %N when fewer may run at once."""
        last = len(self.elements) - 1
        text = f"0-{last}" if last else "0"
        if max_parallel is not None and max_parallel < len(self.elements):
            text += f"%{max_parallel}"
        return text


def shape_of(plan: JobPlan) -> tuple[str, ...]:
    """The element's #SBATCH lines that its array shares: all but its own log path."""
    return tuple(line for line in sbatch_directives(plan)
                 if not line.removeprefix("#SBATCH ").startswith(_PER_ELEMENT))


def group(plans: Sequence[JobPlan], max_array_size: int = DEFAULT_MAX_ARRAY_SIZE) -> list[ArrayGroup]:
    """Elements (in sweep order) -> arrays: one per shape, in order of each shape's first
    element, split where a shape has more elements than one array may hold."""
    if max_array_size < 1:
        raise SchedulerError(f"Slurm's MaxArraySize is {max_array_size}: this cluster takes no job arrays")
    shapes: dict[tuple[str, ...], list[int]] = {}
    for index, plan in enumerate(plans):
        shapes.setdefault(shape_of(plan), []).append(index)
    groups: list[ArrayGroup] = []
    for shape, indices in shapes.items():
        for start in range(0, len(indices), max_array_size):
            groups.append(ArrayGroup(len(groups), shape, tuple(indices[start:start + max_array_size])))
    return groups


def render_array(group: ArrayGroup, plans: Sequence[JobPlan], *, sweep_id: str, sweep_dir: str,
                 arrays: int, max_parallel: int | None) -> str:
    """The array script of `group` (`plans`: every element of the sweep, in order). Pure."""
    first = plans[group.elements[0]]
    directives = list(group.shape) + [
        shell.sbatch_directive("chdir", first.workdir),
        shell.sbatch_directive("output", os.path.join(sweep_dir, LOG_DIR, ARRAY_TASK_LOG_PATTERN)),
        shell.sbatch_directive("array", group.spec(max_parallel)),
    ]
    run_dirs = lines(f"    [{task}]={shell.quote(plans[element].run_dir)}  # element {element}"
                     for task, element in enumerate(group.elements))
    workdirs = lines(f"    [{task}]={shell.quote(plans[element].workdir)}"
                     for task, element in enumerate(group.elements))
    return template("array.sbatch.j2", sweep_id=sweep_id, sweep_id_word=shell.quote(sweep_id), number=group.number,
                    arrays=arrays, name=first.name, site=first.site_name, directives=lines(directives),
                    elements=len(group.elements), run_dirs=run_dirs, workdirs=workdirs)


def array_script(sweep_dir: str | os.PathLike[str], number: int) -> Path:
    return Path(sweep_dir) / ARRAY_SCRIPT.format(number=number)


# --- Slurm's answers --------------------------------------------------------------------------


def max_array_size(settings: Mapping[str, str]) -> int:
    """MaxArraySize from the cluster's settings (`scontrol show config`); Slurm's default
    where it is not listed."""
    value = str(settings.get("MaxArraySize") or "").strip()
    return int(value) if value.isdigit() else DEFAULT_MAX_ARRAY_SIZE


_PENDING_TASKS = re.compile(r"(?P<job>\d+)_\[(?P<tasks>[0-9,\-]+)(?:%\d+)?\]")


def task_rows(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """sacct's rows with an array's tasks that never left its pending record (`12_[0-3%2]`,
    as a cancelled pending array shows) given one row each (`12_0`, `12_1`, ...), where a
    task has no row of its own. Pure."""
    own = {r["job_id"] for r in rows}
    out = []
    for row in rows:
        m = _PENDING_TASKS.fullmatch(row["job_id"])
        if m is None:
            out.append(row)
            continue
        for part in m["tasks"].split(","):
            first, _, last = part.partition("-")
            if not first.isdigit() or (last and not last.isdigit()):
                continue
            for task in range(int(first), int(last or first) + 1):
                job_id = f"{m['job']}_{task}"
                if job_id not in own:
                    out.append(dict(row, job_id=job_id))
    return out


def array_job_id(squeue_id: str) -> str:
    """squeue's %i of an array (`123_[0-3%2]`, `123_4`) -> the array's job id, 123."""
    return squeue_id.split("_", 1)[0]


def submission_marker(sweep_id: str, number: int) -> str:
    """The array job's --comment: which sweep and array it is, to find it after a lost answer."""
    return f"glaunch:{sweep_id}:array-{number}"
