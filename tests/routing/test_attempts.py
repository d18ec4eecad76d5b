"""The attempt budget of one request: which target next, and when (sdk/routing/attempts.py)."""

from __future__ import annotations

import pytest

from sdk.errors import UpstreamHTTPError
from sdk.policy import RetryPolicy, Target
from sdk.routing.attempts import AttemptPlan
from sdk.routing.backoff import FirstByteTimeout, Step

RETRY = RetryPolicy(max_attempts=2, base_delay_ms=100, max_delay_ms=2000)


def _plan(retry: RetryPolicy = RETRY) -> AttemptPlan:
    targets = [Target(provider="a"), Target(provider="b")]
    return AttemptPlan(targets, ["a/m", "b/m"], retry)


def _http(status: int, **headers: str) -> UpstreamHTTPError:
    return UpstreamHTTPError(status, b"{}", headers, "t/m")


def _keys(slots) -> list[str]:
    return [slot.key for slot in slots]


def test_targets_take_turns_and_backoff_sets_when_a_target_is_ready_again():
    plan = _plan()
    ready, later = plan.split(0.0)
    assert _keys(ready) == ["a/m", "b/m"] and later is None
    first = ready[0]
    plan.started(first)
    assert plan.failed(first, _http(429, **{"retry-after-ms": "300"}), 10.0).step is Step.RETRY
    ready, later = plan.split(10.0)
    assert _keys(ready) == ["b/m"] and later == 10.3  # the other target at once; `a` after its hint
    second = ready[0]
    plan.started(second)
    plan.failed(second, _http(500), 10.01)
    ready, later = plan.split(10.5)
    assert _keys(ready) == ["a/m", "b/m"]  # both ready again, one attempt each: the strategy's order
    assert all(s.attempts_left == 1 for s in plan.slots)


def test_a_running_target_comes_after_an_idle_one_and_the_budget_ends():
    plan = _plan(RetryPolicy(max_attempts=1))
    a, b = plan.slots
    plan.started(a)
    assert _keys(plan.split(0.0)[0]) == ["b/m"]  # `a` has no attempt left
    plan.started(b)
    assert plan.split(0.0) == ([], None)


def test_stalls_keep_the_target_and_refusals_retire_it():
    plan = _plan()
    a, b = plan.slots
    plan.started(a)
    assert plan.failed(a, FirstByteTimeout("stalled"), 1.0).step is Step.NEXT
    assert a.usable and a.ready_at == 0.0  # a stall may pass: ready at once, one attempt left
    plan.started(b)
    assert plan.failed(b, _http(401), 1.0).step is Step.NEXT
    assert not b.usable  # our key is wrong there: never again in this request
    plan.started(a)
    assert plan.failed(a, _http(400), 2.0).step is Step.FAIL


def test_a_hint_over_the_cap_retires_the_target():
    plan = _plan(RetryPolicy(max_attempts=3, max_delay_ms=500))
    a, _ = plan.slots
    plan.started(a)
    assert plan.failed(a, _http(429, **{"retry-after": "30"}), 0.0).step is Step.NEXT
    assert _keys(plan.split(0.0)[0]) == ["b/m"]


def test_hedge_delay_is_the_p95_of_a_long_window():
    from sdk.routing.strategies import TargetStats

    stats = TargetStats()
    assert stats.p95_ttfb_s(min_samples=20) is None
    for i in range(100):
        stats.success(0.2 + i / 1000)
    assert stats.p95_ttfb_s(min_samples=20) == pytest.approx(0.295)
    for burst in (False, True, False):  # one burst of slow samples (a pause on our side): 3% of the window
        for _ in range(32 if burst else 500):
            stats.success(0.6 if burst else 0.2)
    assert stats.p95_ttfb_s(min_samples=20) == 0.2
