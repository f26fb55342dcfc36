"""A sweep submitted over SSH (see launcher.runner.remote for one run): every element
rendered here with the cluster's paths, the sweep directory written to a local staging
folder and sent in one transfer, then one array job per allocation shape queued held,
the elements' run.json and submitit tasks put in place in one more call, and the arrays
released. Any failure before the release cancels the arrays and removes what was sent
(launcher.runner.cluster_undo); what a dropped link left there is named in the error and
recorded here under the sweep's id, for `glaunch cancel` to remove.

The record here mirrors the sweep's directory on the cluster: a folder of glaunch's
state directory named by the sweep's id holds remote.json (the login, the sweep's
directory there) and sweep.json, and a folder per element with its remote.json and the
last run.json read from the cluster. status, wait, logs and cancel read the cluster
through them: every element's run.json in one call, Slurm once for all of them.
"""

from __future__ import annotations

import dataclasses
import io
import os
import posixpath
import shutil
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from launcher.errors import GlaunchError
from launcher.resolution.jobplan import JobPlan
from launcher.rundir import registry
from launcher.rundir.files import atomic_write_text
from launcher.rundir.layout import REMOTE_FILE, RunDir
from launcher.rundir.records import RunRecord, State
from launcher.runner import cluster_undo, remote, sweep_bundle, sweeps
from launcher.runner.cluster_undo import OnCluster
from launcher.runner.prepared import PreparedSweep
from launcher.runner.results import Run, Sweep
from launcher.schedulers.base import Launched, LaunchedBatch, SweepBatch, SweepPlan
from launcher.schedulers.slurm import array
from launcher.schedulers.slurm.recording import record_queued
from launcher.schedulers.slurm.submit import dump_task, preflight, release, submitted_pickle, task_template
from launcher.schedulers.ssh import on_login
from launcher.schedulers.ssh.connection import Connection
from launcher.schedulers.ssh.transfer import send_tree

if TYPE_CHECKING:
    from launcher.schedulers.slurm.scheduler import SlurmScheduler

SWEEP_FILE = sweeps.SWEEP_FILE


def launch(prepared: PreparedSweep, conn: Connection, *, check: bool) -> Sweep:
    """Write, send and queue the prepared sweep over its connection `conn` (closed at the end)."""
    try:
        staging = remote.staging_folder()
        try:
            return _stage_send_queue(prepared, conn, staging / prepared.sweep_id, check)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        conn.close()


def relocated_sweep(prepared: PreparedSweep, local: Path) -> PreparedSweep:
    """The prepared sweep with every directory under the cluster's sweep directory under `local`."""
    cluster = str(prepared.sweep_dir)
    items = tuple(dataclasses.replace(p, plan=remote.relocated_under(p.plan, cluster, str(local)))
                  for p in prepared.prepared)
    return dataclasses.replace(prepared, sweep_dir=local, prepared=items)


def rendered_here(prepared: PreparedSweep) -> PreparedSweep:
    """A sweep prepared as a dry run, its directories moved into this machine's record
    folder (the cluster is not contacted)."""
    registry.check_state_dir()
    remote.records_dir().mkdir(parents=True, exist_ok=True)
    return relocated_sweep(prepared, remote.records_dir() / prepared.sweep_id)


