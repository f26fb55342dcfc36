"""Stop requests: the handler only sets a flag, ours replaces earlier handlers, ranks agree."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from launcher.runtime import stop, stopflag
from launcher.rundir.rankcontext import RuntimeConfigError, context, free_port

REPO = Path(__file__).resolve().parents[2]
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
             "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for k in list(os.environ):
        if k in RANK_VARS or k.startswith("GLAUNCH_"):
            monkeypatch.delenv(k, raising=False)
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)}
    stop.reset_stop()
    yield
    stop.uninstall_stop_handler()
    for s, h in saved.items():
        signal.signal(s, h)
    stop.reset_stop()


def _deliver(sig: signal.Signals) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.01)   # python runs the handler at the next bytecode boundary


def test_default_signals_and_flag():
    assert stop.install_stop_handler() == ("SIGUSR2", "SIGTERM")
    assert not stop.stop_requested() and not stop.should_stop()
    _deliver(signal.SIGUSR2)
    assert stop.stop_requested() and stop.received_signal() == "SIGUSR2"
    _deliver(signal.SIGTERM)                     # the first signal is the one remembered
    assert stop.received_signal() == "SIGUSR2"
    assert stop.should_stop() and stop.stop_signal() == "SIGUSR2"
    stop.reset_stop()
    assert not stop.should_stop() and stop.stop_signal() is None


def test_replaces_submitit_handlers_and_restores_them():
    from submitit.core.job_environment import SignalHandler

    sub = SignalHandler(env=None, job_paths=None, delayed=None)   # would crash if ever called
    signal.signal(signal.SIGTERM, sub.bypass)
    signal.signal(signal.SIGUSR2, sub.checkpoint_and_try_requeue)
    stop.install_stop_handler()
    assert signal.getsignal(signal.SIGUSR2) is stopflag.handler and signal.getsignal(signal.SIGTERM) is stopflag.handler
    _deliver(signal.SIGUSR2)
    _deliver(signal.SIGTERM)
    assert stop.stop_requested()
    stop.install_stop_handler()                  # installing twice keeps the original to restore
    stop.uninstall_stop_handler()
    assert signal.getsignal(signal.SIGUSR2) == sub.checkpoint_and_try_requeue
    assert signal.getsignal(signal.SIGTERM) == sub.bypass


def test_stop_signals_from_env(monkeypatch):
    monkeypatch.setenv("GLAUNCH_STOP_SIGNALS", " usr1 ,SIGUSR2,")
    assert context().stop_signals == ("USR1", "USR2")
    assert stop.install_stop_handler() == ("SIGUSR1", "SIGUSR2")
    assert signal.getsignal(signal.SIGTERM) is not stopflag.handler
    _deliver(signal.SIGUSR1)
    assert stop.received_signal() == "SIGUSR1"


def test_unknown_signal_name_is_an_error(monkeypatch):
    monkeypatch.setenv("GLAUNCH_STOP_SIGNALS", "USR2,NOPE")
    with pytest.raises(ValueError, match="NOPE"):
        stop.install_stop_handler()


def test_request_stop_from_code():
    stop.request_stop()
    assert stop.should_stop() and stop.stop_signal() is None


def test_bad_env_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("GLAUNCH_CHECKPOINT_EVERY", "often")
    with pytest.raises(RuntimeConfigError, match="GLAUNCH_CHECKPOINT_EVERY"):
        context()


def test_context_from_env(monkeypatch, tmp_path):
    for k, v in dict(RANK=5, LOCAL_RANK=1, WORLD_SIZE=8, LOCAL_WORLD_SIZE=4, GROUP_RANK=1,
                     GLAUNCH_RUN_DIR=tmp_path, GLAUNCH_CHECKPOINT_EVERY=50, GLAUNCH_RESTART=2,
                     GLAUNCH_JOB_ID="123_4", GLAUNCH_STRATEGY="DeepSpeed").items():
        monkeypatch.setenv(k, str(v))
    c = context()
    assert (c.rank, c.local_rank, c.world_size, c.node_rank, c.num_nodes) == (5, 1, 8, 1, 2)
    assert c.checkpoint_dir == tmp_path / "checkpoints" and c.restart == 2 and not c.is_main
    assert c.checkpoint_due(100) and not c.checkpoint_due(0) and not c.checkpoint_due(75)
    assert c.strategy == "deepspeed" and c.job_id == "123_4" and not c.standalone


def test_standalone_context(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    c = context()
    assert (c.rank, c.world_size, c.is_main, c.standalone) == (0, 1, True, True)
    assert c.run_dir == tmp_path / "glaunch-run" and c.checkpoint_every == 0


def test_import_does_not_import_torch():
    code = "import sys, launcher.runtime; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO,
                   env={**os.environ, "PYTHONPATH": str(REPO)})


AGREE = textwrap.dedent("""
    import os, signal, sys, time
    from launcher import runtime as rt
    ctx = rt.init_distributed()
    rt.install_stop_handler()
    target, sig = int(sys.argv[1]), getattr(signal, sys.argv[2])
    for step in range(1, 50):
        if ctx.rank == target and step == 4:
            os.kill(os.getpid(), sig)
        time.sleep(0.01 * (ctx.rank + 1))   # ranks arrive at the boundary at different times
        if rt.should_stop():
            print(f"rank {ctx.rank} stops at {step} by {rt.stop_signal()} own {rt.received_signal()}")
            break
    # a rank failing inside a checkpoint write makes every rank raise, nothing is committed
    try:
        with rt.stage_checkpoint(step) as st:
            st.file(f"r{ctx.rank}.bin").write_bytes(b"x")
            if ctx.rank == 1:
                raise RuntimeError("boom")
    except rt.CheckpointError as e:
        print(f"rank {ctx.rank} CheckpointError")
    assert rt.latest_complete(ctx.checkpoint_dir, quiet=True) is None
    with rt.stage_checkpoint(step) as st:
        st.file(f"r{ctx.rank}.bin").write_bytes(b"y" * (ctx.rank + 1))
    shards = sorted((s["path"], s["rank"]) for s in st.committed.manifest["shards"])
    print(f"rank {ctx.rank} committed {st.committed.path.name} {shards}")
    rt.shutdown_distributed()   # as every rank must: gloo torn down under a busy peer aborts
