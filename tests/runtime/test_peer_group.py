"""The process group of a run with peer recovery (launcher.runtime.peergroup): a collective
whose peer is gone raises on the ranks left, synchronous or not, as gloo's own group does;
none goes on with this rank's values alone. Two ranks started directly over gloo."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import RANK_VARS
from test_peer_recovery import REPO, stop_all

from launcher.rundir.rankcontext import free_port

SCRIPT = """
import os, sys, time, torch, torch.distributed as dist
from launcher import runtime as rt
ctx = rt.init_distributed()
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {ctx.rank}: first {t.item():g} over {dist.get_backend()}", flush=True)
if ctx.rank == 1:
    os._exit(3)
time.sleep(1)
for how in ("sync", "async"):
    t = torch.ones(1)
    try:
        if how == "sync":
            dist.all_reduce(t)
        else:
            dist.all_reduce(t, async_op=True).wait()
        print(f"rank 0: {how} returned {t.item():g}", flush=True)
    except RuntimeError as exc:
        print(f"rank 0: {how} raised", flush=True)
os._exit(0)
"""


def test_a_collective_whose_peer_is_gone_raises_and_never_returns_this_rank_s_values(tmp_path):
    script = tmp_path / "gone.py"
    script.write_text(SCRIPT)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS and not k.startswith(("GLAUNCH_", "SLURM"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", GROUP_RANK="0",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLAUNCH_RUN_DIR=str(tmp_path),
               GLAUNCH_RECOVERY_PEER="1", GLAUNCH_JOB_ID="4242")
    procs = [subprocess.Popen([sys.executable, str(script)], env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)),
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(2)]
    try:
        outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    finally:
        stop_all(procs, port)
    text = "\n".join(outputs)
    assert "rank 0: first 2 over glaunch_peer" in text, text[-3000:]
    assert "rank 0: sync raised" in text and "rank 0: async raised" in text, text[-3000:]
    assert "returned" not in text, text[-3000:]
