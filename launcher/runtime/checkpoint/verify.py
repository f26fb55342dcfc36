"""Is a checkpoint dir complete? Its manifest against the files: every shard present with
its size and, unless only sizes are asked for, its checksum.

``verify="load"`` leaves the checksums of a DCP checkpoint's data files (:func:`load_checked`)
to the load, which takes them while it reads those files anyway
(:class:`launcher.runtime.checkpoint.dcp.VerifyingReader`): the files are read once, not twice.

The re-check can be split over the ranks (:func:`verify_share`); choosing the checkpoint
to resume from is :mod:`launcher.runtime.checkpoint.selection`.
"""

from __future__ import annotations

import heapq
import os
import stat
from pathlib import Path

from launcher.rundir.files import NotARegularFile, load_json_object

from launcher.rundir.rankcontext import log
from launcher.runtime.checkpoint import checksums
from launcher.runtime.checkpoint.directory import MANIFEST, STEP_RE

VERIFY = ("hash", "load", "size")


def _safe_rel(rel: str) -> bool:
    parts = Path(rel).parts
    return bool(parts) and not Path(rel).is_absolute() and ".." not in parts


def read_manifest(path: str | os.PathLike) -> tuple[dict | None, str | None]:
    """A checkpoint dir's manifest.json, checked for shape: ``(manifest, None)`` or ``(None, why)``."""
    path = Path(path)
    try:
        manifest = load_json_object(path / MANIFEST)
    except FileNotFoundError:
        return None, "no manifest.json"
    except NotARegularFile:
        return None, "manifest.json is not a regular file"
    except OSError as e:
        return None, f"unreadable manifest.json ({e.strerror or e})"
    except ValueError as e:
        return None, f"damaged manifest.json ({e})"
    if not isinstance(manifest.get("shards"), list):
        return None, "manifest.json has no shard list"
    m = STEP_RE.match(path.name)
    if m and int(m.group(1)) != manifest.get("step"):
        return None, f"manifest step {manifest.get('step')} does not match the dir name"
    for shard in manifest["shards"]:
        try:
            rel, _ = shard["path"], int(shard["size"])
        except (KeyError, TypeError, ValueError):
            return None, "malformed shard entry"
        if not isinstance(rel, str) or not _safe_rel(rel) or checksums.shard_checksum(shard) is None:
            return None, f"malformed or unsafe shard entry {rel!r}"
    return manifest, None


def verify_share(shards: list[dict], rank: int, world: int) -> list[dict]:
    """The shards ``rank`` of ``world`` re-checksums: largest first, each to the least-loaded rank.

    Deterministic, so every rank computes the same split from the same manifest.
    """
    heap = [(0, r) for r in range(max(1, world))]
    mine = []
    for shard in sorted(shards, key=lambda s: (-int(s["size"]), s["path"])):
        load, r = heapq.heappop(heap)
        heapq.heappush(heap, (load + int(shard["size"]) + 1, r))
        if r == rank:
            mine.append(shard)
    return mine


def load_checked(manifest: dict) -> list[dict]:
    """The shards whose checksums ``verify="load"`` leaves to the load: the data files
    (``*.distcp``) of a DCP checkpoint's state dir, where they can be checked here."""
    layout = manifest.get("layout") or {}
    d = layout.get("dir")
    if layout.get("state") != "dcp" or not isinstance(d, str):
        return []
    found = []
    for shard in manifest["shards"]:
        parent, _, name = shard["path"].rpartition("/")
        checksum = checksums.shard_checksum(shard)
        if parent == d and name.endswith(".distcp") and checksum and checksums.can_checksum(checksum[0]):
            found.append(shard)
    return found


def check_shards(path: Path, manifest: dict, *, verify: str = "hash",
                 share: tuple[int, int] | None = None) -> str | None:
    """Why ``path`` does not match ``manifest`` (None when it does).

    Every shard's presence and size is checked; with ``verify="hash"`` the checksums of
    all shards, or only of this rank's share when ``share=(rank, world)``, are re-computed;
    ``verify="load"`` leaves out those of :func:`load_checked`.
    """
    if verify not in VERIFY:
        raise ValueError(f"verify must be one of {', '.join(VERIFY)}, not {verify!r}")
    for shard in manifest["shards"]:
        rel, size = shard["path"], int(shard["size"])
        try:
            st = (path / rel).stat()
        except OSError:
            return f"shard {rel} is missing"
        if not stat.S_ISREG(st.st_mode):
            return f"shard {rel} is not a regular file"
        actual = st.st_size
        if actual != size:
            return f"shard {rel} has {actual} bytes, manifest says {size}"
    if verify == "size":
        return None
    todo = manifest["shards"]
    if verify == "load":
        later = {shard["path"] for shard in load_checked(manifest)}
        todo = [shard for shard in todo if shard["path"] not in later]
    todo = todo if share is None else verify_share(todo, *share)
    for shard in todo:
        found = checksums.shard_checksum(shard)
        if found is None:
            return f"shard {shard['path']} has no checksum"
        algo, digest = found
        if not checksums.can_checksum(algo):
            log(f"cannot re-check {shard['path']}: its crc32c checksum needs the 'crc32c' package; "
                "checked its size only")
            continue
        try:
            if checksums.checksum_file(path / shard["path"], algo) != digest:
                return f"shard {shard['path']} {algo} mismatch"
        except OSError as e:      # replaced since its size was checked
            return f"shard {shard['path']} unreadable ({e.strerror or e})"
    return None


def verify_checkpoint(path: str | os.PathLike, *, verify: str = "hash") -> tuple[dict | None, str | None]:
    """Check a checkpoint dir against its manifest: ``(manifest, None)`` if complete, else ``(None, why)``.

    ``verify="hash"`` re-checksums every shard (default); ``"size"`` only checks presence and sizes;
    ``"load"`` all but the checksums the load takes (:func:`load_checked`).
    """
    if verify not in VERIFY:
        raise ValueError(f"verify must be one of {', '.join(VERIFY)}, not {verify!r}")
    path = Path(path)
    manifest, why = read_manifest(path)
    if manifest is None:
        return None, why
    why = check_shards(path, manifest, verify=verify)
    return (manifest, None) if why is None else (None, why)
