"""Typed schemas of the two config files.

Field names are the user contract (DESIGN.md). A field's type decides how a YAML
scalar is read (launcher.config.typed): `str` keeps the text as written, `int`,
`float` and `bool` parse it, `Any` types it as YAML does. Enumerated values are plain
strings, checked after conversion so the error can list the allowed values next to the
key. Fields whose values are shell environment values carry `SHELL_VALUES` metadata:
there `${NAME}` is a variable of the job's shell, not an interpolation.
"""

# No `from __future__ import annotations`: launcher.config.typed reads these annotations on
# every load (typing.get_type_hints), and evaluated ones cost nothing to read.
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from launcher.rundir import envnames



class _Required:
    def __repr__(self) -> str:
        return "<required>"


# The default of a field the file must set.
MISSING: Any = _Required()

# Names of runs, sites and partitions: safe in a path, a job name and a shell word, and
# never read as an option (-x) or a hidden file (.x).
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
NAME_RULE = "letters, digits, '.', '_' and '-', not starting with '.' or '-'"
# A run id is the name plus a stamp (and, in a sweep, more); it names a directory, whose
# name a file system bounds at 255 bytes.
MAX_RUN_NAME = 128
# A site name is looked up and written as NAME.yaml, under the same bound.
MAX_SITE_NAME = 128


def name_problem(name: str, what: str, longest: int | None = None) -> str | None:
    """Why `name` cannot name a site, partition or run (`what`, e.g. "a site name"), or None."""
    if not NAME_PATTERN.fullmatch(name):
        return f"{name!r}: {what} is {NAME_RULE}"
    if longest is not None and len(name) > longest:
        return f"{name[:20]}... is {len(name)} characters long; {what} has at most {longest}"
    return None


def partition_name_problem(name: str) -> str | None:
    """Why `name` cannot be a partition's (a profile's key and the job's --partition), or None."""
    return name_problem(name, "a partition name")


def site_name_problem(name: str) -> str | None:
    """Why `name` cannot be a site profile's name (nor so its file's), or None."""
    return name_problem(name, "a site name", MAX_SITE_NAME)

# Environment values: `$NAME` and `${NAME}` expand in the job's shell; `${run:...}` is
# filled in at each start (launcher.rundir.runvalues), as in the entry point's arguments.
SHELL_VALUES = {"shell_values": True, "run_values": True}
RUN_VALUES = {"run_values": True}

# Environment variables an experiment or a site may not set: Slurm's and glaunch's own
# (the job script reads them, in arithmetic too), and those that change how the job's
# bash itself runs.
RESERVED_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", envnames.PREFIX)
RESERVED_ENV_NAMES = frozenset({"IFS", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND",
                                "BASH_XTRACEFD", "CDPATH", "GLOBIGNORE"})
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_name_problem(name: str) -> str | None:
    """Why `name` cannot be set in `env`, or None."""
    if not _ENV_NAME.fullmatch(name):
        return f"{name!r} is not a valid environment variable name (letters, digits and '_', not starting with a digit)"
    if name.startswith(RESERVED_ENV_PREFIXES):
        prefix = next(p for p in RESERVED_ENV_PREFIXES if name.startswith(p))
        return f"{prefix}* variables are set by Slurm or glaunch for the job, never by a config"
    if name in RESERVED_ENV_NAMES:
        return f"{name} is read by bash itself while the job script runs; it cannot be set in env"
    return None

# --- experiment ------------------------------------------------------------------

# Every command builds these classes: eq=False (configs are never compared) and a docstring
# (else dataclass renders one from the signature) keep that cheap.


@dataclass(eq=False)
class Progress:
    """`entrypoint.progress:` how to read the step from rank 0's output, for a script that
    does not use glaunch's runtime: `pattern`'s first group is the step."""

    pattern: str = MISSING
    total: Optional[int] = None        # the step the run ends at, for the ETA


@dataclass(eq=False)
class Entrypoint:
    """`entrypoint:` what every rank runs: exactly one of a script and a module, with its
    arguments; `resume_args` follow them on every start after the run's first."""

    script: Optional[str] = None
    module: Optional[str] = None
    args: List[str] = field(default_factory=list, metadata=RUN_VALUES)
    resume_args: List[str] = field(default_factory=list, metadata=RUN_VALUES)
    progress: Optional[Progress] = None


