"""Slurm: job.sbatch's directives and srun line, the profile checked against the live
cluster, preflight with `sbatch --test-only`, submission through submitit with glaunch's
rendered job.sbatch as the exact submission text, state from squeue and sacct, scancel.

Every Slurm command runs through the scheduler's client (client.py), its transport: this
machine's, or a login node's over SSH (launcher.schedulers.ssh.on_login.slurm_client),
handed to the scheduler and to every query by whoever holds the connection; a timeout, a
bounded retry on transient errors, an environment without the submitting shell's SLURM_*
variables or Slurm's input variables (SBATCH_*, SALLOC_*, SRUN_*), which would otherwise
reach or reshape the job.

Here: the scheduler itself. sbatch and submitit are driven by submit.py, squeue and sacct
asked by queries.py, run.json written by records.py, job arrays shaped by array.py;
`glaunch run` inside an existing allocation is allocation.py."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from launcher.errors import GlaunchError, SchedulerError
from launcher.processes import without_tool_prefix
from launcher.rendering.render import JobShell
from launcher.resolution.jobplan import PORT_BASE, PORT_SPAN, PORT_STRIDE, JobPlan
from launcher.rundir import envnames, registry
from launcher.rundir.lifecycle import move
from launcher.rundir.layout import RunDir
from launcher.rundir.records import RunRecord, State, is_terminal
from launcher.schedulers.base import Echo, Launched, LaunchedBatch, Scheduler, SweepBatch, SweepPlan
from launcher.schedulers.slurm import array
from launcher.schedulers.slurm.script import controller_command, sbatch_directives

# What talks to Slurm (sbatch and submitit, squeue and sacct, the cluster's checks) is
# imported by the methods that do so: a dry run renders job.sbatch with script.py and
# array.py alone, and never loads the rest (tests/test_command_imports.py says so).
if TYPE_CHECKING:
    from launcher.schedulers.cluster.facts import Cluster
    from launcher.schedulers.slurm.client import Client


class SlurmScheduler(Scheduler):
    """Slurm, its commands run through a transport: `client`, this machine's by default
    (client.CLIENT), or one that runs them on a login node over SSH
    (launcher.schedulers.ssh.on_login.slurm_client)."""

    name = "slurm"

    def __init__(self, client: Client | None = None) -> None:
        self._client = client
        self._cluster: Cluster | None = None   # read once per submission

    @property
    def client(self) -> Client:
        if self._client is None:
            from launcher.schedulers.slurm.client import CLIENT

            self._client = CLIENT
        return self._client

    def cluster(self) -> Cluster:
        """The live cluster's facts (one scontrol call, sacctmgr), read once."""
        from launcher.schedulers.cluster.facts import read_cluster

        if self._cluster is None:
            self._cluster = read_cluster(self.client, "glaunch submit")
        return self._cluster

    def version(self) -> str | None:
        """Slurm's version, where this submission read the cluster (run.json's provenance)."""
        version = self._cluster.settings.get("SLURM_VERSION") if self._cluster is not None else None
        return f"slurm {version}" if version else None

    # --- rendering ---------------------------------------------------------------------

    def job_shell(self, plan: JobPlan) -> JobShell:
        # A sweep's element is one task of an array job: Slurm's id for it, ARRAYJOB_TASK,
        # stays the same across its requeues, and `scontrol requeue` of it requeues it alone.
        directives = tuple(sbatch_directives(plan))
        if plan.sweep_id is not None:
            job_env: tuple[str, str, Any] = (envnames.JOB_ID, "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}", "raw")
            directives += (f"# an element of sweep {plan.sweep_id}: run by the sweep's array script "
                           "(the directives above are its array's)",)
        else:
            job_env = (envnames.JOB_ID, "$SLURM_JOB_ID", True)
        return JobShell(
            directives=directives, launch=controller_command(plan, batch=True),
            launch_template="slurm.launch.sh.j2", launch_context={"nodes": plan.allocation.nodes},
            rendezvous_template="slurm.rendezvous.sh.j2",
            rendezvous_context={"derive_master_port": plan.launch.derive_master_port, "port_base": PORT_BASE,
                                "port_span": PORT_SPAN, "port_stride": PORT_STRIDE},
            submitit_executor="slurm", node_rank="$SLURM_NODEID", job_id="$SLURM_JOB_ID",
            extra_env=(job_env, (envnames.RESTART, "${SLURM_RESTART_COUNT:-0}", "raw")))

    # --- submission --------------------------------------------------------------------

    def require(self) -> None:
        if not self.client.has_command("sbatch") or not self.client.has_command("srun"):
            raise SchedulerError("sbatch is not on PATH here: run glaunch on the cluster's login node, or give the "
                                 "profile a login: section to submit over SSH from here (--dry-run renders the "
                                 "bundle without Slurm)")

    def check_cluster(self, plan: JobPlan) -> list[str]:
        """The site profile against the live cluster, for the partition this job uses, and
        the nodes' interpreter: SchedulerError naming every difference that would get the
        job refused, leave it pending forever or run it on other hardware, or `python:`
        when the interpreter does not start or finds no torch; the harmless ones as warnings."""
        from launcher.schedulers.cluster.check import Request, check_site
        from launcher.schedulers.cluster.torchprobe import probe_plan

        report = check_site(plan.site, self.cluster(), partition=plan.allocation.partition,
                            request=Request.of_plan(plan))
        if report.fatal:
            raise report.error(plan.site_file, site_reference(plan.site_name, plan.site_file))
        # The nodes' interpreter, asked where Slurm's commands run (the login node stands in
        # for the nodes): one that is not there or finds no torch would fail every start.
        found = probe_plan(self.client, plan, where=self.client.where)
        if found.problem:
            raise SchedulerError(f"{found.problem}; nothing was submitted (`glaunch sites check` asks the same)",
                                 file=plan.site_file, key=found.key)
        return [str(d) for d in report.warnings] + list(report.notes)

    def launch(self, plan: JobPlan, run_dir: Path, *, check: bool, echo: Echo | None) -> Launched:
        from launcher.schedulers.slurm.client import clean_env, ignored_inputs_warning
        from launcher.schedulers.slurm.recording import record_queued, record_refused, record_released, request_values
        from launcher.schedulers.slurm.submit import SubmissionUncertain, preflight, release, submit

        job_text = RunDir(run_dir).job_script.read_text(encoding="utf-8")
        env, ignored = clean_env(os.environ)
        warnings = [w for w in (ignored_inputs_warning(ignored),) if w]
        try:
            if check:
                warnings += self.check_cluster(plan)
            _log_warnings(warnings)
            if check:
                preflight(self.client, plan, RunDir(run_dir).job_script, env)
            job_id = submit(self.client, plan, job_text, env)
        except SubmissionUncertain as exc:
            with registry.updating(run_dir) as record:
                move(record, State.UNKNOWN.value, reason="submission uncertain", detail=exc.message)
                record.extra["submission"] = {"script": exc.script, "marker": exc.marker}
                record.extra["request"] = request_values(plan)
            raise
        except SchedulerError as exc:
            record_refused(run_dir, exc, warnings)
            raise
        # The job is held: its record names it before it may start.
        try:
            record_queued(run_dir, plan, job_id, warnings, self.version(), releasing=True)
            release(self.client, [job_id])
        except BaseException as exc:
            raise undo_held(self.client, job_id, {Path(run_dir): job_id}, exc) from None
        record_released(run_dir)
        return Launched(job_id, State.PENDING.value)

    # --- sweeps: job arrays -------------------------------------------------------------

    def plan_sweep(self, plans: Sequence[JobPlan], *, sweep_id: str, sweep_dir: str, max_parallel: int | None,
                   dry_run: bool) -> SweepPlan:
        """One array per allocation shape, within the cluster's MaxArraySize (Slurm's
        default on a dry run, which asks the cluster nothing)."""
        limit = array.DEFAULT_MAX_ARRAY_SIZE
        if not dry_run:
            self.require()
            limit = array.max_array_size(self.cluster().settings)
        groups = array.group(plans, limit)
        files, batches = {}, []
        for group in groups:
            name = array.array_script(sweep_dir, group.number).name
            files[name] = array.render_array(group, plans, sweep_id=sweep_id, sweep_dir=sweep_dir,
                                             arrays=len(groups), max_parallel=max_parallel)
            batches.append(SweepBatch(name, group.elements))
        return SweepPlan(tuple(batches), files)

    def launch_sweep(self, plans: Sequence[JobPlan], sweep: SweepPlan, sweep_dir: Path, *,
                     max_parallel: int | None, check: bool, echo: Echo | None) -> list[LaunchedBatch]:
        """Check every array (the profile against the cluster, sbatch --test-only), then
        submit them: one sbatch call per array. An array sbatch refuses leaves its elements
        REFUSED; those already queued stay queued."""
        from launcher.schedulers.slurm.client import clean_env, ignored_inputs_warning
        from launcher.schedulers.slurm.recording import record_refused
        from launcher.schedulers.slurm.submit import preflight

        env, ignored = clean_env(os.environ)
        warnings = [w for w in (ignored_inputs_warning(ignored),) if w]
        scripts = [Path(sweep_dir) / str(batch.script) for batch in sweep.batches]
        try:
            if check:
                for batch, script in zip(sweep.batches, scripts):
                    first = plans[batch.elements[0]]
                    warnings += [w for w in self.check_cluster(first) if w not in warnings]
                    preflight(self.client, first, script, env)
        except SchedulerError as exc:
            for plan in plans:
                record_refused(Path(plan.run_dir), exc, warnings)
            raise
        _log_warnings(warnings)
        version = self.version()
        results: list[LaunchedBatch] = []
        try:
            for number, (batch, script) in enumerate(zip(sweep.batches, scripts)):
                members = [plans[i] for i in batch.elements]
                results.append(_queue_array(self.client, number, batch, script, members, env, warnings, version))
        except BaseException as exc:
            # Stopped (Ctrl-C, a failure writing a record): the arrays queued stay, each element
            # without a job is refused, so none waits SUBMITTING for a job that never comes.
            for plan in plans:
                _refuse_unqueued(Path(plan.run_dir), exc)
            raise
        return results

    # --- following ---------------------------------------------------------------------

    def settled(self, record: RunRecord) -> bool:
        from launcher.schedulers.slurm.recording import settled

        return settled(record)

    def refresh(self, run_dir: Path, record: RunRecord) -> RunRecord:
        """squeue says what is live now (and why a pending job waits); sacct fills in
        starts the job could not record (killed at the time limit, node failure). An
        ended run keeps its state whatever squeue says: sacct alone is asked. With the
        controller unreachable, or squeue unable to tell: SchedulerError, and run.json
        says so (`unreachable`)."""
        from launcher.schedulers.slurm.client import Unreachable
        from launcher.schedulers.slurm.queries import sacct_records, squeue_job
        from launcher.schedulers.slurm.recording import fold_job, has_ended

        if _submission_stopped(run_dir, record):
            record = _mark_stopped(run_dir)
        if _release_stopped(run_dir, record):
            record = _finish_release(self.client, run_dir, str(record.job_id))
        uncertain = isinstance(record.extra.get("submission"), dict)
        if (not self.client.has_command("squeue") or not (record.job_id or uncertain)
                or record.extra.get("allocation")):
            return record       # a run inside an allocation: its own record says all (the job is the allocation)
        if not record.job_id:
            try:
                return _settle_uncertain(self, run_dir, record)
            except Unreachable as exc:
                _record_unreachable(run_dir, exc)
                raise
        live = reason = None
        if not has_ended(record):
            try:
                live, reason = squeue_job(self.client, record.job_id)
            except SchedulerError as exc:
                _record_unreachable(run_dir, exc)
                raise
        # An array task's rows: asked of its array, whose row a task still pending when the
        # array was cancelled shares (sacct -j ARRAY_TASK has none for it).
        return fold_job(run_dir, live, reason, sacct_records(self.client, array.array_job_id(record.job_id)))

    def refresh_many(self, runs: Sequence[tuple[Path, RunRecord]]) -> list[RunRecord]:
        """One squeue and one sacct call for all of them (a sweep's elements: by their
        array jobs), instead of two per run."""
        from launcher.schedulers.slurm.queries import sacct_records, squeue_jobs
        from launcher.schedulers.slurm.recording import fold_job, has_ended, job_rows

        if not self.client.has_command("squeue"):
            return [record for _, record in runs]
        runs = [(d, _finish_release(self.client, d, str(r.job_id)) if _release_stopped(d, r) else r)
                for d, r in runs]
        queued = [(d, r) for d, r in runs if r.job_id and not r.dry_run and not r.extra.get("allocation")]
        ids = sorted({array.array_job_id(r.job_id) for _, r in queued if r.job_id})
        # An ended run keeps its state whatever squeue says: only sacct may add to its starts.
        listed = sorted({array.array_job_id(r.job_id) for _, r in queued if r.job_id and not has_ended(r)})
        live: dict[str, tuple[str | None, str | None]] = {}
        histories: dict[str, list[dict[str, str]]] | None = {}
        if listed:
            try:
                live = squeue_jobs(self.client, listed)
            except SchedulerError as exc:
                for run_dir, record in queued:
                    if not has_ended(record):
                        _record_unreachable(run_dir, exc)
                raise
        if ids:
            rows = sacct_records(self.client, ",".join(ids))
            histories = None if rows is None else {}
            for row in job_rows(rows or []):
                histories.setdefault(row["job_id"], []).append(row)  # type: ignore[union-attr]
        asked = {id(r) for _, r in queued}
        out = []
        for run_dir, record in runs:
            if id(record) in asked and record.job_id:
                state, reason = live.get(record.job_id, (None, None))
                history = None if histories is None else histories.get(record.job_id, [])
                out.append(fold_job(run_dir, state, reason, history))
            else:
                out.append(self.refresh(run_dir, record))
        return out

    def cancel_many(self, runs: Sequence[tuple[Path, RunRecord]], job_ids: Sequence[str] = ()) -> list[str]:
        """One scancel for all: the arrays' jobs, and the runs outside them; each run's job
        marked first as `cancel` marks it (its controller then ends it as cancelled, not
        requeued)."""
        arrays = set(job_ids)
        live = [(run_dir, r.job_id) for run_dir, r in runs if r.job_id and not is_terminal(r.state)]
        targets = list(job_ids) + [job_id for _, job_id in live if array.array_job_id(job_id) not in arrays]
        if not targets:
            return ["nothing to cancel"]
        for run_dir, job_id in live:
            with registry.updating(run_dir) as rec:
                registry.request_cancel(run_dir, rec.job_id or job_id)
        proc = self.client.call("scancel", *targets)
        if proc.returncode != 0:
            raise SchedulerError(f"scancel {' '.join(targets)} failed: {without_tool_prefix('scancel', proc.stderr)}")
        return [f"cancelled job {t}" for t in targets]

    def cancel(self, run_dir: Path, record: RunRecord) -> str:
        if not record.job_id:
            return f"run {record.run_id}: nothing to cancel ({record.state})"
        if record.extra.get("allocation"):
            return inside_allocation(record)
        from launcher.schedulers.slurm.queries import refuse_foreign_job

        with registry.updating(run_dir) as rec:
            # Read with the mark set: a job ending at its time limit that resubmits the run
            # either recorded its successor already (cancelled here) or finds the mark and
            # cancels the successor itself (launcher.jobcontrol.jobend.record_successor).
            job_id = rec.job_id or record.job_id
            # The record names the job: Slurm must say it is this run's before it is marked
            # or ended (an edited run.json would end another run's job).
            refuse_foreign_job(self.client, job_id, rec.run_id, str(rec.run_dir or run_dir))
            registry.request_cancel(run_dir, job_id)
        proc = self.client.call("scancel", job_id)
        if proc.returncode != 0:
            raise SchedulerError(f"scancel {job_id} failed: {without_tool_prefix('scancel', proc.stderr)}")
        return f"run {record.run_id}: cancelled job {job_id}"


