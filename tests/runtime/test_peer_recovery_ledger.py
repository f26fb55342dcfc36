"""The ledger of peer recoveries as the ranks keep it: after a recovery of the torch DDP
example, the rank that failed appends one line once the next step has ended (the plan,
the steps lost, the failure -> next step on its clock), and `glaunch status` counts it as
a road of its own and projects goodput with it. The failing example is
test_peer_recovery's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from launcher.rundir.layout import RunDir
from launcher.runner import goodput
from test_peer_recovery import EXPERIMENT, REPO, SCRIPT, run_ranks, submit


@pytest.mark.parametrize("where,resume_after,next_step", [
    ("data", 6, 7),        # the step in flight is redone: one step lost, the next step is the one redone
    ("after", 7, 8),       # after its update: nothing redone, the next step is the one after
])
def test_the_failed_rank_records_the_recovery_once_its_next_step_ended(tmp_path, where, resume_after, next_step):
    run_dir, codes, text = run_ranks(tmp_path, "peer", peer=True, fail_rank=1, fail_step=7, where=where)
    assert codes == [0, 0], text[-4000:]
    lines = RunDir(run_dir).peer_recovery_file.read_text().splitlines()
    assert len(lines) == 1, lines                    # one line per recovery, not one per rank
    entry = json.loads(lines[0])
    assert (entry["rank"], entry["failed"], entry["source"], entry["receivers"]) == (1, [1], 0, [1])
    assert (entry["step"], entry["resume_after"], entry["lost_steps"]) == (7, resume_after, 7 - resume_after)
    assert entry["next_step"] == next_step and entry["checkpoint_read"] is False
    what = {"data": "in its data", "after": "after its optimizer step"}[where]
    assert entry["error"] == f"ValueError: injected failure {what} at step 7"
    # Its clock against the script's own: the failure noted just before the raise, the next
    # step's end noted in should_stop, inside the step the runtime times.
    times = json.loads((run_dir / "peer-times-1.json").read_text())
    assert times["next_step"] == next_step
    between = times["next_step_at"] - times["failed_at"]
    assert entry["recovery_s"] <= entry["to_next_step_s"] and 0 < entry["to_next_step_s"] < between + 1.0
    ledger = goodput.read_peer_ledger(run_dir)
    assert ledger is not None and ledger["damaged_lines"] == 0 and len(ledger["entries"]) == 1


def test_status_counts_the_peer_road_and_projects_with_it(tmp_path, isolated_env):
    (tmp_path / "failing_ddp.py").write_text(SCRIPT)
    (tmp_path / "peer.yaml").write_text(EXPERIMENT)
    run_dir, proc = submit(tmp_path, "peer", isolated_env, "recovery.peer=true", "env.FAIL_RANK=1",
                           "env.FAIL_STEP=7", "env.FAIL_WHERE=backward")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    def status(*options: str) -> str:
        done = subprocess.run([sys.executable, "-m", "launcher.cli", "status", str(run_dir), *options], cwd=REPO,
                              env=isolated_env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    summary = json.loads(status("--json"))
    assert summary["state"] == "COMPLETED" and len(summary["starts"]) == 1 and summary["restarts"] == 0
    good = summary["goodput"]
    road = good["peer_recoveries"]
    assert road["recoveries"] == 1 and road["lost_steps"] == 1 and road["checkpoint_reads"] == 0, road
    (entry,) = road["entries"]
    assert (entry["step"], entry["source"], entry["failed"], entry["next_step"]) == (7, 0, [1], 7)
    assert entry["job_id"] == summary["job_id"] and entry["restart"] == 0
    assert 0 < road["to_next_step_s"]["median"] < 30
    assert good["lost_steps"] == 1 and good["interruptions"] == 0
    # The projection at the run's size has the peer road, at the recovery the run measured.
    projection = good["projection"]
    assert projection["costs"]["peer_measured"] is True
    assert projection["costs"]["peer_s"] == road["to_next_step_s"]["median"]
    (size,) = projection["sizes"]
    roads = {r["road"]: r for r in size["roads"]}
    assert roads["peer"]["ettr_optimal"] >= roads["in_allocation"]["ettr_optimal"]
    text = status()
    assert "peer recoveries: 1 in the start they happened in, no checkpoint read; lost steps 1" in text, text
    assert "from rank 0 to rank(s) 1" in text, text
