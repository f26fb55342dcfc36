"""What each task runs, from the job's task spec (task.json, :mod:`.taskspec`): the entry
point's words and torchrun's arguments. job.sbatch prints the same words from the same
spec, so what the script says is what runs. Pure.

torchrun's options differ between torch releases, and the torch a job runs is the one its
nodes load (a module, a container), not the submitting machine's. So the node's task
passes the options its own torchrun accepts (:func:`parser_options`) and
:func:`torchrun_args` fits the words to them; without that list (job.sbatch's
description, written at submit time) every option is shown.
"""

from __future__ import annotations

from typing import Any, Collection, Sequence

from launcher.rundir.taskspec import TaskSpec

# SIGTERM (preemption) must not make the agent tear its workers down before they save:
# glaunch's task forwards it, like the time-limit warning. torchrun gained this option in
# torch 2.9 (pytorch/pytorch#160690); an older agent handles SIGTERM itself and stops the
# workers with it, which still lets them checkpoint but ends the start as a failure.
SIGNALS_TO_HANDLE = "SIGINT,SIGHUP,SIGQUIT"

# Options a torchrun may lack: left out where the node's torchrun does not know them.
OPTIONAL = frozenset({"--signals-to-handle", "--log-dir", "--redirects"})

# torchrun's --redirects: both streams of every worker into its own file (1 stdout, 2 stderr).
REDIRECT_BOTH = "3"


def entry_words(spec: TaskSpec, args: Sequence[str] | None = None) -> list[str]:
    """The program and its arguments, as a user would type them after `python`: `args`
    for one start (run-scoped values filled in), else the spec's as written."""
    head = ["-m", spec.module] if spec.module is not None else [str(spec.script)]
    return head + list(spec.args if args is None else args)


def torchrun_args(spec: TaskSpec, *, node_rank: str, master_addr: str, master_port: str,
                  job_id: str, accepted: Collection[str] | None = None) -> list[str]:
    """torchrun's arguments for one node: static rendezvous at the first host, node rank
    ``node_rank`` (the task's Slurm node id).

    Static, not c10d: c10d numbers the nodes by sorting their host names and agent pids
    and ignores --node-rank, so global rank 0 may land on any node (``node10`` sorts
    before ``node2``; two agents on one host in pid order). Static keeps torchrun's node
    rank equal to Slurm's node id: node ``n`` runs ranks ``n*nproc`` to
    ``(n+1)*nproc - 1``, the placement srun gives, and task ``n``'s log is node ``n``'s
    (rundir.taskspec.Placement). The allocation is fixed and nothing restarts inside
    torchrun (--max-restarts=0), so c10d's elasticity buys nothing here. Node 0 hosts the
    rendezvous store at ``master_addr``, the first host of the allocation.

    ``accepted``: the option strings the node's torchrun knows (:func:`parser_options`).
    Given, each option takes the spelling it knows (``--nproc-per-node``, or the
    ``--nproc_per_node`` of torch before 2.0) and optional ones it lacks are left out;
    None keeps every option as written (the submit-time description).
    """
    options = [
        ("--nnodes", str(spec.nodes)),
        ("--nproc-per-node", str(spec.ranks_per_node)),
        ("--node-rank", node_rank),
        ("--rdzv-backend", "static"),
        ("--rdzv-endpoint", f"{master_addr}:{master_port}"),
        ("--rdzv-id", job_id),
        ("--max-restarts", "0"),
        ("--signals-to-handle", SIGNALS_TO_HANDLE),
    ]
    return fitted(options, accepted)


def worker_log_args(log_dir: str, accepted: Collection[str] | None = None) -> list[str]:
    """torchrun's options that give each worker its own stdout and stderr file under
    `log_dir` (layout's WORKER_LOG): what `glaunch logs --rank N` shows of rank N, and
    where rank 0's lines are followed for `entrypoint.progress` and the console. Not
    tee'd to the agent's log too: torchrun would put its ``[default0]:`` before every
    line. Left out where the node's torchrun lacks them (its workers then share the
    node's log)."""
    return fitted([("--log-dir", log_dir), ("--redirects", REDIRECT_BOTH)], accepted)


def fitted(options: Sequence[tuple[str, str]], accepted: Collection[str] | None) -> list[str]:
    """`--name=value` words, each name in the node's spelling (see :func:`torchrun_args`)."""
    words = []
    for name, value in options:
        if accepted is not None:
            spelled = spelling(name, accepted)
            if spelled is None:
                if name in OPTIONAL:
                    continue
                raise RuntimeError(f"glaunch: this node's torchrun has no {name} option; "
                                   "glaunch needs torch 2.0 or newer on the nodes")
            name = spelled
        words.append(f"{name}={value}")
    return words


def spelling(name: str, accepted: Collection[str]) -> str | None:
    """``name`` as the node's torchrun spells it (dashes, else underscores), None if unknown."""
    for candidate in (name, "--" + name[2:].replace("-", "_")):
        if candidate in accepted:
            return candidate
    return None


def parser_options(parser: Any) -> frozenset[str]:
    """Every option string an argparse parser accepts (torch.distributed.run.get_args_parser())."""
    return frozenset(s for action in parser._actions for s in action.option_strings)
