"""What a node's ranks actually imported: Python, torch, CUDA and NCCL as torch was built
with them, DeepSpeed and Lightning where the script imported them. The first rank of each
node writes it at its first step (telemetry/versions_JOB_RESTART_NODE.json); the end of the
start folds every node's into its run.json entry (launcher.rundir.startsummary), where
`glaunch status` compares them with the versions the run was submitted with.

Only modules already imported are read: recording never imports a framework the script
did not use."""

from __future__ import annotations

import json
import os
import platform
import sys
from typing import Any

from launcher.rundir.files import atomic_write_text
from launcher.rundir.layout import RunDir

# The modules whose version decides what the ranks compute, as run.json names them.
MODULES = {"torch": "torch", "deepspeed": "deepspeed", "lightning": "lightning",
           "pytorch_lightning": "pytorch-lightning"}


def imported() -> dict[str, str]:
    """The versions of what this process imported (nothing is imported to find out)."""
    found = {"python": platform.python_version()}
    for module, name in MODULES.items():
        version = getattr(sys.modules.get(module), "__version__", None)
        if isinstance(version, str):
            found[name] = version
    torch = sys.modules.get("torch")
    if torch is not None:
        cuda = getattr(getattr(torch, "version", None), "cuda", None)
        if isinstance(cuda, str):
            found["cuda"] = cuda
        nccl = _nccl(torch)
        if nccl:
            found["nccl"] = nccl
    return found


def _nccl(torch: Any) -> str | None:
    """NCCL's version as torch was built with it (None without CUDA)."""
    try:
        if not torch.cuda.is_available():
            return None
        version = torch.cuda.nccl.version()
    except Exception:       # a build without NCCL, a driver that cannot say
        return None
    return ".".join(str(part) for part in version) if isinstance(version, tuple) else str(version)


def record(run_dir: str | os.PathLike[str], job_id: str, restart: int, node: int, node_name: str) -> None:
    """This node's versions into the start's telemetry (never raises for a file it cannot write)."""
    path = RunDir(run_dir).versions(job_id, restart, node)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"node": node_name, "node_index": node, "versions": imported()}) + "\n")
    except OSError:
        pass
