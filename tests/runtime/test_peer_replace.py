"""Peer recovery of a rank whose process is lost (``recovery.peer: true``), two ranks of the
torch DDP example over gloo started directly, this test in the job controller's place: rank
1's process ends at step FAIL_STEP (``os._exit``); rank 0, blocked in the gradient
all-reduce with it, raises, reports and waits; with no report of rank 1 it asks in the run
directory for rank 1 to be started again; the test starts that process as the controller
would (launcher.jobcontrol.replace: the rank's place, the generation to join, the lost pid);
the new process joins, receives rank 0's state and the run ends with the parameters of an
uninterrupted run, no checkpoint read. Also the plan and the requests, pure."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import RANK_VARS
from test_peer_recovery import (  # noqa: F401
    REPO,
    SCRIPT,
    STEPS,
    param_sha256,
    recovery_lines,
    stop_all,
    store_processes,
    uninterrupted,
)

from launcher.rundir.layout import RunDir, heartbeat_bytes
from launcher.rundir.rankcontext import context, free_port
from launcher.runtime import peer, peerstore
from launcher.runtime.peerplan import PeerRecoveryImpossible, Report, plan_recovery

JOB = "4242"
FAIL_STEP = 7


def rank_env(run_dir: Path, port: int, rank: int, lost: int, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in RANK_VARS and not k.startswith(("GLAUNCH_", "SLURM"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
               LOCAL_WORLD_SIZE="2", GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               GLAUNCH_RUN_DIR=str(run_dir), GLAUNCH_CHECKPOINT_DIR=str(run_dir / "checkpoints"),
               GLAUNCH_RECOVERY_PEER="1", GLAUNCH_JOB_ID=JOB, FAIL_RANK=str(lost), FAIL_STEP=str(FAIL_STEP),
               FAIL_WHERE="exit")
    env.update(more)
    return env


def start(script: Path, run_dir: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(script), "--steps", str(STEPS), "--log-every", "5"], env=env,
                            cwd=run_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_request(run_dir: Path, survivor: subprocess.Popen[str], bound_s: float = 60.0) -> dict:
    deadline = time.monotonic() + bound_s
    folder = RunDir(run_dir).peer_replace_dir
    while time.monotonic() < deadline:
        found = sorted(folder.glob("*.json")) if folder.is_dir() else []
        if found:
            return json.loads(found[0].read_text())
        if survivor.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError("no request to start the lost rank again:\n" + survivor.communicate(timeout=30)[0][-4000:])


# Rank 0: the store of the rendezvous lives in a process of its own, which outlives it. Rank
# 1 lost, with the local site's controller starting it again, is test_peer_recovery.py's.
@pytest.mark.parametrize("lost", [0])
def test_a_lost_rank_is_started_again_and_gets_its_peers_state(tmp_path, uninterrupted, lost):  # noqa: F811
    """The lost rank, started again, joins and receives its peer's state; the store's
    process ends with the run."""
    survivor = 1 - lost
    script = tmp_path / "failing_ddp.py"
    script.write_text(SCRIPT)
    run_dir = tmp_path / "lost"
    run_dir.mkdir()
    port = free_port()
    procs = [start(script, run_dir, rank_env(run_dir, port, rank, lost)) for rank in range(2)]
    try:
        lost_code = procs[lost].wait(timeout=120)
        assert len(store_processes(port)) == 1
        request = wait_for_request(run_dir, procs[survivor])
        # The controller's part: the rank's place, the generation to join, the pid it had.
        assert (request["job_id"], request["restart"], request["rank"], request["asked_by"]) == (JOB, 0, lost, survivor)
        assert request["generation"] == 1 and request["pid"] == procs[lost].pid, request
        procs.append(start(script, run_dir, rank_env(run_dir, port, lost, lost, FAIL_RANK="none",
                                                     GLAUNCH_PEER_JOIN=str(request["generation"]),
                                                     GLAUNCH_PEER_LOST_PID=str(request["pid"]))))
        outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    finally:
        stop_all(procs)
    text = "\n".join(outputs)
    assert lost_code == 3 and [procs[survivor].returncode, procs[2].returncode] == [0, 0], text[-6000:]
    assert param_sha256(run_dir) == uninterrupted
    lines = recovery_lines(text)
    assert len(lines) == 2, text[-4000:]            # the survivor's and the new process's
    for line in lines:
        assert (f"failed rank(s) {lost}; state of step {FAIL_STEP - 1} from rank {survivor} to rank(s) {lost}; the "
                f"ranks go on at step {FAIL_STEP} (generation 1); rank(s) {lost} lost their process and were "
                "started again") in line
    assert any("(received it)" in line for line in recovery_lines(outputs[2]))
    assert "resumed from" not in text and not (run_dir / "checkpoints").exists()
    (entry,) = (json.loads(line) for line in (run_dir / "peer-recoveries.jsonl").read_text().splitlines())
    assert (entry["failed"], entry["replaced"], entry["lost_steps"]) == ([lost], [lost], 1), entry
    deadline = time.monotonic() + peerstore.LINGER_S + 10
    while store_processes(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = store_processes(port)
    stop_all([], port)
    assert left == [], "the store's process outlived the run's ranks"
    print(f"lost process of rank {lost} at step {FAIL_STEP}: rank {survivor}'s failure -> the end of step "
          f"{entry['next_step']} {entry['to_next_step_s']:.3f} s (the new process, started by this test, included)")


def rank_1_lost_and_started_again(tmp_path: Path, name: str, lost_code: int, **fault: str) -> tuple[Path, str]:
    """Two ranks of SCRIPT with rank 1's `fault` (FAIL_* and more of its environment): once
    its process has ended (`lost_code`), the test starts its new process as the job
    controller would. The run directory and every process's output; both went well."""
    script = tmp_path / "failing_ddp.py"
    script.write_text(SCRIPT)
    run_dir = tmp_path / name
    run_dir.mkdir()
    port = free_port()
    more = {k: v for k, v in fault.items() if not k.startswith("FAIL_")}
    procs = [start(script, run_dir, rank_env(run_dir, port, rank, 1, **fault)) for rank in range(2)]
    try:
        assert procs[1].wait(timeout=120) == lost_code
        request = wait_for_request(run_dir, procs[0])
        procs.append(start(script, run_dir, rank_env(run_dir, port, 1, 1, FAIL_RANK="none", **more,
                                                     GLAUNCH_PEER_JOIN=str(request["generation"]),
                                                     GLAUNCH_PEER_LOST_PID=str(request["pid"]))))
        outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    finally:
        stop_all(procs, port)
    text = "\n".join(outputs)
    assert [procs[0].returncode, procs[2].returncode] == [0, 0], text[-6000:]
    return run_dir, text