def site_reference(name: str, site_file: str) -> str:
    """How `glaunch sites check` is to be told the profile: its name where the search path
    finds this file by it, else the file's path (a profile given as a file, off the path or
    behind another of its name), quoted for a shell."""
    from launcher import shell
    from launcher.config.sites import find_site
    from launcher.errors import GlaunchError

    try:
        found = find_site(name, Path.cwd(), os.environ)
    except (GlaunchError, OSError):
        found = None
    if found is not None and os.path.realpath(found) == os.path.realpath(site_file):
        return name
    return shell.quote(site_file)


def _queue_array(client: Client, number: int, batch: SweepBatch, script: Path, members: Sequence[JobPlan],
                 env: Mapping[str, str], warnings: list[str], version: str | None) -> LaunchedBatch:
    """One array of a sweep queued held, each element's task and record put in place, then
    released. Slurm's refusal (of the array, or of its release) refuses its elements; an
    uncertain answer leaves them UNKNOWN, looked up again by status."""
    from launcher.schedulers.slurm.recording import (
        QUEUEING, record_queued, record_refused, record_released, request_values)
    from launcher.schedulers.slurm.submit import (
        SubmissionUncertain, dump_task, link_task, release, submit_array, task_template)

    marker = array.submission_marker(str(members[0].sweep_id), number)
    for task, plan in enumerate(members):
        dump_task(plan, task_template(plan.log_dir))
        with registry.updating(plan.run_dir) as record:
            record.extra[QUEUEING] = {"script": str(script), "marker": marker, "task": task}
    try:
        array_id = submit_array(client, members[0], script, marker, env)
    except SubmissionUncertain as exc:
        for task, plan in enumerate(members):
            with registry.updating(plan.run_dir) as record:
                move(record, State.UNKNOWN.value, reason="submission uncertain", detail=exc.message)
                record.extra.pop(QUEUEING, None)        # looked up as the uncertain submission it is
                record.extra["submission"] = {"script": exc.script, "marker": exc.marker, "task": task}
                record.extra["request"] = request_values(plan)
        return LaunchedBatch(batch.script, None, batch.elements, (None,) * len(members), exc.message)
    except SchedulerError as exc:
        for plan in members:
            record_refused(Path(plan.run_dir), exc, warnings)
        return LaunchedBatch(batch.script, None, batch.elements, (None,) * len(members), exc.message)
    # The array is held: each element's record names its task before any may start.
    element_jobs = {Path(plan.run_dir): f"{array_id}_{task}" for task, plan in enumerate(members)}
    try:
        for plan in members:
            job_id = element_jobs[Path(plan.run_dir)]
            link_task(plan.log_dir, job_id)
            record_queued(Path(plan.run_dir), plan, job_id, warnings, version, releasing=True)
        release(client, [array_id])
    except SchedulerError as exc:
        undone = undo_held(client, array_id, element_jobs, exc)
        return LaunchedBatch(batch.script, None, batch.elements, (None,) * len(members), str(undone))
    except BaseException as exc:
        raise undo_held(client, array_id, element_jobs, exc) from None
    for plan in members:
        record_released(Path(plan.run_dir))
    launched = tuple(Launched(element_jobs[Path(plan.run_dir)], State.PENDING.value) for plan in members)
    return LaunchedBatch(batch.script, array_id, batch.elements, launched)


