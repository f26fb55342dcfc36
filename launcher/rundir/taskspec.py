"""The task spec: what every task of a job needs to know from submit time, as one frozen,
typed record, kept in the run directory as task.json (layout.TASK_FILE).

The submit side builds it from the job plan (launcher.rendering.task_json) and writes it
before the job can start; on the nodes the task (launcher.runtime.task), the end of each
start (launcher.jobcontrol.jobend), the hang watchdog (launcher.jobcontrol.watchdog) and the
local stand-in for srun read it. Nothing of it travels through the environment or the
heartbeats.

task.json may have been edited, damaged or replaced since: :meth:`TaskSpec.from_json`
checks every field and raises :class:`TaskSpecError` (naming the file and the key) for
anything glaunch would not have written. Standard library only.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, Callable, Mapping

from launcher.errors import RunError
from launcher.rundir.files import atomic_write_text, json_type, load_json_object, parse_json_object
from launcher.rundir.layout import RunDir

FORMAT = 2                      # task.json's layout; a reader refuses any other
# watchdog.stall_s: auto: the bound before the run's step times are known (warm-up).
STALL_AUTO_INITIAL_S = 600.0
SLOW_NODE_ACTIONS = ("report", "exclude")
LAUNCHERS = ("srun", "torchrun")
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SHOWN = 60                      # characters of a bad value an error quotes
MAX_COUNT = 2**31 - 1           # nodes, ranks, requeues: more is not a number glaunch wrote

# What is wrong with a field's value, or None.
Check = Callable[[object], "str | None"]


class TaskSpecError(RunError):
    """task.json is missing, unreadable, or holds what glaunch would not have written."""


@dataclass(frozen=True)
class TaskSpec:
    """What every task of one job needs (see the module docstring). Checked when made."""

    launcher: str                       # srun: one task per rank | torchrun: one task (agent) per node
    script: str | None                  # the entry point: an absolute script path, or
    module: str | None                  # a module run with -m (exactly one of them)
    args: tuple[str, ...]
    nodes: int
    ranks_per_node: int
    world_size: int                     # nodes * ranks_per_node
    run_dir: str
    run_id: str
    requeue_max: int
    crash_retries: int
    exclude_bad_nodes: bool             # requeue without the node a crash or a hang points at
    watchdog_stall_s: float             # 0: no stall bound; with watchdog_stall_auto, the bound until warm-up
    watchdog_first_step_s: float        # 0: no first-step bound
    watchdog_stall_auto: bool = False   # the stall bound from the run's own step and save times
    watchdog_auto_floor_s: float = 60.0  # the least bound auto derives
    watchdog_slow_node: str = "report"  # report | exclude: a node whose ranks compute slower than their peers
    code_path: str | None = None        # the code snapshot's counterpart of the working directory
    requeue_mode: str = "requeue"       # after the time limit: resubmit (a new job) | requeue
    resume_args: tuple[str, ...] = ()   # after args on every start but the run's first
    run_env: tuple[str, ...] = ()       # env variables whose values hold ${run:...} (rundir.runvalues)
    progress_pattern: str | None = None  # rank 0's output: the first group is the step
    progress_total: int | None = None

    def __post_init__(self) -> None:
        for field in fields(self):
            problem = _problem(field.name, getattr(self, field.name))
            if problem:
                raise TaskSpecError(problem, key=field.name)
        if (self.script is None) == (self.module is None):
            raise TaskSpecError("give exactly one of script and module", key="script")
        if self.world_size > MAX_WORLD_SIZE:
            raise TaskSpecError(f"{self.world_size} ranks: more than any job runs ({MAX_WORLD_SIZE})",
                                key="world_size")
        if self.world_size != self.nodes * self.ranks_per_node:
            raise TaskSpecError(f"{self.world_size} is not nodes x ranks_per_node "
                                f"({self.nodes} x {self.ranks_per_node})", key="world_size")

    def to_json(self) -> str:
        """task.json's text."""
        data: dict[str, Any] = {"format": FORMAT, **asdict(self)}
        for name in WORD_LISTS:
            data[name] = list(getattr(self, name))
        return json.dumps(data, indent=1, allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str, *, file: str | None = None) -> TaskSpec:
        """The spec task.json's `text` holds; TaskSpecError (naming `file`) when it is not one."""
        try:
            data = parse_json_object(text)
        except ValueError as exc:
            raise TaskSpecError(str(exc), file=file) from None
        return cls.from_dict(data, file=file)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, file: str | None = None) -> TaskSpec:
        if data.get("format") != FORMAT:
            raise TaskSpecError(f"format {data.get('format')!r}: this glaunch reads format {FORMAT} "
                                "(written by another glaunch version?)", file=file, key="format")
        names = [field.name for field in fields(cls)]
        unknown = sorted(set(data) - set(names) - {"format"})
        if unknown:
            raise TaskSpecError(f"not a field of the task spec: {', '.join(_shown(k) for k in unknown[:3])}"
                                + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""), file=file)
        # A field added since a spec was written keeps its default there.
        missing = [f.name for f in fields(cls) if f.name not in data and f.default is MISSING]
        if missing:
            raise TaskSpecError("missing", file=file, key=missing[0])
        values = {name: data[name] for name in names if name in data}
        for name in WORD_LISTS:
            if isinstance(values.get(name), list):
                values[name] = tuple(values[name])
        try:
            return cls(**values)
        except TaskSpecError as exc:
            raise TaskSpecError(exc.message, file=file, key=exc.key) from None


