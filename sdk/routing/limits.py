"""Team limits as a pipeline stage: requests and tokens per minute, and a concurrency cap.

Each limit is a token bucket (capacity = the per-minute figure, refilled continuously), kept for
the team and, with `limits.per_key`, for each team key (`RequestContext.key_id`). A request is
admitted only if every bucket it touches has room; otherwise it is answered at once with a
provider-shaped 429 and a retry-after saying when there will be room. Tokens are charged from the
answer's real usage when it completes, so a bucket can go into debt and then admits nothing until
refilled: the long-run rate holds without guessing sizes up front. State is per process, like the
breaker's (a shared store can come later behind the same admit/charge calls).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from sdk.errors import RateLimitedError
from sdk.pipeline import Handler, RequestContext
from sdk.policy import Policy, RateLimits
from sdk.services import Services
from sdk.streams import on_end
from sdk.types import Answer, LLMResponse, Usage


@dataclass(slots=True)
class TokenBucket:
    per_minute: float
    tokens: float = field(init=False)
    updated: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.tokens = self.per_minute

    def _refill(self, now: float) -> None:
        self.tokens = min(self.per_minute, self.tokens + (now - self.updated) * self.per_minute / 60)
        self.updated = now

    def wait_s(self, need: float, now: float) -> float:
        """Seconds until `need` tokens are available (0: now)."""
        self._refill(now)
        return max(0.0, (need - self.tokens) * 60 / self.per_minute)

    def charge(self, amount: float, now: float) -> None:
        self._refill(now)
        self.tokens -= amount


class Limiter:
    """The buckets and concurrency count of one team or one key."""

    def __init__(self, limits: RateLimits, scope: str):
        self.scope = scope
        self.limits = limits
        self.requests = TokenBucket(limits.requests_per_minute) if limits.requests_per_minute else None
        self.tokens = TokenBucket(limits.tokens_per_minute) if limits.tokens_per_minute else None
        self.in_flight = 0

    def refusal(self, now: float) -> RateLimitedError | None:
        if self.limits.max_concurrent is not None and self.in_flight >= self.limits.max_concurrent:
            return _limited(f"{self.scope} has {self.in_flight} requests in flight, its limit of {self.limits.max_concurrent}", 1.0)
        if self.requests is not None and (wait := self.requests.wait_s(1, now)) > 0:
            return _limited(f"{self.scope} is over its limit of {self.limits.requests_per_minute} requests per minute", wait)
        # Any positive balance admits: actual usage is charged afterwards (see the module docstring).
        if self.tokens is not None and (wait := self.tokens.wait_s(1e-9, now)) > 0:
            return _limited(f"{self.scope} is over its limit of {self.limits.tokens_per_minute} tokens per minute", wait)
        return None

    def admit(self, now: float) -> None:
        self.in_flight += 1
        if self.requests is not None:
            self.requests.charge(1, now)

    def done(self, usage: Usage | None) -> None:
        self.in_flight -= 1
        if self.tokens is not None and usage is not None:
            self.tokens.charge(usage.total_input_tokens + usage.output_tokens, time.monotonic())


def _limited(message: str, wait_s: float) -> RateLimitedError:
    seconds = max(1, math.ceil(wait_s))
    return RateLimitedError(f"rate limit: {message}; retry in {seconds}s",
                            headers={"retry-after": str(seconds), "retry-after-ms": str(max(1, math.ceil(wait_s * 1000)))})


class LimitsStage:
    name = "limits"

    def __init__(self, policy: Policy):
        limits = policy.limits
        self.team = Limiter(limits, f"team {policy.team}") if limits.active else None
        self.per_key = limits.per_key if limits.per_key.active else None
        self.keys: dict[str, Limiter] = {}

    def _limiters(self, ctx: RequestContext) -> list[Limiter]:
        limiters = [self.team] if self.team is not None else []
        if self.per_key is not None and ctx.key_id:
            limiter = self.keys.get(ctx.key_id)
            if limiter is None:
                limiter = self.keys[ctx.key_id] = Limiter(self.per_key, f"key {ctx.key_id}")
            limiters.append(limiter)
        return limiters

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Answer:
        limiters = self._limiters(ctx)
        now = time.monotonic()
        for limiter in limiters:  # check all before charging any, so a refusal costs nothing
            if (refusal := limiter.refusal(now)) is not None:
                raise refusal
        for limiter in limiters:
            limiter.admit(now)
        try:
            answer = await call_next(ctx)
        except BaseException:
            for limiter in limiters:
                limiter.done(None)
            raise
        if isinstance(answer, LLMResponse):
            for limiter in limiters:
                limiter.done(answer.usage)
        else:
            stream = answer

            def release(_completed: bool) -> None:  # the slot is held until the stream ends; then its real usage is charged
                for limiter in limiters:
                    limiter.done(stream.usage)

            on_end(stream, release)
        return answer


def build_limits(policy: Policy, services: Services) -> LimitsStage | None:
    limits = policy.limits
    return LimitsStage(policy) if limits.active or limits.per_key.active else None
