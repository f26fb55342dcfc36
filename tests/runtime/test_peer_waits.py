"""A rank's busy time leaves out what it waited for its peers inside the training's own
collectives (launcher.runtime.peerwaits): two ranks over gloo, one slow in its data or its
backward pass, with DDP and FSDP2. The peers wait for it inside the gradient collective,
not in should_stop's; measured there, the slow rank's busy time stands out, and equal
ranks' do not. Without the measurement every rank's busy time is the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.rundir.heartbeatrecord import EARLY_STEPS
from launcher.runtime.heartbeats import Beats, busy_time
from launcher.runtime.peerwaits import BucketTail, PeerWaits
from launcher.jobcontrol.watchdog import SLOW_RATIO
from launcher.rundir.rankcontext import free_port
from conftest import RANK_VARS

REPO = Path(__file__).resolve().parents[2]
STEPS = 30
WORK_S = 0.03          # every rank's own work a step, after its optimizer step
SLOW_S = 0.1           # rank 1's extra, before its batch or inside its backward pass

WORKER = '''
import json, os, sys, time
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from launcher import runtime as rt
from launcher.runtime import heartbeats
from launcher.runtime.fsdp import shard

mode, slow, timed = sys.argv[1], sys.argv[2], sys.argv[3] == "timed"
steps, work_s, slow_s = int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
torch.set_num_threads(1)
ctx = rt.init_distributed()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
is_slow = ctx.rank == 1
if slow == "backward" and is_slow:
    model[2].register_full_backward_pre_hook(lambda module, grad: time.sleep(slow_s))
if mode == "ddp":
    wrapped = DDP(model)
    if timed:
        rt.time_peer_waits(wrapped)
else:
    wrapped = shard(model, ctx) if timed else shard(model, ctx, time_waits=False)
opt = torch.optim.SGD(wrapped.parameters(), lr=1e-3)
for step in range(1, steps + 1):
    if slow == "data" and is_slow:
        time.sleep(slow_s)                     # a slow data loader: before the forward pass
    x = torch.randn(32, 16)
    opt.zero_grad()
    wrapped(x).pow(2).mean().backward()
    opt.step()
    time.sleep(work_s)
    rt.should_stop(step=step, total=steps)
pace = heartbeats.current().pace()
with open(os.path.join(os.environ["OUT_DIR"], f"rank-{ctx.rank}.json"), "w") as f:
    json.dump(pace, f)
rt.shutdown_distributed()
'''


def run_ranks(tmp_path: Path, mode: str, slow: str, timed: bool) -> dict[int, dict]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / f"{mode}-{slow}-{timed}"
    out.mkdir()
    port = free_port()
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if k not in RANK_VARS and not k.startswith("GLAUNCH_")}
        env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_WORLD_SIZE="2", GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OUT_DIR=str(out))
        procs.append(subprocess.Popen([sys.executable, str(script), mode, slow, "timed" if timed else "plain",
                                       str(STEPS), str(WORK_S), str(SLOW_S)], env=env, cwd=out,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        for proc in procs:
            text, _ = proc.communicate(timeout=300)
            assert proc.returncode == 0, text[-4000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    return {rank: json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(2)}


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
@pytest.mark.parametrize("slow", ["data", "backward"])
def test_a_rank_slow_before_the_gradient_collective_is_busy_longer_than_its_peer(tmp_path, mode, slow):
    pace = run_ranks(tmp_path, mode, slow, timed=True)
    ratio = pace[1]["busy_s"] / pace[0]["busy_s"]
    print(f"{mode}, slow {slow}: busy {pace[1]['busy_s']:.3f} s against {pace[0]['busy_s']:.3f} s (x{ratio:.2f})")
    assert ratio > 2 * SLOW_RATIO, pace
    assert pace[1]["busy_s"] >= SLOW_S + WORK_S * 0.9, pace


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_equal_ranks_are_busy_alike(tmp_path, mode):
    pace = run_ranks(tmp_path, mode, "none", timed=True)
    ratio = pace[1]["busy_s"] / pace[0]["busy_s"]
    print(f"{mode}, equal: busy {pace[1]['busy_s']:.3f} s and {pace[0]['busy_s']:.3f} s (x{ratio:.2f})")
    assert 1 / SLOW_RATIO < ratio < SLOW_RATIO, pace


def test_without_the_measurement_a_rank_slow_in_its_data_does_not_stand_out(tmp_path):
    """What the busy time was before: the peer waits for the slow rank inside DDP's
    all-reduce, within its own busy time."""
    pace = run_ranks(tmp_path, "ddp", "data", timed=False)
    ratio = pace[1]["busy_s"] / pace[0]["busy_s"]
    assert ratio < SLOW_RATIO, pace


# --- the arithmetic ------------------------------------------------------------------------------


@pytest.mark.parametrize("interval,waited,busy", [
    (1.0, 0.0, 1.0),          # waited for nobody
    (1.0, 0.25, 0.75),        # a quarter of the step in the gradient collective
    (1.0, 1.5, 0.0),          # a wait measured across the beat: never below 0
    (1.0, -1.0, 1.0),         # a negative wait (a clock that went back) counts nothing
])
def test_busy_time_is_the_interval_less_the_waits(interval, waited, busy):
    assert busy_time(interval, waited) == pytest.approx(busy)


class FakeClock:
    def __init__(self, times):
        self.times = iter(times)

    def __call__(self):
        return next(self.times)


def test_a_beat_takes_the_waits_since_the_last_one_off_the_busy_time(monkeypatch):
    clock = FakeClock([100.0, 100.1, 101.1, 101.2, 102.2])
    monkeypatch.setattr("launcher.runtime.heartbeats.time.time", clock)
    beats = Beats(run_dir=None, interval_s=0, checkpoint_every=0)
    waits = PeerWaits()
    beats.add_wait_source(waits.take)
    waits.add(5.0)                     # before the first step: not counted
    beats.beat(1)                      # 100.0
    beats.synced_at = clock()          # 100.1
    waits.add(0.6)                     # waited in step 2's all-reduce
    beats.beat(2)                      # 101.1: busy 1.0 - 0.6
    beats.synced_at = clock()          # 101.2
    beats.beat(3)                      # 102.2: busy 1.0, no wait
    assert list(beats.busy) == [pytest.approx(0.4), pytest.approx(1.0)]
    assert waits.take() == 0.0


def test_a_failing_wait_source_is_dropped_not_raised(monkeypatch, capsys):
    beats = Beats(run_dir=None, interval_s=0, checkpoint_every=0)

    def broken() -> float:
        raise RuntimeError("no events")

    beats.add_wait_source(broken)
    beats.beat(1)
    beats.beat(2)
    assert beats.wait_sources == [] and beats.busy_count == 1
    assert capsys.readouterr().err.count("no longer measured") == 1


def test_the_ddp_wait_runs_from_the_last_bucket_handed_over_to_the_last_completion(monkeypatch):
    now = [10.0]
    monkeypatch.setattr("launcher.runtime.peerwaits.time.monotonic", lambda: now[0])
    waits = PeerWaits()
    tail = BucketTail(None, waits)
    tail.handed_over(None, last=False)    # 10.0: bucket 0, while the backward pass goes on
    now[0] = 10.5
    tail.handed_over(None, last=True)     # 10.5: the backward pass is done
    now[0] = 10.7
    tail.completed()                      # bucket 1 first: bucket 0 is still in flight
    now[0] = 11.0
    tail.completed()                      # 11.0: the last one
    assert waits.take() == pytest.approx(0.5)
    tail.handed_over(None, last=True)     # a step of one bucket that completes at once
    tail.completed()
    assert waits.take() == 0.0


def test_the_heartbeat_is_written_when_the_early_bound_s_steps_are_timed(tmp_path, monkeypatch):
    clock = FakeClock([100.0 + 0.1 * i for i in range(10)] + [200.0] * 10)
    monkeypatch.setattr("launcher.runtime.heartbeats.time.time", clock)
    beats = Beats(run_dir=tmp_path, interval_s=5.0, checkpoint_every=0)
    written = []

    def write(now=None):
        beats.last_write = now
        written.append(beats.step)

    monkeypatch.setattr(beats, "write", write)
    for step in range(1, EARLY_STEPS + 4):
        beats.beat(step)
    assert written == [1, 1 + EARLY_STEPS]      # the first step, and the one that makes EARLY_STEPS timed


def test_lightning_s_ddp_strategy_times_the_all_reduces_unless_the_script_brings_its_own_hook(monkeypatch):
    pytest.importorskip("lightning")
    from launcher.runtime import heartbeats, peerwaits
    from launcher.runtime.lightning import trainer_strategy

    for key in RANK_VARS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.delenv("GLAUNCH_RUN_DIR", raising=False)
    monkeypatch.setattr(peerwaits, "_waits", None)
    heartbeats.reset()
    try:
        strategy = trainer_strategy(find_unused_parameters=True)
        assert strategy._ddp_comm_hook is peerwaits.ddp_hook
        assert isinstance(strategy._ddp_comm_state, BucketTail)
        assert heartbeats.current().wait_sources == [peerwaits.waits().take]

        def own_hook(state, bucket):
            return None

        assert trainer_strategy(ddp_comm_hook=own_hook)._ddp_comm_hook is own_hook
    finally:
        heartbeats.reset()
