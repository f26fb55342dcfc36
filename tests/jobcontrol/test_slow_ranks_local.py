"""Slow ranks named where they are slow, and the early bound, on the local scheduler end to
end (two ranks of the torch DDP example on this machine).

A rank slow in its data (a sleep before its batch) or in its backward pass (a sleep in a
backward hook) holds its peer up inside DDP's gradient all-reduce, not in should_stop's
collective: the rank's busy time leaves out what it waited there
(launcher.runtime.peerwaits), and the watchdog names the slow rank with its node; the same
run with equal ranks names none.

``watchdog.stall_s: auto`` before warm-up: a fast run that hangs at step 5 is found within
the early bound its first timed steps call for (watchdog.AUTO_EARLY_FACTOR x the slowest
of them, at least the floor), not the initial 600 s; a first step of 20 s (compilation) is
judged by the first-step bound, never taken for a hang."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

import pytest

from launcher.jobcontrol.watchdog import AUTO_EARLY_FACTOR, SLOW_RATIO
from test_watchdog_local import REPO, status_of, submit

SCRIPT = f'''
import os, sys, time
sys.path.insert(0, {str(REPO / "examples")!r})
import torch_ddp
from launcher import runtime as rt

RANK, RESTART = os.environ.get("RANK"), os.environ.get("GLAUNCH_RESTART")
SLOW = os.environ.get("SLOW_RANK") == RANK
EXTRA_S = float(os.environ.get("SLOW_EXTRA_S", "0"))
WHERE = os.environ.get("SLOW_WHERE", "")
make_model, batch, should_stop = torch_ddp.make_model, torch_ddp.batch, rt.should_stop


def slow_batch(step, rank):
    if SLOW and WHERE == "data":
        time.sleep(EXTRA_S)               # a slow data loader: before the forward pass
    return batch(step, rank)


def slow_model(*args, **kwargs):
    model = make_model(*args, **kwargs)
    if SLOW and WHERE == "backward":
        model[-1].register_full_backward_pre_hook(lambda module, grad: time.sleep(EXTRA_S))
    return model


def hang_here():
    with open(os.path.join(os.environ["GLAUNCH_RUN_DIR"], "hang_began"), "w") as f:
        f.write(repr(time.time()))
    time.sleep(10**6)


def pacing_should_stop(step=None, total=None):
    if step == 1 and os.environ.get("FIRST_STEP_S"):
        time.sleep(float(os.environ["FIRST_STEP_S"]))      # compilation, on every rank, every start
    if os.environ.get("HANG_RANK") == RANK and RESTART == "0" and step == int(os.environ["HANG_STEP"]):
        hang_here()
    return should_stop(step=step, total=total)


torch_ddp.batch, torch_ddp.make_model, rt.should_stop = slow_batch, slow_model, pacing_should_stop
sys.exit(torch_ddp.main())
'''

EXPERIMENT = """
name: slow
entrypoint:
  script: slow_ddp.py
  args: ["--steps", "${hparams.steps}", "--seconds-per-step", "${hparams.work_s}"]