@dataclass(eq=False)
class Resources:
    """`resources:` the allocation (defaults: the site's partition)."""

    nodes: int = 1
    spare_nodes: int = 0               # held besides `nodes`: a bad node's replacement without requeue
    gpus_per_node: Optional[int] = None
    partition: Optional[str] = None
    time: str = "01:00:00"
    cpus_per_task: Optional[int] = None
    mem_gb: Optional[float] = None


@dataclass(eq=False)
class Strategy:
    """`strategy:` how the model is distributed (ddp | fsdp | deepspeed | auto) and ZeRO's settings."""

    name: str = "ddp"
    zero_stage: int = 2
    offload_optimizer: str = "none"
    offload_params: str = "none"
    nvme_path: Optional[str] = None


@dataclass(eq=False)
class Batch:
    """`batch:` the global batch (DeepSpeed's train_batch_size) and the per-GPU micro batch."""

    global_size: Optional[int] = None
    micro_size: int = 1


@dataclass(eq=False)
class Model:
    """`model:` the model's size and shape, for the planner (`glaunch plan`, `strategy: auto`)."""

    params: Optional[float] = None
    factory: Optional[str] = None
    optimizer: str = "adam"
    layers: Optional[int] = None
    hidden_size: Optional[int] = None
    heads: Optional[int] = None
    seq_len: Optional[int] = None
    largest_layer_params: Optional[int] = None
    activation_checkpointing: str = "none"    # the recomputation the planner counts
    flash_attention: bool = True               # attention scores never materialised (planner)


@dataclass(eq=False)
class Checkpoint:
    """`checkpoint:` where and how often checkpoints are written, and how many are kept."""

    dir: Optional[str] = None
    every_steps: int = 500
    keep: int = 3
    # A run id: this run takes that run's checkpoint.dir over and continues from its newest
    # checkpoint (the directory is then this run's; the other can no longer resume from it).
    take_over: Optional[str] = None


@dataclass(eq=False)
class Requeue:
    """`requeue:` requeues after a time limit, preemption or a bad node, and the warning before the limit."""

    max: int = 3
    signal_lead_s: int = 120
    exclude_bad_nodes: bool = True     # a crash or hang that points at a node: the next start avoids it
    # How a start that reached the time limit is followed: resubmit (a new job, chained after
    # this one) or requeue (the same job again, which Slurm holds about 120 s). Preemption
    # and crashes always requeue.
    mode: str = "resubmit"


@dataclass(eq=False)
class Watchdog:
    """`watchdog:` how long the ranks may go without finishing a step before it is a hang,
    and what becomes of a node whose ranks compute slower than their peers."""

    # No rank finished a step for this long: a hang. "auto": from the run's own step and save
    # times (launcher.jobcontrol.watchdog); a number of seconds; 0: off. Any: YAML types it.
    stall_s: Any = "auto"
    auto_floor_s: float = 60.0         # the least bound "auto" derives
    first_step_s: int = 1800           # the same bound for the first step of a start (loading, compiling)
    slow_node: str = "report"          # report | exclude (from the next start on)


@dataclass(eq=False)
class Recovery:
    """`recovery:` roads to recover a failure besides a restart from a checkpoint."""

    # A data-parallel rank whose step raises gets a live peer's state in the same job, no
    # checkpoint read (launcher.runtime.peer).
    peer: bool = False


@dataclass(eq=False)
class Code:
    """`code:` the snapshot of the entry point's code that every start runs from."""

    snapshot: Optional[bool] = None    # copy the code into the run directory; unset: on for Slurm
    exclude: List[str] = field(default_factory=list)    # globs left out of the copy
    max_mb: float = 100.0              # larger copies are refused, naming the largest files


