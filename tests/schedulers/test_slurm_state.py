"""Slurm's answers read without a cluster: sacct and squeue output recorded on the local
Slurm 22.05 cluster (tests/recorded/, each file's first line says the command), merged
into a run's starts and state; sbatch --test-only's recorded refusals said in the
profile's terms."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from launcher.rundir.records import RunRecord, StartRecord
from launcher.schedulers.slurm.state import (
    SACCT_FORMAT,
    base_state,
    current_state,
    foreign_job,
    merge_history,
    parse_sacct,
    parse_squeue,
    preflight_message,
)

RECORDED = Path(__file__).parent.parent / "recorded"


def recorded(name: str) -> str:
    """The command's output, verbatim, without the file's first line (the command)."""
    return (RECORDED / name).read_text(encoding="utf-8").partition("\n")[2]


def test_every_recording_names_its_command_and_slurm_version():
    files = sorted(RECORDED.glob("*.txt"))
    assert len(files) >= 30
    for path in files:
        head = path.read_text(encoding="utf-8").partition("\n")[0]
        assert re.match(r"# \$ (sacct|squeue|sbatch|scontrol) ", head), path.name
        assert re.search(r"[Ss]lurm[- ](wlm )?\d\d\.\d\d", head), path.name


def test_recordings_use_the_sacct_format_the_launcher_asks_for():
    for path in RECORDED.glob("sacct-*.txt"):
        assert f"-o {','.join(SACCT_FORMAT)} " in path.read_text(encoding="utf-8").partition("\n")[0], path.name


# --- parsing ----------------------------------------------------------------------------


def row(job_id, state, exit_code, start, end, elapsed, nodes, reason):
    return dict(job_id=job_id, state=state, exit_code=exit_code, start=start, end=end, elapsed=elapsed,
                nodes=nodes, reason=reason)


REQUEUED_0 = row("13", "REQUEUED", "0:0", "2026-12-03T13:11:25", "2026-12-03T13:11:26", "00:00:01", "node1", "None")
REQUEUED_1 = row("13", "REQUEUED", "0:0", "2026-12-03T13:11:32", "2026-12-03T13:11:33", "00:00:01", "node1", "None")

SACCT = {
    "sacct-completed.txt": [
        row("10", "COMPLETED", "0:0", "2026-12-03T13:11:10", "2026-12-03T13:11:12", "00:00:02", "node1", "None")],
    "sacct-failed.txt": [
        row("11", "FAILED", "3:0", "2026-12-03T13:11:10", "2026-12-03T13:11:11", "00:00:01", "node1", "None")],
    "sacct-running.txt": [
        row("12", "RUNNING", "0:0", "2026-12-03T13:11:10", "Unknown", "00:00:02", "node1", "None")],
    "sacct-cancelled.txt": [
        row("12", "CANCELLED by 0", "0:0", "2026-12-03T13:11:10", "2026-12-03T13:11:12", "00:00:02", "node1", "None")],
    "sacct-cancelled-pending.txt": [
        row("22", "CANCELLED by 0", "0:0", "2026-12-03T13:14:54", "2026-12-03T13:14:54", "00:00:00", "None assigned",
            "None")],
    "sacct-two-nodes.txt": [
        row("21", "COMPLETED", "0:0", "2026-12-03T13:14:53", "2026-12-03T13:14:55", "00:00:02", "node[1-2]", "None")],
    "sacct-pending.txt": [],   # a job waiting for its --begin time is not in accounting yet
    "sacct-lagging.txt": [     # squeue said RUNNING already: accounting lags behind
        row("23", "PENDING", "0:0", "2026-12-03T13:18:54", "Unknown", "00:00:01", "node1", "None")],
    "sacct-suspended.txt": [
        row("23", "SUSPENDED", "0:0", "2026-12-03T13:18:54", "Unknown", "00:00:01", "node1", "None")],
    "sacct-resumed.txt": [
        row("23", "RUNNING", "0:0", "2026-12-03T13:18:54", "Unknown", "00:00:02", "node1", "None")],
    "sacct-resumed-completed.txt": [
        row("23", "COMPLETED", "0:0", "2026-12-03T13:18:54", "2026-12-03T13:19:00", "00:00:03", "node1", "None")],
    "sacct-requeued-pending.txt": [REQUEUED_0],
    "sacct-requeued-running.txt": [
        REQUEUED_0, row("13", "RUNNING", "0:0", "2026-12-03T13:11:32", "Unknown", "00:00:01", "node1", "None")],
    "sacct-requeue-hold.txt": [
        REQUEUED_0, REQUEUED_1,
        row("13", "PENDING", "0:0", "Unknown", "Unknown", "00:00:00", "None assigned", "JobHeldUser")],
    "sacct-requeued-completed.txt": [
        REQUEUED_0, REQUEUED_1,
        row("13", "COMPLETED", "0:0", "2026-12-03T13:11:41", "2026-12-03T13:11:49", "00:00:08", "node1", "JobHeldUser")],
}


@pytest.mark.parametrize("name", sorted(SACCT))
def test_parse_sacct(name):
    assert parse_sacct(recorded(name)) == SACCT[name]


def test_parse_sacct_skips_what_is_not_a_row():
    text = "sacct: error: slurmdbd: Connection refused\n\n" + recorded("sacct-failed.txt") + "12|RUNNING|0:0\n"
    assert parse_sacct(text) == SACCT["sacct-failed.txt"]


@pytest.mark.parametrize("name, state", [
    ("squeue-running.txt", "RUNNING"),
    ("squeue-pending.txt", "PENDING"),
    ("squeue-after-requeue.txt", "COMPLETING"),    # the first start is still being torn down
    ("squeue-requeued-pending.txt", "PENDING"),
    ("squeue-requeue-hold.txt", "PENDING"),
    ("squeue-suspended.txt", "SUSPENDED"),
    ("squeue-ended.txt", None),                     # squeue lists it no more
    ("squeue-unknown-job.txt", None),               # "Invalid job id specified", on stderr
])
def test_parse_squeue(name, state):
    assert parse_squeue(recorded(name)) == state


@pytest.mark.parametrize("state, base", [("CANCELLED by 0", "CANCELLED"), ("CANCELLED by 1000", "CANCELLED"),
                                         ("COMPLETED", "COMPLETED"), ("REQUEUED", "REQUEUED"), ("", "")])
def test_base_state(state, base):
    assert base_state(state) == base


# --- the run's state now ------------------------------------------------------------------


def squeue(name):
    return parse_squeue(recorded(name))


def sacct(name):
    return parse_sacct(recorded(name))


@pytest.mark.parametrize("recorded_state, live, history, state", [
    # the job's own terminal record wins over the scheduler
    ("COMPLETED", None, "sacct-completed.txt", "COMPLETED"),
    ("FAILED", "squeue-running.txt", "sacct-running.txt", "FAILED"),
    ("TIMEOUT", None, "sacct-cancelled.txt", "TIMEOUT"),
    # while squeue lists the job, squeue says
    ("PENDING", "squeue-pending.txt", "sacct-pending.txt", "PENDING"),
    ("PENDING", "squeue-running.txt", "sacct-running.txt", "RUNNING"),
    ("PENDING", "squeue-running.txt", "sacct-lagging.txt", "RUNNING"),
    ("RUNNING", "squeue-suspended.txt", "sacct-suspended.txt", "SUSPENDED"),
    ("REQUEUED", "squeue-after-requeue.txt", "sacct-requeued-pending.txt", "COMPLETING"),
    ("REQUEUED", "squeue-requeued-pending.txt", "sacct-requeued-pending.txt", "PENDING"),
    ("REQUEUED", "squeue-requeue-hold.txt", "sacct-requeue-hold.txt", "PENDING"),
    # once squeue has forgotten it, sacct's last start
    ("RUNNING", "squeue-ended.txt", "sacct-completed.txt", "COMPLETED"),
    ("RUNNING", "squeue-ended.txt", "sacct-failed.txt", "FAILED"),
    ("RUNNING", "squeue-ended.txt", "sacct-cancelled.txt", "CANCELLED"),
    ("PENDING", "squeue-unknown-job.txt", "sacct-cancelled-pending.txt", "CANCELLED"),
    ("REQUEUED", "squeue-ended.txt", "sacct-requeued-completed.txt", "COMPLETED"),
    # neither knows it: in flight becomes UNKNOWN, anything else stays
    ("PENDING", "squeue-unknown-job.txt", None, "UNKNOWN"),
    ("RUNNING", "squeue-ended.txt", "sacct-pending.txt", "UNKNOWN"),
    ("REQUEUED", None, None, "UNKNOWN"),
    ("SUBMITTING", None, None, "UNKNOWN"),
    (None, None, None, "UNKNOWN"),
    ("RENDERED", None, None, "RENDERED"),
    # a dry run's record hides no job the scheduler has
    ("RENDERED", "squeue-running.txt", "sacct-running.txt", "RUNNING"),
])
def test_current_state(recorded_state, live, history, state):
    live_state = squeue(live) if live else None
    rows = sacct(history) if history else None
    assert current_state(recorded_state, live_state, rows) == state


def test_current_state_takes_a_state_squeue_shows_for_an_ended_job():
    # Within MinJobAge `squeue -j JOB -t all` still lists an ended job; without accounting that is all there is.
    assert current_state("RUNNING", "COMPLETED", None) == "COMPLETED"
    # squeue's word counts over sacct's only while the job is live.
    assert current_state("RUNNING", "COMPLETED", sacct("sacct-failed.txt")) == "FAILED"


# --- merging sacct's starts into the run's ------------------------------------------------


def run(*starts: StartRecord) -> RunRecord:
    return RunRecord(run_id="r1", job_id="13", requeue_max=3, starts=list(starts))


def jobend_start(restart, **values):
    """A start as launcher.jobcontrol.jobend records it when the step ends."""
    start = StartRecord(job_id="13", restart=restart, submitted="2026-12-03T13:11:20")
    start.update(**values)
    return start


def test_merge_fills_in_starts_the_job_could_not_record():
    # Start 0 ended through jobend; start 1 was killed before it could write; start 2 finished
    # with nobody refreshing until now.
    record = run(jobend_start(0, state="REQUEUED", reason="timeout", started="2026-12-03T13:11:25",
                              ended="2026-12-03T13:11:26", exit_code=0, nodes="node1", stopped_at=120))
    merge_history(record, sacct("sacct-requeued-completed.txt"))
    assert [s.to_dict() for s in record.starts] == [
        {"job_id": "13", "restart": 0, "submitted": "2026-12-03T13:11:20", "started": "2026-12-03T13:11:25",
         "ended": "2026-12-03T13:11:26", "state": "REQUEUED", "reason": "timeout", "detail": None, "exit_code": 0,
         "resumed_from": None, "stopped_at": 120, "nodes": "node1", "scheduler_state": "REQUEUED"},
        {"job_id": "13", "restart": 1, "submitted": None, "started": "2026-12-03T13:11:32",
         "ended": "2026-12-03T13:11:33", "state": "REQUEUED", "reason": None, "detail": None, "exit_code": None,
         "resumed_from": None, "stopped_at": None, "nodes": "node1", "scheduler_state": "REQUEUED"},
        {"job_id": "13", "restart": 2, "submitted": None, "started": "2026-12-03T13:11:41",
         "ended": "2026-12-03T13:11:49", "state": "COMPLETED", "reason": None, "detail": None, "exit_code": None,
         "resumed_from": None, "stopped_at": None, "nodes": "node1", "scheduler_state": "COMPLETED"},
    ]


def test_merge_follows_one_start_from_running_to_cancelled():
    record = RunRecord(run_id="r1", job_id="12", starts=[StartRecord(job_id="12", restart=0,
                                                                      submitted="2026-12-03T13:11:09")])
    merge_history(record, sacct("sacct-running.txt"))
    (start,) = record.starts
    assert (start.state, start.reason, start.started, start.ended, start.get("nodes"), start.get("scheduler_state")) \
        == ("RUNNING", None, "2026-12-03T13:11:10", None, "node1", None)   # sacct's End=Unknown is no time
    merge_history(record, sacct("sacct-cancelled.txt"))
    (start,) = record.starts
    assert (start.state, start.reason, start.started, start.ended, start.get("nodes"), start.get("scheduler_state")) \
        == ("CANCELLED", "cancelled", "2026-12-03T13:11:10", "2026-12-03T13:11:12", "node1", "CANCELLED")


@pytest.mark.parametrize("live", ["RUNNING", "STOPPED", "REQUEUE_HOLD", "SUSPENDED", "SPECIAL_EXIT"])
def test_a_start_the_job_ended_keeps_no_live_scheduler_state_from_a_read_while_it_ran(live):
    # sacct read while the start ran, then the job recorded its end and settled: nothing asks
    # sacct again, so a RUNNING there would stand for ever beside the start's COMPLETED.
    running = parse_sacct(recorded("sacct-running.txt").replace("|RUNNING|", f"|{live}|"))
    assert [row["state"] for row in running] == [live]
    record = RunRecord(run_id="r1", job_id="12", starts=[StartRecord(job_id="12", restart=0)])
    merge_history(record, running)
    (start,) = record.starts
    start.update(state="COMPLETED", ended="2026-12-03T13:11:12", exit_code=0)
    assert "scheduler_state" not in start.to_dict()
    merge_history(record, running)                             # accounting lagging the job's end
    assert (start.state, start.get("scheduler_state")) == ("COMPLETED", None)
    merge_history(record, sacct("sacct-cancelled.txt"))        # its end, when accounting has it
    assert (start.state, start.get("scheduler_state")) == ("COMPLETED", "CANCELLED")


def test_an_allocation_s_end_goes_to_its_last_start_not_the_one_it_restarted_from():
    """Start 0 crashed and the job restarted in its allocation (start 1); the job was then
    cancelled before it could record start 1's end. sacct's one row for the allocation
    ends start 1; start 0 keeps its own end."""
    restarted = StartRecord(job_id="12", restart=0, state="RESTARTED", reason="crash", detail="retry 1 of 2",
                            ended="2026-12-03T13:11:11")
    record = RunRecord(run_id="r1", job_id="12", starts=[restarted, StartRecord(job_id="12", restart=1,
                                                                                  state="RUNNING")])
    merge_history(record, sacct("sacct-cancelled.txt"))
    first, second = record.starts
    assert (first.state, first.reason, first.started) == ("RESTARTED", "crash", "2026-12-03T13:11:10")
    assert (second.state, second.reason, second.ended) == ("CANCELLED", "cancelled", "2026-12-03T13:11:12")


@pytest.mark.parametrize("name, state, reason", [
    ("sacct-failed.txt", "FAILED", "crash"),
    ("sacct-completed.txt", "COMPLETED", None),
    ("sacct-two-nodes.txt", "COMPLETED", None),
])
def test_merge_gives_a_pending_start_sacct_s_end(name, state, reason):
    (expected,) = SACCT[name]
    record = run(StartRecord(job_id=expected["job_id"], restart=0))
    merge_history(record, sacct(name))
    (start,) = record.starts
    assert (start.state, start.reason, start.started, start.ended, start.get("nodes")) \
        == (state, reason, expected["start"], expected["end"], expected["nodes"])


def test_the_job_s_own_record_of_a_start_wins_over_sacct():
    # jobend wrote COMPLETED on gpu-node7; an scancel during the epilogue made sacct say CANCELLED on node1.
    start = jobend_start(0, job_id="12", state="COMPLETED", started="2026-12-03T13:11:00",
                         ended="2026-12-03T13:11:11", exit_code=0, nodes="gpu-node7")
    record = run(start)
    merge_history(record, sacct("sacct-cancelled.txt"))
    assert record.starts == [start]
    assert (start.state, start.reason, start.started, start.ended, start.get("nodes")) \
        == ("COMPLETED", None, "2026-12-03T13:11:00", "2026-12-03T13:11:11", "gpu-node7")
    assert start.get("scheduler_state") == "CANCELLED"


def test_a_start_the_job_left_running_takes_sacct_s_end():
    # The task marks its start RUNNING; the time limit killed it before jobend ran.
    text = recorded("sacct-requeued-running.txt").replace("RUNNING|0:0|2026-12-03T13:11:32|Unknown",
                                                          "TIMEOUT|0:0|2026-12-03T13:11:32|2026-12-03T13:12:32")
    record = run(jobend_start(0, state="REQUEUED", reason="timeout", ended="2026-12-03T13:11:26"),
                 jobend_start(1, state="RUNNING", started="2026-12-03T13:11:32"))
    merge_history(record, parse_sacct(text))
    assert [(s.restart, s.state, s.reason, s.ended) for s in record.starts] == [
        (0, "REQUEUED", "timeout", "2026-12-03T13:11:26"), (1, "TIMEOUT", "timeout", "2026-12-03T13:12:32")]


def test_merge_orders_the_starts_by_restart():
    # jobend recorded restart 1 only (restart 0 ended by a node failure it never saw).
    record = run(jobend_start(1, state="REQUEUED", reason="timeout", ended="2026-12-03T13:11:33"))
    merge_history(record, sacct("sacct-requeued-completed.txt"))
    assert [(s.restart, s.state, s.reason) for s in record.starts] == [
        (0, "REQUEUED", None), (1, "REQUEUED", "timeout"), (2, "COMPLETED", None)]


def test_merge_keeps_an_earlier_job_s_starts_apart_from_a_resumed_run_s_job():
    # `glaunch resume` appended job 14's starts after job 9's (requeued once, then cancelled).
    earlier = [jobend_start(0, job_id="9", state="REQUEUED", reason="preemption", ended="2026-12-03T12:00:00"),
               jobend_start(1, job_id="9", state="CANCELLED", reason="cancelled", ended="2026-12-03T12:30:00")]
    record = run(*earlier, StartRecord(job_id="14", restart=0))
    text = ("14|REQUEUED|0:0|2026-12-03T14:00:00|2026-12-03T14:10:00|00:10:00|node1|None\n"
            "14|COMPLETED|0:0|2026-12-03T14:12:00|2026-12-03T14:40:00|00:28:00|node2|None\n")
    merge_history(record, parse_sacct(text))
    assert [(s.job_id, s.restart, s.state, s.get("nodes")) for s in record.starts] == [
        ("9", 0, "REQUEUED", None), ("9", 1, "CANCELLED", None),
        ("14", 0, "REQUEUED", "node1"), ("14", 1, "COMPLETED", "node2")]
    assert earlier[0].ended == "2026-12-03T12:00:00" and earlier[1].state == "CANCELLED"


def test_merge_follows_a_start_through_suspend_and_resume():
    record = run(StartRecord(job_id="23", restart=0, submitted="2026-12-03T13:18:53"))
    seen = []
    for name in ("sacct-lagging.txt", "sacct-suspended.txt", "sacct-resumed.txt", "sacct-resumed-completed.txt"):
        merge_history(record, sacct(name))
        (start,) = record.starts
        seen.append((start.state, start.started, start.ended))
    assert seen == [("PENDING", "2026-12-03T13:18:54", None), ("SUSPENDED", "2026-12-03T13:18:54", None),
                    ("RUNNING", "2026-12-03T13:18:54", None),
                    ("COMPLETED", "2026-12-03T13:18:54", "2026-12-03T13:19:00")]


def test_a_start_last_seen_suspended_takes_its_end_from_sacct():
    record = run(StartRecord(job_id="23", restart=0))
    merge_history(record, sacct("sacct-suspended.txt"))
    merge_history(record, sacct("sacct-resumed-completed.txt"))
    assert (record.starts[0].state, record.starts[0].ended) == ("COMPLETED", "2026-12-03T13:19:00")


def test_a_reason_the_job_gave_is_kept():
    # The job named why its start is ending (here a hang) before Slurm ended it; sacct only says FAILED.
    record = run(StartRecord(job_id="11", restart=0, state="RUNNING", reason="hang"))
    merge_history(record, sacct("sacct-failed.txt"))
    assert (record.starts[0].state, record.starts[0].reason) == ("FAILED", "hang")


def test_merge_of_nothing_changes_nothing():
    start = jobend_start(0, state="PENDING")
    record = run(start)
    merge_history(record, sacct("sacct-pending.txt"))
    assert record.starts == [start] and start.extra == {}


# Rows in sacct's format for endings the local cluster cannot produce in a few seconds.
@pytest.mark.parametrize("state, reason", [("TIMEOUT", "timeout"), ("PREEMPTED", "preemption"),
                                           ("NODE_FAIL", "node failure"), ("FAILED", "crash"),
                                           ("OUT_OF_MEMORY", "crash"), ("CANCELLED", "cancelled"),
                                           ("BOOT_FAIL", None), ("DEADLINE", None)])
def test_merge_says_why_a_start_ended(state, reason):
    text = f"14|{state}|0:15|2026-12-03T14:00:00|2026-12-03T15:00:03|01:00:03|node[1-2]|None\n"
    record = run(StartRecord(job_id="14", restart=0))
    merge_history(record, parse_sacct(text))
    assert (record.starts[0].state, record.starts[0].reason, record.starts[0].get("nodes")) == (state, reason, "node[1-2]")


@pytest.mark.parametrize("name", ["sacct-requeue-hold.txt", "sacct-cancelled-pending.txt"])
def test_a_start_that_never_ran_has_no_nodes(name):
    record = run()
    merge_history(record, sacct(name))
    assert record.starts[-1].get("nodes") is None


# --- preflight: sbatch --test-only's refusals in the profile's terms ----------------------

VALUES = dict(partition="debug", gpus=2, directive="gpus-per-node", time="00:10:00", account="glaunch", qos=None,
              nodes=1, tasks=2, cpus=2, mem="default")

PREFLIGHT = [
    ("sbatch-invalid-partition.txt", {"partition": "nosuch"},
     "partition 'nosuch' does not exist on this cluster (resources.partition / the site's default_partition)"),
    ("sbatch-gpus-per-node-9.txt", {"gpus": 9},
     "no node of partition 'debug' has what one node of this job asks: 9 GPU(s), 2 task(s) x 2 CPU(s), memory "
     "default (resources.gpus_per_node, cpus_per_task, mem_gb; partitions.debug.gpus_per_node, cpus_per_node, "
     "mem_gb)"),
    ("sbatch-mem-100g.txt", {"mem": "100 GB"},
     "no node of partition 'debug' has what one node of this job asks: 2 GPU(s), 2 task(s) x 2 CPU(s), memory "
     "100 GB (resources.gpus_per_node, cpus_per_task, mem_gb; partitions.debug.gpus_per_node, cpus_per_node, "
     "mem_gb)"),
    ("sbatch-invalid-gres.txt", {"directive": "gres"},
     "the cluster refused the GPU request (2 per node as --gres): check the site's gpu_directive and "
     "partitions.debug.gpus_per_node"),
    ("sbatch-time-over-limit.txt", {"time": "100-00:00:00"},
     "time 100-00:00:00 is over the limit of partition 'debug' on the cluster (resources.time, "
     "partitions.debug.max_time)"),
    ("sbatch-invalid-account.txt", {"account": "nosuch"},
     "account 'nosuch' is not valid here, or not on partition 'debug' (the site's account)"),
    ("sbatch-invalid-qos.txt", {"qos": "nosuch"},
     "QOS 'nosuch' is not valid here (the site's qos, partitions.debug.qos)"),
    ("sbatch-nodes-9.txt", {"nodes": 9},
     "partition 'debug' cannot give 9 node(s) of 2 task(s) x 2 CPU(s) (resources.nodes, "
     "partitions.debug.max_nodes, cpus_per_node)"),
    ("sbatch-nodes-3-urgent.txt", {"nodes": 3, "partition": "urgent"},
     "partition 'urgent' cannot give 3 node(s) of 2 task(s) x 2 CPU(s) (resources.nodes, "
     "partitions.urgent.max_nodes, cpus_per_node)"),
    ("sbatch-cpus-9.txt", {"cpus": 9, "tasks": 1},
     "partition 'debug' cannot give 1 node(s) of 1 task(s) x 9 CPU(s) (resources.nodes, "
     "partitions.debug.max_nodes, cpus_per_node)"),
    # Refusals with no hint: said as they are.
    ("sbatch-invalid-constraint.txt", {}, "sbatch --test-only refused the job"),
    ("sbatch-invalid-reservation.txt", {}, "sbatch --test-only refused the job"),
]


@pytest.mark.parametrize("name, values, hint", PREFLIGHT, ids=[p[0] for p in PREFLIGHT])
def test_preflight_message(name, values, hint):
    raw = recorded(name).strip()     # as launcher.schedulers.slurm.scheduler.preflight reads sbatch's stderr
    assert preflight_message(raw, {**VALUES, **values}) == f"preflight: {hint}\n  sbatch said: {raw}"


def test_every_recorded_refusal_is_covered():
    # sbatch --test-only's; those of a submission (sbatch-submit-*) are tests/schedulers/test_sched_edge_cases.py's.
    refusals = {p.name for p in RECORDED.glob("sbatch-*.txt")
                if "--test-only" in p.read_text().partition("\n")[0]} - {"sbatch-accepted.txt"}
    assert refusals == {p[0] for p in PREFLIGHT}
    assert "exit 0;" in (RECORDED / "sbatch-accepted.txt").read_text().partition("\n")[0]
    for name in refusals:
        assert "exit 1;" in (RECORDED / name).read_text().partition("\n")[0], name


# --- whose job it is (squeue -o "%o|%k": batch script, then comment) ----------------------------

SWEEP = "/runs/s-1"
ELEMENT = f"{SWEEP}/s-1-0"


@pytest.mark.parametrize("origin, run_id, run_dir, foreign", [
    ("/runs/a/logs/.submission_file_x.sh|glaunch:a", "a", "/runs/a", False),
    ("/runs/a/job.sbatch|(null)", "a", "/runs/a/", False),
    ("/elsewhere/job.sh|glaunch:a", "a", "/runs/a", False),          # the marker names the run
    ("/runs/a/job.sbatch|team|budget x", "a", "/runs/a", False),     # a comment of the profile's own, with "|"
    ("/runs/b/job.sbatch|glaunch:b", "a", "/runs/a", True),
    ("/runs/ab/job.sbatch|glaunch:ab", "a", "/runs/a", True),        # a directory whose name extends the run's
    ("/runs/b/job.sbatch|glaunch:b|glaunch:a ", "a", "/runs/a", True),
    ("(null)|(null)", "a", "/runs/a", True),
    ("", "a", "/runs/a", True),
    # a sweep's element: the sweep's array's marker or script
    (f"{SWEEP}/array-0.sbatch|glaunch:s-1:array-0", "s-1-0", ELEMENT, False),
    (f"{SWEEP}/array-3.sbatch|(null)", "s-1-0", ELEMENT, False),
    ("/runs/s-2/array-0.sbatch|glaunch:s-2:array-0", "s-1-0", ELEMENT, True),
    ("/runs/s-2/array-0.sbatch|glaunch:s-2:array-0", "a", "/runs/a", True),
])
def test_a_job_is_the_run_s_only_where_its_script_or_marker_says_so(origin, run_id, run_dir, foreign):
    assert (foreign_job(origin + "\n", run_id, run_dir) is not None) is foreign


def test_why_a_job_is_not_the_run_s_shows_what_slurm_said_printably():
    assert foreign_job("/x/\x1b]0;t\x07.sh|glaunch:b\n", "a", "/runs/a") == \
        "Slurm's record of it is not the run's (batch script and comment: '/x/?]0;t?.sh|glaunch:b')"
