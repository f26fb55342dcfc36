"""The beginning of a start, decided without a cluster (launcher.jobcontrol.jobstart): a start
that begins after its run has ended does nothing and changes nothing (Slurm 24.11 starts a
job it requeued after a preemption once more after the job completed); a bundle written by
--dry-run and submitted with sbatch is taken on by its job, once; a job that is not the
run's does not start it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.rundir import registry
from launcher.rundir.records import RunRecord, StartRecord
from launcher.jobcontrol import jobend
from launcher.jobcontrol.jobstart import Action, Origin, beginning, late_stop, origin_of
from launcher.rundir.layout import RunDir

REPO = Path(__file__).resolve().parents[2]
RUN, END, ADOPT, REFUSE, START = "r", Action.END, Action.ADOPT, Action.REFUSE, Action.START

TABLE = [
    # state, result.json written, origin, the record's job id -> what the start does
    # --- the run has ended: whichever job begins, nothing happens (exit 0)
    ("COMPLETED", True, Origin.RUN_JOB, "7", END),
    ("COMPLETED", False, Origin.RUN_JOB, "7", END),
    ("FAILED", False, Origin.RUN_JOB, "7", END),
    ("CANCELLED", False, Origin.RUN_JOB, "7", END),
    ("TIMEOUT", False, Origin.RUN_JOB, "7", END),
    ("PREEMPTED", False, Origin.EARLIER_JOB, "8", END),
    ("NODE_FAIL", False, Origin.RUN_JOB, "7", END),
    ("REFUSED", False, Origin.OTHER_JOB, None, END),
    ("COMPLETED", False, Origin.OTHER_JOB, "7", END),
    ("COMPLETED", False, Origin.NO_JOB, "7", END),
    # ... or its result is written though its end was not recorded (the end's record was lost)
    ("RUNNING", True, Origin.RUN_JOB, "7", END),
    ("REQUEUED", True, Origin.RUN_JOB, "7", END),
    # --- the run's own job: a first start, a requeue, a step after a preemption
    ("PENDING", False, Origin.RUN_JOB, "7", START),
    ("RUNNING", False, Origin.RUN_JOB, "7", START),
    ("REQUEUED", False, Origin.RUN_JOB, "7", START),
    ("UNKNOWN", False, Origin.RUN_JOB, "7", START),
    ("CONFIGURING", False, Origin.RUN_JOB, "7", START),      # a state of Slurm's glaunch does not name
    # --- the job sbatch has just queued, before its id reached run.json (a submit, a resume)
    ("SUBMITTING", False, Origin.OTHER_JOB, None, START),
    ("UNKNOWN", False, Origin.OTHER_JOB, None, START),
    ("SUBMITTING", False, Origin.NO_JOB, None, START),
    # --- a job the run has left (resubmitted at the time limit, replaced by a resume): nothing (exit 0)
    ("REQUEUED", False, Origin.EARLIER_JOB, "8", END),
    ("RUNNING", False, Origin.EARLIER_JOB, "8", END),
    ("SUBMITTING", False, Origin.EARLIER_JOB, None, END),
    # --- another job while the run is some job's: refused (exit 1), it would train beside it
    ("RUNNING", False, Origin.OTHER_JOB, "7", REFUSE),
    ("PENDING", False, Origin.OTHER_JOB, "7", REFUSE),
    ("REQUEUED", False, Origin.OTHER_JOB, "7", REFUSE),
    # --- a dry run's bundle submitted by hand: its job takes it on
    ("RENDERED", False, Origin.OTHER_JOB, None, ADOPT),
    ("RENDERED", False, Origin.NO_JOB, None, REFUSE),
    ("RENDERED", True, Origin.OTHER_JOB, None, END),
]


@pytest.mark.parametrize("state, finished, origin, run_job, action", TABLE,
                         ids=[f"{s}-{'result' if f else 'none'}-{o.name}" for s, f, o, _, _ in TABLE])
def test_what_a_start_does_as_it_begins(state, finished, origin, run_job, action):
    decided = beginning(run_id=RUN, state=state, finished=finished, origin=origin,
                        job_id=None if origin is Origin.NO_JOB else "9", run_job=run_job)
    assert decided.action is action
    if action is not START:
        assert decided.why and "\n" not in decided.why and RUN in decided.why


def test_the_lines_say_what_to_do():
    ended = beginning(run_id=RUN, state="COMPLETED", finished=True, origin=Origin.OTHER_JOB, job_id="9", run_job="7")
    assert ended.why == "run r has ended (COMPLETED): job 9 does nothing; `glaunch resume r` continues the run"
    again = beginning(run_id=RUN, state="COMPLETED", finished=True, origin=Origin.RUN_JOB, job_id="7", run_job="7")
    assert "Slurm started the job again after the run's end" in again.why
    other = beginning(run_id=RUN, state="RUNNING", finished=False, origin=Origin.OTHER_JOB, job_id="9", run_job="7")
    assert other.why.startswith("run r is job 7's (RUNNING): job 9 is not one of its starts")


def test_which_job_a_start_is_of():
    record = RunRecord(run_id=RUN, job_id="8", starts=[StartRecord(job_id="7", restart=0),
                                                       StartRecord(job_id="8", restart=1)])
    assert origin_of(record, "8") is Origin.RUN_JOB
    assert origin_of(record, "7") is Origin.EARLIER_JOB
    assert origin_of(record, "9") is Origin.OTHER_JOB
    assert origin_of(record, None) is Origin.NO_JOB and origin_of(record, "x;y") is Origin.NO_JOB
    assert origin_of(RunRecord(run_id=RUN, job_id="5_2"), "5_2") is Origin.RUN_JOB


# --- the recorded sequence: preempted, requeued, completed, then started once more ----------------


@pytest.fixture
def run_dir(tmp_path, monkeypatch, isolated_env):
    """A submitted run of job 7, as `glaunch submit` leaves run.json; the job's environment."""
    path = tmp_path / "run"
    (path / "logs").mkdir(parents=True)
    registry.write(path, RunRecord(run_id=RUN, state="PENDING", nodes=1, requeue_max=3, job_id="7",
                                   starts=[registry.new_start("7", 0)]))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GLAUNCH_JOB_ID", "7")
    monkeypatch.setattr(jobend, "requeue_mode_setting", lambda run_dir: "requeue")
    return path