def test_a_rank_lost_inside_its_checkpoint_save_is_started_again_and_gets_its_peers_state(tmp_path, uninterrupted):  # noqa: F811
    """Rank 1's process is killed 5 ms into its save of step 10 (a checkpoint every 5 steps):
    rank 0, inside the save's collectives with it, raises there, and the lost rank is
    started again and joins with rank 0's state of step 10; the run ends bitwise."""
    run_dir, text = rank_1_lost_and_started_again(tmp_path, "lost-in-save", -9, FAIL_STEP="10",
                                                  FAIL_WHERE="kill_save", GLAUNCH_CHECKPOINT_EVERY="5")
    assert param_sha256(run_dir) == uninterrupted
    assert "from rank 0 to rank(s) 1" in text and "no checkpoint read" in text, text[-4000:]
    assert "resumed from" not in text


def test_a_rank_lost_after_its_last_update_is_started_again_and_the_run_ends_with_a_loss(tmp_path, uninterrupted):  # noqa: F811
    """Rank 1's process is lost after its update of the last step: its new process joins
    with rank 0's state of that step and runs no step; the run ends with the uninterrupted
    run's parameters and the last step's loss of the rank that ran it (not NaN)."""
    run_dir, text = rank_1_lost_and_started_again(tmp_path, "lost-last", 3, FAIL_STEP=str(STEPS),
                                                  FAIL_WHERE="exit_after")
    assert param_sha256(run_dir) == uninterrupted
    assert f"state of step {STEPS} from rank 0 to rank(s) 1; the ranks go on at step {STEPS + 1}" in text, text[-4000:]
    final_loss = json.loads((run_dir / "result.json").read_text())["final_loss"]
    assert isinstance(final_loss, float) and math.isfinite(final_loss), final_loss


# --- pure -------------------------------------------------------------------------------------


