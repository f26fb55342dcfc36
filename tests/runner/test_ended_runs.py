"""A run's record is authoritative once the run has ended: status, logs, list, resume and
--after of an ended run answer from its run directory, asking the scheduler nothing, so they
answer at once with the controller down. A run still in flight whose scheduler cannot be
reached says so within the client's bound and names the state last recorded.

The cluster is played by fake squeue/sacct/scontrol first on PATH that log each call and
answer as a controller that cannot be reached does (tests/recorded_cluster/errors/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher import api
from launcher.errors import SchedulerError
from launcher.rundir import registry
from launcher.rundir.records import StartRecord
from launcher.runner import lookup
from launcher.schedulers.slurm import client as slurm_client, queries as slurm_queries
from launcher.schedulers.slurm.client import RetryPolicy
from launcher.views.listing import format_list

REPO = Path(__file__).resolve().parents[2]
ERRORS = REPO / "tests" / "recorded_cluster" / "errors"
RECORDED = REPO / "tests" / "recorded"
QUICK = RetryPolicy(attempts=2, attempt_timeout_s=8.0, budget_s=10.0, backoff_s=(0.1,), min_attempt_s=2.0)

FAKE = """\
#!/bin/bash
echo "$*" >> "$FAKE_DIR/{name}.calls"
if [ -e "$FAKE_DIR/{name}.out" ]; then cat "$FAKE_DIR/{name}.out"; exit 0; fi
cat "$FAKE_DIR/unreachable.txt" >&2
exit 1
"""


@pytest.fixture(autouse=True)
def fresh_client():
    slurm_client.CLIENT.forget_down()
    yield
    slurm_client.CLIENT.forget_down()


@pytest.fixture
def down(tmp_path, monkeypatch, mysite_workdir):
    """squeue, sacct, scontrol, scancel, sbatch and srun that cannot reach the controller
    (each call logged), retried within a short bound; the working directory has the Slurm
    profile `mysite` and exp.yaml."""
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    text = (ERRORS / "squeue-unreachable.txt").read_text(encoding="utf-8").partition("\n")[2]
    (fakes / "unreachable.txt").write_text(text)
    for name in ("squeue", "sacct", "scontrol", "scancel", "sbatch", "srun"):
        (fakes / name).write_text(FAKE.format(name=name))
        (fakes / name).chmod(0o755)
    conf = tmp_path / "slurm.conf"
    conf.write_text("SlurmctldHost=ctl01\nSlurmctldPort=1\n")
    monkeypatch.setenv("PATH", f"{fakes}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DIR", str(fakes))
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.setattr(slurm_client, "DEFAULT_POLICY", QUICK)
    monkeypatch.setattr(slurm_queries, "ACCOUNTING_POLICY", QUICK)
    return fakes


def calls(fakes: Path) -> dict[str, list[str]]:
    return {p.stem: p.read_text().splitlines() for p in sorted(fakes.glob("*.calls"))}


def slurm_run(runs: str = "runs", **values) -> Path:
    """A run of exp.yaml on mysite as its submission leaves it, then run.json as `values` say."""
    run = api.submit("exp.yaml", site="mysite", dry_run=True, runs_dir=runs)
    with registry.updating(run.run_dir) as record:
        record.dry_run = False
        for key, value in values.items():
            setattr(record, key, value)
    return Path(run.run_dir)


def job_start(restart: int, state: str, **values) -> StartRecord:
    """A start as the job records its end (launcher.jobcontrol.jobend)."""
    return StartRecord(job_id="12", restart=restart, state=state, started=f"2026-12-03T13:1{restart}:00",
                       ended=f"2026-12-03T13:1{restart}:30", extra={"nodes": "node1"}, **values)


def completed(**values) -> Path:
    return slurm_run(state="COMPLETED", job_id="12", starts=[job_start(0, "COMPLETED")], **values)


# --- an ended run: nothing asked ----------------------------------------------------------------


def test_status_of_a_completed_run_with_the_controller_down_answers_from_its_record(down):
    run_dir = completed()
    began = time.monotonic()
    summary = api.status(str(run_dir))
    took = time.monotonic() - began
    assert summary["state"] == "COMPLETED" and [s["state"] for s in summary["starts"]] == ["COMPLETED"]
    assert calls(down) == {} and took < 1.0


def test_glaunch_status_of_a_completed_run_exits_0_with_the_controller_down(down, isolated_env):
    run_dir = completed()
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "status", str(run_dir)], env=dict(os.environ),
                          capture_output=True, text=True, timeout=120)
    took = time.monotonic() - began
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"run {run_dir.name}: COMPLETED") and proc.stderr == ""
    assert calls(down) == {}
    assert took < 10.0          # the interpreter's start; no Slurm command's bound


def test_logs_list_and_cancel_of_an_ended_run_ask_nothing(down):
    run_dir = slurm_run(state="FAILED", job_id="12", starts=[job_start(0, "FAILED", reason="crash")])
    log = run_dir / "logs" / "12_0_log.out"
    log.parent.mkdir(exist_ok=True)
    log.write_text("step 1\n")
    lines: list[str] = []
    api.logs(str(run_dir), follow=True, echo=lines.append, poll_s=0.0)
    assert lines == ["[r0] step 1"]
    assert [(r["run_id"], r["state"]) for r in api.list_runs()] == [(run_dir.name, "FAILED")]
    assert api.cancel(str(run_dir)) == f"run {run_dir.name}: nothing to cancel (FAILED)"
    assert calls(down) == {}


@pytest.mark.parametrize("asked, shown, spares", [(3, "2+1", 1), (2, "2", 0), ("3", "2", 0), (None, "2", 0)])
def test_list_counts_the_spare_nodes_a_job_holds_besides_its_training_nodes(down, asked, shown, spares):
    # `request` is what the job asked Slurm for (training nodes and spares); a record that
    # lacks it, or whose value is not a count, shows the training nodes alone.
    run_dir = completed(nodes=2)
    with registry.updating(run_dir) as record:
        record.extra["request"] = {"nodes": asked}
    rows = api.list_runs()
    assert [(r["nodes"], r["spare_nodes"]) for r in rows] == [(2, spares)]
    assert format_list(rows).splitlines()[1].split()[3] == shown
    assert calls(down) == {}


def test_resume_of_an_ended_run_is_prepared_without_the_scheduler(down):
    run_dir = slurm_run(state="TIMEOUT", job_id="12", starts=[job_start(0, "TIMEOUT", reason="timeout")])
    prepared = api.prepare_resume(str(run_dir), overrides=["resources.nodes=1"])
    assert prepared.record.state == "TIMEOUT" and prepared.plan.allocation.nodes == 1
    assert calls(down) == {}


def test_after_an_ended_run_is_prepared_without_the_scheduler(down):
    upstream = completed(runs="upstream")
    prepared = api.prepare("exp.yaml", site="mysite", runs_dir="runs", after=[f"{upstream}:ok"])
    assert prepared.plan.run_id
    assert calls(down) == {}


def test_status_of_an_ended_sweep_asks_nothing(down):
    sweep = api.submit("exp.yaml", site="mysite", dry_run=True, runs_dir="runs", sweep=["resources.nodes=1,2"])
    data = json.loads((sweep.sweep_dir / "sweep.json").read_text())
    data["dry_run"] = False
    for number, array in enumerate(data["arrays"]):
        array["job_id"] = str(20 + number)
    (sweep.sweep_dir / "sweep.json").write_text(json.dumps(data))
    for number, element in enumerate(sweep.runs):
        with registry.updating(element.run_dir) as record:
            record.dry_run, record.state, record.job_id = False, "COMPLETED", f"{20 + number}_0"
            record.starts = [StartRecord(job_id=f"{20 + number}_0", restart=0, state="COMPLETED",
                                         started="2026-12-03T13:10:00", ended="2026-12-03T13:10:30",
                                         extra={"nodes": "node1"})]
    summary = api.status(sweep.sweep_id)
    assert summary["state"] == "COMPLETED"
    assert [r["state"] for r in api.list_runs(sweep=sweep.sweep_id)] == ["COMPLETED", "COMPLETED"]
    assert calls(down) == {}


# --- an ended run with a start its job could not record: accounting folded once -----------------


def test_an_ended_run_s_unrecorded_start_is_taken_from_accounting_once(down):
    # Start 0 was killed without recording its end (a node failure Slurm requeued); start 1 completed.
    unrecorded = StartRecord(job_id="12", restart=0, state="RUNNING", started="2026-12-03T13:11:25")
    run_dir = slurm_run(state="COMPLETED", job_id="12", starts=[unrecorded, job_start(1, "COMPLETED")])
    (down / "sacct.out").write_text("12|NODE_FAIL|0:0|2026-12-03T13:11:25|2026-12-03T13:11:26|00:00:01|node1|None\n"
                                    "12|COMPLETED|0:0|2026-12-03T13:11:32|2026-12-03T13:11:49|00:00:17|node1|None\n")
    first = api.status(str(run_dir))
    assert [(s["state"], s["reason"], s["ended"]) for s in first["starts"]] == [
        ("NODE_FAIL", "node failure", "2026-12-03T13:11:26"), ("COMPLETED", None, "2026-12-03T13:11:30")]
    assert len(calls(down)["sacct"]) == 1 and "squeue" not in calls(down)     # an ended job: squeue has nothing
    again = api.status(str(run_dir))
    assert again["starts"] == first["starts"] and len(calls(down)["sacct"]) == 1
    assert registry.read(run_dir).extra["accounting_after_end"]["job_id"] == "12"


# --- a run in flight: the scheduler asked, within the bound ------------------------------------------


def test_status_of_a_running_run_with_the_controller_down_says_so_and_the_last_state(down):
    run_dir = slurm_run(state="RUNNING", job_id="12",
                        starts=[StartRecord(job_id="12", restart=0, state="RUNNING", started="2026-12-03T13:11:25")])
    began = time.monotonic()
    with pytest.raises(SchedulerError) as err:
        api.status(str(run_dir))
    assert time.monotonic() - began < QUICK.budget_s + 5
    message = err.value.message
    assert err.value.exit_code == 3
    assert message.startswith("cannot reach the Slurm controller, slurmctld on ctl01 port 1")
    assert f"run {run_dir.name} was last recorded RUNNING (job 12" in message
    record = registry.read(run_dir)
    assert record.state == "RUNNING" and record.extra["unreachable"]["message"] in message
    assert err.value.record.state == "RUNNING"


def test_a_squeue_that_cannot_tell_is_recorded_as_unreachable(down):
    # munge down: the controller is not reached, and squeue says why at once (not a transient error).
    (down / "unreachable.txt").write_text(
        (RECORDED / "squeue-munge-down-stderr.txt").read_text(encoding="utf-8").partition("\n")[2])
    run_dir = slurm_run(state="PENDING", job_id="12", starts=[StartRecord(job_id="12", restart=0)])
    with pytest.raises(SchedulerError, match=rf"squeue could not tell the state of job 12: .*; run {run_dir.name} "
                                             r"was last recorded PENDING \(job 12"):
        lookup.refreshed(run_dir)
    assert "Protocol authentication error" in registry.read(run_dir).extra["unreachable"]["message"]
