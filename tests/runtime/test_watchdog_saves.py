"""A checkpoint save longer than watchdog.stall_s is not a hang: every save that holds up the
loop (blocking, the host copy of a background one, waiting for a background one, DeepSpeed's,
the Lightning callback's) says ``saving`` in the rank's heartbeat, and the step bound counts
from the save's end. The same wait outside a save is a hang. Real saves with their writer made
slow (a slow filesystem); the watchdog's own Watch reads the heartbeat files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import RANK_VARS  # noqa: E402
from launcher import runtime as rt  # noqa: E402
from launcher.rundir.layout import RunDir, read_heartbeat  # noqa: E402
from launcher.runtime import heartbeats, torchstate  # noqa: E402
from launcher.runtime.checkpoint.directory import CheckpointError  # noqa: E402
from launcher.runtime.checkpoint import dcp  # noqa: E402
from launcher.rundir.rankcontext import free_port  # noqa: E402
from launcher.jobcontrol.watchdog import Limits, Watch  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
STALL_S = 1.5                 # a pause this long after a save must not be taken for a stall, even on a loaded machine
SLOW_S = 3 * STALL_S          # longer than the step bound, far within the save bound


@pytest.fixture(autouse=True)
def _clean_env(single_rank_env):
    yield
    try:
        rt.wait_checkpoints()
    except CheckpointError:
        pass
    heartbeats.reset()


def _watched(tmp_path) -> tuple[heartbeats.Beats, Watch, Path]:
    """This process's beats, as a rank's task sets them up, and the watchdog's view of them."""
    run = tmp_path / "run"
    beats = heartbeats.Beats(run_dir=run, interval_s=0.05, checkpoint_every=0, rank=0, node="n1", job_id="77",
                             restart=0, world_size=1)
    heartbeats.reset(beats)
    return beats, Watch(run, "77", 0, limits=Limits(STALL_S, 0), world_size=1), run / "heartbeats" / "rank-00000.json"


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 32)).sum().backward()
    opt.step()
    return model, opt


def test_a_slow_blocking_save_is_no_hang_and_the_same_wait_in_a_step_is(tmp_path, monkeypatch):
    beats, watch, path = _watched(tmp_path)
    beats.beat(1)
    seen = []
    torch_save = torchstate._torch_save

    def slow_torch_save(obj, f):
        time.sleep(SLOW_S)
        seen.append((read_heartbeat(path)["state"], watch.check()))
        torch_save(obj, f)

    monkeypatch.setattr(torchstate, "_torch_save", slow_torch_save)
    model, opt = _model()
    saved = rt.save_torch_state(1, model, opt)
    assert saved.step == 1
    assert seen == [("saving", None)]
    # Just after it: the step before the save is SLOW_S old, but the bound counts from the save's end.
    record = read_heartbeat(path)
    assert record["state"] == "running" and record["saving_since"] is None and record["checkpoint_step"] == 1
    assert time.time() - record["time"] > STALL_S + record["interval_s"]
    assert watch.check() is None
    time.sleep(SLOW_S)                      # the same wait, in the loop
    hang = watch.check()
    assert hang is not None and hang.kind == "stall" and hang.bound_s == STALL_S


