"""The beginning of one start of a job: whether it is a start of the run at all.

The job controller (launcher.jobcontrol.controller) asks before anything else of the start
runs (no watchdog, no job step): :func:`begin` answers START with the start's number
(Slurm's requeue count past the numbers earlier steps of the job took), END (exit 0 at
once) or REFUSE (exit 1; one line on stderr). By hand, ``python -m launcher.jobcontrol.jobend
RUN_DIR --begin`` prints ``start N`` or ``end``. What decides (:func:`beginning`, pure) is run.json's
state, whether the run's result is written, and which job this is to the run (:class:`Origin`):

- A start that begins after its run has ended does nothing and changes nothing: no start is
  recorded, run.json and result.json stay as they are, and the job exits 0, so that Slurm
  leaves it ended (it requeues a batch job only on `scontrol requeue` or a failure the
  cluster's RequeueExit names). Slurm 24.11 starts a job it requeued after a preemption once
  more after the job completed (slurmctld: ``_job_complete: requeue JobId=N per user/system
  request``); a job that handed the run on (resubmitted at its time limit, or replaced by
  `glaunch resume`) may be started again the same way, and does nothing either.
- A bundle written by `glaunch submit --dry-run` and submitted by hand (``sbatch
  RUN_DIR/job.sbatch``) is taken on by its job (:func:`launcher.rundir.lifecycle.adopt`):
  run.json records the job as the run's first start, as `glaunch submit` would have, and the
  tasks get submitit's pickled task. This happens under the run's lock: of two jobs of one
  bundle, the second finds the run another job's and is refused.
- A job the run does not know, while the run is another job's, is refused: it would train
  beside that job in the same run directory.

Imports no torch; submitit only to take on a bundle.
"""

from __future__ import annotations

import enum
import math
import pickle
import sys
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import RunError
from launcher.rundir import registry
from launcher.rundir.files import exclusive_lock, read_json
from launcher.rundir.heartbeatrecord import MAX_STEP
from launcher.rundir.layout import RunDir
from launcher.rundir.lifecycle import ENDS, adopt
from launcher.rundir.records import GOES_ON, RunRecord, State, is_job_id
from launcher.rundir.startsummary import epoch


class Origin(str, enum.Enum):
    """Which job this start is of, to the run."""

    RUN_JOB = "the run's job"           # the job run.json names now
    EARLIER_JOB = "an earlier job"      # a job of one of the run's starts, which the run has left
    OTHER_JOB = "another job"           # a job none of the run's starts was
    NO_JOB = "no job id"                # GLAUNCH_JOB_ID is not a Slurm job id


class Action(str, enum.Enum):
    START = "start"         # go on: a start of the run
    END = "end"             # exit 0 at once, nothing changed: the run has ended or gone on
    ADOPT = "adopt"         # a dry run's bundle submitted by hand: this job becomes the run's
    REFUSE = "refuse"       # exit 1 at once, nothing changed: the run is another job's


@dataclass(frozen=True)
class Beginning:
    action: Action
    why: str | None = None      # one line for the batch log


def origin_of(record: RunRecord, job_id: str | None) -> Origin:
    """Pure: which job `job_id` is to the run `record`."""
    if not is_job_id(job_id):
        return Origin.NO_JOB
    if record.job_id == job_id:
        return Origin.RUN_JOB
    if any(start.job_id == job_id for start in record.starts):
        return Origin.EARLIER_JOB
    return Origin.OTHER_JOB


def beginning(*, run_id: str, state: str, finished: bool, origin: Origin, job_id: str | None,
              run_job: str | None) -> Beginning:
    """Pure: what a start of job `job_id` does as it begins, from run.json's `state` and job
    (`run_job`), whether the run's result.json is written (`finished`) and `origin`."""
    this = f"job {job_id}" if job_id else "this job"
    if finished or state in ENDS:
        ended = state if state in ENDS else "its result is written"
        if origin in (Origin.RUN_JOB, Origin.EARLIER_JOB):
            return Beginning(Action.END, f"run {run_id} has ended ({ended}): this start of {this} does "
                             "nothing (Slurm started the job again after the run's end)")
        return Beginning(Action.END, f"run {run_id} has ended ({ended}): {this} does nothing; "
                         f"`glaunch resume {run_id}` continues the run")
    if state == State.RENDERED.value:
        if origin is Origin.NO_JOB:
            return Beginning(Action.REFUSE, f"run {run_id} was rendered by --dry-run and this start has no Slurm "
                             "job id to record: submit the bundle with `sbatch RUN_DIR/job.sbatch`, or submit "
                             "the experiment with `glaunch submit EXPERIMENT`")
        return Beginning(Action.ADOPT, f"{this} takes on run {run_id}, rendered by --dry-run and submitted "
                         "by hand: it is the run's first start")
    if origin is Origin.RUN_JOB:
        return Beginning(Action.START)
    if origin is Origin.EARLIER_JOB:
        now = f"job {run_job}" if run_job else "a new submission"
        return Beginning(Action.END, f"run {run_id} has gone on in {now} ({state}): this start of {this} "
                         "does nothing (Slurm started the job again after it handed the run on)")
    if run_job is None:
        # Between sbatch's answer and its record (a submission, a resume), or a job the
        # scheduler lost: this job may well be the one being recorded.
        return Beginning(Action.START)
    return Beginning(Action.REFUSE, f"run {run_id} is job {run_job}'s ({state}): {this} is not one of its "
                     f"starts and does not start it (`glaunch status {run_id}` follows the run)")


