"""What Slurm's commands print, as two releases print it: Debian 12's Slurm 22.05 and Debian
13's 24.11, each recorded on cluster `main` of scripts/local-slurm (run by
scripts/slurm-release) by scripts/record-slurm-outputs into tests/recorded/slurm-RELEASE/
(commands.txt there names the command behind each file). Every parser glaunch runs on
Slurm's output is fed both releases' answers and reads the same facts from each."""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path

import pytest

from launcher.config.sites import load_site
from launcher.rundir.records import RunRecord
from launcher.jobcontrol.jobend import usable_nodes
from launcher.schedulers.cluster.check import compare, site_mapping
from launcher.schedulers.cluster.detect import detect_profile
from launcher.schedulers.cluster.facts import parse_associations, parse_cluster, parse_qos
from launcher.schedulers.cluster.scontrol_text import split_scontrol
from launcher.schedulers.slurm import queries
from launcher.schedulers.slurm.state import (
    base_state,
    merge_history,
    parse_sacct,
    parse_squeue,
    parse_squeue_reason,
    pending_verdict,
    preflight_message,
    squeue_error,
)

RECORDED = Path(__file__).resolve().parents[1] / "recorded"
REPO = Path(__file__).resolve().parents[2]
RELEASES = ("22.05", "24.11")


@pytest.fixture(params=RELEASES)
def release(request) -> str:
    return request.param


def recorded(release: str, name: str) -> str:
    return (RECORDED / f"slurm-{release}" / name).read_text(encoding="utf-8")


def recorded_cluster(release: str, scontrol: str = "scontrol.txt"):
    return parse_cluster(recorded(release, scontrol), assoc_text=recorded(release, "sacctmgr-assoc.txt"),
                         qos_text=recorded(release, "sacctmgr-qos.txt"), user="root")


def test_each_release_is_recorded_from_its_own_slurm(release):
    assert recorded(release, "version.txt").split() == ["slurm-wlm", recorded_cluster(release).settings["SLURM_VERSION"]]
    assert recorded_cluster(release).settings["SLURM_VERSION"].startswith(release + ".")


# --- scontrol (sites check, submit's check, detect) ------------------------------------------


def test_scontrol_gives_the_same_partitions_nodes_and_settings(release):
    cluster = recorded_cluster(release)
    assert cluster.name == "glaunch" and list(cluster.partitions) == ["debug", "urgent"]
    debug, urgent = cluster.partitions["debug"], cluster.partitions["urgent"]
    assert (debug.default, debug.max_time, debug.max_nodes, debug.total_nodes) == (True, "02:00:00", 2, 2)
    assert (urgent.default, urgent.max_time, urgent.priority_tier, urgent.preempt_mode) == (False, "00:30:00", 10, "OFF")
    assert (debug.priority_tier, debug.preempt_mode, debug.max_cpus_per_node) == (1, "REQUEUE", None)
    assert [(n.name, n.cpus, n.mem_mb, dict(n.gpus), n.usable) for n in debug.nodes] == [
        ("node1", 4, 8000, {"sim": 2}, True), ("node2", 4, 8000, {"sim": 2}, True)]
    assert cluster.enforce == {"associations", "limits", "qos"} and cluster.enforce_part_limits == "ALL"
    assert cluster.takes_gpus_per_node and cluster.default_partition == "debug"
    assert sorted((a.account, a.qos) for a in cluster.associations) == [("glaunch", {"normal"}), ("root", {"normal"})]
    assert list(cluster.qos) == ["normal"] and cluster.qos["normal"].max_tres == {}


def test_a_node_running_a_job_is_still_usable(release):
    node1 = recorded_cluster(release, "scontrol-busy.txt").partitions["debug"].nodes[0]
    assert (node1.name, node1.state, node1.usable) == ("node1", "MIXED", True)


def test_the_shipped_profile_matches_each_release_and_the_check_names_the_release(release):
    site = copy.deepcopy(site_mapping(load_site("local-slurm", REPO, os.environ).config))
    report = compare(site, recorded_cluster(release))
    version = recorded_cluster(release).settings["SLURM_VERSION"]
    assert report.fatal == [] and report.warnings == [], report.format()
    assert report.lines()[0] == f"site local-slurm matches Slurm cluster glaunch (Slurm {version})"
    assert report.to_json()["slurm_version"] == version