def test_a_background_save_is_a_save_while_the_loop_waits_for_it_and_never_writes_the_heartbeat(
        tmp_path, monkeypatch):
    beats, watch, path = _watched(tmp_path)
    beats.beat(1)
    writers: list[str] = []
    write = heartbeats.Beats.write

    def write_from(self, now=None):
        writers.append(threading.current_thread().name)
        write(self, now)

    monkeypatch.setattr(heartbeats.Beats, "write", write_from)
    seen: dict[str, tuple] = {}
    stage = dcp.StagingPlanner.stage

    def slow_stage(self, plan, buffers):      # the copy to host memory: the loop waits
        time.sleep(SLOW_S)
        seen["copy"] = (read_heartbeat(path)["state"], watch.check())
        return stage(self, plan, buffers)

    returned, released = threading.Event(), threading.Event()
    torch_save = torchstate._torch_save

    def slow_torch_save(obj, f):              # the writer thread: the loop steps meanwhile
        returned.wait(30)                     # (once the call has returned to it)
        seen["writing"] = (read_heartbeat(path)["state"],)
        released.wait(30)
        time.sleep(SLOW_S)                    # what is left once the loop waits for it
        seen["waited"] = (read_heartbeat(path)["state"], watch.check())
        torch_save(obj, f)

    monkeypatch.setattr(dcp.StagingPlanner, "stage", slow_stage)
    monkeypatch.setattr(torchstate, "_torch_save", slow_torch_save)
    model, opt = _model()
    pending = rt.save_torch_state(2, model, opt, blocking=False)
    returned.set()
    assert seen["copy"] == ("saving", None)
    record = read_heartbeat(path)
    assert record["state"] == "running" and record["checkpoint_step"] is None   # not committed yet
    beats.beat(2)
    time.sleep(2 * beats.interval_s)
    beats.beat(3)
    assert not pending.done() and read_heartbeat(path)["step"] == 3
    released.set()
    committed = rt.wait_checkpoints()
    assert committed.step == 2
    assert seen["writing"] == ("running",) and seen["waited"] == ("saving", None)
    assert read_heartbeat(path)["checkpoint_step"] == 2 and watch.check() is None
    assert writers and set(writers) == {threading.main_thread().name}


def test_a_save_within_a_stop_keeps_the_stops_bound_and_a_failed_save_records_no_checkpoint(tmp_path):
    beats, _, path = _watched(tmp_path)
    beats.beat(5)
    heartbeats.note_stop_decided()
    decided = beats.stop_decided
    with heartbeats.saving(5):
        record = read_heartbeat(path)
        assert record["state"] == "stopping" and record["saving_since"] == decided
    record = read_heartbeat(path)
    assert record["state"] == "stopping" and record["saving_since"] == decided and record["checkpoint_step"] == 5

    beats.state, beats.saving_since = "running", None
    with pytest.raises(OSError), heartbeats.saving(6):
        raise OSError("disk full")
    record = read_heartbeat(path)
    assert record["state"] == "running" and record["checkpoint_step"] == 5 and record["save_ended"] is not None


# --- DeepSpeed's engine and the Lightning callback, each in its own process (a process group) --

ADAPTER_SCRIPT = r'''
import json, os, sys, time
from pathlib import Path

import torch
from launcher.rundir.layout import read_heartbeat
from launcher.runtime import heartbeats
from launcher.jobcontrol.watchdog import Limits, Watch

SLOW_S = float(os.environ["SLOW_S"])
run = Path(os.environ["GLAUNCH_RUN_DIR"])
beats = heartbeats.Beats(run_dir=run, interval_s=0.05, checkpoint_every=0, rank=0, node="n1", job_id="77",
                         restart=0, world_size=1)
heartbeats.reset(beats)
watch = Watch(run, "77", 0, limits=Limits(float(os.environ["STALL_S"]), 0), world_size=1)
path = run / "heartbeats" / "rank-00000.json"
seen = []


def slowly():
    time.sleep(SLOW_S)
    seen.append([read_heartbeat(path)["state"], watch.check() is None])


beats.beat(1)
if sys.argv[1] == "deepspeed":
    from launcher.runtime import deepspeed as gds

    ds = gds.import_deepspeed()
    model = torch.nn.Linear(4, 4)
    engine, *_ = ds.initialize(model=model, model_parameters=model.parameters(), config={
        "train_batch_size": 1, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_optimization": {"stage": 1},
        "zero_allow_untested_optimizer": True})
    save = engine.checkpoint_engine.save

    def slow_save(state_dict, path, *a, **kw):
        slowly()
        return save(state_dict, path, *a, **kw)

    engine.checkpoint_engine.save = slow_save
    saved = gds.save_engine(engine, 1)
else:
    import lightning as L
    from launcher.runtime.lightning import GlaunchCallback

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def on_save_checkpoint(self, checkpoint):
            slowly()

    callback = GlaunchCallback(every=1)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=1, callbacks=[callback], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Model(), torch.utils.data.DataLoader(torch.randn(4, 4), batch_size=2))
    saved = callback.last_saved
record = read_heartbeat(path)
print("RESULT " + json.dumps({"seen": seen, "step": saved.step, "after": [record["state"], record["checkpoint_step"],
                                                                       watch.check() is None]}))
'''