def _stage_send_queue(prepared: PreparedSweep, conn: Connection, local: Path, check: bool) -> Sweep:
    cluster = str(prepared.sweep_dir)
    plans = [p.plan for p in prepared.prepared]
    on_login.account(conn)      # asked once, before the sweep is planned: whose jobs sbatch queues
    client = on_login.slurm_client(conn)
    slurm = remote.slurm_of(prepared.scheduler, plans[0], client)
    here = relocated_sweep(prepared, local)
    sweep_plan = slurm.plan_sweep(plans, sweep_id=prepared.sweep_id, sweep_dir=cluster,
                                  max_parallel=prepared.max_parallel, dry_run=False)
    sweep_bundle.write_sweep(here, sweep_plan, sweep_bundle.checked_inputs(here), dry_run=False, register=False)
    _name_the_cluster(local, cluster, [p.plan for p in here.prepared])
    for plan, local_plan in zip(plans, (p.plan for p in here.prepared)):
        dump_task(plan, task_template(local_plan.log_dir))
    where = remote.Where(conn.login, cluster)
    home = remote.records_dir() / prepared.sweep_id
    # Until the arrays are queued and recorded, the record here is a run under the sweep's
    # id that journals what the submission did (as a run's: launcher.runner.remote), so a
    # glaunch process stopped midway leaves a record naming what it left.
    with remote.record_opened(home, prepared.sweep_id, where,
                              lambda home: registry.write(home, _standing_for(prepared, plans[0], where))):
        done = OnCluster(journal=cluster_undo.Journal(home))
        try:
            done.place(cluster)
            send_tree(conn, local, cluster, make_parent=True)
            warnings = _checked(slurm, plans, sweep_plan, cluster) if check else []
            batches = []
            for number, batch in enumerate(sweep_plan.batches):
                marker = array.submission_marker(prepared.sweep_id, number)
                members = [plans[i] for i in batch.elements]
                with_comment = "comment" not in dict(members[0].allocation.extra_sbatch)
                array_id = remote.sbatch_held(conn, client, posixpath.join(cluster, str(batch.script)),
                                              marker if with_comment else "", done, array=True)
                batches.append(_queued(here, batch, array_id, warnings, slurm.version()))
            sweeps.record_launch(local, batches)
            _put_records(conn, local, cluster, here)
            cluster_undo.forget_here(home)          # the sweep's own record takes its place
            _record_here(local, prepared, where)
            release(client, [held.job_id for held in done.held if held.job_id])
        except BaseException as exc:
            if (home / sweeps.SWEEP_FILE).is_file():
                cluster_undo.forget_here(home)      # back to the run standing for it, below
            cluster_undo.undo_after(exc, conn, client, done, prepared.sweep_id,
                                    keep=lambda left, said: _record_left(prepared, plans[0], left, where, said),
                                    clean=lambda: cluster_undo.forget_here(home))
    return _result(prepared)


def _standing_for(prepared: PreparedSweep, first: JobPlan, where: remote.Where) -> RunRecord:
    """The run under the sweep's id that its record here is until its arrays are queued."""
    return RunRecord(prepared.sweep_id, name=first.name, site=first.site_name, scheduler="slurm",
                     transport=first.transport.name, run_dir=where.run_dir, created=registry.now(),
                     state=State.SUBMITTING.value)


def _record_left(prepared: PreparedSweep, first: JobPlan, left: OnCluster, where: remote.Where, said: str) -> None:
    """The record here of a sweep whose submission left `left` on the cluster: a failed
    run under the sweep's id (no sweep was queued), which `glaunch cancel` cleans."""
    home = remote.records_dir() / prepared.sweep_id
    created = not home.is_dir()
    try:
        home.mkdir(exist_ok=True)
        atomic_write_text(home / REMOTE_FILE, where.to_json())
        cluster_undo.Journal(home).keep(left)
        record = dataclasses.replace(_standing_for(prepared, first, where), state=State.FAILED.value,
                                     detail=f"its sweep's submission's link dropped: {said}")
        registry.write(home, record)
        if created:
            registry.register(prepared.sweep_id, str(home))
    except (OSError, GlaunchError):
        if created:
            shutil.rmtree(home, ignore_errors=True)


def _name_the_cluster(local: Path, cluster: str, local_plans: Sequence[JobPlan]) -> None:
    """The staged records name the cluster's directories, as the job there reads them."""
    for plan in local_plans:
        with registry.updating(plan.run_dir) as record:
            record.run_dir = remote.moved_paths(plan.run_dir, str(local), cluster)
            record.extra = remote.moved_paths(record.extra, str(local), cluster)
    with sweeps.updating(local) as sweep:
        sweep.sweep_dir = cluster
        for element in sweep.elements:
            element.run_dir = remote.moved_paths(element.run_dir, str(local), cluster)


