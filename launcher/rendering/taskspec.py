"""The task spec: what every task of a run needs to know, as plain data. Pickled with
the task function at submit time (launcher.runtime.task) and printed into job.sbatch
(launcher.rundir.launch spells both from it). Pure."""

from __future__ import annotations

from typing import Any

from launcher.resolution.jobplan import JobPlan


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
        "exclude_bad_nodes": plan.exclude_bad_nodes,
        "watchdog_stall_s": plan.watchdog_stall_s,
        "watchdog_first_step_s": plan.watchdog_first_step_s,
        # The code snapshot's counterpart of the working directory: imported from before it.
        "code_path": plan.code.import_path if plan.code is not None else None,
    }