def test_detect_writes_the_same_profile_from_each_release(release):
    parts, nodes, settings = split_scontrol(recorded(release, "scontrol.txt"))
    account = recorded(release, "sacctmgr-user.txt").split()[0]
    detected = detect_profile("detected", parts, nodes, settings=settings, account=account, user="root")
    assert detected.profile["account"] == "glaunch" and detected.profile["gpu_directive"] == "gpus-per-node"
    assert detected.profile["default_partition"] == "debug"
    debug = detected.profile["partitions"]["debug"]
    assert (debug["gpus_per_node"], debug["gpu_type"], debug["cpus_per_node"], debug["max_nodes"],
            debug["max_time"], debug["preemptible"]) == (2, "sim", 4, 2, "02:00:00", True)


# --- sacctmgr -------------------------------------------------------------------------------


def test_sacctmgr_rows(release):
    assert sorted(a.account for a in parse_associations(recorded(release, "sacctmgr-assoc.txt"))) == ["glaunch", "root"]
    assert [q.name for q in parse_qos(recorded(release, "sacctmgr-qos.txt"))] == ["normal"]


# --- sacct (status, the record of each start) -----------------------------------------------


@pytest.mark.parametrize("name,state,exit_code,nodes", [
    ("sacct-two-nodes-completed.txt", "COMPLETED", "0:0", "node[1-2]"),
    ("sacct-failed.txt", "FAILED", "3:0", "node1"),
    ("sacct-cancelled-running.txt", "CANCELLED", "0:0", "node1"),
    ("sacct-cancelled-pending.txt", "CANCELLED", "0:0", "None assigned"),
])
def test_sacct_row_of_an_ended_job(release, name, state, exit_code, nodes):
    (row,) = parse_sacct(recorded(release, name))
    assert (base_state(row["state"]), row["exit_code"], row["nodes"]) == (state, exit_code, nodes)
    assert row["job_id"].isdigit() and row["end"] not in ("", "Unknown")


def test_sacct_rows_of_a_preempted_job_become_its_starts(release):
    rows = parse_sacct(recorded(release, "sacct-preempted.txt"))
    # The requeued job's next start, still pending, is a row of its own.
    assert [row["state"] for row in rows] == ["PREEMPTED", "PENDING"]
    record = RunRecord(run_id="r", state="PENDING", job_id=rows[0]["job_id"])
    merge_history(record, rows)
    assert [(s.state, s.reason, s.get("nodes"), s.restart) for s in record.starts] == [
        ("PREEMPTED", "preemption", "node[1-2]", 0), ("PENDING", None, None, 1)]


def test_sacct_says_who_cancelled(release):
    rows = parse_sacct(recorded(release, "sacct-cancelled-running.txt"))
    record = RunRecord(run_id="r", state="RUNNING", job_id=rows[0]["job_id"])
    merge_history(record, rows)
    assert record.starts[0].detail == "cancelled by uid 0 (root: an administrator or Slurm)"


# --- squeue ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name,state,reason", [
    ("squeue-running.txt", "RUNNING", None),
    ("squeue-held.txt", "PENDING", "JobHeldUser"),
    ("squeue-begin-time.txt", "PENDING", "BeginTime"),
    ("squeue-unknown-job.txt", None, None),
])
def test_squeue_state_and_reason(release, name, state, reason):
    text = recorded(release, name)
    assert (parse_squeue(text), parse_squeue_reason(text)) == (state, reason)
    assert pending_verdict(parse_squeue_reason(text), {}) is None       # these clear by themselves


def test_a_requeued_job_is_pending_again(release):
    assert parse_squeue(recorded(release, "squeue-requeued.txt")) == "PENDING"


def test_squeue_of_a_job_it_forgot_means_gone(release):
    assert squeue_error(recorded(release, "squeue-unknown-job-stderr.txt")) is None


class RecordedSlurm:
    """A client whose every command answers the recorded `stdout`."""

    def __init__(self, stdout: str) -> None:
        self.stdout = stdout

    def call(self, *cmd, **_):
        return subprocess.CompletedProcess(list(cmd), 0, self.stdout, "")


def test_squeue_lists_an_array_task_by_task(release):
    text = recorded(release, "squeue-array.txt")
    array, running = (line.split("|")[0] for line in text.splitlines()[::2])
    found = queries.squeue_jobs(RecordedSlurm(text), [array.partition("_")[0], running])
    array_id = array.partition("_")[0]
    assert found == {f"{array_id}_0": ("PENDING", "JobHeldUser"), f"{array_id}_1": ("PENDING", "JobHeldUser"),
                     running: ("RUNNING", None)}


def test_a_submission_is_found_by_its_marker(release):
    text = recorded(release, "squeue-user-jobs.txt")
    # The recording queued the marked job more than once: the one queued last is found.
    expected = max((line.split("|")[0] for line in text.splitlines() if "|glaunch:record-running|" in line), key=int)
    assert queries.find_submitted(RecordedSlurm(text), "", "glaunch:record-running") == expected


