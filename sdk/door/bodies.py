"""The request bodies a serving process holds at once, bounded, each team its share.

Each team's body limit (`limits.max_body_bytes`, up to 32 MiB by default) bounds one request; nothing
bounded them all together, so one team's many concurrent large requests could hold the memory every
team's requests share until the process ran out of it. A request's body is counted from the moment it
is read (its declared `content-length` before a byte of it, else its bytes as they arrive) until its
answer has ended (a whole answer handed back, or a stream closed however it ended): the parsed request
lives that long.

The rule is the one every shared queue of the gateway uses (`sdk/shares.py:FairShares`, one place a
byte): up to half the budget, any team's request is taken; past it, a team is taken only while it
holds less than its share of that half (the half over the teams holding bodies), and never past the
whole budget. A request that cannot be taken is refused at once with its provider's 429 (its team
holds its share) or 503 (the process is full), with `retry-after`, never queued: a queue of waiting
bodies would be the unbounded memory again. Each request counts at least its part of the budget by the
process's connection cap (`per_request`: 256 KiB of the default 1 GiB over 4,096 connections), so the same
rule keeps one team's many small requests from taking every connection. Counting only: no lock (the door runs on one event loop)
and no await, so a small request pays a few additions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from sdk.errors import RateLimitedError, SlipstreamError
from sdk.observability.metrics import BODY_REFUSALS
from sdk.shares import FairShares

DEFAULT_BUDGET_BYTES = 1 << 30  # --max-body-bytes-in-flight: a team alone holds up to half (16 bodies of 32 MiB)
RETRY_AFTER_S = "1"  # bodies are let go as answers end: a second is many answers


class BodyBudget:
    """The process's budget of body bytes (None: counted, never refused, as in the drop-in SDK,
    whose bodies are its application's own memory already)."""

    __slots__ = ("budget_bytes", "per_request", "shares")

    def __init__(self, budget_bytes: int | None = DEFAULT_BUDGET_BYTES, requests: int | None = None):
        self.budget_bytes = budget_bytes
        self.shares = FairShares(budget_bytes // 2 if budget_bytes is not None else 1 << 62)
        # Each request in flight also holds one of the process's `requests` connections (--max-connections),
        # whatever its body: it counts at least its part of the budget, so a team's share of the budget is
        # its share of the connections too. Counted by bytes alone, a team's many small slow requests took
        # every connection, and another team's were answered 503 at the connection cap.
        self.per_request = budget_bytes // requests if budget_bytes is not None and requests else 0

    def hold(self, team: str) -> BodyHold:
        return BodyHold(self, team)

    def _refusal(self, team: str, amount: int, own: int = 0) -> SlipstreamError:
        """The refusal of `amount` more for `team`, whose request being refused holds `own` already (its place)."""
        shares = self.shares
        if shares.held(team) + amount > shares.share(team):
            BODY_REFUSALS.labels(team, "share").inc()
            # The team's own bytes, not its share: the share is the budget over the teams holding bodies
            # now, so its figure told a team how many others had requests in flight.
            each = f" (each request counts at least {self.per_request}, its part of the process's connections)" if self.per_request else ""
            return RateLimitedError(
                f"this team's requests in flight hold {shares.held(team) - own} bytes of request bodies{each}, its share of the bodies "
                "this gateway process holds for every team at once; retry after the time the retry-after header gives",
                headers={"retry-after": RETRY_AFTER_S})
        BODY_REFUSALS.labels(team, "full").inc()
        return SlipstreamError(
            f"this gateway process holds as many request bodies as it may at once ({self.budget_bytes} bytes); "
            "retry after the time the retry-after header gives", status=503, headers={"retry-after": RETRY_AFTER_S})


class BodyHold:
    """One request's bytes in the budget: taken as its body is read, let go once (`release`)."""

    __slots__ = ("_budget", "_team", "held", "streaming")

    def __init__(self, budget: BodyBudget, team: str):
        self._budget, self._team = budget, team
        self.held = 0
        self.streaming = False  # let go by the stream's close (`until`), not when the answer is in hand

    def need(self, size: int) -> None:
        """The body is `size` bytes so far (or declared): take what is not held yet (at least the request's
        part of the budget, `per_request`), or raise the refusal."""
        size = max(size, self._budget.per_request)
        more = size - self.held
        if more > 0:
            if not self._budget.shares.take(self._team, more):
                raise self._budget._refusal(self._team, more, self.held)
            self.held = size

    def until(self, close: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        """A stream's `close` that lets this hold go too: the request lives until its stream ends."""
        self.streaming = True

        async def closed() -> None:
            try:
                await close()
            finally:
                self.release()

        return closed

    def release(self) -> None:
        if self.held:
            self._budget.shares.give_back(self._team, self.held)
            self.held = 0
