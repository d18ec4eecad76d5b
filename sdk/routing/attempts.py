"""One request's attempt budget: which target to try next, and when.

Every target of the route gets `retry.max_attempts` attempts. After a failure a target is ready
again after its backoff (a server hint or full jitter, sdk/routing/backoff.py), or leaves the
request for good (401/403, a hint over the cap, its last attempt). The next attempt goes to a
target that is ready now, preferring one with no attempt of this request already running, then one
tried fewer times (so targets take turns: rounds), then the strategy's order; with none ready, the
request waits for the first to become ready. So a failed target is left for the next one at once,
and when all have failed the request waits only for the first of them to be ready again: the
"rounds over the targets" of docs/routing.md, without waiting for a round to finish when a hedge
is running beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from sdk.policy import RetryPolicy, Target
from sdk.routing.backoff import Decision, FirstByteTimeout, Step, decide


@dataclass(slots=True)
class TargetSlot:
    target: Target
    key: str  # target_key: breakers and statistics
    rank: int  # place in the strategy's order
    attempts_left: int
    ready_at: float = 0.0  # monotonic time it may be tried again
    running: int = 0  # attempts of this request on it now
    retired: bool = False

    @property
    def usable(self) -> bool:
        return not self.retired and self.attempts_left > 0


@dataclass(slots=True)
class Leg:
    """A running attempt: its target, and when it counts as slow (no first byte by the hedge delay)."""

    slot: TargetSlot
    hedge_at: float


class AttemptPlan:
    def __init__(self, targets: list[Target], keys: list[str], retry: RetryPolicy):
        self.retry = retry
        self.slots = [TargetSlot(t, k, rank, retry.max_attempts) for rank, (t, k) in enumerate(zip(targets, keys, strict=True))]

    def split(self, now: float) -> tuple[list[TargetSlot], float | None]:
        """Targets that may be tried now, best first, and when the next of the others is ready (None: no
        other has attempts left). Best: not already running, then fewest attempts made (rounds), then rank."""
        usable = [s for s in self.slots if s.usable]
        ready = sorted((s for s in usable if s.ready_at <= now), key=lambda s: (s.running > 0, -s.attempts_left, s.rank))
        later = min((s.ready_at for s in usable if s.ready_at > now), default=None)
        return ready, later

    def started(self, slot: TargetSlot) -> None:
        slot.attempts_left -= 1
        slot.running += 1

    def finished(self, slot: TargetSlot) -> None:
        slot.running -= 1

    def failed(self, slot: TargetSlot, error: BaseException, now: float) -> Decision:
        """Book a failed attempt; FAIL means the error is the client's own and nothing else is tried."""
        self.finished(slot)
        decision = decide(error, self.retry.max_attempts - slot.attempts_left - 1, self.retry)
        if decision.step is Step.RETRY:
            slot.ready_at = max(slot.ready_at, now + decision.delay_s)
        elif isinstance(error, FirstByteTimeout):
            pass  # a stall may pass: the target keeps its remaining attempts, ready at once
        else:
            slot.retired = True
        return decision
