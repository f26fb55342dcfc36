"""Peer recovery's decisions: which ranks failed, the step every rank goes on from, and
which live rank sends its state to the others.

After a failure every rank reports (:class:`Report`) the last step whose optimizer update
it completed and whether its own step raised (``failed``) or it only lost a peer inside a
collective. From the reports alone, the same on every rank, :func:`plan_recovery` decides:

- The state comes from a rank that did not fail: a failed rank's state may be half
  updated (an exception inside its optimizer step), a surviving rank's never is, since its
  step only stopped in a collective, where the update has either happened or not begun.
- The ranks go on from the newest state a survivor holds (``resume_after``), so at most the
  step in flight is lost; the lowest such rank sends it (``source``).
- Every rank whose state differs from it receives it: the failed ones and any survivor
  whose last update is older (a collective that completed on some ranks only).
- A rank whose process was lost is reported by the process started in its place
  (``replaced``): a failed rank with no state, which receives it like any failed one.
- No survivor, or a rank that gives up (its step failed again when redone): no recovery;
  the ranks raise and the start ends as a crash, for the restart from a checkpoint.

Pure: standard library only, no torch, so it is tested on recorded reports.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

# What a collective raises when a peer is gone: torch's own exception types, and the words
# of the backends' messages for a RuntimeError (gloo: "Connection closed by peer",
# "Connection reset by peer"; NCCL: "NCCL error", a watchdog's "Timed out").
PEER_LOSS_TYPES = frozenset({"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"})
PEER_LOSS_WORDS = ("connection closed by peer", "connection reset by peer", "broken pipe", "gloo",
                   "nccl", "timed out", "socket timeout")


class PeerRecoveryImpossible(RuntimeError):
    """No live peer can restore the failed ranks: the start ends as a crash."""


@dataclass(frozen=True)
class Report:
    """One rank's account of a failure, as every rank reads it from the store."""

    rank: int
    committed: int          # the last step whose optimizer update this rank completed
    failed: bool            # its own step raised (not a peer lost inside a collective)
    error: str              # the exception, one line
    retry: bool = True      # False: this rank gives up (the same step failed on it again)
    replaced: bool = False  # a process started in place of this rank's lost one reports (failed, no state)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Report:
        data = json.loads(text)
        return cls(rank=int(data["rank"]), committed=int(data["committed"]), failed=bool(data["failed"]),
                   error=str(data["error"]), retry=bool(data.get("retry", True)),
                   replaced=bool(data.get("replaced", False)))


@dataclass(frozen=True)
class RecoveryPlan:
    """What every rank does to recover: the same on all of them."""

    generation: int                 # the process group's generation formed for it
    resume_after: int               # the step whose state every rank holds afterwards
    source: int                     # the rank that sends it
    receivers: tuple[int, ...]      # the ranks that load it
    failed: tuple[int, ...]         # the ranks whose own step raised, or whose process was lost
    replaced: tuple[int, ...] = ()  # of them, the ranks whose process was lost and started again

    @property
    def redo(self) -> int:
        """The step every rank runs next."""
        return self.resume_after + 1

    def describe(self) -> str:
        who = ", ".join(str(r) for r in self.failed) or "none"
        to = ", ".join(str(r) for r in self.receivers) or "no rank"
        replaced = ", ".join(str(r) for r in self.replaced)
        return (f"failed rank(s) {who}; state of step {self.resume_after} from rank {self.source} "
                f"to rank(s) {to}; the ranks go on at step {self.redo} (generation {self.generation})"
                + (f"; rank(s) {replaced} lost their process and were started again" if replaced else ""))


def plan_recovery(generation: int, reports: Sequence[Report], world_size: int) -> RecoveryPlan:
    """The plan of the module's docstring, from every rank's report (PeerRecoveryImpossible
    when there is none to recover from)."""
    ranks = sorted(r.rank for r in reports)
    if ranks != list(range(world_size)):
        raise PeerRecoveryImpossible(f"reports from ranks {ranks}, expected 0..{world_size - 1}")
    gave_up = [r for r in reports if not r.retry]
    if gave_up:
        first = min(gave_up, key=lambda r: r.rank)
        if first.replaced:
            raise PeerRecoveryImpossible(f"rank {first.rank}'s process was lost and {first.error}")
        raise PeerRecoveryImpossible(f"rank {first.rank} failed again at the step redone: {first.error}")
    survivors = [r for r in reports if not r.failed and not r.replaced]
    if not survivors:
        raise PeerRecoveryImpossible("every rank's own step failed: no live peer holds a whole state")
    resume_after = max(r.committed for r in survivors)
    source = min(r.rank for r in survivors if r.committed == resume_after)
    receivers = tuple(sorted(r.rank for r in reports if r.failed or r.committed != resume_after))
    failed = tuple(sorted(r.rank for r in reports if r.failed))
    replaced = tuple(sorted(r.rank for r in reports if r.replaced))
    return RecoveryPlan(generation=generation, resume_after=resume_after, source=source,
                        receivers=receivers, failed=failed, replaced=replaced)


def is_peer_loss(type_names: Iterable[str], message: str) -> bool:
    """Whether an exception (the names of its classes, its message) is a collective that
    lost a peer rather than this rank's own failure."""
    names = set(type_names)
    if PEER_LOSS_TYPES & names:
        return True
    text = message.lower()
    return "RuntimeError" in names and any(word in text for word in PEER_LOSS_WORDS)
