"""The job plan's task spec (launcher.rundir.taskspec): what every task of the run needs
to know, and task.json's text, written into the run directory with the bundle. job.sbatch
describes what runs from the same spec (launcher.rundir.launch). Pure."""

from __future__ import annotations

from launcher.resolution.jobplan import JobPlan
from launcher.rundir import runvalues
from launcher.rundir.taskspec import TaskSpec


def task_spec(plan: JobPlan) -> TaskSpec:
    return TaskSpec(
        launcher=plan.launcher,
        script=plan.entry_script,
        module=plan.entry_module,
        args=tuple(plan.entry_args),
        nodes=plan.nodes,
        ranks_per_node=plan.ranks_per_node,
        world_size=plan.world_size,
        run_dir=plan.run_dir,
        run_id=plan.run_id,
        requeue_max=plan.requeue_max,
        crash_retries=plan.crash_retries,
        exclude_bad_nodes=plan.exclude_bad_nodes,
        requeue_mode=plan.requeue_mode,
        watchdog_stall_s=float(plan.watchdog_stall_s),
        watchdog_stall_auto=plan.watchdog_stall_auto,
        watchdog_auto_floor_s=float(plan.watchdog_auto_floor_s),
        watchdog_first_step_s=float(plan.watchdog_first_step_s),
        watchdog_slow_node=plan.watchdog_slow_node,
        # The code snapshot's counterpart of the working directory: imported from before it.
        code_path=plan.code.import_path if plan.code is not None else None,
        resume_args=tuple(plan.entry_resume_args),
        run_env=tuple(name for name, value in plan.env if runvalues.mentions(value)),
        progress_pattern=plan.progress_pattern,
        progress_total=plan.progress_total,
    )


def task_file_text(plan: JobPlan) -> str:
    """task.json (layout.TASK_FILE) of the plan's run directory."""
    return task_spec(plan).to_json()
