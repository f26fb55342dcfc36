"""What each Slurm task runs, as plain data: the pickled task function receives it, and
the renderer prints it into job.sbatch, so what the script says is what runs. Pure."""

from __future__ import annotations

from typing import Any

from .resolve import JobPlan


def task_spec(plan: JobPlan) -> dict[str, Any]:
    return {
        "launcher": plan.launcher,
        "script": plan.entry_script,
        "module": plan.entry_module,
        "args": list(plan.entry_args),
        "nodes": plan.nodes,
        "ranks_per_node": plan.ranks_per_node,
        "world_size": plan.world_size,
        "run_dir": plan.run_dir,
        "run_id": plan.run_id,
        "requeue_max": plan.requeue_max,
        "crash_retries": plan.crash_retries,
    }


def entry_words(spec: dict[str, Any]) -> list[str]:
    """The program and its arguments, as a user would type them after `python`."""
    head = ["-m", spec["module"]] if spec["module"] else [spec["script"]]
    return head + list(spec["args"])


def torchrun_args(spec: dict[str, Any], *, node_rank: str, master_addr: str, master_port: str,
                  job_id: str) -> list[str]:
    """torchrun's arguments for one node: c10d rendezvous at the first host."""
    return [
        f"--nnodes={spec['nodes']}",
        f"--nproc-per-node={spec['ranks_per_node']}",
        f"--node-rank={node_rank}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={master_addr}:{master_port}",
        f"--rdzv-id={job_id}",
        "--max-restarts=0",
        # SIGTERM (preemption) must not make the agent tear its workers down before they
        # save: glaunch's task forwards it, like the time-limit warning.
        "--signals-to-handle=SIGINT,SIGHUP,SIGQUIT",
    ]