def _refuse_unqueued(run_dir: Path, exc: BaseException) -> None:
    """A sweep element still SUBMITTING with no job once its sweep's submission stopped:
    REFUSED, saying why."""
    why = exc.message if isinstance(exc, GlaunchError) else f"interrupted ({type(exc).__name__})"
    try:
        with registry.updating(run_dir) as rec:
            if rec.state == State.SUBMITTING and not rec.job_id:
                move(rec, State.REFUSED.value, reason="interrupted",
                     detail=f"the sweep's submission stopped before its array was queued: {why}")
    except (GlaunchError, OSError):
        pass        # the record could not be read or written: the submission's own error says why


def undo_held(client: Client, job_id: str, runs: Mapping[Path, str], exc: BaseException) -> BaseException:
    """After `exc` stopped a submission between the queueing of its held job `job_id` (a
    run's, or a sweep's array) and its release: what to raise. The job is cancelled, and
    the record of each run in `runs` (its directory: its job) no longer names it: REFUSED
    where Slurm refused, else with no job at all (the submission then removes the
    directory). Where the cancel fails, the records keep the held job and the error names
    it with the command that removes it."""
    from launcher.schedulers.slurm.submit import cancel_held

    if not cancel_held(client, job_id):
        for run_dir, own in runs.items():
            _mark_left_held(run_dir, own)
        names = " ".join(sorted({_run_id_of(run_dir) for run_dir in runs}))
        left = f"job {job_id} is left held, never released (scancel failed too): glaunch cancel {names} removes it"
        return SchedulerError(f"{exc.message}; {left}") if isinstance(exc, SchedulerError) else exc
    for run_dir, own in runs.items():
        _forget_held(run_dir, own, exc)
    return exc