def beginning_of(run_dir: Path, record: RunRecord, job_id: str | None) -> Beginning:
    return beginning(run_id=record.run_id, state=str(record.state), finished=RunDir(run_dir).result_file.exists(),
                     origin=origin_of(record, job_id), job_id=job_id, run_job=record.job_id)


def take_on(run_dir: Path, job_id: str) -> Beginning:
    """Under the run's lock, decided again: the dry run's record taken on by job `job_id`,
    with the pickle submitit's loader reads in each task (LOG_DIR/JOB_submitted.pkl). A run
    another job took on meanwhile is left as it is (and the decision says so)."""
    with exclusive_lock(RunDir(run_dir).lock_file, "run record"):
        record = registry.read(run_dir)
        decided = beginning_of(run_dir, record, job_id)
        if decided.action is Action.ADOPT:
            from launcher.runtime.task import place_task     # the one import of the training library

            place_task(run_dir, job_id)
            adopt(record, job_id, registry.now())
            registry.write(run_dir, record)
    return decided


@dataclass(frozen=True)
class Begun:
    """What a start does, decided as it begins: go on as start `number`, end at once (exit
    0, nothing changed) or be refused (exit 1)."""

    action: Action          # START, END or REFUSE (a bundle taken on is a START)
    number: int = 0


def begin(run_dir: Path, job_id: str | None, requeues: int) -> Begun:
    """Whether this start is one of the run's, and its number (see the module docstring);
    a dry run's bundle is taken on here. Says why on stderr when it does not start."""
    try:
        record = registry.read(run_dir)
    except (RunError, OSError, ValueError) as exc:
        # Nothing to decide on: the start goes on, and its end says what it cannot record.
        _say(f"run.json not read, this start is number {requeues}: {exc}")
        return Begun(Action.START, requeues)
    decided = beginning_of(run_dir, record, job_id)
    if decided.action is Action.ADOPT and job_id is not None:
        try:
            decided = take_on(run_dir, job_id)
            record = registry.read(run_dir)
        except (RunError, OSError, ValueError, ImportError, pickle.PickleError) as exc:
            # Never train a run whose record cannot say so.
            _say(f"run {record.run_id}: job {job_id} cannot take on the bundle ({exc}); submit the experiment "
                 "with `glaunch submit EXPERIMENT`")
            return Begun(Action.REFUSE)
    if decided.why:
        _say(decided.why)
    if decided.action in (Action.REFUSE, Action.END):
        return Begun(decided.action)
    note_stop_after_end(run_dir, record)
    number = record.next_restart(job_id, requeues) if job_id is not None and is_job_id(job_id) else requeues
    return Begun(Action.START, number)


def late_stop(record: RunRecord, stop: object) -> tuple[int, int] | None:
    """Pure: (index in record.starts, step) where stop.json (`stop`) says a start saved at a
    stop that its recorded end lacks: Slurm ends a requeued job's processes KillWait after its
    SIGTERM, and the controller records the end before that, while the ranks may still be
    saving. The start is the newest of that number (a resumed run numbers its job's starts
    from 0 again) that had begun by the stop's time; None otherwise."""
    if not isinstance(stop, dict):
        return None
    restart, step, at = stop.get("restart"), stop.get("step"), stop.get("time")
    if type(restart) is not int or type(step) is not int or not 0 <= step <= MAX_STEP:
        return None
    if not isinstance(at, (int, float)) or isinstance(at, bool) or not math.isfinite(at):
        return None
    numbered = [i for i, s in enumerate(record.starts) if s.restart == restart]
    if not numbered:
        return None
    index = numbered[-1]
    start, began = record.starts[index], epoch(record.starts[index].started)
    # started is cut to the second; a stop before it is an earlier start's.
    if start.stopped_at is not None or start.state not in GOES_ON or began is None or at < began - 1:
        return None
    return index, step


def note_stop_after_end(run_dir: Path, record: RunRecord) -> None:
    """The stop a start's ranks saved after its end was recorded, noted in run.json before
    the next start begins (status and goodput count from it)."""
    stop = read_json(RunDir(run_dir).stop_file)
    late = late_stop(record, stop)
    if late is None:
        return
    index, step = late
    try:
        with registry.updating(run_dir) as rec:
            # Asked again of run.json as it is under the lock: another writer may have come first.
            if late_stop(rec, stop) == late:
                rec.starts[index].stopped_at = step
    except (RunError, OSError, ValueError) as exc:
        _say(f"a stop at step {step} is not noted: {exc}")


def begin_start(run_dir: Path, job_id: str | None, requeues: int) -> int:
    """`RUN_DIR --begin`: print ``start N`` or ``end`` (see the module docstring); 1 refuses."""
    begun = begin(run_dir, job_id, requeues)
    if begun.action is Action.REFUSE:
        return 1
    print("end" if begun.action is Action.END else f"start {begun.number}", flush=True)
    return 0


def _say(line: str) -> None:
    print(f"glaunch: {line}", file=sys.stderr, flush=True)