def _shown(value: object) -> str:
    """`value` as an error quotes it: repr, cut short."""
    text = repr(value)
    return text if len(text) <= SHOWN else text[:SHOWN] + "..."


def _problem(name: str, value: object) -> str | None:
    """What is wrong with `value` for field `name`, or None."""
    return _CHECKS[name](value)


def _text(value: object, *, empty: bool = False) -> str | None:
    if not isinstance(value, str):
        return f"a {json_type(value)}, not text"
    if not value and not empty:
        return "empty"
    if "\x00" in value:
        return "holds a NUL character"
    return None


def _name(value: object) -> str | None:
    problem = _text(value)
    if problem is None and _CONTROL.search(str(value)):
        return "holds a control character"
    return problem


def _absolute(value: object) -> str | None:
    problem = _text(value)
    if problem is None and not os.path.isabs(str(value)):
        return f"{_shown(value)} is not an absolute path"
    return problem


def _optional(check: Check) -> Check:
    return lambda value: None if value is None else check(value)


def _one_of(*choices: str) -> Check:
    def check(value: object) -> str | None:
        if isinstance(value, str) and value in choices:
            return None
        return f"{_shown(value)}: expected one of {', '.join(choices)}"
    return check


def _module(value: object) -> str | None:
    problem = _text(value)
    if problem is None and not MODULE_NAME.fullmatch(str(value)):
        return f"{_shown(value)} is not a Python module name"
    return problem


def _args(value: object) -> str | None:
    if not isinstance(value, tuple):
        return f"a {json_type(value)}, not a list of words"
    for index, word in enumerate(value):
        problem = _text(word, empty=True)
        if problem:
            return f"word {index}: {problem}"
    return None


WORD_LISTS = ("args", "resume_args", "run_env")


def _env_names(value: object) -> str | None:
    problem = _args(value)
    if problem is None and isinstance(value, tuple) and not all(ENV_NAME.fullmatch(name) for name in value):
        return "not a list of environment variable names"
    return problem


def _pattern(value: object) -> str | None:
    problem = _text(value)
    if problem is None:
        try:
            if re.compile(str(value)).groups < 1:
                return "a pattern without a group for the step"
        except re.error as exc:
            return f"not a regular expression: {exc}"
    return problem


# Far beyond the largest training jobs (tens of thousands of GPUs); the watchdog and the
# job's end go over every rank of it.
MAX_WORLD_SIZE = 1 << 20


def _count(minimum: int) -> Check:
    def check(value: object) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{_shown(value)} is not a whole number"
        if value > MAX_COUNT:
            return f"{_shown(value)} is more than {MAX_COUNT}"
        return None if value >= minimum else f"{value} is less than {minimum}"
    return check