def _mark_left_held(run_dir: Path, job_id: str) -> None:
    """run.json: its job is held by glaunch and was never released (status says the job
    never starts, and how to release or cancel it)."""
    from launcher.schedulers.slurm.recording import LEFT_HELD

    try:
        with registry.updating(run_dir) as rec:
            if rec.job_id == job_id:
                rec.extra[LEFT_HELD] = job_id
    except (GlaunchError, OSError):
        pass        # the record could not be written: the submission's own error names the job


def _run_id_of(run_dir: Path) -> str:
    try:
        return registry.read(run_dir).run_id
    except GlaunchError:
        return str(run_dir)


def _forget_held(run_dir: Path, job_id: str, exc: BaseException) -> None:
    """A run's record once its held job was cancelled: the job and its start gone, REFUSED
    saying why (an end: a resumed run can be resumed again; a new run's directory is
    removed by its submission, as nothing was queued for it)."""
    if isinstance(exc, SchedulerError):
        reason, why = "refused", exc.message
    else:
        reason, why = "interrupted", f"the submission was interrupted ({type(exc).__name__})"
    try:
        with registry.updating(run_dir) as rec:
            if rec.job_id == job_id:
                rec.job_id = None
                rec.starts = [start for start in rec.starts if start.job_id != job_id]
            move(rec, State.REFUSED.value, reason=reason, detail=f"{why}; its held job {job_id} was cancelled")
    except (GlaunchError, OSError):
        pass        # the record could not be read or written: the submission's own error says why


