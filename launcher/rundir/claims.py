"""Which run a checkpoint directory outside its run directory belongs to: OWNER_FILE in it,
written once, when the run is submitted. No two runs load or write the same checkpoint
directory: a run whose `checkpoint.dir` another run owns (or that holds files no run
claims) is refused before anything is written.

Imports the standard library only (and `files`, `records`): the in-job runtime reads the
claim before it loads a checkpoint.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.errors import GlaunchError
from launcher.rundir.files import atomic_write_text, open_regular, read_record
from launcher.rundir.layout import CHECKPOINT_DIR, RUN_FILE
from launcher.rundir.records import RUN_ID, RecordError, RunRecord

OWNER_FILE = "glaunch-owner.json"
# Shown of a directory that holds files no run claims.
_SHOWN_ENTRIES = 3


@dataclass(frozen=True)
class Owner:
    """The claim: the run that owns the directory, where its run directory is, since when,
    and the runs that owned it before it was handed on (`claim(..., take_over=)`)."""

    run_id: str
    run_dir: str
    claimed: str
    previous: tuple[Owner, ...] = ()

    @classmethod
    def from_dict(cls, data: Any) -> Owner:
        if not isinstance(data, dict):
            raise RecordError(None, "not a JSON object")
        run_id, run_dir, claimed = data.get("run_id"), data.get("run_dir"), data.get("claimed")
        previous = data.get("previous", [])
        if not (isinstance(run_id, str) and RUN_ID.fullmatch(run_id)):
            raise RecordError("run_id", "not a run id")
        if not isinstance(run_dir, str) or not run_dir or "\0" in run_dir:
            raise RecordError("run_dir", "not a path")
        if not isinstance(claimed, str):
            raise RecordError("claimed", "not text")
        if not isinstance(previous, list):
            raise RecordError("previous", "not a list")
        before = []
        for index, entry in enumerate(previous):
            if isinstance(entry, dict) and entry.get("previous"):
                raise RecordError(f"previous[{index}].previous", "nested")
            try:
                before.append(cls.from_dict(entry))
            except RecordError as exc:
                raise exc.within(f"previous[{index}]") from None
        return cls(run_id, run_dir, claimed, tuple(before))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run_id": self.run_id, "run_dir": self.run_dir, "claimed": self.claimed}
        if self.previous:
            out["previous"] = [p.to_dict() for p in self.previous]
        return out


def owner_file(directory: str | os.PathLike[str]) -> Path:
    return Path(directory) / OWNER_FILE


def owner_of(directory: str | os.PathLike[str]) -> Owner | None:
    """The directory's claim; None when it has none. RunError naming the file when the
    claim is there but damaged (or not a regular file). A run's default checkpoint
    directory (`<run dir>/checkpoints`) is its run's without a claim. Decided on the real
    path: a link to another run's directory, or `..` after one, is that run's."""
    real = os.path.realpath(directory)
    path = owner_file(real)
    if not os.path.lexists(path):
        return _run_of_default(real)
    return read_record(path, Owner.from_dict, "checkpoint directory's owner record")


def _run_of_default(directory: str | os.PathLike[str]) -> Owner | None:
    parent = Path(directory).parent
    if Path(directory).name != CHECKPOINT_DIR or not os.path.lexists(parent / RUN_FILE):
        return None
    record = read_record(parent / RUN_FILE, RunRecord.from_dict, "run record")
    return Owner(record.run_id, str(parent), record.created or "")


def claim_problem(directory: str | os.PathLike[str], run_id: str, take_over: str | None = None) -> str | None:
    """Why run `run_id` cannot own `directory` (taking it over from run `take_over`, when
    given), or None. Looks only."""
    return _problem(owner_of(directory), directory, run_id, take_over)


def _problem(owner: Owner | None, directory: str | os.PathLike[str], run_id: str,
             take_over: str | None) -> str | None:
    if owner is not None:
        if owner.run_id == run_id or (take_over is not None and owner.run_id == take_over):
            return None
        return (f"it holds the checkpoints of run {owner.run_id} (run directory {owner.run_dir}); a run loads and "
                "writes only a checkpoint directory of its own: continue that run with glaunch resume "
                f"{owner.run_id}, or choose another directory")
    if take_over is not None:
        return f"it was to be taken over from run {take_over}, but no run owns it"
    others = _entries(directory)
    if others:
        shown = ", ".join(others[:_SHOWN_ENTRIES]) + (", ..." if len(others) > _SHOWN_ENTRIES else "")
        return (f"it already holds files that no run claims ({shown}): a new run would load whatever checkpoint "
                "is there; choose an empty directory, or empty this one")
    return None


def _entries(directory: str | os.PathLike[str]) -> list[str]:
    try:
        # A claim appearing (or being written) as this looks is another run's, not a file no
        # run claims: the exclusive link then says whose.
        return sorted(n for n in os.listdir(directory) if n != OWNER_FILE and not n.startswith(f".{OWNER_FILE}."))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        return [f"<unreadable: {exc.strerror or exc}>"]


class ClaimTaken(RecordError):
    """Another run claimed the directory first."""


def claim(directory: str | os.PathLike[str], run_id: str, run_dir: str, take_over: str | None = None) -> None:
    """Make run `run_id` the owner of `directory` (an existing directory). The first claim
    is created exclusively: of two runs submitted at once, one gets it and the other a
    ClaimTaken. A take-over replaces the owner's claim, keeping who owned it before."""
    # Read once: every decision below is about this claim. Without a claim file then, the
    # claim is created exclusively, whatever another run did since.
    claimed = os.path.lexists(owner_file(directory))
    owner = owner_of(directory)
    problem = _problem(owner, directory, run_id, take_over)
    if problem is not None:
        raise ClaimTaken(None, problem)
    if owner is not None and owner.run_id == run_id:
        return
    now = dt.datetime.now(dt.timezone.utc).astimezone().isoformat(timespec="seconds")
    previous = (*owner.previous, Owner(owner.run_id, owner.run_dir, owner.claimed)) if owner is not None else ()
    _write(directory, Owner(run_id, run_dir, now, previous), new=not claimed, run_id=run_id)


def _write(directory: str | os.PathLike[str], owner: Owner, *, new: bool, run_id: str) -> None:
    """The claim file: created exclusively when `new`, else replaced whole."""
    text = json.dumps(owner.to_dict(), indent=2) + "\n"
    path = owner_file(directory)
    if new:
        # Written beside it, then linked into place: the claim appears whole, and link()
        # fails if another run's appeared first.
        temporary = path.with_name(f".{OWNER_FILE}.{os.uname().nodename}-{os.getpid()}-{threading.get_ident()}")
        fd = open_regular(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            os.link(temporary, path)
        except FileExistsError:
            raise ClaimTaken(None, claim_problem(directory, run_id) or "claimed at the same time") from None
        finally:
            temporary.unlink(missing_ok=True)
        return
    atomic_write_text(path, text)


def release(directory: str | os.PathLike[str], run_id: str) -> None:
    """Take back the claim of `run_id` (its submission failed before any job ran); a claim
    it took over goes back to the run it took it from."""
    try:
        owner = owner_of(directory)
    except GlaunchError:        # a damaged claim is left for the user to see
        return
    if owner is None or owner.run_id != run_id:
        return
    if not owner.previous:
        owner_file(directory).unlink(missing_ok=True)
        return
    # The run it was taken over from owns it again.
    last = owner.previous[-1]
    _write(directory, Owner(last.run_id, last.run_dir, last.claimed, owner.previous[:-1]), new=False, run_id=run_id)