def _flag(value: object) -> str | None:
    return None if isinstance(value, bool) else f"{_shown(value)} is not true or false"


def _seconds(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{_shown(value)} is not a number of seconds"
    return None if math.isfinite(value) and value >= 0 else f"{_shown(value)} is not a number of seconds >= 0"


_CHECKS: dict[str, Check] = {
    "launcher": _one_of(*LAUNCHERS), "script": _optional(_absolute), "module": _optional(_module), "args": _args,
    "nodes": _count(1), "ranks_per_node": _count(1), "world_size": _count(1), "run_dir": _absolute,
    "run_id": _name, "requeue_max": _count(0), "crash_retries": _count(0), "exclude_bad_nodes": _flag,
    "watchdog_stall_s": _seconds, "watchdog_stall_auto": _flag, "watchdog_auto_floor_s": _seconds,
    "watchdog_first_step_s": _seconds, "watchdog_slow_node": _one_of(*SLOW_NODE_ACTIONS),
    "code_path": _optional(_absolute),
    "requeue_mode": _one_of("resubmit", "requeue"),
    "resume_args": _args, "run_env": _env_names, "progress_pattern": _optional(_pattern),
    "progress_total": _optional(_count(1)),
}


def read_task_spec(run_dir: str | os.PathLike[str]) -> TaskSpec:
    """The run's task.json; TaskSpecError when it is missing, unreadable or not a spec."""
    path = RunDir(run_dir).task_file
    try:
        data = load_json_object(path)
    except FileNotFoundError:
        raise TaskSpecError("missing: the job's task spec was never written here", file=str(path)) from None
    except OSError as exc:
        raise TaskSpecError(f"cannot be read: {exc.strerror or exc}", file=str(path)) from None
    except ValueError as exc:
        raise TaskSpecError(str(exc), file=str(path)) from None
    return TaskSpec.from_dict(data, file=str(path))


def write_task_spec(run_dir: str | os.PathLike[str], spec: TaskSpec) -> None:
    """task.json into the run directory, replacing any earlier one whole."""
    atomic_write_text(RunDir(run_dir).task_file, spec.to_json())


@dataclass(frozen=True)
class Placement:
    """Which global ranks each task of a job runs, as its task logs are named (layout's
    ``JOB_TASK_log``): under srun a task is one rank; under torchrun a task is one node's
    agent, and its node rank is the task's Slurm node id (launch.py pins it), so node
    ``t`` runs ranks ``t*ranks_per_node`` to ``(t+1)*ranks_per_node - 1``, the block
    placement srun gives."""

    launcher: str = "srun"
    ranks_per_node: int = 1

    @classmethod
    def of(cls, spec: TaskSpec) -> Placement:
        return cls(spec.launcher, spec.ranks_per_node)

    @property
    def per_node(self) -> bool:
        return self.launcher == "torchrun"

    def ranks(self, task: int) -> range:
        """The global ranks of task `task`."""
        if not self.per_node:
            return range(task, task + 1)
        return range(task * self.ranks_per_node, (task + 1) * self.ranks_per_node)

    def task(self, rank: int) -> int:
        """The task that runs global rank `rank`."""
        return rank // self.ranks_per_node if self.per_node else rank

    def rank(self, node: int, local_rank: int) -> int:
        """The global rank of worker `local_rank` of torchrun node `node`."""
        return node * self.ranks_per_node + local_rank

    def label(self, task: int) -> str:
        """The task in a few characters: ``r3`` (srun), ``node1 r2-3`` (torchrun)."""
        ranks = self.ranks(task)
        shown = f"r{ranks[0]}" if len(ranks) == 1 else f"r{ranks[0]}-{ranks[-1]}"
        return f"node{task} {shown}" if self.per_node else shown


def read_placement(run_dir: str | os.PathLike[str]) -> Placement:
    """The placement of the run's task.json; one rank per task when it cannot be read (a
    run directory's logs are still shown, by task)."""
    try:
        return Placement.of(read_task_spec(run_dir))
    except TaskSpecError:
        return Placement()
