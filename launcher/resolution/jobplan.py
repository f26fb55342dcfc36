"""The job plan: everything resolved about one run, frozen. What rendering and the
schedulers read; nothing after resolution changes it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from . import slurmtime

# Ports below the Linux ephemeral range (32768-60999), so a rendezvous port is never
# taken by some outgoing connection on the node.
PORT_BASE = 10000
PORT_SPAN = 20000
STOP_SIGNALS = ("USR2", "TERM")


@dataclass(frozen=True)
class SubmitContext:
    cwd: str
    python: str                       # the submitting interpreter (default on the nodes)
    environ: Mapping[str, str]        # for $VAR / ~ in paths
    run_id: str
    runs_dir: str | None = None       # --runs-dir


@dataclass(frozen=True)
class Container:
    runtime: str
    image: str
    mounts: tuple[str, ...]


@dataclass(frozen=True)
class JobPlan:
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
    # allocation
    partition: str | None
    account: str | None
    qos: str | None
    constraint: str | None
    nodes: int
    gpus_per_node: int
    gpu_directive: str
    tasks_per_node: int
    cpus_per_task: int | None
    mem_gb: float | None
    time_seconds: int
    preemptible: bool
    extra_sbatch: tuple[tuple[str, Any], ...]
    # launch
    launcher: str
    ranks_per_node: int
    world_size: int
    entry_script: str | None
    entry_module: str | None
    entry_args: tuple[str, ...]
    python: tuple[str, ...]           # interpreter command words, on the nodes
    container: Container | None
    modules: tuple[str, ...]
    setup: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # site then experiment
    derive_master_port: bool
    # training
    strategy: str                     # ddp | deepspeed
    zero_stage: int | None
    precision: str
    global_batch: int
    micro_batch: int
    accumulation: int
    ds_config: Mapping[str, Any] | None
    strategy_choice: Mapping[str, Any] | None   # what `auto` chose and why
    checkpoint_every: int
    checkpoint_keep: int
    requeue_max: int
    signal_lead_s: int
    crash_retries: int
    # the merged configs, for resolved.yaml
    experiment: Mapping[str, Any] = field(repr=False)
    site: Mapping[str, Any] = field(repr=False)

    @property
    def time(self) -> str:
        return slurmtime.format(self.time_seconds)