def begin(run_dir: Path, monkeypatch, capsys, requeues: int, job_id: str = "7") -> tuple[int, str, str]:
    """`jobend RUN_DIR --begin` as job.sbatch runs it: Slurm's requeue count in GLAUNCH_RESTART."""
    monkeypatch.setenv("GLAUNCH_JOB_ID", job_id)
    monkeypatch.setenv("GLAUNCH_RESTART", str(requeues))
    code = jobend.main([str(run_dir), "--begin"])
    out = capsys.readouterr()
    return code, out.out.strip(), out.err.strip()


def end(run_dir: Path, monkeypatch, capsys, restart: int, status: int, preempted: str = "0") -> tuple[int, str]:
    monkeypatch.setenv("GLAUNCH_RESTART", str(restart))
    code = jobend.main([str(run_dir), "--status", str(status), "--preempted", preempted,
                        "--started", "2026-12-05T10:00:00+00:00"])
    return code, capsys.readouterr().out.strip()


def test_a_start_after_the_run_completed_exits_and_changes_nothing(run_dir, monkeypatch, capsys):
    states = []
    # Start 0 is preempted; Slurm requeues the job.
    assert begin(run_dir, monkeypatch, capsys, 0)[:2] == (0, "start 0")
    assert end(run_dir, monkeypatch, capsys, 0, 143, preempted="1") == (0, "requeue")
    states.append(registry.read(run_dir).state)
    # Start 1 (Slurm's requeue count 1) runs to the end and writes the result.
    assert begin(run_dir, monkeypatch, capsys, 1)[:2] == (0, "start 1")
    (run_dir / "result.json").write_text(json.dumps({"final_step": 40}) + "\n")
    assert end(run_dir, monkeypatch, capsys, 1, 0) == (0, "done")
    states.append(registry.read(run_dir).state)
    assert states == ["REQUEUED", "COMPLETED"]
    record, result = (run_dir / "run.json").read_bytes(), (run_dir / "result.json").read_bytes()
    assert [(s.restart, s.state, s.reason) for s in registry.read(run_dir).starts] == [
        (0, "REQUEUED", "preemption"), (1, "COMPLETED", None)]

    # Slurm 24.11 starts the job once more (requeue count 2): it ends at once, exit 0.
    code, out, err = begin(run_dir, monkeypatch, capsys, 2)
    assert (code, out) == (0, "end")
    assert err == ("glaunch: run r has ended (COMPLETED): this start of job 7 does nothing (Slurm started the "
                   "job again after the run's end)")
    assert (run_dir / "run.json").read_bytes() == record and (run_dir / "result.json").read_bytes() == result


