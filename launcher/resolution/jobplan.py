"""The job plan: everything resolved about one run, frozen. What rendering and the
schedulers read; nothing after resolution changes it.

A JobPlan holds who the run is and where its files go, and one part per concern, each read
by its own consumers: `allocation` (what the scheduler is asked for: the directives),
`launch` (how every start runs the ranks: launcher, entry point, interpreter, environment),
`training` (what the script is told: strategy, precision, batches, checkpoints),
`recovery` (how a start ends and the run goes on: requeue, restarts, the watchdog) and
`transport` (how the run's Slurm commands reach the cluster: here, or through a login node)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from launcher.config import slurmtime
from launcher.config.login import Login
from launcher.config.sites import ProfileFile

# Ports below the Linux ephemeral range (32768-60999), so a rendezvous port is never
# taken by some outgoing connection on the node.
PORT_BASE = 10000
PORT_SPAN = 20000
# A start's port is PORT_BASE + (job id x PORT_STRIDE + its start's number) mod PORT_SPAN.
# The stride is prime to the span (every port is used) and spreads neighbouring jobs apart:
# of two jobs whose ids are within 300 of each other, neither's start lands on the other's
# port while their starts' numbers differ by less than 65 (a stride of 1 put job N's second
# start on job N+1's first).
PORT_STRIDE = 1329
STOP_SIGNALS = ("USR2", "TERM")

# Every command builds these classes: eq=False (plans are never compared) and a docstring
# (else dataclass renders one from the signature) keep that cheap.


@dataclass(frozen=True, eq=False)
class CodeRoot:
    """Where the entry point's code lives, as found on disk at submit
    (launcher.runner.snapshot.locate): the git work tree holding it, else its folder."""

    path: str                         # absolute
    git: bool
    entry_dir: str = "."              # the entry point's folder (module: the working directory), relative to path
    workdir: str | None = None        # the working directory relative to path, when it is inside


@dataclass(frozen=True, eq=False)
class SubmitContext:
    """What resolution takes from the submitting command, beside the two configs."""

    cwd: str
    python: str                       # the submitting interpreter (default on the nodes)
    environ: Mapping[str, str]        # for $VAR / ~ in paths
    run_id: str
    runs_dir: str | None = None       # --runs-dir
    code_root: CodeRoot | None = None   # None: the entry point's folder, without git
    code_dir: str | None = None       # where the code snapshot goes (a sweep's shared copy); default <run dir>/code
    sweep_id: str | None = None       # the sweep this run is an element of (a task of a Slurm job array)
    dependency: str | None = None     # Slurm's --dependency (glaunch submit --after), e.g. afterok:12:13


@dataclass(frozen=True, eq=False)
class CodeSnapshot:
    """The copy of the entry point's code every start runs from (`code.snapshot`)."""

    source: str                       # the folder copied: the git work tree, or the entry point's folder
    git: bool
    dest: str                         # <run dir>/code, or a sweep's copy shared by its elements
    script: str | None                # the submitted script (entry_script is its copy under dest)
    exclude: tuple[str, ...]          # globs, relative to source
    max_bytes: int
    skip: tuple[str, ...]             # absolute directories never copied (runs root, checkpoints)
    import_path: str | None           # the working directory's counterpart under dest, put first on sys.path
    module: str | None = None         # the entry module, imported from import_path

    def copy_of(self, relative: str) -> str:
        return os.path.normpath(os.path.join(self.dest, relative))


@dataclass(frozen=True, eq=False)
class Container:
    """The container every task runs in (the site's `container:`)."""

    runtime: str
    image: str
    mounts: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class Allocation:
    """What the job asks of the scheduler: the directives of job.sbatch (or localrun's options)."""

    partition: str | None
    account: str | None
    qos: str | None
    constraint: str | None
    nodes: int                        # the nodes training runs on
    spare_nodes: int                  # held besides them: what replaces a bad node in the allocation
    gpus_per_node: int
    gpu_directive: str
    tasks_per_node: int
    cpus_per_task: int | None
    mem_gb: float | None
    time_seconds: int
    extra_sbatch: tuple[tuple[str, Any], ...]
    segment: int | None = None        # partitions.P.segment: nodes per segment of a topology block (--segment)
    dependency: str | None = None     # Slurm's --dependency: the runs it waits for (--after)

    @property
    def allocated_nodes(self) -> int:
        """The nodes the job asks the scheduler for: its own and the spares."""
        return self.nodes + self.spare_nodes

    @property
    def time(self) -> str:
        return slurmtime.format(self.time_seconds)


