"""The checks a site profile must pass on its own, whatever experiment runs on it.

`load_site` applies them, so `glaunch sites validate` and `glaunch submit` refuse the
same profiles. What depends on the experiment (a request over a partition's limits) is
resolution's. Types, finiteness and NUL characters are settled by the converter
(launcher.config.typed) before these run. Pure: an error names its key, and loading
gives it the key's file and line.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from launcher import shell
from launcher.config import slurmtime
from launcher.config import schema
from launcher.config.login import login_of
from launcher.config.sourcemap import ConfigKeyError
from launcher.config.schema import env_name_problem, partition_name_problem, site_name_problem

# sbatch options glaunch writes itself, or that contradict what it writes: the key that
# sets it instead. sbatch takes any unambiguous abbreviation of a long option, so an
# extra that abbreviates one of these is refused too.
_TASKS = "launcher and resources.gpus_per_node (glaunch starts one task per GPU or per node)"
_GPUS = "resources.gpus_per_node and gpu_directive"
_CPUS = "resources.cpus_per_task or partitions.<name>.cpus_per_node"
_MEM = "resources.mem_gb or partitions.<name>.mem_gb"
_LOGS = "runs_root or --runs-dir (glaunch writes the job's output into the run directory)"
OWN_SBATCH_OPTIONS = {
    "job-name": "the experiment's name", "partition": "resources.partition or default_partition",
    "account": "account", "qos": "qos or partitions.<name>.qos", "constraint": "partitions.<name>.constraint",
    "nodes": "resources.nodes", "ntasks": _TASKS, "ntasks-per-node": _TASKS, "tasks-per-node": _TASKS,
    "gpus-per-node": _GPUS, "gres": _GPUS, "gpus": _GPUS, "gpus-per-task": _GPUS,
    "cpus-per-task": _CPUS, "cpus-per-gpu": _CPUS, "mem": _MEM, "mem-per-cpu": _MEM, "mem-per-gpu": _MEM,
    "time": "resources.time", "chdir": "the directory glaunch runs in", "workdir": "the directory glaunch runs in",
    "output": _LOGS, "error": _LOGS, "open-mode": _LOGS,
    "signal": "requeue.signal_lead_s", "requeue": "requeue.max", "no-requeue": "requeue.max: 0",
    "array": "glaunch submit --sweep", "wrap": "entrypoint (job.sbatch is the batch script)",
    "input": "nothing: the job reads no standard input", "dependency": "glaunch submit --after",
    "parsable": "nothing: glaunch reads sbatch's answer itself", "hold": "nothing: glaunch submits jobs to run",
    "export": "env: (srun inside the job inherits the job's environment, so --export=NONE or a list would "
              "start the ranks without the variables glaunch and the site set)",
    "test-only": "nothing: glaunch runs sbatch --test-only itself before it submits, and with it in the job "
                 "script nothing would ever be queued",
    "wait": "nothing: glaunch submit --wait follows the run (in the script, --wait would block glaunch submit "
            "until the job ended)",
}
# The first word of a site's `python:`, a command name or path.
_INTERPRETER = r"[A-Za-z0-9_./+@~-]*[A-Za-z0-9_]"
# Names a module command takes: no quoting, spaces or options reach `module load`.
_MODULE_NAME = r"[A-Za-z0-9_.+@%=~/][A-Za-z0-9_.+@%=~/:-]*"
# goodput.failures_per_node_hour, failures per node-hour: from a node failing once in about
# 100,000 years (below it a projection is that of no failure at all, and the job's MTBF
# leaves the floats) to every node failing every hour (past it no run makes progress to
# project). Published clusters: about 1e-4 to 1e-3.
FAILURE_RATE_RANGE = (1e-9, 1.0)


def check_site(site: schema.Site) -> None:
    """The profile's own checks; the first that fails raises, naming its key."""
    problem = site_name_problem(site.name)
    if problem:
        raise _error("name", problem)
    for key in site.env:
        problem = env_name_problem(key)
        if problem:
            raise _error(f"env.{key}", problem)
    _check_partitions(site)
    for key in ("account", "qos"):
        _check_directive_value(getattr(site, key), key)
    for key, value in site.sbatch.items():
        _check_sbatch_extra(key, value)
    _check_shell_lines(site)
    if site.container is not None:
        _check_image(site.container.image)
        for i, mount in enumerate(site.container.mounts):
            _check_mount(mount, f"container.mounts[{i}]")
    if site.python is not None:
        python_words(site.python)
    _check_counts(site)
    _check_login(site)


def _check_login(site: schema.Site) -> None:
    """`login:` as ssh would take it: the first problem, naming its key (`login.port`)."""
    login = login_of(site.login)
    problems = login.problems() if login is not None else []
    if problems:
        key, text = problems[0]
        raise _error(key, text)


def _error(key: str, message: str) -> ConfigKeyError:
    # site=True: python_words also runs in resolution, where the experiment's keys are the default.
    return ConfigKeyError(key, message, site=True)


def _check_partitions(site: schema.Site) -> None:
    for pname, part in site.partitions.items():
        _check_partition(pname, part)
    if site.default_partition is not None and not site.partitions:
        # Nothing lists it, yet it becomes the job's --partition.
        problem = partition_name_problem(site.default_partition)
        if problem:
            raise _error("default_partition", problem)
    if site.default_partition is not None and site.partitions and site.default_partition not in site.partitions:
        raise _error("default_partition",
                     f"{site.default_partition!r} is not among partitions: {', '.join(site.partitions)}")