def test_a_start_of_a_job_the_run_has_left_does_nothing(run_dir, monkeypatch, capsys):
    # Job 7 reached its time limit and handed the run on to job 8, which runs now.
    assert begin(run_dir, monkeypatch, capsys, 0)[:2] == (0, "start 0")
    assert jobend.record_successor(run_dir, "8", "7", 0)
    with registry.updating(run_dir) as record:
        record.state = "RUNNING"
    before = (run_dir / "run.json").read_bytes()
    assert begin(run_dir, monkeypatch, capsys, 1, job_id="7")[:2] == (0, "end")
    assert begin(run_dir, monkeypatch, capsys, 0, job_id="8")[:2] == (0, "start 1")
    code, out, err = begin(run_dir, monkeypatch, capsys, 0, job_id="9")
    assert (code, out) == (1, "") and "run r is job 8's (RUNNING): job 9 is not one of its starts" in err
    assert (run_dir / "run.json").read_bytes() == before


# --- a dry run's bundle submitted with sbatch ----------------------------------------------------


def dry_run(run_dir: Path) -> None:
    registry.write(run_dir, RunRecord(run_id=RUN, state="RENDERED", dry_run=True, nodes=1, requeue_max=3))


def test_the_job_of_a_dry_run_bundle_takes_it_on_and_ends_as_a_run(run_dir, monkeypatch, capsys):
    dry_run(run_dir)
    code, out, err = begin(run_dir, monkeypatch, capsys, 0, job_id="12")
    assert (code, out) == (0, "start 0")
    assert "job 12 takes on run r, rendered by --dry-run and submitted by hand" in err
    record = registry.read(run_dir)
    assert (record.state, record.job_id, record.dry_run) == ("RUNNING", "12", False)
    assert [(s.job_id, s.restart, s.state) for s in record.starts] == [("12", 0, "RUNNING")]
    # What submitit's loader in each task reads.
    assert (run_dir / "logs" / "12_submitted.pkl").stat().st_size > 0
    # Trained, the start ends as any run's does: COMPLETED.
    monkeypatch.setenv("GLAUNCH_JOB_ID", "12")
    (run_dir / "result.json").write_text("{}\n")
    assert end(run_dir, monkeypatch, capsys, 0, 0) == (0, "done")
    assert registry.read(run_dir).state == "COMPLETED"


def test_a_bundle_is_taken_on_once(run_dir, monkeypatch, capsys):
    dry_run(run_dir)
    assert begin(run_dir, monkeypatch, capsys, 0, job_id="12")[:2] == (0, "start 0")
    before = (run_dir / "run.json").read_bytes()
    code, out, err = begin(run_dir, monkeypatch, capsys, 0, job_id="13")
    assert (code, out) == (1, "") and "run r is job 12's (RUNNING): job 13 is not one of its starts" in err
    assert (run_dir / "run.json").read_bytes() == before
    assert not (run_dir / "logs" / "13_submitted.pkl").exists()