""")


@pytest.mark.parametrize("target,sig", [(1, "SIGUSR2"), (0, "SIGTERM")])
def test_two_ranks_agree_on_stop_step(tmp_path, target, sig):
    script = tmp_path / "agree.py"
    script.write_text(AGREE)
    port = free_port()
    procs = []
    for r in range(2):
        env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
        env.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", GROUP_RANK="0",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONPATH=str(REPO),
                   GLAUNCH_CHECKPOINT_DIR=str(tmp_path / "ckpt"), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(script), str(target), sig], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=90)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
    for r, out in enumerate(outs):
        own = sig if r == target else "None"
        assert f"rank {r} stops at 4 by {sig} own {own}" in out, out
        assert f"rank {r} CheckpointError" in out, out
        assert (f"rank {r} committed step-00000004 [('r0.bin', 0), ('r1.bin', 1)]") in out, out


def test_lightning_cluster_environment_per_launch_mode(monkeypatch):
    pytest.importorskip("lightning")
    from lightning.pytorch.plugins.environments import (
        LightningEnvironment,
        SLURMEnvironment,
        TorchElasticEnvironment,
    )

    from launcher.runtime.lightning import cluster_environment, trainer_precision, trainer_topology

    for k in [k for k in os.environ if k.startswith("SLURM_") or k.startswith("TORCHELASTIC")]:
        monkeypatch.delenv(k)
    assert type(cluster_environment()) is LightningEnvironment
    for k, v in dict(RANK=3, LOCAL_RANK=1, WORLD_SIZE=4, LOCAL_WORLD_SIZE=2, GROUP_RANK=1).items():
        monkeypatch.setenv(k, str(v))
    monkeypatch.setenv("GLAUNCH_LAUNCHER", "torchrun")
    assert type(cluster_environment()) is TorchElasticEnvironment
    assert trainer_topology() == {"devices": 2, "num_nodes": 2}
    monkeypatch.setenv("GLAUNCH_LAUNCHER", "srun")
    assert type(cluster_environment()) is TorchElasticEnvironment   # srun, but no SLURM vars
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert type(cluster_environment()) is TorchElasticEnvironment   # Lightning wants NTASKS_PER_NODE
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2")
    env = cluster_environment()
    assert type(env) is SLURMEnvironment and env.auto_requeue is False
    monkeypatch.setenv("GLAUNCH_PRECISION", "bf16")
    assert trainer_precision() == "32-true"                        # on this CPU; bf16-mixed on a GPU
