"""Render: a JobPlan -> the run bundle's files, as text. Pure: the only files it reads
are its own templates, and it writes none (the caller writes what it returns).

What differs between schedulers (directives, the launch line, the shell after it, the
rendezvous) comes in a `JobShell` from the scheduler; the shell that runs is in the
templates (templates/), which receive only text that `launcher.shell` has
already quoted.
"""

from __future__ import annotations

import importlib.resources
import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from launcher import __version__
from launcher.errors import ConfigError
from launcher.resolution.jobplan import STOP_SIGNALS, JobPlan
from launcher.rundir import envnames
from launcher.rundir.layout import (
    DS_CONFIG_FILE,
    ENV_FILE,
    HPARAMS_FILE,
    JOB_SCRIPT,
    RESOLVED_FILE,
    TASK_FILE,
    RunDir,
)
from launcher.rundir.launch import entry_words, torchrun_args
from launcher import shell
from launcher.rendering import templating
from launcher.rendering.task_json import task_file_text, task_spec

NETWORK_PREFIXES = ("NCCL_", "TORCH_NCCL_", "FI_", "UCX_", "GLOO_", "CUDA_DEVICE_MAX_CONNECTIONS")


def _templates_dir() -> Path:
    """glaunch's templates: launcher/templates/ where the package is installed (pyproject.toml's
    package-dir puts the checkout's templates/ there), else the checkout's own (a source
    tree, an editable install)."""
    installed = importlib.resources.files("launcher").joinpath("templates")
    if isinstance(installed, Path) and installed.is_dir():
        return Path(os.fspath(installed))
    return Path(__file__).resolve().parents[2] / "templates"


TEMPLATES = _templates_dir()


@dataclass(frozen=True)
class JobShell:
    """The scheduler's part of job.sbatch and env.sh."""

    directives: tuple[str, ...]          # header lines (#SBATCH ..., or a comment)
    launch: str                          # the command that starts every task
    launch_template: str                 # the shell around it (templates/NAME)
    launch_context: Mapping[str, Any]    # what that template needs besides `launch`
    rendezvous_template: str             # env.sh's rendezvous section (templates/NAME)
    rendezvous_context: Mapping[str, Any]
    submitit_executor: str               # SUBMITIT_EXECUTOR for submitit's task loader
    node_rank: str                       # torchrun's --node-rank, as shell text
    job_id: str                          # torchrun's --rdzv-id, as shell text
    extra_env: tuple[tuple[str, str, Any], ...] = ()   # more GLAUNCH_* exports (see glaunch_env)


@cache
def _parsed(name: str) -> tuple[templating.Node, ...]:
    """The template `name` of templates/, parsed (launcher.rendering.templating)."""
    if TEMPLATES.is_dir():
        text = (TEMPLATES / name).read_text(encoding="utf-8")
    else:   # a package with no folder of its own on disk (a zip): read through its loader
        text = importlib.resources.files("launcher").joinpath("templates", name).read_text(encoding="utf-8")
    return templating.parse(text, name)


def lines(items: Iterable[str]) -> str:
    """Lines of a template's section, one text: the templates hold no loop."""
    return "\n".join(items)


def template(file: str, /, **values: Any) -> str:
    """The template `file` of templates/ rendered with `values` (each name it uses must have
    one: templating.TemplateError otherwise)."""
    return templating.render(_parsed(file), values, file, _parsed)


def render(plan: JobPlan, job_shell: JobShell) -> dict[str, str]:
    """File name (relative to the run dir) -> content."""
    files = {
        JOB_SCRIPT: render_job_script(plan, job_shell),
        ENV_FILE: render_env(plan, job_shell),
        RESOLVED_FILE: render_resolved(plan),
        HPARAMS_FILE: render_hparams(plan),
        TASK_FILE: task_file_text(plan),
    }
    if plan.training.ds_config is not None:
        files[DS_CONFIG_FILE] = render_ds_config(plan)
    return files


def render_ds_config(plan: JobPlan) -> str:
    """ds_config.json; resolution has refused NaN and infinities, allow_nan=False makes
    sure none is ever written (DeepSpeed's JSON reader would take them, and train on NaN)."""
    try:
        text = json.dumps(plan.training.ds_config, indent=2, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"not valid JSON: {exc}", file=plan.experiment_file, key="deepspeed") from None
    # json.dumps escapes every other control character; DEL too, so the file shows none.
    return text.replace("\x7f", "\\u007f") + "\n"


