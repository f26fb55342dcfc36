"""The process of a run's rendezvous store under peer recovery (``recovery.peer: true``;
what it serves: launcher.runtime.peerstore), started and known to listen. Two start one:

- the job controller on the batch host (launcher.jobcontrol.controller), for each job step
  whose rendezvous host it is: on a port of the system's choosing, told to the ranks in
  GLAUNCH_PEER_STORE. It lives outside the step, so it outlives any rank's process, rank
  0's included, even where rank 0 was its node's only task: Slurm ends every process a
  step started on a node once the step's last task there has ended.
- rank 0 (launcher.runtime.peer), on the rendezvous port, where nothing serves one: a run
  on the local site, or a step whose first node is not the batch host.

Standard library only: the in-job runtime and the job controller use it.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
from pathlib import Path

MODULE = "launcher.runtime.peerstore"
# The store's first line once it listens: READY and its port.
READY = "listening"
# How long the starter waits for it to listen: it imports torch first.
READY_WAIT_S = 120.0
# How long a store that is no longer needed gets to end on SIGTERM before it is killed.
STOP_WAIT_S = 5.0


def start(host: str, port: int, world_size: int, watched: int) -> tuple[subprocess.Popen[bytes], int]:
    """The store's process, listening on `port` (0: one the system picks) for `world_size`
    ranks, and the port it listens on; it ends when `watched` is gone. RuntimeError naming
    the port when it cannot listen (in use), or does not say so within READY_WAIT_S.

    It holds none of its starter's output: a step's end waits for every holder of its
    tasks' output to close it, and the store may end after the step (it says why it cannot
    listen on its first line, read here)."""
    package_root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH"))
                                                      if p))
    proc = subprocess.Popen([sys.executable, "-m", MODULE, host, str(port), str(world_size), str(watched)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    said = _first_line(proc, READY_WAIT_S)
    word, _, listening = said.partition(" ")
    if word != READY or not listening.isdigit() or not 0 < int(listening) < 65536:
        stop(proc)
        where = f"port {port}" if port else "a port the system picks"
        raise RuntimeError(f"recovery.peer: the rendezvous store could not listen on {where} "
                           f"({said or 'it said nothing within ' + format(READY_WAIT_S, 'g') + ' s'})")
    if proc.stdout is not None:
        proc.stdout.close()
    return proc, int(listening)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """`proc` ended: SIGTERM, then SIGKILL after STOP_WAIT_S; reaped."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _first_line(proc: subprocess.Popen[bytes], bound_s: float) -> str:
    """The first line `proc` writes within `bound_s`, stripped ('' when none)."""
    if proc.stdout is None:
        return ""
    out = proc.stdout
    data = b""
    with selectors.DefaultSelector() as sel:
        sel.register(out, selectors.EVENT_READ)
        deadline = time.monotonic() + bound_s
        while b"\n" not in data and (left := deadline - time.monotonic()) > 0:
            if not sel.select(left):
                break
            chunk = os.read(out.fileno(), 4096)
            if not chunk:
                break
            data += chunk
    return data.split(b"\n", 1)[0].decode("utf-8", errors="replace").strip()[:500]
