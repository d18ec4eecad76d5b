"""Admission without waiting for Redis while every limit a request touches is far from reached.

Each admission Redis answers says how much room its buckets and slot sets had left after it. While
that room is large, waiting for Redis cannot change the answer, so this replica grants the next
admission at once and sends the same charge to Redis in the background (the script's `force`
mode: charged, not checked). The bound that keeps limits exact: a replica admits ahead only while

    (its admissions not yet answered + 1) × replicas × cost ≤ room it last heard of / 2

for every request bucket and concurrency cap (cost: the requests or slots one admission takes), so
even if every replica did the same at the same moment, together they would use at most half the room. The room a replica heard may be up to
`MAX_AGE_S` old, and what other replicas admitted *after checking* in that time is not in it: with
two workers at 5 requests/minute, one worker drained the bucket while the other still held the room
it heard a moment before and let a sixth request through. So a bucket or cap also needs
`AHEAD_MIN_ROOM` units of room before anything goes ahead: below that (small limits, where one
request is a large share) every admission is checked in Redis and the limit is exact; above it, an
overshoot would need the other replicas to take more than half the room within one second; a token bucket (charged after the
call, from usage) needs half its capacity left, a budget half of it neither spent nor held by requests
in flight after this one's share of reservations. Each answer, to a
checked admission or to an ahead one's background charge, refreshes the room; room older than
`MAX_AGE_S` is forgotten. Near a limit (a team at its rate; the limits benchmark) every admission is
checked in Redis, as before; far from it (most traffic) a request waits for nothing. This
replica's own settlements (tokens, spend) take from the room at once; other replicas' show in the
next answer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sdk.state.backend import Admission, Settlement

MAX_AGE_S = 1.0
AHEAD_MIN_ROOM = 64  # requests (or leases) of room a bucket or cap needs before admitting ahead


@dataclass(slots=True)
class Headroom:
    _room: dict[str, tuple[float, float]] = field(default_factory=dict)  # key → (room left, when heard)
    unanswered: int = 0  # ahead admissions whose background charge Redis has not answered yet

    def grants(self, admission: Admission, replicas: int) -> bool:
        """True when `admission` may go ahead without waiting for Redis."""
        now = time.monotonic()
        share = (self.unanswered + 1) * replicas
        for rate in admission.rates:
            left = self._left(rate.key, now)
            if left is None or (left < rate.per_minute / 2 if rate.cost <= 0 else left < AHEAD_MIN_ROOM * rate.cost or share * rate.cost > left / 2):
                return False
        for cap in admission.caps:
            left = self._left(cap.key, now)
            if left is None or left < AHEAD_MIN_ROOM * cap.weight or share * cap.weight > left / 2:
                return False
        budget = admission.budget
        if budget is not None:
            left = self._left(budget.key, now)
            if left is None or left - share * budget.reserve < budget.usd / 2:
                return False
        return True

    def _left(self, key: str, now: float) -> float | None:
        seen = self._room.get(key)
        return seen[0] if seen is not None and now - seen[1] < MAX_AGE_S else None

    def heard(self, admission: Admission, levels: list[float], held: list[float], spent: float) -> None:
        """Redis admitted `admission`: its buckets' levels and its caps' leases after the charge."""
        now = time.monotonic()
        if len(self._room) >= 4096:  # per-key scopes come and go: keep it bounded
            self._room.clear()
        for rate, level in zip(admission.rates, levels, strict=True):
            self._room[rate.key] = (level, now)
        for cap, count in zip(admission.caps, held, strict=True):
            self._room[cap.key] = (cap.limit - count, now)
        if admission.budget is not None:
            self._room[admission.budget.key] = (admission.budget.usd - spent, now)

    def settled(self, settlement: Settlement) -> None:
        """This replica charged tokens or spend: less room than Redis last said."""
        for rate, amount in settlement.charges:
            self._spend(rate.key, amount)
        if settlement.spend is not None:
            for key, _ in settlement.spend.records:
                self._spend(key, settlement.spend.usd)

    def _spend(self, key: str, amount: float) -> None:
        seen = self._room.get(key)
        if seen is not None:
            self._room[key] = (seen[0] - amount, seen[1])

    def refused(self, admission: Admission) -> None:
        """Redis refused: none of its limits has room to spare."""
        for key in (*(r.key for r in admission.rates), *(c.key for c in admission.caps)):
            self._room.pop(key, None)
        if admission.budget is not None:
            self._room.pop(admission.budget.key, None)