def render_hparams(plan: JobPlan) -> str:
    """hparams.json: the experiment's `hparams:`, for the script (GLAUNCH_HPARAMS)."""
    return json.dumps(dict(plan.hparams), indent=2, allow_nan=False) + "\n"


# --- job.sbatch ------------------------------------------------------------------------


def python_command(plan: JobPlan) -> str:
    return shell.join(plan.launch.python)


def submitit_command(plan: JobPlan) -> str:
    """The task command, spelled exactly as submitit's executors spell it."""
    return " ".join([python_command(plan), "-u -m submitit.core._submit", shell.quote(plan.log_dir)])


def task_log_patterns(plan: JobPlan) -> tuple[str, str]:
    """Per-task stdout and stderr paths; %j and %t are filled in by srun (or localrun). A
    task of an array job is named as Slurm names it, ARRAYJOB_TASK (%A_%a): the id its
    run record keeps across requeues."""
    run_dir = RunDir(plan.run_dir)
    out, err = run_dir.task_log_pattern("out"), run_dir.task_log_pattern("err")
    if plan.sweep_id is not None and plan.scheduler == "slurm":
        head, _, tail = out.rpartition("%j")
        out = head + "%A_%a" + tail
        head, _, tail = err.rpartition("%j")
        err = head + "%A_%a" + tail
    return out, err


def task_description(plan: JobPlan, job_shell: JobShell) -> list[str]:
    spec = task_spec(plan)
    entry = entry_words(spec)
    if plan.launch.launcher == "torchrun":
        args = torchrun_args(spec, node_rank=job_shell.node_rank, master_addr="$MASTER_ADDR",
                             master_port="$MASTER_PORT", job_id=job_shell.job_id)
        return ["torchrun " + " ".join(args) + " " + shell.join(entry),
                f"(one task per node, {plan.launch.ranks_per_node} worker(s) each)"]
    return ["python " + shell.join(entry),
            "(one task per rank; RANK, LOCAL_RANK and WORLD_SIZE come from the task's rank "
            "in the allocation)"]


def render_job_script(plan: JobPlan, job_shell: JobShell) -> str:
    return template("job.sbatch.j2",
        run_id=plan.run_id, name=plan.name, site=plan.site_name, scheduler=plan.scheduler,
        directives=lines(job_shell.directives),
        env_sh=shell.quote(os.path.join(plan.run_dir, ENV_FILE)),
        total_tasks=plan.allocation.nodes * plan.allocation.tasks_per_node,
        task_description=lines(f"#   {line}" for line in task_description(plan, job_shell)),
        submitit_executor=job_shell.submitit_executor,
        launch_template=job_shell.launch_template, launch=job_shell.launch, **job_shell.launch_context)


# --- env.sh --------------------------------------------------------------------------


def glaunch_env(plan: JobPlan, job_shell: JobShell) -> list[tuple[str, str, Any]]:
    """(name, value, how) of the variables the in-job runtime reads; how is False (literal),
    True ($NAME expands) or "raw" (glaunch's own shell text, e.g. a ${X:-default})."""
    values: list[tuple[str, str, Any]] = [
        (envnames.RUN_ID, plan.run_id, False),
        (envnames.RUN_DIR, plan.run_dir, False),
        (envnames.CHECKPOINT_DIR, plan.checkpoint_dir, False),
        (envnames.CHECKPOINT_EVERY, str(plan.training.checkpoint_every), False),
        (envnames.CHECKPOINT_KEEP, str(plan.training.checkpoint_keep), False),
        (envnames.STRATEGY, plan.training.strategy, False),
        (envnames.PRECISION, plan.training.precision, False),
        (envnames.LAUNCHER, plan.launch.launcher, False),
        (envnames.NODES, str(plan.allocation.nodes), False),
        (envnames.RANKS_PER_NODE, str(plan.launch.ranks_per_node), False),
        (envnames.MICRO_BATCH, str(plan.training.micro_batch), False),
        (envnames.GLOBAL_BATCH, str(plan.training.global_batch), False),
        # The time limit's warning is a stop request whatever signal it comes as: a script
        # read as plain Lightning (warned with USR1) that does use the runtime still saves.
        (envnames.STOP_SIGNALS, ",".join(dict.fromkeys((plan.recovery.warning_signal, *STOP_SIGNALS))), False),
        (envnames.HPARAMS, os.path.join(plan.run_dir, HPARAMS_FILE), False),
    ]
    if plan.training.ds_config is not None:
        values.append((envnames.DS_CONFIG, os.path.join(plan.run_dir, DS_CONFIG_FILE), False))
    if plan.recovery.peer:
        values.append((envnames.RECOVERY_PEER, "1", False))
    return values + list(job_shell.extra_env)