def _checked(slurm: SlurmScheduler, plans: Sequence[JobPlan], sweep_plan: SweepPlan, cluster: str) -> list[str]:
    """The profile against the cluster and `sbatch --test-only` of each array: its warnings."""
    warnings: list[str] = []
    for batch in sweep_plan.batches:
        first = plans[batch.elements[0]]
        warnings += [w for w in slurm.check_cluster(first) if w not in warnings]
        preflight(slurm.client, first, Path(posixpath.join(cluster, str(batch.script))), {})
    return warnings


def _queued(here: PreparedSweep, batch: SweepBatch, array_id: str, warnings: list[str],
            version: str | None) -> LaunchedBatch:
    """The staged records of the array's elements: queued as tasks of `array_id`, each with
    its submitit task under the task's id."""
    launched = []
    for task, index in enumerate(batch.elements):
        plan = here.prepared[index].plan
        job_id = f"{array_id}_{task}"
        os.replace(task_template(plan.log_dir), submitted_pickle(plan.log_dir, job_id))
        record_queued(Path(plan.run_dir), plan, job_id, warnings, version)
        launched.append(Launched(job_id, "PENDING"))
    return LaunchedBatch(batch.script, array_id, batch.elements, tuple(launched))


def _put_records(conn: Connection, local: Path, cluster: str, here: PreparedSweep) -> None:
    """sweep.json, every element's run.json and submitit task, over those on the cluster, in one call."""
    names = [SWEEP_FILE]
    for item in here.prepared:
        run_dir = Path(item.plan.run_dir)
        names.append(str(run_dir.relative_to(local) / "run.json"))
        names += [str(p.relative_to(local)) for p in Path(item.plan.log_dir).glob("*_submitted.pkl")]
    on_login.unpack_over(conn, cluster, _archive(local, names))


def _archive(root: Path, names: Sequence[str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            info = tar.gettarinfo(str(root / name), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(root / name, "rb") as f:
                tar.addfile(info, f)
    return buffer.getvalue()


def _record_here(local: Path, prepared: PreparedSweep, where: remote.Where) -> None:
    """The record here: sweep.json naming the elements' folders here, remote.json, and an
    element folder each with its remote.json and run.json; registered under their ids."""
    home = remote.records_dir() / prepared.sweep_id
    home.mkdir()
    registered: list[tuple[str, str]] = []
    try:
        atomic_write_text(home / REMOTE_FILE, where.to_json())
        sweep = sweeps.read(local)
        for element in sweep.elements:
            element_home = home / posixpath.relpath(element.run_dir, where.run_dir)
            element_home.mkdir(parents=True)
            atomic_write_text(element_home / REMOTE_FILE, remote.Where(where.login, element.run_dir).to_json())
            shutil.copyfile(Path(remote.moved_paths(element.run_dir, where.run_dir, str(local))) / "run.json",
                            RunDir(element_home).run_file)
            element.run_dir = str(element_home)
        sweep.sweep_dir = str(home)
        sweeps.write(home, sweep)
        for run_id, path in [(prepared.sweep_id, str(home)), *((e.run_id, e.run_dir) for e in sweep.elements)]:
            registry.register(run_id, path)
            registered.append((run_id, path))
    except BaseException:
        for run_id, path in reversed(registered):
            registry.unregister(run_id, path)
        shutil.rmtree(home, ignore_errors=True)
        raise


def _result(prepared: PreparedSweep) -> Sweep:
    home = remote.records_dir() / prepared.sweep_id
    sweep = sweeps.read(home)
    runs = []
    for element, item in zip(sweep.elements, prepared.prepared):
        record = registry.read(element.run_dir)
        runs.append(Run(record.run_id, Path(element.run_dir), item.plan.site_name, False, tuple(item.files),
                        record.state, record.job_id))
    return Sweep(prepared.sweep_id, home, sweep.site, False, tuple(runs), tuple(a.__dict__ for a in sweep.arrays),
                 {}, sweeps.sweep_state([r.state for r in runs]))