# A submission runs its checks, preflight and sbatch within a few minutes, each call
# bounded: a run's record still SUBMITTING without a job this long after it was last written
# was left by a glaunch process that stopped (killed, its machine gone) mid-submission.
STOPPED_SUBMISSION_S = 600.0


def _submission_stopped(run_dir: Path, record: RunRecord) -> bool:
    """A run (or a sweep's element) whose submission stopped before it recorded a job, or
    whether Slurm queued one."""
    if (record.state != State.SUBMITTING or record.job_id or record.dry_run or record.extra.get("allocation")
            or isinstance(record.extra.get("submission"), dict)):
        return False
    return _left_alone(run_dir)


def _left_alone(run_dir: Path) -> bool:
    """Whether run.json was last written longer ago than any submission takes."""
    try:
        written = RunDir(run_dir).run_file.stat().st_mtime
    except OSError:
        return False
    return time.time() - written > STOPPED_SUBMISSION_S


def _release_stopped(run_dir: Path, record: RunRecord) -> bool:
    """A run whose submission stopped after run.json named its held job, before it was
    released (RELEASING still names that job)."""
    from launcher.schedulers.slurm.recording import RELEASING

    return (record.job_id is not None and record.extra.get(RELEASING) == record.job_id
            and record.state == State.PENDING and _left_alone(run_dir))


