"""Backoff delays stay within bounds and server hints are honoured only within policy limits."""

from __future__ import annotations

from sdk.errors import UpstreamHTTPError, UpstreamUnreachableError
from sdk.policy import RetryPolicy
from sdk.routing.backoff import FirstByteTimeout, Step, backoff_delay, decide

POLICY = RetryPolicy(max_attempts=4, base_delay_ms=100, max_delay_ms=1000)


def error(status: int, **headers: str) -> UpstreamHTTPError:
    return UpstreamHTTPError(status, b"{}", headers, "p/m")


def test_full_jitter_within_exponential_cap():
    for attempt, ceiling in [(0, 0.1), (1, 0.2), (2, 0.4), (3, 0.8), (6, 1.0)]:
        delays = [backoff_delay(attempt, {}, POLICY) for _ in range(300)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling * 0.7  # full jitter spreads over the whole range


def test_retry_after_headers_within_bounds():
    assert backoff_delay(0, {"retry-after": "0.5"}, POLICY) == 0.5
    assert backoff_delay(0, {"retry-after-ms": "250", "retry-after": "9"}, POLICY) == 0.25  # ms is finer: first
    assert backoff_delay(0, {"retry-after": "30"}, POLICY) is None  # over max_delay_ms: next target now
    ignoring = POLICY.model_copy(update={"honor_retry_after": False})
    assert backoff_delay(0, {"retry-after": "30"}, ignoring) <= 0.1


def test_decisions():
    assert decide(error(429, **{"retry-after": "0.2"}), 0, POLICY).step is Step.RETRY
    assert decide(error(429, **{"retry-after": "0.2"}), 3, POLICY).step is Step.NEXT  # attempts used up
    assert decide(error(529), 0, POLICY).step is Step.RETRY
    assert decide(error(401), 0, POLICY).step is Step.NEXT
    assert decide(error(400), 0, POLICY).step is Step.FAIL  # the client's own error
    assert decide(error(400, **{"x-should-retry": "true"}), 0, POLICY).step is Step.RETRY
    assert decide(error(503, **{"x-should-retry": "false"}), 0, POLICY).step is Step.NEXT
    assert decide(UpstreamUnreachableError("reset"), 0, POLICY).step is Step.RETRY

    assert decide(FirstByteTimeout("stalled"), 0, POLICY).step is Step.NEXT  # a stalled target is abandoned