def test_two_jobs_of_one_bundle_beginning_together_one_trains(run_dir):
    dry_run(run_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GLAUNCH_", "SLURM_"))}
    procs = [subprocess.Popen([sys.executable, "-m", "launcher.jobcontrol.jobend", str(run_dir), "--begin"], cwd=REPO,
                              env=dict(env, GLAUNCH_JOB_ID=job, GLAUNCH_RESTART="0"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for job in ("21", "22")]
    results = [(p.wait(timeout=120), p.stdout.read().strip()) for p in procs]    # type: ignore[union-attr]
    assert sorted(results) == [(0, "start 0"), (1, "")]
    record = registry.read(run_dir)
    winner = "21" if results[0][0] == 0 else "22"
    assert record.job_id == winner and [s.job_id for s in record.starts] == [winner]


def test_only_a_dry_runs_record_is_taken_on():
    from launcher.rundir.lifecycle import IllegalMove, adopt

    for state in ("RUNNING", "COMPLETED", "SUBMITTING"):
        record = RunRecord(run_id=RUN, state=state, job_id="7")
        with pytest.raises(IllegalMove):
            adopt(record, "9", "2026-12-05T10:00:00+00:00")
        assert (record.state, record.job_id, record.starts) == (state, "7", [])


BEGAN = "2026-12-07T17:00:00+00:00"
AT = 1796662810.0           # the stop's time: 10 s after BEGAN


def _starts(*entries: tuple) -> RunRecord:
    """Starts of job 7 by (restart, state, stopped_at[, job id[, started]])."""
    return RunRecord(run_id=RUN, job_id="7", starts=[
        StartRecord(job_id=(rest[0] if rest else "7"), restart=r, state=state, stopped_at=at,
                    started=(rest[1] if len(rest) > 1 else BEGAN))
        for r, state, at, *rest in entries])


def _stop(restart: object = 0, step: object = 31, at: object = AT) -> dict:
    return {"restart": restart, "step": step, "time": at, "signal": "SIGTERM"}


@pytest.mark.parametrize("record, stop, late", [
    # A requeued start whose end was recorded before its ranks' stop.json: noted.
    (_starts((0, "REQUEUED", None)), _stop(), (0, 31)),
    (_starts((0, "REQUEUED", 5), (1, "RESTARTED", None)), _stop(1, 12), (1, 12)),
    # A resumed run numbers its new job's starts from 0 again: the newest of that number,
    # and only if it had begun by the stop's time.
    (_starts((0, "REQUEUED", None), (0, "COMPLETED", None, "8")), _stop(), None),
    (_starts((0, "REQUEUED", 40), (0, "REQUEUED", None, "8")), _stop(), (1, 31)),
    (_starts((0, "REQUEUED", None), (0, "REQUEUED", None, "8", "2026-12-07T18:00:00+00:00")), _stop(), None),
    (_starts((0, "REQUEUED", None, "7", None)), _stop(), None),
    # Its stop already recorded, or another start's, or an end that does not go on: nothing.
    (_starts((0, "REQUEUED", 30)), _stop(), None),
    (_starts((0, "REQUEUED", None)), _stop(1), None),
    (_starts((0, "FAILED", None)), _stop(), None),
    (_starts((0, "CANCELLED", None)), _stop(), None),
    (_starts((0, "RUNNING", None)), _stop(), None),
    # stop.json damaged or absent: nothing.
    (_starts((0, "REQUEUED", None)), _stop(restart=True), None),
    (_starts((0, "REQUEUED", None)), _stop(step="31"), None),
    (_starts((0, "REQUEUED", None)), _stop(step=-1), None),
    (_starts((0, "REQUEUED", None)), _stop(step=2**64), None),
    (_starts((0, "REQUEUED", None)), _stop(at=None), None),
    (_starts((0, "REQUEUED", None)), _stop(at=float("nan")), None),
    (_starts((0, "REQUEUED", None)), _stop(at=True), None),
    (_starts((0, "REQUEUED", None)), ["restart", 0], None),
    (_starts((0, "REQUEUED", None)), None, None),
])
def test_a_stop_saved_after_the_start_s_end_was_recorded(record, stop, late):
    assert late_stop(record, stop) == late


def test_the_next_start_notes_a_stop_saved_after_the_end_was_recorded(run_dir, monkeypatch, capsys):
    with registry.updating(run_dir) as rec:
        rec.starts[0].state, rec.starts[0].started, rec.state = "REQUEUED", BEGAN, "REQUEUED"
    RunDir(run_dir).stop_file.write_text(json.dumps(_stop()))
    code, out, _ = begin(run_dir, monkeypatch, capsys, requeues=1)
    assert code == 0 and out == "start 1"
    assert registry.read(run_dir).starts[0].stopped_at == 31


def test_a_start_that_does_not_train_notes_nothing(run_dir, monkeypatch, capsys):
    """A job that is not the run's changes nothing of it, a late stop's note included."""
    with registry.updating(run_dir) as rec:
        rec.starts[0].state, rec.starts[0].started, rec.state = "REQUEUED", BEGAN, "REQUEUED"
    RunDir(run_dir).stop_file.write_text(json.dumps(_stop()))
    before = (run_dir / "run.json").read_text()
    code, _, err = begin(run_dir, monkeypatch, capsys, requeues=0, job_id="99")
    assert code == 1 and "99" in err
    assert (run_dir / "run.json").read_text() == before
