"""The rendezvous store of a run with peer recovery in a process of its own
(launcher.runtime.peerstore): it says why it cannot listen, naming the port; the signals meant
for the ranks leave it running; it ends when every rank has finished, or when the step that
started rank 0 has ended. Under torchrun the agent's store serves instead (none is started),
and a rank's failure is recovered there too."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from conftest import RANK_VARS
from launcher.rundir.rankcontext import context, free_port
from launcher import storeprocess
from launcher.rundir.rankcontext import RuntimeConfigError
from launcher.runtime import peer, peerstore
from test_peer_recovery import REPO, SCRIPT, STEPS, stop_all, store_processes


LINGER_S = 1.0


def serving(port: int, watched: int) -> subprocess.Popen[str]:
    """The store's process as rank 0 starts it, watching `watched`, lingering LINGER_S
    (not peerstore.LINGER_S) once every rank has finished; once it listens."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "launcher.runtime.peerstore", "127.0.0.1", str(port), "2",
                             str(watched), str(LINGER_S)], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().split() == [storeprocess.READY, str(port)]
    return proc


def ended_within(proc: subprocess.Popen[str], bound_s: float) -> bool:
    try:
        proc.wait(timeout=bound_s)
        return True
    except subprocess.TimeoutExpired:
        return False


def test_a_port_in_use_is_named():
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"the rendezvous store could not listen on port {port} \\(.+\\)"):
            peerstore.start("127.0.0.1", port, 2)
    assert store_processes(port) == []


def test_the_ranks_signals_leave_it_running_and_the_end_of_its_step_ends_it():
    port = free_port()
    step = subprocess.Popen(["sleep", "60"])
    proc = serving(port, step.pid)
    try:
        for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGHUP):
            proc.send_signal(sig)
        assert not ended_within(proc, 1.5)
        step.kill()
        step.wait()
        assert ended_within(proc, 5) and proc.returncode == 0
    finally:
        step.kill()
        proc.kill()


def test_it_ends_a_while_after_every_rank_has_finished():
    port = free_port()
    step = subprocess.Popen(["sleep", "60"])
    proc = serving(port, step.pid)
    try:
        peerstore.connect("127.0.0.1", port, 2, timedelta(seconds=10))
        peerstore.finished()
        assert not ended_within(proc, 1.5)      # one of two
        peerstore.finished()
        # Still there while the ranks tear down (their clients live on), then gone.
        assert not ended_within(proc, LINGER_S / 2)
        assert ended_within(proc, LINGER_S + 5) and proc.returncode == 0
    finally:
        peerstore._client = None
        step.kill()
        proc.kill()


def test_the_job_controller_s_store_listens_on_a_port_it_says_and_rank_0_starts_none(monkeypatch):
    """As the job controller serves one: a port of the system's choosing, said on the first
    line; the ranks, rank 0 too, connect to it as GLAUNCH_PEER_STORE names it."""
    watched = subprocess.Popen(["sleep", "60"])
    proc, port = storeprocess.start("127.0.0.1", 0, 2, watched.pid)
    try:
        monkeypatch.setenv("GLAUNCH_RECOVERY_PEER", "1")
        monkeypatch.setenv("GLAUNCH_PEER_STORE", f"127.0.0.1:{port}")
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", "1")           # not where the store is
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
            monkeypatch.setenv(name, {"WORLD_SIZE": "2"}.get(name, "0"))
        client = peer.peer_store(context(), "glaunch_peer", timedelta(seconds=10))
        client.set("asked", "here")
        assert client.get("asked") == b"here" and proc.poll() is None
        assert store_processes(1) == []                   # none on the rendezvous port
    finally:
        peerstore._client = None
        storeprocess.stop(proc)
        watched.kill()
        watched.wait()
    assert proc.returncode is not None


@pytest.mark.parametrize("value,served", [("", None), ("n1:4321", ("n1", 4321)), ("[::1]:80", ("[::1]", 80)),
                                          ("n1", "not HOST:PORT"), (":4321", "not HOST:PORT"),
                                          ("n1:0", "not HOST:PORT"), ("n1:65536", "not HOST:PORT"),
                                          ("n1:$(id)", "not HOST:PORT"), ("n1:٤٣", "not HOST:PORT")])
def test_the_served_store_s_address_is_read_strictly(value, served):
    if isinstance(served, str):
        with pytest.raises(RuntimeConfigError, match=served):
            peer.served_store(value)
    else:
        assert peer.served_store(value) == served


def test_none_is_started_off_recovery_peer_for_another_backend_or_under_torchrun(monkeypatch):
    monkeypatch.setenv("GLAUNCH_RECOVERY_PEER", "0")
    assert peer.peer_store(context(), "glaunch_peer", None) is None
    monkeypatch.setenv("GLAUNCH_RECOVERY_PEER", "1")
    assert peer.peer_store(context(), "nccl", None) is None
    monkeypatch.setenv(peer.AGENT_STORE, "True")
    assert peer.peer_store(context(), "glaunch_peer", None) is None


def test_under_torchrun_a_failed_rank_is_recovered_through_the_agent_s_store(tmp_path):
    """torchrun's agent holds the rendezvous port: the workers' recovery meets through its store."""
    (tmp_path / "failing_ddp.py").write_text(SCRIPT)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS and not k.startswith(("GLAUNCH_", "SLURM"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", GLAUNCH_RUN_DIR=str(run_dir),
               GLAUNCH_CHECKPOINT_DIR=str(run_dir / "checkpoints"), GLAUNCH_RECOVERY_PEER="1", FAIL_RANK="1",
               FAIL_STEP="7", FAIL_WHERE="data")
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.Popen([str(torchrun), "--nproc-per-node", "2", "--master-port", str(port),
                             str(tmp_path / "failing_ddp.py"), "--steps", str(STEPS), "--log-every", "5"],
                            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out = proc.communicate(timeout=180)[0]
    finally:
        stop_all([proc], port)
    assert proc.returncode == 0, out[-4000:]
    # The agent passes both workers' output on through one pipe: their lines may run together.
    said = "peer recovery: failed rank(s) 1; state of step 6 from rank 0 to rank(s) 1; the ranks go on at step 7"
    assert out.count(said) == 2 and out.count("(received it)") == 1, out[-4000:]
    assert f"done: step {STEPS}" in out
