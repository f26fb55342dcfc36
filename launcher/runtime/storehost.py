"""The rendezvous store of a run with peer recovery, hosted outside its ranks::

    python -m launcher.runtime.storehost PORT

Under env:// every rank but rank 0 connects to rank 0's TCPStore: a rank 0 whose process is
lost takes the store with it, and its peers can neither agree on a recovery nor let a new
process join. The job controller (Slurm) or the local job step starts this process beside
the step instead, on MASTER_ADDR:PORT, and gives the ranks TORCHELASTIC_USE_AGENT_STORE=True
(torch's own switch for a store its launcher hosts): every rank is then a client, and any
rank's process can be lost and started again (launcher.runtime.peer).

It prints one line, ``ready PORT``, once the store listens, and serves until its stdin
closes (the process that started it ended) or it gets SIGTERM. Job side: torch and the
standard library only.
"""

from __future__ import annotations

import datetime
import signal
import sys
import threading

READY = "ready"


def serve(port: int) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))
    print(f"{READY} {store.port}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())

    def until_stdin_closes() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=until_stdin_closes, daemon=True).start()
    done.wait()


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].isdigit() or not 0 < int(argv[0]) < 65536:
        print("usage: python -m launcher.runtime.storehost PORT", file=sys.stderr)
        return 2
    serve(int(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