def carried_lib_path(plan: JobPlan) -> list[str]:
    """The line putting the run's lib/ (glaunch's job side and submitit, copied there at
    submit: launcher.runner.carried) first on PYTHONPATH, ahead of anything the profile's
    setup or env put there. No line for a run directory holding a ':', which PYTHONPATH cannot
    carry (it has no escape): such a run imports glaunch as the nodes have it installed."""
    lib = str(RunDir(plan.run_dir).lib_dir)
    return [] if ":" in lib else [shell.prepend_path("PYTHONPATH", lib)]


def render_env(plan: JobPlan, job_shell: JobShell) -> str:
    exports: list[str] = []
    network: list[str] = []
    for name, value in plan.launch.env:
        (network if name.startswith(NETWORK_PREFIXES) else exports).append(shell.export(name, value))
    modules = [f"module load {shell.quote(m)}" for m in plan.launch.modules]
    return template("env.sh.j2",
        run_id=plan.run_id, site=plan.site_name, modules=lines(modules), setup=lines(plan.launch.setup),
        exports=lines(exports), network_exports=lines(network),
        glaunch_exports=lines([*carried_lib_path(plan), *(
            f'export {n}="{v}"' if e == "raw" else shell.export(n, v, expand=e)
            for n, v, e in glaunch_env(plan, job_shell))]),
        rendezvous_template=job_shell.rendezvous_template, **job_shell.rendezvous_context)


# --- resolved.yaml ---------------------------------------------------------------------


def resolved_document(plan: JobPlan) -> dict[str, Any]:
    derived: dict[str, Any] = {
        "scheduler": plan.scheduler,
        "partition": plan.allocation.partition,
        "nodes": plan.allocation.nodes,
        "gpus_per_node": plan.allocation.gpus_per_node,
        "ranks_per_node": plan.launch.ranks_per_node,
        "tasks_per_node": plan.allocation.tasks_per_node,
        "world_size": plan.launch.world_size,
        "cpus_per_task": plan.allocation.cpus_per_task,
        "time": plan.allocation.time,
        "strategy": plan.training.strategy,
        "zero_stage": plan.training.zero_stage,
        "global_batch": plan.training.global_batch,
        "micro_batch": plan.training.micro_batch,
        "gradient_accumulation_steps": plan.training.accumulation,
        "run_dir": plan.run_dir,
        "checkpoint_dir": plan.checkpoint_dir,
        "workdir": plan.workdir,
        "python": list(plan.launch.python),
        "warning_signal": plan.recovery.warning_signal,
    }
    if plan.code is not None:
        derived["code"] = {"source": plan.code.source, "git": plan.code.git, "snapshot": plan.code.dest,
                           "script": plan.code.script}
    if plan.training.strategy_choice is not None:
        derived["strategy_choice"] = dict(plan.training.strategy_choice)
    return {
        "glaunch": __version__,
        "run_id": plan.run_id,
        "experiment_file": plan.experiment_file,
        "site_file": plan.site_file,
        "derived": derived,
        "experiment": plan.experiment,
        "site": plan.site,
    }


# libyaml's emitter where PyYAML was built with it, in a tenth of the time: the same document
# (it folds long quoted strings, writes odd keys as "? key" and characters past U+FFFF as
# escapes, and loads back equal).
_SAFE_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def render_resolved(plan: JobPlan) -> str:
    return yaml.dump(resolved_document(plan), Dumper=_SAFE_DUMPER, sort_keys=False, allow_unicode=True, width=100)