@dataclass(frozen=True, eq=False)
class Launch:
    """How every start runs the ranks: the launcher, the entry point, and the environment
    on the nodes."""

    launcher: str
    ranks_per_node: int
    world_size: int
    entry_script: str | None          # what every start runs (the snapshot's copy when JobPlan.code is set)
    entry_module: str | None
    entry_args: tuple[str, ...]
    entry_resume_args: tuple[str, ...]  # after entry_args on every start but the run's first
    progress_pattern: str | None      # rank 0's output: the first group is the step
    progress_total: int | None
    python: tuple[str, ...]           # interpreter command words, on the nodes
    container: Container | None
    modules: tuple[str, ...]
    setup: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # site then experiment
    derive_master_port: bool


@dataclass(frozen=True, eq=False)
class Training:
    """What the training script is told: strategy, precision, batch sizes, checkpoints."""

    strategy: str                     # ddp | fsdp | deepspeed
    zero_stage: int | None
    precision: str
    global_batch: int
    micro_batch: int
    accumulation: int
    ds_config: Mapping[str, Any] | None
    strategy_choice: Mapping[str, Any] | None   # what `auto` chose and why
    checkpoint_every: int
    checkpoint_keep: int


@dataclass(frozen=True, eq=False)
class Recovery:
    """How a start ends and the run goes on: the time limit's warning, requeues, restarts,
    the watchdog, peer recovery. The job controller reads it from task.json."""

    requeue_max: int
    signal_lead_s: int
    crash_retries: int
    exclude_bad_nodes: bool           # requeue without the node a crash or hang points at
    requeue_mode: str                 # after the time limit: resubmit | requeue (a sweep's element: requeue)
    watchdog_stall_s: float           # 0: no stall bound; with watchdog_stall_auto, the bound until warm-up
    watchdog_stall_auto: bool         # stall_s: auto, the bound from the run's step and save times
    watchdog_auto_floor_s: float
    watchdog_first_step_s: int
    watchdog_slow_node: str           # report | exclude
    # The time limit's warning (Slurm's --signal, signal_lead_s ahead): USR2, glaunch's stop
    # request; USR1 for a plain Lightning script, whose own SLURM handling listens for it
    # (launcher.runner.frameworks).
    warning_signal: str = "USR2"
    peer: bool = False                # recovery.peer: a failed data-parallel rank restored from a live peer


@dataclass(frozen=True, eq=False)
class Transport:
    """How the run's Slurm commands reach the cluster: on this machine, or over SSH through
    the login node the site's `login:` names, where Slurm does not answer here (the
    submission's road, launcher.runner.submission_road, makes that choice)."""

    login: Login | None               # None: the site names no login node; Slurm's commands run here

    @property
    def name(self) -> str:
        """What run.json records: ``local`` (this machine's commands), or
        ``ssh://[user@]host[:port]`` (the login node's, over SSH)."""
        return "local" if self.login is None else f"ssh://{self.login.shown}"


@dataclass(frozen=True, eq=False)
class JobPlan:
    """Everything resolved about one run: who it is and where its files go, and its parts."""

    run_id: str
    name: str
    site_name: str
    site_file: str
    scheduler: str
    experiment_file: str
    # paths (absolute, expanded)
    workdir: str
    run_dir: str
    log_dir: str
    checkpoint_dir: str
    checkpoint_take_over: str | None   # the run whose checkpoint directory this one takes over
    # The site profile's files as read (base first, each with its SHA-256): run.json's provenance.
    profile_files: tuple[ProfileFile, ...]
    allocation: Allocation
    launch: Launch
    training: Training
    recovery: Recovery
    transport: Transport
    # the merged configs, for resolved.yaml
    experiment: Mapping[str, Any] = field(repr=False)
    site: Mapping[str, Any] = field(repr=False)
    # launch.entry_script is the snapshot's copy when the code is snapshotted
    code: CodeSnapshot | None = None
    hparams: Mapping[str, Any] = field(default_factory=dict)
    sweep_id: str | None = None       # an element of this sweep: on Slurm, one task of an array job

    @property
    def submitted_script(self) -> str | None:
        """The script as the experiment names it (before any snapshot)."""
        return self.code.script if self.code is not None else self.launch.entry_script