def _finish_release(client: Client, run_dir: Path, job_id: str) -> RunRecord:
    """What the stopped submission had left to do: release the job (or mark it left held)."""
    from launcher.schedulers.slurm.recording import record_released
    from launcher.schedulers.slurm.submit import release

    try:
        release(client, [job_id])
    except SchedulerError:
        _mark_left_held(run_dir, job_id)
    record_released(run_dir)
    return registry.read(run_dir)


def _mark_stopped(run_dir: Path) -> RunRecord:
    """The stopped submission taken as an uncertain one: the job it may have queued (held,
    so never started) is looked for by the run's marker or the script sbatch was given (a
    job whose --comment is the user's own carries no marker), then released or the run
    refused. A sweep's element: by its array's, and its task in it."""
    from launcher.schedulers.slurm.recording import QUEUEING
    from launcher.schedulers.slurm.submit import submission_marker, submission_scripts

    with registry.updating(run_dir) as rec:
        queueing = rec.extra.pop(QUEUEING, None)
        if isinstance(queueing, dict):
            rec.extra["submission"] = {**queueing, "stopped": True}
        elif rec.extra.get("sweep"):
            # An element whose array was never reached: its keys are written before sbatch.
            rec.extra["submission"] = {"script": "", "marker": "", "stopped": True}
        else:
            scripts = submission_scripts(RunDir(run_dir).log_dir)
            rec.extra["submission"] = {"script": str(scripts[-1]) if scripts else "",
                                       "marker": submission_marker(rec.run_id), "stopped": True}
    return rec


