"""What `glaunch submit`, `resume` and `run` print about what they wrote and started (the
console of a run followed to its end is launcher.views.console's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launcher.runner.results import Run, StateChange, Sweep

if TYPE_CHECKING:       # every command's CLI imports this module: `status` needs no plan
    from launcher.resolution.jobplan import JobPlan


def running_here(plan: JobPlan) -> str:
    """The first line of a run on this machine."""
    return f"run {plan.run_id}: running on this machine ({plan.launch.world_size} ranks); {plan.run_dir}"


def dry_run(run: Run, job_script: str, to_submit: str | None = None) -> str:
    """The bundle rendered; `to_submit`: the command that submits it (the one given, less
    --dry-run)."""
    end = f"\nto submit it: {to_submit}" if to_submit else ""
    where = f"run directory: {run.run_dir}"
    if run.cluster_dir is not None:
        where = (f"run directory on {run.cluster_host}: {run.cluster_dir} ($HOME and $USER: the cluster "
                 f"account's, asked when it is submitted)\nrendered here: {run.run_dir}")
    return f"{where}\n--- job.sbatch ---\n{job_script}{end}"


def started(run: Run, action: str = "submitted", *, following: bool = False) -> str:
    """`action`: submitted, resumed as. Over SSH the run directory named is the cluster's.
    Unless glaunch goes on `following` the run, the last line is what to type next."""
    if run.cluster_dir is not None:
        where = f"run directory on {run.cluster_host}: {run.cluster_dir}\nrecord here: {run.run_dir}"
    else:
        where = f"run directory: {run.run_dir}"
    return f"run {run.run_id}: {action} job {run.job_id}\n{where}" + ("" if following else
                                                                       f"\n{next_commands(run.run_id)}")


def next_commands(run_id: str) -> str:
    """What to type after a run was submitted."""
    return f"next: glaunch logs -f {run_id}   |   glaunch status {run_id}"


def ended_here(run: Run) -> str:
    """A run `glaunch run` followed to its end."""
    return f"run {run.run_id}: {run.state}\nrun directory: {run.run_dir}"


def sweep_running_here(prepared: Any) -> str:
    """The first line of a sweep on this machine (`prepared`: its PreparedSweep)."""
    return (f"sweep {prepared.sweep_id}: {len(prepared.elements)} runs on this machine, "
            f"{prepared.max_parallel or 1} at a time; {prepared.sweep_dir}")


def sweep_dry_run(sweep: Sweep, first_job_script: str) -> str:
    """The sweep directory, how its elements would be submitted, and the first array's
    script (else the first element's job.sbatch, `first_job_script`)."""
    arrays = [a for a in sweep.arrays if a.get("script")]
    count = len(sweep.runs)
    how = f"{count} element(s) in {len(arrays)} job array(s)" if arrays else f"{count} element(s), run one by one"
    name, text = ((arrays[0]["script"], sweep.files[arrays[0]["script"]]) if arrays
                  else ("job.sbatch (element 0)", first_job_script))
    return f"sweep directory: {sweep.sweep_dir}\n{how}\n--- {name} ---\n{text}"


def sweep_started(sweep: Sweep) -> str:
    """Each submission of a sweep (a Slurm job array): its job or why it was not submitted."""
    lines = [f"sweep {sweep.sweep_id}: {len(sweep.runs)} element(s)"]
    for array in sweep.arrays:
        what = f"job array {array['job_id']}" if array.get("job_id") else "not submitted"
        lines.append(f"  {array.get('script')}: {what}, {len(array['elements'])} task(s)"
                     + (f" ({array['error']})" if array.get("error") else ""))
    lines.append(f"sweep directory: {sweep.sweep_dir}")
    lines.append(f"next: glaunch status {sweep.sweep_id}   |   glaunch logs {sweep.sweep_id}")
    return "\n".join(lines)


def state_line(change: StateChange) -> str:
    """A change of state while `--wait` follows a run or sweep."""
    if change.sweep:
        return f"[glaunch] element {change.element} (job {change.job_id}): {change.state}"
    return f"[glaunch] job {change.job_id}: {change.state}"