launcher: srun
resources: {nodes: 1, time: "00:10:00"}
strategy: {name: ddp}
precision: fp32
batch: {micro_size: 8}
checkpoint: {every_steps: 1000, keep: 2}
requeue: {max: 3, signal_lead_s: 30}
hparams: {steps: 120, work_s: 0.1}
"""

SITE = """
name: local-retry
extends: local
crash_retries: 1
"""

SLOW_EXTRA_S = 0.15     # the straggler: 0.15 s more a step, before the all-reduce


def write_files(tmp_path: Path) -> None:
    (tmp_path / "slow_ddp.py").write_text(SCRIPT)
    (tmp_path / "hang.yaml").write_text(EXPERIMENT)     # submit() reads hang.yaml
    (tmp_path / "site.yaml").write_text(SITE)


def only_start(run_dir: Path) -> dict:
    (start,) = json.loads((run_dir / "run.json").read_text())["starts"]
    return start


def at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


# Heartbeats every second and a floor of a second (the watchdog polls at a tenth of its
# bound): windows close sooner.
SHAPE = ["checkpoint.every_steps=1000", "watchdog.auto_floor_s=1"]


@pytest.mark.parametrize("where", ["data", "backward"])
def test_a_rank_slow_before_the_all_reduce_is_named_with_its_node(tmp_path, isolated_env, where):
    write_files(tmp_path)
    env = dict(isolated_env, GLAUNCH_HEARTBEAT_S="1")
    run_dir, proc, seconds = submit(tmp_path, "slow", env, *SHAPE, "env.SLOW_RANK=1",
                                    f"env.SLOW_EXTRA_S={SLOW_EXTRA_S}", f"env.SLOW_WHERE={where}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    start = only_start(run_dir)
    assert len(start["watchdog"]["slow"]) == 1, start["watchdog"]
    (named,) = start["watchdog"]["slow"]
    assert named["rank"] == 1 and named["node"] == start["nodes"], named
    assert named["ratio"] > SLOW_RATIO, named
    after = at(named["named_at"]) - at(start["first_step_at"])
    assert after < 60, after
    assert (f"    slow: rank 1 on {start['nodes']}, busy {named['ratio']:.2f}x its peers' time a step"
            in status_of(run_dir, env))
    assert json.loads(status_of(run_dir, env, "--json"))["starts"][0]["watchdog"]["slow"] == [named]
    print(f"slow in its {where} ({SLOW_EXTRA_S} s a step): rank 1 named {after:.1f} s after the first step, busy "
          f"{named['busy_s']:.3f} s against {named['peers_busy_s']:.3f} s (x{named['ratio']:.2f}); run {seconds:.0f} s")


def test_equal_ranks_are_not_named(tmp_path, isolated_env):
    write_files(tmp_path)
    env = dict(isolated_env, GLAUNCH_HEARTBEAT_S="1")
    run_dir, proc, _ = submit(tmp_path, "equal", env, *SHAPE)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert only_start(run_dir)["watchdog"]["slow"] == []
    assert "slow:" not in status_of(run_dir, env)


def test_an_early_hang_in_a_fast_run_is_found_within_the_early_bound(tmp_path, isolated_env):
    """0.1 s steps after a first step of 20 s (compilation); rank 1 hangs at step 5 on the
    first start. The first step is judged by the first-step bound (not killed); the hang by
    the early bound, found within it plus the heartbeat interval (1 s) and a poll; the retry
    (its own 20 s first step) completes."""
    write_files(tmp_path)
    env = dict(isolated_env, GLAUNCH_HEARTBEAT_S="1")
    run_dir, proc, seconds = submit(tmp_path, "early", env, "hparams.steps=30", "watchdog.auto_floor_s=1",
                                    "env.FIRST_STEP_S=20", "env.HANG_RANK=1", "env.HANG_STEP=5")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((run_dir / "run.json").read_text())
    first, last = record["starts"][0], record["starts"][-1]
    assert (first["reason"], last["state"]) == ("hang", "COMPLETED"), record["starts"]
    assert len(record["starts"]) == 2
    hang, watch = first["hang"], first["watchdog"]
    assert hang["kind"] == "stall" and watch["basis"] == "early", (hang, watch)
    slowest = watch["step_p99_s"]
    assert hang["bound_s"] == pytest.approx(max(1.0, AUTO_EARLY_FACTOR * slowest), rel=1e-3)
    since_hang = at(hang["detected_at"]) - float((run_dir / "hang_began").read_text())
    # The bound with a poll at a tenth of it, the interval, and half a second for a loaded machine.
    assert since_hang <= 1.1 * hang["bound_s"] + 1.0 + 0.5, (since_hang, hang["bound_s"])
    print(f"early hang at step 5 found {since_hang:.2f} s after rank 1 stopped: bound {hang['bound_s']:.2f} s "
          f"({AUTO_EARLY_FACTOR:g} x the slowest first step {slowest:.3f} s, floor 1 s), heartbeat interval 1 s; "
          f"first steps of 20 s in both starts not taken for a hang; run {seconds:.0f} s ({time.strftime('%H:%M')})")
