"""Experiment trackers that follow the glaunch run across requeues: every start of a run
logs into the same W&B run and the same TensorBoard log directory.

W&B: ``WANDB_RUN_ID`` is the glaunch run id (W&B's limit is 64 characters: a longer id
keeps its first 55 and a hash of the whole), ``WANDB_RESUME=allow`` (the first start
creates the W&B run, each requeue resumes it), ``WANDB_DIR`` is ``<run dir>/wandb`` and
``WANDB_NAME`` the run id; a value already in the environment (the experiment's ``env:``)
wins. :func:`wandb_init` calls ``wandb.init`` with them on rank 0.

TensorBoard: ``<run dir>/tensorboard`` (``GLAUNCH_TENSORBOARD_DIR`` overrides);
:func:`tensorboard_writer` gives rank 0 a ``SummaryWriter`` that drops the events a
previous start wrote after the step this start resumed from (``purge_step``), so a
requeued run's curves do not fold back on themselves.

W&B keeps a run's steps increasing: after a stop that saved, the resumed start logs on
from the next step; after a crash, the steps it does again up to the last one logged are
dropped by W&B (TensorBoard's purge_step replaces them instead).

Both return None where they do nothing (other ranks, the package not installed): a
script calls them unconditionally and checks the result. Offline W&B
(``WANDB_MODE=offline`` in the experiment's ``env:``) syncs later with ``wandb sync``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from launcher.rundir.files import read_json
from launcher.rundir import envnames
from launcher.rundir.layout import RunDir
from launcher.rundir.rankcontext import RankContext, context, log

WANDB_ID_LIMIT = 64
_said: set[str] = set()


def wandb_id(run_id: str) -> str:
    """The W&B run id of a glaunch run: the run id itself when W&B accepts its length."""
    if len(run_id) <= WANDB_ID_LIMIT:
        return run_id
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:WANDB_ID_LIMIT - 56]
    return f"{run_id[:55]}-{digest}"


def tracker_env(ctx: RankContext | None = None) -> dict[str, str]:
    """Set (where not already set) and return the variables that make W&B follow this
    run: WANDB_RUN_ID, WANDB_RESUME, WANDB_DIR, WANDB_NAME; and GLAUNCH_TENSORBOARD_DIR."""
    ctx = ctx or context()
    run_id = ctx.run_id or ctx.run_dir.name
    wanted = {"WANDB_RUN_ID": wandb_id(run_id), "WANDB_RESUME": "allow",
              "WANDB_DIR": str(RunDir(ctx.run_dir).wandb_dir), "WANDB_NAME": run_id,
              envnames.TENSORBOARD_DIR: str(RunDir(ctx.run_dir).tensorboard_dir)}
    for key, value in wanted.items():
        if not os.environ.get(key):
            os.environ[key] = value
    if ctx.is_main and _installed("wandb"):
        # W&B falls back to a temporary directory when WANDB_DIR does not exist.
        try:
            Path(os.environ["WANDB_DIR"]).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            _say_once("wandb_dir", f"cannot create WANDB_DIR {os.environ['WANDB_DIR']}: {exc.strerror or exc}")
    return {key: os.environ[key] for key in wanted}


def _installed(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def tensorboard_dir(ctx: RankContext | None = None) -> Path:
    return Path(tracker_env(ctx)[envnames.TENSORBOARD_DIR])


def _say_once(what: str, message: str) -> None:
    if what not in _said:
        _said.add(what)
        log(message)


def resumed_step(ctx: RankContext) -> int | None:
    """The step this start resumed from (resume.json of this start), or None."""
    resume = read_json(RunDir(ctx.run_dir).resume_file) or {}
    step, restart = resume.get("step"), resume.get("restart")
    if type(restart) is not int or restart != ctx.restart or type(step) is not int or not 0 <= step < 2**63:
        return None
    return step


def wandb_init(**kwargs: Any) -> Any:
    """``wandb.init(id=..., resume="allow", dir=..., **kwargs)`` for this glaunch run, on
    rank 0; None on the other ranks and where wandb is not installed."""
    ctx = context()
    env = tracker_env(ctx)
    if not ctx.is_main:
        return None
    try:
        import wandb
    except ImportError:
        _say_once("wandb", "wandb is not installed: no W&B logging")
        return None
    kwargs.setdefault("id", env["WANDB_RUN_ID"])
    kwargs.setdefault("resume", env["WANDB_RESUME"])
    kwargs.setdefault("dir", env["WANDB_DIR"])
    kwargs.setdefault("name", env["WANDB_NAME"])
    return wandb.init(**kwargs)


def tensorboard_writer(**kwargs: Any) -> Any:
    """A ``torch.utils.tensorboard.SummaryWriter`` on the run's log directory, on rank 0;
    None on the other ranks and where tensorboard is not installed."""
    ctx = context()
    log_dir = tensorboard_dir(ctx)
    if not ctx.is_main:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        _say_once("tensorboard", "tensorboard is not installed: no TensorBoard logging")
        return None
    step = resumed_step(ctx)
    if step is not None:
        kwargs.setdefault("purge_step", step + 1)
    kwargs.setdefault("log_dir", str(log_dir))
    return SummaryWriter(**kwargs)
