"""The Slurm scheduler's decisions on unusual answers, from output recorded on the local
Slurm 22.05 cluster (tests/recorded/): heterogeneous jobs and steps in sacct, array tasks
whose rows are their array's, squeue failing for another reason than a job it forgot (munge
down), a job squeue no longer lists while accounting lags or lost it, held states that never
clear, sbatch refusals that name their cause before a generic last line.

What cannot be made to happen on a shared cluster (munge down for glaunch only, a runaway
job) is played by fake `squeue`/`sacct` scripts first on PATH that print a recording: the
tests that use them are named fake_*."""

from __future__ import annotations

import datetime as dt
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from launcher.errors import SchedulerError
from launcher.rundir import registry
from launcher.rundir.records import RunRecord, StartRecord
from launcher.schedulers.slurm import client as slurm_client
from launcher.schedulers.slurm.scheduler import SlurmScheduler
from launcher.schedulers.slurm.client import Client
from launcher.schedulers.slurm.queries import squeue_job, squeue_jobs
from launcher.schedulers.slurm.recording import UNKNOWN_TO_SLURM, fold_job, own_rows, record_pending_reason
from launcher.schedulers.slurm.state import (
    UNLISTED_GRACE_S,
    current_state,
    merge_history,
    parse_sacct,
    parse_squeue,
    preflight_message,
    squeue_error,
)

RECORDED = Path(__file__).parent.parent / "recorded"


def recorded(name: str) -> str:
    """The command's output, verbatim, without the file's first line (the command)."""
    return (RECORDED / name).read_text(encoding="utf-8").partition("\n")[2]


@pytest.fixture(autouse=True)
def fresh_client():
    """The process's client remembers a controller it found down: each test starts afresh."""
    slurm_client.CLIENT.forget_down()
    yield
    slurm_client.CLIENT.forget_down()