def test_the_plan_sends_the_state_to_a_replaced_rank_and_names_it():
    reports = [Report(0, 6, False, "peer"), Report(1, 6, False, "peer"),
               Report(2, -1, True, "process lost; started again", replaced=True)]
    plan = plan_recovery(1, reports, 3)
    assert (plan.source, plan.receivers, plan.failed, plan.replaced, plan.redo) == (0, (2,), (2,), (2,), 7)
    assert plan.describe().endswith("; rank(s) 2 lost their process and were started again")
    assert peer.ledger_writer(plan) == 0            # the source's clock saw the loss; the new process did not
    assert Report.from_json(reports[2].to_json()) == reports[2]
    # A replacement that cannot take the rank's place gives up: no plan.
    with pytest.raises(PeerRecoveryImpossible):
        plan_recovery(1, reports[:2] + [Report(2, -1, True, "not replaced", retry=False, replaced=True)], 3)


class Store:
    """The rendezvous store's check and set, in memory."""

    def __init__(self, reports: dict[int, Report]) -> None:
        self.keys = {peer.REPORT_KEY.format(generation=1, rank=r): rep.to_json().encode() for r, rep in reports.items()}

    def set(self, key, value):
        self.keys[key] = value.encode() if isinstance(value, str) else value

    def check(self, keys):
        return all(k in self.keys for k in keys)

    def get(self, key):
        return self.keys[key]


def test_a_missing_report_asks_once_for_the_missing_ranks_then_the_wait_goes_on(monkeypatch):
    monkeypatch.setattr(peer, "REPLACE_AFTER_S", 0.05)
    store = Store({1: Report(1, 6, False, "peer")})
    asked: list[tuple[list[int], list[int]]] = []

    def on_missing(present, missing):
        asked.append((present, missing))
        store.set(peer.REPORT_KEY.format(generation=1, rank=2), Report(2, -1, True, "lost", replaced=True).to_json())

    reports = peer.exchange(store, 1, Report(0, 6, False, "peer"), 3, on_missing=on_missing)
    assert asked == [([0, 1], [2])]
    assert [r.rank for r in reports] == [0, 1, 2] and reports[2].replaced


def test_the_lowest_reporting_rank_writes_the_request_with_the_lost_rank_s_node_and_pid(tmp_path, monkeypatch):
    heartbeats = RunDir(tmp_path).heartbeat(2)
    heartbeats.parent.mkdir(parents=True)
    heartbeats.write_bytes(heartbeat_bytes({"job_id": JOB, "restart": 0, "rank": 2, "pid": 4321, "node": "n2"}))
    for name, value in {"GLAUNCH_RUN_DIR": str(tmp_path), "GLAUNCH_JOB_ID": JOB, "RANK": "1",
                        "WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(name, value)
    peer.ask_replacement(context(), 1, [1, 3], [0, 2], time.time())
    folder = RunDir(tmp_path).peer_replace_dir
    assert sorted(folder.iterdir()) == sorted(RunDir(tmp_path).peer_replace_request(JOB, 0, 1, r) for r in (0, 2))
    request = json.loads(RunDir(tmp_path).peer_replace_request(JOB, 0, 1, 2).read_text())
    assert (request["rank"], request["generation"], request["node"], request["pid"], request["asked_by"]) == \
        (2, 1, "n2", 4321, 1)
    lost_0 = json.loads(RunDir(tmp_path).peer_replace_request(JOB, 0, 1, 0).read_text())
    assert (lost_0["rank"], lost_0["node"], lost_0["pid"]) == (0, None, None)      # it wrote no heartbeat
    monkeypatch.setenv("RANK", "3")             # not the lowest that reported: it leaves it to rank 1
    for path in folder.iterdir():
        path.unlink()
    peer.ask_replacement(context(), 1, [1, 3], [0, 2], time.time())
    assert not list(RunDir(tmp_path).peer_replace_dir.iterdir())


def test_a_replacement_does_not_take_the_place_of_a_process_that_still_runs_nor_rebuild_ddp_buckets():
    assert peer.process_runs(os.getpid()) and not peer.process_runs(2**22 + 12345)

    class Rebuilding:
        reducer, find_unused_parameters = object(), False

    assert "rebuilds its gradient buckets" in (peer.replacement_unfit(Rebuilding()) or "")
    assert peer.replacement_unfit(object()) is None
    reports = [Report(0, 6, False, "peer"), Report(1, -1, True, "not started again: why", retry=False, replaced=True)]
    with pytest.raises(PeerRecoveryImpossible, match="rank 1's process was lost and not started again: why"):
        plan_recovery(1, reports, 2)
