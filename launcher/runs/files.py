"""Small file operations both sides share: atomic writes and tolerant JSON reads.
Standard library only (the in-job runtime uses them on every rank)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename or a new entry in `path` durable; some filesystems refuse, harmlessly."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` so a reader sees the old content or the new, never a part: a temp file
    beside it (named per host and process, for shared filesystems), fsync, rename, fsync
    of the directory."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{socket.gethostname()}-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def read_json(path: str | os.PathLike) -> dict | None:
    """A JSON object from `path`, or None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
