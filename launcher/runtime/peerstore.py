"""The rendezvous store of a run with peer recovery (``recovery.peer: true``), in a process of
its own, so that a recovery outlives the loss of any rank's process, rank 0's included.

Without peer recovery, the TCPStore of the env:// rendezvous lives in rank 0's process, and
dies with it. Under peer recovery the store is what the ranks meet through after a failure
(their reports, each generation of the group: launcher.runtime.peer, peergroup), so it is a
process of its own, and every rank, rank 0 too, connects to it as a client
(:func:`connect`). The job controller serves one beside each step whose rendezvous host is
the batch host (GLAUNCH_PEER_STORE names it); elsewhere rank 0 starts it on its node
(:func:`start`), on the rendezvous' address and port (launcher.storeprocess says why). A
rank 0 started again in place of a lost one (``GLAUNCH_PEER_JOIN``) finds it there and
starts none.

The store's process (:func:`main`) ends LINGER_S after every rank has said it finished
(:func:`finished`, from launcher.runtime.shutdown_distributed), or when the process that
started it is gone (the job controller; for rank 0's, srun's step daemon or the local job
step: the step it served has ended, whatever became of its ranks). It ignores the signals
a job's warning, its stack dumps and a terminal's keys send, which are meant for the
ranks; SIGTERM ends it.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import time
from typing import Any

from launcher import storeprocess
from launcher.processes import process_runs

# Every rank adds 1 to this key as it shuts down cleanly; the store ends at the world size.
FINISHED_KEY = "glaunch-store/finished"
POLL_S = 0.5
# A rank's client of the store still lives while the rank tears its group down and its
# interpreter ends, after it said it finished: a store gone under it can abort it there
# ("terminate called without an active exception"). The end of the step comes first.
LINGER_S = 10.0
# Meant for the ranks (the job's warning, the watchdog's stack dump, a terminal's keys).
IGNORED_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP", "SIGQUIT", "SIGPIPE")

_client: Any = None


def start(host: str, port: int, world_size: int) -> subprocess.Popen[bytes]:
    """The store's process, started by rank 0 on the rendezvous port (launcher.storeprocess:
    where the job controller serves none), watching this process's parent (the step that
    started rank 0)."""
    return storeprocess.start(host, port, world_size, os.getppid())[0]


def connect(host: str, port: int, world_size: int, timeout: datetime.timedelta) -> Any:
    """A client of the store (kept for :func:`finished`)."""
    import torch.distributed as dist

    global _client
    _client = dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout, wait_for_workers=False)
    return _client


def finished() -> None:
    """This rank has finished: the store ends once every rank has said so. Never raises (the
    store may be gone already)."""
    if _client is None:
        return
    try:
        _client.add(FINISHED_KEY, 1)
    except Exception:
        pass


def serve(host: str, port: int, world_size: int, watched: int, linger_s: float = LINGER_S) -> int:
    """The store: listening on `port` (0: one the system picks, said on the first line)
    until `linger_s` after every rank has finished, or until `watched` is gone."""
    for name in IGNORED_SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    import torch.distributed as dist

    try:
        store = dist.TCPStore(host, port, world_size, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=60))
    except Exception as exc:
        print(f"{type(exc).__name__}: {' '.join(str(exc).split())}", flush=True)
        return 1
    print(f"{storeprocess.READY} {store.port}", flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)         # rank 0 reads one line; nothing more goes to its pipe
    all_finished_at: float | None = None
    while process_runs(watched):
        if all_finished_at is None:
            try:
                if store.add(FINISHED_KEY, 0) >= world_size:
                    all_finished_at = time.monotonic()
            except Exception:
                break
        elif time.monotonic() - all_finished_at >= linger_s:
            break
        time.sleep(POLL_S)
    return 0


def main(argv: list[str]) -> int:
    host, port, world_size, watched, *linger = argv
    return serve(host, int(port), int(world_size), int(watched), *(float(s) for s in linger[:1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
