"""`glaunch run`: a run inside a Slurm allocation that exists already (salloc, an
interactive job), its ranks started with srun by the run's own job.sbatch, run by bash
here; never submitted with sbatch, never requeued.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from launcher.errors import ConfigError
from launcher.rendering.render import JobShell
from launcher.resolution.jobplan import JobPlan
from launcher.rundir import registry
from launcher.rundir.lifecycle import move
from launcher.rundir.layout import RunDir
from launcher.rundir.records import RunRecord, State
from launcher.schedulers.base import Echo, Launched, RunConsole, console_of
from launcher.schedulers.slurm.scheduler import SlurmScheduler, inside_allocation
from launcher.schedulers.slurm.script import controller_command
from launcher.schedulers.slurm.submit import dump_task, submitted_pickle


@dataclass(frozen=True)
class Allocation:
    """The Slurm allocation this process runs in (salloc, an interactive job), from the
    variables Slurm sets in it."""

    job_id: str
    nodes: int
    nodelist: str
    cpus_per_node: int | None = None    # the fewest the allocation has on one node (None: not said)

    @classmethod
    def of(cls, environ: Mapping[str, str]) -> Allocation | None:
        """The allocation this shell is in; None outside one (SLURM_JOB_ID unset); ConfigError
        naming the variable and its value when Slurm's variables are set but not Slurm's."""
        job_id = environ.get("SLURM_JOB_ID", "")
        if not job_id:
            return None
        if not re.fullmatch(r"[0-9]{1,18}", job_id):
            raise _bad_variable("SLURM_JOB_ID", job_id, "not a Slurm job id")
        count_name = "SLURM_JOB_NUM_NODES" if environ.get("SLURM_JOB_NUM_NODES") else "SLURM_NNODES"
        count = environ.get(count_name) or ""
        if count and not re.fullmatch(r"[0-9]{1,6}", count):
            raise _bad_variable(count_name, count, "not a number of nodes")
        return cls(job_id, int(count) if count else 0, environ.get("SLURM_JOB_NODELIST", ""),
                   _fewest_cpus(environ.get("SLURM_JOB_CPUS_PER_NODE", "")))


def _bad_variable(name: str, value: str, problem: str) -> ConfigError:
    shown = repr(value) if len(value) <= 60 else repr(value[:57]) + "..."
    return ConfigError(f"{name}={shown} is set but {problem}: this shell's Slurm environment is not an "
                       "allocation's", file="environment", key=name)


class AllocationScheduler(SlurmScheduler):
    """`glaunch run`: every rank started with srun inside an allocation that exists
    already, no sbatch. The run's job.sbatch is the same script as a batch job's (env.sh,
    rendezvous, srun line, end of start), run here by bash with this shell's environment,
    the allocation's SLURM_* included; it is never requeued (the allocation ends when its
    owner says), and its checkpoints resume with glaunch resume."""

    runs_to_completion = True

    def __init__(self, allocation: Allocation) -> None:
        super().__init__()
        self.allocation = allocation

    def check(self, plan: JobPlan) -> None:
        asked = plan.allocation
        if self.allocation.nodes and asked.nodes > self.allocation.nodes:
            raise ConfigError(f"{asked.nodes} nodes requested, the allocation (job {self.allocation.job_id}) has "
                              f"{self.allocation.nodes}", file=plan.experiment_file, key="resources.nodes")
        # srun would refuse the step ("More processors requested than permitted").
        have = self.allocation.cpus_per_node
        if have is not None and asked.cpus_per_task and asked.cpus_per_task * asked.tasks_per_node > have:
            raise ConfigError(f"{asked.tasks_per_node} task(s) x {asked.cpus_per_task} CPUs per node requested, the "
                              f"allocation (job {self.allocation.job_id}) has {have} CPUs on a node "
                              "(SLURM_JOB_CPUS_PER_NODE); set resources.cpus_per_task to fit",
                              file=plan.experiment_file, key="resources.cpus_per_task")

    def job_shell(self, plan: JobPlan) -> JobShell:
        batch = super().job_shell(plan)
        directives = (f"# run by `glaunch run` inside allocation {self.allocation.job_id} with bash; "
                      "never submitted with sbatch",)
        return dataclasses.replace(batch, directives=directives, launch=controller_command(plan, batch=False))

    def launch(self, plan: JobPlan, run_dir: Path, *, check: bool, echo: Echo | None) -> Launched:
        from launcher.rundir.startsummary import iso

        job_id = self.allocation.job_id
        paths = RunDir(run_dir)
        dump_task(plan, submitted_pickle(plan.log_dir, job_id))
        with registry.updating(run_dir) as record:
            move(record, State.RUNNING.value)
            record.job_id = job_id
            record.requeue_max = record.crash_retries = 0      # nothing requeues an allocation
            record.extra["allocation"] = {"job_id": job_id, "nodes": self.allocation.nodelist}
            record.starts.append(registry.new_start(job_id, 0, started=iso(time.time()), state=State.RUNNING.value))
        console = console_of(echo, run_dir)
        console.observe(record)
        # The caller's environment as it is: srun needs the allocation's SLURM_* variables.
        env = dict(os.environ, SLURM_TIME_FORMAT="standard")
        env.pop("MASTER_PORT", None)
        interrupts = 0
        with open(paths.batch_log(job_id), "ab") as batch_log:
            proc = subprocess.Popen(["bash", str(paths.job_script)], cwd=plan.workdir, env=env,
                                    stdin=subprocess.DEVNULL, stdout=batch_log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            while True:
                try:
                    while proc.poll() is None:
                        console.pump()
                        time.sleep(0.2)
                    break
                except KeyboardInterrupt:
                    interrupts += 1
                    _interrupt(proc.pid, interrupts, console)
        with registry.updating(run_dir) as record:
            start = record.starts[-1] if record.starts else None
            stopped = start.stopped_at if start is not None else None
            at = f"stopped at step {stopped} with a checkpoint" if stopped is not None else "no checkpoint saved"
            if interrupts or record.state == State.RUNNING.value:
                move(record, State.CANCELLED.value, reason="cancelled")
                if start is not None:
                    start.state, start.reason = State.CANCELLED.value, "cancelled"
                record.detail = ("interrupted (Ctrl-C)" if interrupts else
                                 f"the job script exited {proc.returncode} without recording the start") + f": {at}"
            elif record.state in (State.TIMEOUT.value, State.PREEMPTED.value):
                record.detail = (f"{at}; inside an allocation nothing requeues: glaunch resume "
                                 f"{record.run_id} continues from it")
        console.finish(record)
        return Launched(job_id, record.state, 0 if record.state == State.COMPLETED.value else 1)

    def cancel(self, run_dir: Path, record: RunRecord) -> str:
        return inside_allocation(record)


def _fewest_cpus(text: str) -> int | None:
    """SLURM_JOB_CPUS_PER_NODE (`72(x2),36`: 72 CPUs on each of two nodes, 36 on a third)
    -> the fewest on one node; None when unset or unreadable."""
    counts = [int(m[1]) for m in re.finditer(r"(?:^|,)(\d+)(?:\(x\d+\))?(?=,|$)", text)]
    return min(counts) if counts and len(counts) == text.count(",") + 1 else None


def _interrupt(bash_pid: int, count: int, console: RunConsole) -> None:
    """Ctrl-C in `glaunch run`: the first asks the ranks to stop as before a time limit
    (the warning signal to srun, which passes it on to every task: they save a checkpoint
    and exit, and the script records the start; srun would end the step at once on
    SIGTERM); the second kills everything the script started."""
    from launcher.runtime.task import WARNING_SIGNAL, child_pids

    if count == 1:
        console.event("interrupted: the ranks stop and save a checkpoint (Ctrl-C again kills them)")
        for pid in child_pids(bash_pid):
            try:
                os.kill(pid, WARNING_SIGNAL)
            except ProcessLookupError:
                pass
    else:
        console.event("killing the job step")
        try:
            os.killpg(bash_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