@pytest.mark.parametrize("adapter", ["deepspeed", "lightning"])
def test_deepspeed_and_lightning_saves_are_saves_to_the_watchdog(tmp_path, adapter):
    pytest.importorskip(adapter)
    script = tmp_path / "adapter_save.py"
    script.write_text(ADAPTER_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS and k != "DS_ACCELERATOR"}
    env.update(PYTHONPATH=str(REPO), STALL_S=str(STALL_S), SLOW_S=str(SLOW_S), RANK="0", LOCAL_RANK="0",
               WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    proc = subprocess.run([sys.executable, str(script), adapter], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["seen"] and all(s == ["saving", True] for s in result["seen"]), result
    assert result["step"] == 1 and result["after"] == ["running", 1, True], result



# --- end to end on the local scheduler -------------------------------------------------------

E2E_STALL_S = 3
E2E_SAVE_S = 4 * E2E_STALL_S

# The torch DDP example, its first checkpoint's writer made slow on every rank.
SLOW_SAVE_SCRIPT = f'''
import sys, time
sys.path.insert(0, {str(REPO / "examples")!r})
import torch_ddp
from launcher.runtime import torchstate

torch_save = torchstate._torch_save
slowed = []


def slow_torch_save(obj, f):
    if not slowed:
        slowed.append(True)
        time.sleep({E2E_SAVE_S})
        print("slow save written", flush=True)
    torch_save(obj, f)


torchstate._torch_save = slow_torch_save
sys.exit(torch_ddp.main())
'''

SLOW_SAVE_EXPERIMENT = """
name: slow-save
entrypoint:
  script: slow_save_ddp.py
  args: ["--steps", "8", "--seconds-per-step", "0.1"]
launcher: srun
resources: {nodes: 1, time: "00:10:00"}
strategy: {name: ddp}
precision: fp32
batch: {micro_size: 8}
checkpoint: {every_steps: 4, keep: 2}
"""


def test_a_save_longer_than_stall_s_completes_under_the_local_watchdog(tmp_path, isolated_env):
    (tmp_path / "slow_save_ddp.py").write_text(SLOW_SAVE_SCRIPT)
    (tmp_path / "slow.yaml").write_text(SLOW_SAVE_EXPERIMENT)
    began = time.time()
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", str(tmp_path / "slow.yaml"),
                           "--site", "local", "--runs-dir", str(tmp_path / "runs"), f"watchdog.stall_s={E2E_STALL_S}"],
                          cwd=REPO, env=isolated_env, capture_output=True, text=True, timeout=300)
    seconds = time.time() - began
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "COMPLETED" and len(record["starts"]) == 1, record["starts"]
    assert record["starts"][0]["reason"] is None and "hang" not in record["starts"][0], record["starts"][0]
    assert not RunDir(run_dir).hang_file.exists() and not list((run_dir / "logs").glob("stack-*"))
    logs = "".join(p.read_text(errors="replace") for p in (run_dir / "logs").iterdir() if p.is_file())
    assert logs.count("slow save written") == 2            # both ranks' first save took E2E_SAVE_S
    result = json.loads((run_dir / "result.json").read_text())
    assert result["final_step"] == 8 and result["restarts"] == 0
    assert seconds >= E2E_SAVE_S