def test_of_several_jobs_of_a_run_the_one_queued_last_is_found():
    # A resumed run's earlier jobs carry its marker and script too: ended, cancelled, listed
    # first or last, the one a lost sbatch answer asks for is the newest.
    text = ("1688|glaunch:r1|/runs/r1/job.sbatch\n1714|glaunch:r1|/runs/r1/job.sbatch\n"
            "1702|glaunch:r1|/runs/r1/job.sbatch\n1720|glaunch:r2|/runs/r2/job.sbatch\n")
    assert queries.find_submitted(RecordedSlurm(text), "/runs/r1/job.sbatch", "glaunch:r1") == "1714"
    assert queries.find_submitted(RecordedSlurm(text), "", "glaunch:r3") is None
    arrays = "99_[0-1]|glaunch:s1:array-0|/s/a0.sbatch\n120_0|glaunch:s1:array-0|/s/a0.sbatch\n"
    assert queries.find_submitted(RecordedSlurm(arrays), "", "glaunch:s1:array-0") == "120_0"


def test_the_watchdog_ends_the_steps_squeue_lists(release, monkeypatch):
    from launcher.jobcontrol import watchdog

    monkeypatch.setattr(watchdog, "run_command", lambda words, say=None: recorded(release, "squeue-steps.txt"))
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    asked: list[list[str]] = []
    watchdog.SlurmSteps("29", lambda: {}, asked.append).end()      # no heartbeat names a step
    assert asked == [["--signal=KILL", "29.0"]]                   # the job's step 0; never its batch script


# --- sinfo (a restart in the allocation picks its nodes) ---------------------------------------


@pytest.mark.parametrize("name", ["sinfo-nodes-idle.txt", "sinfo-nodes-busy.txt"])
def test_sinfo_nodes_that_take_a_job(release, name):
    assert usable_nodes(recorded(release, name)) == ["node1", "node2"]


# --- sbatch ----------------------------------------------------------------------------------


def test_sbatch_names_the_job_it_queued(release):
    from submitit.slurm.slurm import SlurmExecutor

    text = recorded(release, "sbatch-submitted.txt")
    assert SlurmExecutor._get_job_id_from_submission_command(text) == text.split()[-1]


PREFLIGHT_VALUES = dict(partition="debug", gpus=0, directive="gpus-per-node", time="01:00:00", account="glaunch",
                        qos=None, nodes=3, tasks=1, cpus="default", mem="default")


@pytest.mark.parametrize("name,said", [
    ("sbatch-test-only-invalid-partition.txt", "does not exist on this cluster"),
    ("sbatch-test-only-time-limit.txt", "is over the limit of partition"),
    ("sbatch-test-only-invalid-account.txt", "is not valid here"),
    ("sbatch-test-only-node-count.txt", "cannot give 3 node(s)"),
])
def test_sbatch_test_only_refusal_in_profile_terms(release, name, said):
    raw = recorded(release, name).strip()
    assert said in preflight_message(raw, PREFLIGHT_VALUES)


def test_sbatch_test_only_acceptance(release):
    assert "to start at" in recorded(release, "sbatch-test-only-accepted.txt")


# --- what a parser does not know --------------------------------------------------------------


def local_profile() -> dict:
    return copy.deepcopy(site_mapping(load_site("local-slurm", REPO, os.environ).config))


def test_a_node_state_word_glaunch_does_not_know_is_read_past_and_said(release):
    text = recorded(release, "scontrol.txt").replace("State=IDLE ", "State=IDLE+WARMING_UP ", 1)
    cluster = parse_cluster(text, user="root")
    node1 = cluster.partitions["debug"].nodes[0]
    assert (node1.name, node1.usable, node1.unknown_state_words) == ("node1", True, ("WARMING_UP",))
    report = compare(local_profile(), cluster)
    assert report.fatal == [] and report.warnings == [], report.format()
    assert report.notes == ["node node1: state IDLE+WARMING_UP has word(s) glaunch does not know (WARMING_UP): "
                            "read as taking jobs"]


@pytest.mark.parametrize("state", ["MIXED+PLANNED", "IDLE+BLOCKED", "IDLE+CLOUD+POWERED_DOWN", "DOWN+NOT_RESPONDING"])
def test_node_states_of_recent_releases_are_known(release, state):
    text = recorded(release, "scontrol.txt").replace("State=IDLE ", f"State={state} ", 1)
    assert compare(local_profile(), parse_cluster(text, user="root")).notes == []