def _check_shell_lines(site: schema.Site) -> None:
    """`modules:` (each becomes `module load NAME`) and `setup:` (lines env.sh runs as written)."""
    for i, module in enumerate(site.modules):
        if not re.fullmatch(_MODULE_NAME, module):
            raise _error(f"modules[{i}]", f"{module!r} is not a module name (letters, digits and . _ + @ % = "
                         "~ / : -, not starting with '-')")
    for i, line in enumerate(site.setup):
        hidden = shell.hidden_characters(line, allowed="\n\t")
        if hidden:
            raise _error(f"setup[{i}]", f"holds {', '.join(hidden)}: setup lines are shell text written as "
                         "they are, and cannot hold control or invisible characters (other than newlines "
                         "and tabs)")


def _check_counts(site: schema.Site) -> None:
    if site.crash_retries < 0:
        raise _error("crash_retries", "must be 0 or more")
    if not 0 <= site.plan.headroom < 1:
        raise _error("plan.headroom", "must be a fraction in [0, 1)")
    if site.plan.overhead_gb < 0:
        raise _error("plan.overhead_gb", "must be 0 or more")
    rate = site.goodput.failures_per_node_hour
    low, high = FAILURE_RATE_RANGE
    if rate is not None and not low <= rate <= high:
        raise _error("goodput.failures_per_node_hour", f"must be from {low:g} to {high:g} failures per node-hour (a "
                     f"rate above 0; published clusters: about 1e-4 to 1e-3), got {rate:.3g}")


def python_words(command: str) -> tuple[str, ...]:
    """The site's `python:` command, split into words as a shell would."""
    try:
        words = tuple(shlex.split(command))
    except ValueError as exc:
        raise _error("python", f"{command!r} is not a command line: {exc}") from None
    if not words:
        raise _error("python", "must name an interpreter")
    if not re.fullmatch(_INTERPRETER, words[0]) or words[0].startswith("-"):
        raise _error("python", f"{command!r} does not start with an interpreter (a command name or path: "
                     "letters, digits and . _ / + @ ~ -)")
    return words


def _check_partition(pname: str, part: schema.Partition) -> None:
    key = f"partitions.{pname}"
    problem = partition_name_problem(pname)
    if problem:
        raise _error(key, problem)
    if part.gpus_per_node < 0:
        raise _error(f"{key}.gpus_per_node", "must be 0 or more")
    for field_name in ("cpus_per_node", "max_nodes", "segment"):
        value = getattr(part, field_name)
        if value is not None and value < 1:
            raise _error(f"{key}.{field_name}", "must be 1 or more")
    for field_name in ("gpu_mem_gb", "mem_gb"):
        value = getattr(part, field_name)
        if value is not None and value <= 0:
            raise _error(f"{key}.{field_name}", "must be more than 0")
    if part.max_time is not None:
        if part.max_time.strip().upper() in ("UNLIMITED", "INFINITE"):
            raise _error(f"{key}.max_time", f"{part.max_time!r}: a partition without a time limit (Slurm's "
                         "MaxTime=UNLIMITED) has no max_time: leave it out or write null")
        try:
            slurmtime.parse(part.max_time)
        except ValueError as exc:
            raise _error(f"{key}.max_time", str(exc)) from None
    for field_name in ("qos", "constraint"):
        _check_directive_value(getattr(part, field_name), f"{key}.{field_name}")


def _check_directive_value(value: Any, key: str) -> None:
    """Values that become #SBATCH lines, which sbatch reads itself."""
    if value is None:
        return
    problem = shell.sbatch_value_problem(value)
    if problem:
        raise _error(key, f"{str(value)!r} {problem}")


def _check_sbatch_extra(key: str, value: Any) -> None:
    dotted = f"sbatch.{key}"
    if not re.fullmatch(r"[a-z][a-z0-9-]*", key):
        raise _error(dotted, "an sbatch option name is lower-case letters, digits and '-'")
    instead = OWN_SBATCH_OPTIONS.get(key)
    if instead is not None:
        raise _error(dotted, f"--{key} is written by glaunch (or contradicts what it writes); set {instead}")
    abbreviated = sorted(own for own in OWN_SBATCH_OPTIONS if own.startswith(key))
    if abbreviated:
        raise _error(dotted, f"sbatch reads --{key} as an abbreviation of --{abbreviated[0]}, which is "
                     f"written by glaunch; set {OWN_SBATCH_OPTIONS[abbreviated[0]]}")
    if isinstance(value, (dict, list)):
        raise _error(dotted, "a directive's value must be a string, number or true/false")
    if value is not None and not isinstance(value, bool):
        _check_directive_value(value, dotted)


def _check_image(image: str) -> None:
    hidden = shell.hidden_characters(image)
    problem = (
        "is empty" if not image else
        "starts with '-' (it would be read as an option)" if image.startswith("-") else
        f"holds {', '.join(hidden)}" if hidden else
        "holds whitespace or ',' (an image is a registry reference or a path)"
        if re.search(r"[\s,]", image) else None)
    if problem:
        raise _error("container.image", f"{image!r} {problem}")


def _check_mount(mount: str, key: str) -> None:
    hidden = shell.hidden_characters(mount)
    parts = mount.split(":")
    problem = None
    if hidden:
        problem = f"holds {', '.join(hidden)}"
    elif "," in mount:
        problem = "holds ',', which separates mounts (pyxis --container-mounts, apptainer --bind)"
    elif len(parts) > 3 or not all(p.startswith("/") for p in parts[:2]) or "" in parts:
        problem = ("is not SRC[:DST[:FLAGS]] with absolute paths (':' separates them; mounts are taken as "
                   "written, $VARIABLES are not expanded)")
    if problem:
        raise _error(key, f"{mount!r} {problem}")
