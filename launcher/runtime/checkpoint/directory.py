"""A checkpoint directory's names and records: what ``launcher.runtime.checkpoint`` lays out on disk.

``step-NNNNNNNN/`` complete checkpoints, ``latest`` (the newest committed name),
``.staging-step-N/`` being written, ``.trash-*`` being deleted; the done and failed
markers ranks leave in a staging dir. Nothing here reads a shard.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from launcher.rundir.files import NotARegularFile, read_text

MANIFEST = "manifest.json"
LATEST = "latest"
STEP_PREFIX = "step-"
STAGING_PREFIX = ".staging-step-"
TRASH_PREFIX = ".trash-"
MARKER_PREFIX = ".done-rank-"
FAILED_PREFIX = ".failed-rank-"
PAD = 8
FORMAT = 2

STEP_RE = re.compile(r"^step-(\d+)$")
STAGING_RE = re.compile(r"^\.staging-step-(\d+)$")
MARKER_RE = re.compile(r"^\.(done|failed)-rank-(\d+)\.json$")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or committed (raised on every rank)."""


class CheckpointDamaged(CheckpointError):
    """A load found a file of the checkpoint not matching its manifest: nothing of it was loaded."""


@dataclass(frozen=True)
class Checkpoint:
    """A complete, verified checkpoint directory."""

    step: int
    path: Path
    manifest: dict = field(repr=False, compare=False)
    # Shards whose checksums are still to be taken, by the load that reads them (verify="load").
    pending: tuple[dict, ...] = field(default=(), repr=False, compare=False)

    @property
    def framework(self) -> str | None:
        return self.manifest.get("framework")

    @property
    def world_size(self) -> int:
        return int(self.manifest.get("world_size", 0))

    @property
    def extra(self) -> dict:
        return self.manifest.get("extra") or {}

    @property
    def layout(self) -> dict:
        """How the adapter that wrote it laid its files out (e.g. ``{"state": "dcp", ...}``)."""
        return self.manifest.get("layout") or {}


def step_dir_name(step: int) -> str:
    """``step-00000042``: zero-padded so that names sort like steps."""
    return f"{STEP_PREFIX}{int(step):0{PAD}d}"


def staging_dir_name(step: int) -> str:
    return f"{STAGING_PREFIX}{int(step):0{PAD}d}"


def marker_name(rank: int) -> str:
    return f"{MARKER_PREFIX}{rank:05d}.json"


def failed_marker_name(rank: int) -> str:
    return f"{FAILED_PREFIX}{rank:05d}.json"


# ``latest`` holds one directory name; more is not a file the commit wrote.
LATEST_LIMIT = 4096


def latest_pointer(checkpoint_dir: str | os.PathLike) -> tuple[str | None, str | None]:
    """``(the dir name in latest, None)`` (not verified), or ``(None, why not)``: why is
    None when there is no ``latest``; a FIFO, a directory or a damaged file says so."""
    try:
        name = read_text(Path(checkpoint_dir) / LATEST, limit=LATEST_LIMIT).strip()
    except FileNotFoundError:
        return None, None
    except NotARegularFile:
        return None, "is not a regular file"
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    except ValueError as exc:       # larger than the limit, or not UTF-8
        return None, f"damaged ({exc})"
    return name or None, None


def read_latest(checkpoint_dir: str | os.PathLike) -> str | None:
    """The dir name in ``latest`` (not verified), or None."""
    return latest_pointer(checkpoint_dir)[0]


def list_checkpoints(checkpoint_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """All ``step-*`` dirs (complete or not), oldest first. Staging and trash dirs are never listed."""
    d = Path(checkpoint_dir)
    out = []
    try:
        entries = list(os.scandir(d))
    except OSError:
        return []
    for e in entries:
        m = STEP_RE.match(e.name)
        if m and e.is_dir(follow_symlinks=False):
            out.append((int(m.group(1)), d / e.name))
    return sorted(out)
