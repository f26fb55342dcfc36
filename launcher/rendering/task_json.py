"""The job plan's task spec (launcher.rundir.taskspec): what every task of the run needs
to know, and task.json's text, written into the run directory with the bundle. job.sbatch
describes what runs from the same spec (launcher.rundir.launch). Pure."""

from __future__ import annotations

from launcher.resolution.jobplan import JobPlan
from launcher.rundir import runvalues
from launcher.rundir.taskspec import TaskSpec


def task_spec(plan: JobPlan) -> TaskSpec:
    return TaskSpec(
        launcher=plan.launch.launcher,
        script=plan.launch.entry_script,
        module=plan.launch.entry_module,
        args=tuple(plan.launch.entry_args),
        nodes=plan.allocation.nodes,
        ranks_per_node=plan.launch.ranks_per_node,
        world_size=plan.launch.world_size,
        run_dir=plan.run_dir,
        run_id=plan.run_id,
        requeue_max=plan.recovery.requeue_max,
        crash_retries=plan.recovery.crash_retries,
        exclude_bad_nodes=plan.recovery.exclude_bad_nodes,
        requeue_mode=plan.recovery.requeue_mode,
        watchdog_stall_s=float(plan.recovery.watchdog_stall_s),
        watchdog_stall_auto=plan.recovery.watchdog_stall_auto,
        watchdog_auto_floor_s=float(plan.recovery.watchdog_auto_floor_s),
        watchdog_first_step_s=float(plan.recovery.watchdog_first_step_s),
        watchdog_slow_node=plan.recovery.watchdog_slow_node,
        # The code snapshot's counterpart of the working directory: imported from before it.
        code_path=plan.code.import_path if plan.code is not None else None,
        resume_args=tuple(plan.launch.entry_resume_args),
        run_env=tuple(name for name, value in plan.launch.env if runvalues.mentions(value)),
        progress_pattern=plan.launch.progress_pattern,
        progress_total=plan.launch.progress_total,
    )


def task_file_text(plan: JobPlan) -> str:
    """task.json (layout.TASK_FILE) of the plan's run directory."""
    return task_spec(plan).to_json()
