"""Peer recovery's decisions from the ranks' reports (launcher.runtime.peerplan), the state
it sends between ranks taken apart and put together (launcher.runtime.peer), without a
process group; and the `recovery.peer` key as the ranks receive it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launcher.runtime.peer import flat_buffers, join_tensors, split_tensors, tensor_specs, unflatten
from launcher.runtime.peerplan import PeerRecoveryImpossible, RecoveryPlan, Report, is_peer_loss, plan_recovery


REPO = Path(__file__).resolve().parents[2]


def report(rank, committed, failed=False, retry=True):
    return Report(rank=rank, committed=committed, failed=failed, error="ValueError: x" if failed else "", retry=retry)


def test_the_failed_rank_receives_a_survivors_state_and_the_step_in_flight_is_redone():
    plan = plan_recovery(1, [report(0, 6), report(1, 6, failed=True)], 2)
    assert plan == RecoveryPlan(generation=1, resume_after=6, source=0, receivers=(1,), failed=(1,))
    assert plan.redo == 7
    assert plan.describe() == ("failed rank(s) 1; state of step 6 from rank 0 to rank(s) 1; "
                               "the ranks go on at step 7 (generation 1)")


def test_a_failed_rank_is_never_the_source_even_when_it_is_ahead():
    # Rank 0 raised after its optimizer step: its update may be half done.
    plan = plan_recovery(2, [report(0, 7, failed=True), report(1, 6), report(2, 6)], 3)
    assert (plan.source, plan.resume_after, plan.receivers) == (1, 6, (0,))


def test_the_newest_update_a_survivor_holds_wins_and_survivors_behind_it_receive_it():
    # A collective that completed on rank 2 only: it stepped, rank 1 did not.
    plan = plan_recovery(1, [report(0, 4, failed=True), report(1, 4), report(2, 5), report(3, 5)], 4)
    assert (plan.source, plan.resume_after, plan.redo) == (2, 5, 6)
    assert plan.receivers == (0, 1)


def test_no_survivor_no_recovery():
    with pytest.raises(PeerRecoveryImpossible, match="every rank's own step failed"):
        plan_recovery(1, [report(0, 3, failed=True), report(1, 3, failed=True)], 2)


def test_a_rank_that_gives_up_ends_the_recovery_on_every_rank():
    with pytest.raises(PeerRecoveryImpossible, match="rank 1 failed again at the step redone"):
        plan_recovery(2, [report(0, 4), report(1, 4, failed=True, retry=False)], 2)


def test_a_missing_report_is_no_plan():
    with pytest.raises(PeerRecoveryImpossible, match=r"expected 0\.\.2"):
        plan_recovery(1, [report(0, 4), report(2, 4)], 3)


def test_reports_travel_as_json():
    r = report(3, 17, failed=True, retry=False)
    assert Report.from_json(r.to_json()) == r


@pytest.mark.parametrize("names,message,lost", [
    (["RuntimeError", "Exception"], "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1", True),
    (["RuntimeError", "Exception"], "Got the following error when running the callback: ... Connection reset by peer",
     True),
    (["DistBackendError", "RuntimeError"], "NCCL communicator was aborted", True),
    (["ValueError", "Exception"], "injected failure at step 7", False),
    # A data loader's own time-out is this rank's failure, not a collective's.
    (["TimeoutError", "OSError"], "DataLoader timed out after 60 seconds", False),
    (["RuntimeError", "Exception"], "CUDA out of memory", False),
])
def test_a_lost_peer_is_told_from_a_ranks_own_failure(names, message, lost):
    assert is_peer_loss(names, message) is lost


def test_a_state_with_tensors_comes_apart_and_together_unchanged():
    torch = pytest.importorskip("torch")
    state = {"model": {"w": torch.arange(6.0).reshape(2, 3), "b": torch.tensor([1.5])},
             "optimizer": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(2, 3)}},
                           "param_groups": [{"lr": 0.01, "params": [0, 1]}]},
             "extra": {"scaler": {"scale": 2.0 ** 16}}}
    tensors: list = []
    skeleton = split_tensors(state, tensors)
    assert len(tensors) == 4
    assert [s.index for s in tensor_specs(skeleton)] == [0, 1, 2, 3]
    assert skeleton["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    # As they travel: one flat buffer per dtype.
    buffers = flat_buffers(tensors)
    assert sorted(buffers) == ["float32"] and buffers["float32"].numel() == 6 + 1 + 1 + 6
    back = join_tensors(skeleton, unflatten(tensor_specs(skeleton), {k: v.clone() for k, v in buffers.items()}))
    assert torch.equal(back["model"]["w"], state["model"]["w"])
    assert torch.equal(back["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])
    assert back["optimizer"]["state"][0]["step"].shape == ()
    assert back["extra"] == state["extra"]


# --- the key: recovery.peer reaches every rank as GLAUNCH_RECOVERY_PEER, for DDP runs only ------

def dry_run(tmp_path, example: str, *overrides: str):
    runs = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", f"examples/{example}.yaml", "--site", "local",
                           "--dry-run", "--runs-dir", str(runs), *overrides],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    env_sh = next(runs.glob("*/env.sh")).read_text() if runs.exists() and any(runs.iterdir()) else None
    return proc, env_sh


def test_recovery_peer_reaches_the_ranks_only_when_asked(tmp_path, isolated_env):
    proc, env_sh = dry_run(tmp_path / "on", "torch_ddp", "recovery.peer=true")
    assert proc.returncode == 0, proc.stderr
    assert "export GLAUNCH_RECOVERY_PEER=1\n" in env_sh
    proc, env_sh = dry_run(tmp_path / "off", "torch_ddp")
    assert proc.returncode == 0, proc.stderr
    assert "GLAUNCH_RECOVERY_PEER" not in env_sh


def test_recovery_peer_of_a_sharded_run_is_bad_input_naming_the_key(tmp_path, isolated_env):
    proc, env_sh = dry_run(tmp_path, "fsdp", "recovery.peer=true")
    assert proc.returncode == 2 and env_sh is None
    assert "recovery.peer: needs strategy.name: ddp (a data-parallel run), not 'fsdp'" in proc.stderr