@pytest.fixture
def fake_bin(tmp_path, monkeypatch):
    """A folder first on PATH for fake Slurm commands; fake(name, recording) makes `name`
    print the recording's output on the stream, and exit with the status, it names."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def fake(name: str, recording: str) -> None:
        head = (RECORDED / recording).read_text(encoding="utf-8").partition("\n")[0]
        m = re.search(r" -- (stdout|stderr), exit (\d+);", head)
        assert m, recording
        body = bin_dir / f"{name}.out"
        body.write_text(recorded(recording), encoding="utf-8")
        redirect = " >&2" if m[1] == "stderr" else ""
        (bin_dir / name).write_text(f"#!/bin/bash\ncat {shlex.quote(str(body))}{redirect}\nexit {m[2]}\n")
        (bin_dir / name).chmod(0o755)

    return fake


def run_dir_with(tmp_path: Path, record: RunRecord) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    registry.write(run_dir, record)
    return run_dir


# --- sacct: rows that are not one start of the job ----------------------------------------------


def test_a_heterogeneous_job_s_leader_is_the_job_and_its_other_components_are_not_starts():
    rows = own_rows(parse_sacct(recorded("sacct-hetjob-completed.txt")), "2504")
    assert [(r["job_id"], r["state"], r["nodes"]) for r in rows] == [("2504", "COMPLETED", "node1")]
    record = RunRecord(run_id="r1", job_id="2504", starts=[StartRecord(job_id="2504", restart=0)])
    merge_history(record, rows)
    assert [(s.job_id, s.restart, s.state) for s in record.starts] == [("2504", 0, "COMPLETED")]


def test_steps_are_no_starts():
    # As sacct lists them without -X; a .extern step is there where PrologFlags=contain.
    text = recorded("sacct-steps-completed.txt")
    text += text.splitlines()[1].replace("2504+0.batch", "2504+0.extern") + "\n"
    assert [r["job_id"] for r in own_rows(parse_sacct(text), "2504")] == ["2504"]


@pytest.mark.parametrize("job_id, expected", [
    ("2506_1", [("2506_1", "COMPLETED", "2026-12-03T19:10:46")]),
    ("2506_2", [("2506_2", "COMPLETED", "2026-12-03T19:10:49")]),
    ("2506", []),
])
def test_an_array_s_rows_give_each_task_its_own(job_id, expected):
    rows = own_rows(parse_sacct(recorded("sacct-array-completed.txt")), job_id)
    assert [(r["job_id"], r["state"], r["start"]) for r in rows] == expected


def test_a_task_cancelled_while_its_array_was_pending_has_the_array_s_row():
    # sacct -j 2396_1 has no row for it; sacct -j 2396 has 2396_[0-2].
    assert parse_sacct(recorded("sacct-array-task-in-cancelled-range.txt")) == []
    rows = own_rows(parse_sacct(recorded("sacct-array-cancelled-range.txt")), "2396_1")
    assert [(r["job_id"], r["state"]) for r in rows] == [("2396_1", "CANCELLED")]


def test_fake_status_of_a_task_cancelled_while_its_array_was_pending(tmp_path, fake_bin):
    fake_bin("squeue", "squeue-unknown-job-stderr.txt")
    fake_bin("sacct", "sacct-array-cancelled-range.txt")
    start = StartRecord(job_id="2396_1", restart=0, state="PENDING")
    record = RunRecord(run_id="r1", job_id="2396_1", state="PENDING", starts=[start])
    rec = SlurmScheduler().refresh(run_dir_with(tmp_path, record), record)
    # The run's reason is its last start's.
    assert (rec.state, rec.reason) == ("CANCELLED", "cancelled")
    assert [(s.job_id, s.state, s.reason) for s in rec.starts] == [("2396_1", "CANCELLED", "cancelled")]


def test_fake_status_of_a_heterogeneous_job(tmp_path, fake_bin):
    fake_bin("squeue", "squeue-ended.txt")
    fake_bin("sacct", "sacct-hetjob-completed.txt")
    record = RunRecord(run_id="r1", job_id="2504", state="RUNNING",
                       starts=[StartRecord(job_id="2504", restart=0, state="RUNNING")])
    run_dir = run_dir_with(tmp_path, record)
    rec = SlurmScheduler().refresh(run_dir, record)
    assert rec.state == "COMPLETED" and [(s.job_id, s.state) for s in rec.starts] == [("2504", "COMPLETED")]
    assert registry.read(run_dir).state == "COMPLETED"          # run.json reads back


# --- squeue failing: a job it forgot, or no answer about the job ------------------------------


def test_squeue_forgetting_a_job_is_no_error():
    assert squeue_error(recorded("squeue-unknown-job-stderr.txt")) is None


def test_squeue_failing_otherwise_says_why():
    said = squeue_error(recorded("squeue-munge-down-stderr.txt"))
    assert said is not None and "Protocol authentication error" in said and "Did you start munged?" in said


def test_fake_squeue_with_munge_down_is_an_error_not_an_ended_job(tmp_path, fake_bin):
    fake_bin("squeue", "squeue-munge-down-stderr.txt")
    fake_bin("sacct", "sacct-pending.txt")
    with pytest.raises(SchedulerError, match=r"squeue could not tell the state of job 12: .*Protocol authentication"):
        squeue_job(slurm_client.CLIENT, "12")
    with pytest.raises(SchedulerError, match="Protocol authentication error"):
        squeue_jobs(slurm_client.CLIENT, ["12", "13"])
    record = RunRecord(run_id="r1", job_id="12", state="RUNNING",
                       starts=[StartRecord(job_id="12", restart=0, state="RUNNING")])
    run_dir = run_dir_with(tmp_path, record)
    with pytest.raises(SchedulerError):
        SlurmScheduler().refresh(run_dir, record)
    assert registry.read(run_dir).state == "RUNNING"           # not taken for UNKNOWN


def test_fake_squeue_forgetting_the_job_leaves_sacct_to_say(fake_bin):
    fake_bin("squeue", "squeue-unknown-job-stderr.txt")
    assert squeue_job(slurm_client.CLIENT, "999999") == (None, None) and squeue_jobs(slurm_client.CLIENT, ["999999"]) == {}


# --- a job squeue no longer lists ---------------------------------------------------------------


def running_record() -> RunRecord:
    return RunRecord(run_id="r1", job_id="12", state="RUNNING",
                     starts=[StartRecord(job_id="12", restart=0, state="RUNNING")])


def test_accounting_lagging_behind_squeue_is_waited_for(tmp_path):
    # squeue has forgotten job 12; sacct still says RUNNING (slurmdbd records the end late).
    run_dir = run_dir_with(tmp_path, running_record())
    rec = fold_job(run_dir, parse_squeue(recorded("squeue-ended.txt")), None,
                   parse_sacct(recorded("sacct-running.txt")))
    assert rec.state == "RUNNING" and rec.reason is None and rec.extra["unlisted_since"]
    rec = fold_job(run_dir, None, None, parse_sacct(recorded("sacct-completed.txt").replace("10|", "12|")))
    assert rec.state == "COMPLETED" and rec.reason is None and "unlisted_since" not in rec.extra


def test_a_job_accounting_shows_running_long_after_squeue_lost_it_is_unknown(tmp_path):
    record = running_record()
    lost_at = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=UNLISTED_GRACE_S + 60)
    record.extra["unlisted_since"] = lost_at.isoformat(timespec="seconds")
    run_dir = run_dir_with(tmp_path, record)
    rec = fold_job(run_dir, None, None, parse_sacct(recorded("sacct-running.txt")))
    assert (rec.state, rec.reason) == ("UNKNOWN", UNKNOWN_TO_SLURM)
    assert rec.detail.startswith("Slurm no longer lists job 12 (squeue, for ")
    assert "accounting (sacct) still shows it RUNNING" in rec.detail and "runawayjobs" in rec.detail
    # It shows up again (a controller restored from its state file): live again, said so no more.
    rec = fold_job(run_dir, parse_squeue(recorded("squeue-running.txt")), None,
                   parse_sacct(recorded("sacct-running.txt")))
    assert (rec.state, rec.reason, rec.detail) == ("RUNNING", None, None)
    assert "unlisted_since" not in rec.extra


@pytest.mark.parametrize("history, said", [
    ("sacct-pending.txt", "accounting (sacct) has no record of it"),
    (None, "this cluster has no accounting (sacct) to tell how it ended"),
])
def test_a_job_gone_from_squeue_and_sacct_is_unknown_and_says_why(tmp_path, history, said):
    run_dir = run_dir_with(tmp_path, running_record())
    rec = fold_job(run_dir, None, None, parse_sacct(recorded(history)) if history else None)
    assert (rec.state, rec.reason) == ("UNKNOWN", UNKNOWN_TO_SLURM)
    assert rec.detail.startswith("Slurm no longer lists job 12 (squeue), the job left no record of its end")
    assert said in rec.detail


def test_a_job_that_recorded_its_end_is_not_unknown(tmp_path):
    record = RunRecord(run_id="r1", job_id="12", state="COMPLETED",
                       starts=[StartRecord(job_id="12", restart=0, state="COMPLETED")])
    rec = fold_job(run_dir_with(tmp_path, record), None, None, [])
    assert (rec.state, rec.reason, rec.detail) == ("COMPLETED", None, None)


# --- held states ------------------------------------------------------------------------------


def test_special_exit_is_a_queued_job_whatever_sacct_says():
    # squeue's SPECIAL_EXIT: requeued held after an exit code in RequeueExitHold.
    assert current_state("RUNNING", "SPECIAL_EXIT", parse_sacct(recorded("sacct-failed.txt"))) == "SPECIAL_EXIT"


@pytest.mark.parametrize("live, said", [
    ("RESV_DEL_HOLD", "the reservation it asked for was deleted"),
    ("SPECIAL_EXIT", "`scontrol release 12` lets it start"),
])
def test_a_hold_that_never_clears_by_itself_is_said_so(live, said):
    rec = running_record()
    record_pending_reason(rec, live, None)
    assert rec.reason == "never starts" and rec.extra["blocked"] is True and said in rec.detail
    record_pending_reason(rec, "RUNNING", None)          # released
    assert rec.reason is None and "blocked" not in rec.extra


def test_a_requeue_hold_the_user_asked_for_is_no_verdict():
    rec = running_record()
    record_pending_reason(rec, parse_squeue(recorded("squeue-requeue-hold.txt")), "JobHeldUser")
    assert rec.reason is None and "blocked" not in rec.extra


# --- sbatch's refusals --------------------------------------------------------------------------

VALUES = dict(partition="debug", gpus=2, directive="gpus-per-node", time="00:10:00", account="glaunch", qos="normal",
              nodes=1, tasks=2, cpus=2, mem="default")


def test_a_qos_policy_refusal_is_not_taken_for_a_partition_time_limit():
    # Slurm's wording of ESLURM_ACCOUNTING_POLICY (src/common/slurm_errno.c), after the limit's name.
    raw = ("sbatch: error: QOSMaxSubmitJobPerUserLimit\nsbatch: error: Batch job submission failed: "
           "Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)")
    said = preflight_message(raw, VALUES)
    assert said.startswith("preflight: the job breaks a limit of QOS 'normal' or of account 'glaunch'")
    assert "partition" not in said.partition("\n")[0]


@pytest.mark.parametrize("name, said", [
    ("sbatch-submit-invalid-partition.txt",
     "sbatch refused the job: invalid partition specified: nosuch; Batch job "
     "submission failed: Invalid partition name specified"),
    ("sbatch-submit-invalid-account.txt",
     "sbatch refused the job: Batch job submission failed: Invalid account or account/partition "
     "combination specified"),
])
def test_an_sbatch_refusal_keeps_the_line_naming_its_cause(name, said):
    def runner(cmd, **_):
        return subprocess.CompletedProcess(cmd, 1, "", recorded(name))

    client = Client(runner=runner, sleep=lambda s: pytest.fail("retried a refusal"))
    with pytest.raises(SchedulerError) as caught:
        client.submit(["sbatch", "job.sh"], lookup=lambda d: pytest.fail("looked up"))
    assert caught.value.message == said


@pytest.mark.parametrize("squeue, sacct, state", [
    ("squeue-hetjob-pending.txt", "sacct-pending.txt", "PENDING"),
    ("squeue-ended.txt", "sacct-hetjob-cancelled-pending.txt", "CANCELLED"),
])
def test_fake_status_of_many_runs_with_a_heterogeneous_job(tmp_path, fake_bin, squeue, sacct, state):
    # `glaunch list`'s one squeue and one sacct for every run.
    fake_bin("squeue", squeue)
    fake_bin("sacct", sacct)
    record = RunRecord(run_id="r1", job_id="2539", state="PENDING",
                       starts=[StartRecord(job_id="2539", restart=0, state="PENDING")])
    (rec,) = SlurmScheduler().refresh_many([(run_dir_with(tmp_path, record), record)])
    assert rec.state == state and [s.job_id for s in rec.starts] == ["2539"]


@pytest.mark.parametrize("name, detail", [
    ("sacct-cancelled.txt", "cancelled by uid 0 (root: an administrator or Slurm)"),
    ("sacct-cancelled-pending.txt", "cancelled by uid 0 (root: an administrator or Slurm)"),
])
def test_a_start_cancelled_by_someone_says_who(name, detail):
    job_id = parse_sacct(recorded(name))[0]["job_id"]
    record = RunRecord(run_id="r1", job_id=job_id, starts=[StartRecord(job_id=job_id, restart=0, state="RUNNING")])
    merge_history(record, parse_sacct(recorded(name)))
    assert (record.starts[0].state, record.starts[0].reason, record.starts[0].detail) == ("CANCELLED", "cancelled",
                                                                                         detail)
    other = parse_sacct(recorded(name).replace("CANCELLED by 0", "CANCELLED by 1000"))
    record = RunRecord(run_id="r1", job_id=job_id, starts=[StartRecord(job_id=job_id, restart=0, state="RUNNING")])
    merge_history(record, other)
    assert record.starts[0].detail == "cancelled by uid 1000"


def test_a_start_glaunch_cancel_ended_says_so_not_which_uid(tmp_path, fake_bin):
    """sacct says `CANCELLED by 0`; the run's cancel file says `glaunch cancel` asked for it."""
    fake_bin("squeue", "squeue-unknown-job-stderr.txt")
    fake_bin("sacct", "sacct-cancelled.txt")
    job_id = parse_sacct(recorded("sacct-cancelled.txt"))[0]["job_id"]
    record = RunRecord(run_id="r1", job_id=job_id, state="RUNNING",
                       starts=[StartRecord(job_id=job_id, restart=0, state="RUNNING")])
    run_dir = run_dir_with(tmp_path, record)
    registry.request_cancel(run_dir, job_id)
    rec = SlurmScheduler().refresh(run_dir, record)
    assert (rec.state, rec.starts[0].state, rec.starts[0].detail) == ("CANCELLED", "CANCELLED",
                                                                      "cancelled with glaunch cancel")
    assert (rec.reason, rec.detail) == ("cancelled", "cancelled with glaunch cancel")
