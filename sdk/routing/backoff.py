"""What to do after a failed attempt: retry the same target after a delay, move on, or give up.

Backoff is exponential with full jitter and a cap (AWS's "full jitter": uniform in [0, min(cap,
base·2^n)]), so synchronized clients spread out. Server hints (retry-after-ms, retry-after,
x-should-retry) are honoured only within the policy's bounds: a hint longer than `max_delay_ms`
sends the request to the next target at once instead of parking it (LiteLLM and the official SDKs
either cap or ignore long hints; waiting 30 s for a 429 while another target is free helps no one).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from enum import Enum

from sdk.errors import (
    ProviderUnavailableError,
    SlipstreamError,
    UpstreamHTTPError,
    UpstreamTimeoutError,
    UpstreamUnreachableError,
)
from sdk.policy import RetryPolicy
from sdk.streams import close_after
from sdk.types import LLMStream, Timings

# 401/403 from a provider mean *our* upstream key is wrong there: try the next target, never retry.
NEXT_TARGET_STATUSES = frozenset({401, 403})
RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


class StreamFailedBeforeFirstByte(SlipstreamError):
    """A stream whose first event was an error: nothing reached the client, so it can be retried."""

    status = 502

    def __init__(self, event: bytes, route: str):
        super().__init__(f"{route} failed before its first event")
        self.event = event


async def primed(stream: LLMStream, timings: Timings) -> LLMStream:
    """`stream` once its first event has arrived, so a stream that fails at once can still be retried
    (raises StreamFailedBeforeFirstByte, the stream closed)."""
    try:
        with timings.upstream():
            first = await anext(stream.events)
    except StopAsyncIteration:
        first = b""
    except BaseException:
        await stream.aclose()
        raise
    if not first or first.startswith((b"event: error", b'data: {"error"')):
        await stream.aclose()
        raise StreamFailedBeforeFirstByte(first, stream.route)
    stream.events = _prepend(first, stream.events)
    return stream


async def _prepend(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        yield first
        async for event in rest:
            yield event
    finally:
        await close_after(rest)


class TranslationRefused(SlipstreamError):
    """The request uses something the target's protocol cannot express; nothing was sent."""

    status = 400


class FirstByteTimeout(UpstreamTimeoutError):
    """No first byte within the policy's per-attempt limit: the target is abandoned, the next one tried."""


class Step(Enum):
    RETRY = "retry"  # same target, after `delay_s`
    NEXT = "next"  # next target now
    FAIL = "fail"  # the client's own error: answer it as it is


@dataclass(frozen=True, slots=True)
class Decision:
    step: Step
    delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Blame:
    failed: bool  # counts against the target's breaker and error score
    open_now: bool = False  # the breaker opens at once (the target rejected our key)


def blame(exc: BaseException) -> Blame:
    """Whether a failed attempt says something about the target's health."""
    if isinstance(exc, UpstreamHTTPError):
        return Blame(failed=exc.status in NEXT_TARGET_STATUSES or exc.status in RETRYABLE_STATUSES,
                     open_now=exc.status in NEXT_TARGET_STATUSES)
    return Blame(failed=isinstance(exc, (UpstreamUnreachableError, UpstreamTimeoutError, StreamFailedBeforeFirstByte)))


def decide(exc: BaseException, attempt: int, policy: RetryPolicy) -> Decision:
    """Classify one failed attempt (`attempt` counts from 0 on this target).

    RETRY: the target may be tried again after `delay_s`; NEXT: leave it for the rest of the request.
    """
    last = attempt + 1 >= policy.max_attempts
    if isinstance(exc, UpstreamHTTPError):
        if exc.status in NEXT_TARGET_STATUSES:
            return Decision(Step.NEXT)
        should = exc.headers.get("x-should-retry", "").lower() if policy.honor_retry_after else ""
        if should == "false":
            return Decision(Step.NEXT)
        if exc.status not in RETRYABLE_STATUSES and should != "true":
            return Decision(Step.FAIL)
        delay = backoff_delay(attempt, exc.headers, policy)
        return Decision(Step.NEXT) if delay is None or last else Decision(Step.RETRY, delay)
    if isinstance(exc, (ProviderUnavailableError, TranslationRefused, FirstByteTimeout)):
        return Decision(Step.NEXT)
    if isinstance(exc, (UpstreamUnreachableError, UpstreamTimeoutError, StreamFailedBeforeFirstByte)):
        return Decision(Step.NEXT) if last else Decision(Step.RETRY, backoff_delay(attempt, {}, policy) or 0.0)
    return Decision(Step.FAIL)


def backoff_delay(attempt: int, headers: Mapping[str, str], policy: RetryPolicy) -> float | None:
    """Seconds to wait before retry number `attempt + 1`, or None: the hint is over the cap, move on."""
    cap = policy.max_delay_ms / 1000
    if policy.honor_retry_after:
        hinted = retry_after(headers)
        if hinted is not None:
            return hinted if hinted <= cap else None
    return random.uniform(0, min(cap, policy.base_delay_ms / 1000 * 2**attempt))


def retry_after(headers: Mapping[str, str]) -> float | None:
    """The server's hint in seconds: retry-after-ms first (finer), then retry-after (seconds)."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value:
            try:
                return max(0.0, float(value) / scale)
            except ValueError:
                continue  # an HTTP date: rare from LLM providers; fall back to our own backoff
    return None