@dataclass(eq=False)
class Experiment:
    """An experiment config file."""

    name: str = MISSING
    site: Optional[str] = None
    entrypoint: Entrypoint = field(default_factory=Entrypoint)
    launcher: str = "srun"
    resources: Resources = field(default_factory=Resources)
    strategy: Strategy = field(default_factory=Strategy)
    precision: str = "fp32"
    batch: Batch = field(default_factory=Batch)
    model: Model = field(default_factory=Model)
    deepspeed: Dict[str, Any] = field(default_factory=dict)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    requeue: Requeue = field(default_factory=Requeue)
    watchdog: Watchdog = field(default_factory=Watchdog)
    recovery: Recovery = field(default_factory=Recovery)
    env: Dict[str, str] = field(default_factory=dict, metadata=SHELL_VALUES)
    hparams: Dict[str, Any] = field(default_factory=dict)    # free-form; hparams.json for the script
    code: Code = field(default_factory=Code)


# --- site profile ------------------------------------------------------------------


@dataclass(eq=False)
class Partition:
    """A site's `partitions.NAME:` its nodes and limits."""

    gpus_per_node: int = MISSING
    gpu_type: Optional[str] = None
    gpu_mem_gb: Optional[float] = None
    cpus_per_node: Optional[int] = None
    mem_gb: Optional[float] = None
    max_nodes: Optional[int] = None
    max_time: Optional[str] = None
    constraint: Optional[str] = None
    qos: Optional[str] = None
    preemptible: bool = False
    segment: Optional[int] = None     # topology/block: a job's nodes in segments of N (sbatch --segment, 24.11+)


@dataclass(eq=False)
class Container:
    """A site's `container:` the image every task runs in."""

    runtime: str = MISSING
    image: str = MISSING
    mounts: List[str] = field(default_factory=list)


@dataclass(eq=False)
class PlanSettings:
    """A site's `plan:` what the planner reserves on each GPU."""

    overhead_gb: float = 2.0
    headroom: float = 0.10


@dataclass(eq=False)
class GoodputSettings:
    """A site's `goodput:` what the projection of goodput to a size assumes of the cluster."""

    failures_per_node_hour: Optional[float] = None    # unset: the published figure the projection cites


@dataclass(eq=False)
class LoginSettings:
    """A site's `login:` the login node reached over SSH from a machine without Slurm."""

    host: str = MISSING
    user: Optional[str] = None
    port: Optional[int] = None
    identity_file: Optional[str] = None
    jump: Optional[str] = None


@dataclass(eq=False)
class Site:
    """A site profile."""

    name: str = MISSING
    scheduler: str = "slurm"
    account: Optional[str] = None
    qos: Optional[str] = None
    default_partition: Optional[str] = None
    gpu_directive: str = "gpus-per-node"
    partitions: Dict[str, Partition] = field(default_factory=dict)
    modules: List[str] = field(default_factory=list)
    env: Dict[str, str] = field(default_factory=dict, metadata=SHELL_VALUES)
    setup: List[str] = field(default_factory=list)
    container: Optional[Container] = None
    sbatch: Dict[str, Any] = field(default_factory=dict)
    runs_root: Optional[str] = None
    python: Optional[str] = None
    crash_retries: int = 0
    plan: PlanSettings = field(default_factory=PlanSettings)
    goodput: GoodputSettings = field(default_factory=GoodputSettings)
    login: Optional[LoginSettings] = None


# Enumerated string fields: dotted key -> allowed values.
EXPERIMENT_CHOICES = {
    "launcher": ("srun", "torchrun"),
    "requeue.mode": ("resubmit", "requeue"),
    "strategy.name": ("ddp", "fsdp", "deepspeed", "auto"),
    "strategy.offload_optimizer": ("none", "cpu", "nvme"),
    "strategy.offload_params": ("none", "cpu", "nvme"),
    "precision": ("fp32", "fp16", "bf16"),
    "model.optimizer": ("adam", "adamw", "sgd"),
    "model.activation_checkpointing": ("none", "selective", "full"),
    "watchdog.slow_node": ("report", "exclude"),
}
SITE_CHOICES = {
    "scheduler": ("slurm", "local"),
    "gpu_directive": ("gpus-per-node", "gres"),
    "container.runtime": ("pyxis", "apptainer"),
}