def _settle_uncertain(slurm: SlurmScheduler, run_dir: Path, record: RunRecord) -> RunRecord:
    """A submission whose sbatch failed without a clear answer: the job, if the
    controller queued it after all, carries the run's marker. Found, it is held: its task
    is put in place and its record names it, then it is released."""
    from launcher.schedulers.slurm.queries import find_submitted
    from launcher.schedulers.slurm.recording import RELEASING

    sub = record.extra["submission"]
    script, marker = str(sub.get("script") or ""), str(sub.get("marker") or "")
    job_id = find_submitted(slurm.client, script, marker) if script or marker else None
    task = sub.get("task")
    element = isinstance(task, int) and not isinstance(task, bool)
    if job_id and element:
        job_id = f"{array.array_job_id(job_id)}_{task}"     # a sweep's element: its array's task
    if job_id:
        _place_task(run_dir, job_id, element=element)
    with registry.updating(run_dir) as rec:
        rec.extra.pop("submission", None)
        if job_id:
            move(rec, State.PENDING.value, reason=None, detail=None)
            rec.job_id = job_id
            rec.starts.append(registry.new_start(job_id, 0))
            rec.extra[RELEASING] = job_id
        elif sub.get("stopped") is True:
            move(rec, State.REFUSED.value, reason="interrupted",
                 detail="the glaunch process submitting it stopped before Slurm queued a job (Slurm has no job "
                        "carrying this run's id)")
        else:
            move(rec, State.REFUSED.value, reason="refused",
                 detail="sbatch did not queue the job (Slurm has no job carrying this run's id)")
    if not job_id:
        return rec
    return slurm.refresh(run_dir, _finish_release(slurm.client, run_dir, job_id))


def _place_task(run_dir: Path, job_id: str, *, element: bool) -> None:
    """The pickled task submitit's loader reads for a job found after a lost answer: a
    sweep element's from its array's template, a run's written anew (the submission
    stopped before submitit put it in place)."""
    from launcher.runtime.task import place_task
    from launcher.schedulers.slurm.submit import link_task

    try:
        if element:
            link_task(RunDir(run_dir).log_dir, job_id)
        else:
            place_task(run_dir, job_id)
    except OSError:
        pass        # the job's loader then fails, and the run's end says so


def _record_unreachable(run_dir: Path, exc: SchedulerError) -> None:
    """run.json: when and why Slurm could not say how the run stands (cleared by the next
    answer); its state stays the last one Slurm gave."""
    from launcher.schedulers.slurm.recording import has_ended

    with registry.updating(run_dir) as rec:
        if not has_ended(rec):      # the job recorded its end while Slurm was asked: that stands
            rec.extra["unreachable"] = {"at": registry.now(), "message": exc.message}


def _log_warnings(warnings: list[str]) -> None:
    import logging      # a submission's warnings only: a dry run, which has none to log, never loads it

    for warning in warnings:
        logging.getLogger(__name__).warning("glaunch: warning: %s", warning)


def inside_allocation(record: RunRecord) -> str:
    return (f"run {record.run_id} runs inside allocation {record.job_id}: stop it with Ctrl-C where `glaunch run` "
            f"runs (scancel {record.job_id} would end the whole allocation)")
