"""What each task runs, from the task spec the submit side pickles with it: the entry
point's words and torchrun's arguments. job.sbatch prints the same words from the same
spec, so what the script says is what runs. Pure."""

from __future__ import annotations

from typing import Any, Mapping


def entry_words(spec: Mapping[str, Any]) -> list[str]:
    """The program and its arguments, as a user would type them after `python`."""
    head = ["-m", spec["module"]] if spec["module"] else [spec["script"]]
    return head + list(spec["args"])


def torchrun_args(spec: Mapping[str, Any], *, node_rank: str, master_addr: str, master_port: str,
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
