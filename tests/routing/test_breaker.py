"""Circuit breaker: opens on a failure rate or at once on 401/403, half-opens after cooldown, closes on success."""

from __future__ import annotations

from sdk.policy import BreakerPolicy
from sdk.routing.breaker import BreakerState, InMemoryBreakerStore
from tests.routing.conftest import collect, inject, messages_request

POLICY = BreakerPolicy(window_s=10, min_requests=4, failure_rate=0.5, cooldown_s=2)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_failure_rate_opens_then_half_open_probe_closes():
    clock = Clock()
    store = InMemoryBreakerStore(POLICY, clock)
    for failed in (False, True, False):
        await store.record("t", failed)
    assert await store.state("t") is BreakerState.CLOSED  # under min_requests
    await store.record("t", True)  # 2 of 4 failed
    assert await store.state("t") is BreakerState.OPEN
    assert not await store.acquire("t")
    clock.now += 2
    assert await store.state("t") is BreakerState.HALF_OPEN
    assert await store.acquire("t")  # the single probe
    assert not await store.acquire("t")
    await store.record("t", False)
    assert await store.state("t") is BreakerState.CLOSED


async def test_probe_failure_reopens_and_cancelled_probe_is_freed():
    clock = Clock()
    store = InMemoryBreakerStore(POLICY, clock)
    await store.record("t", True, open_now=True)  # a 401: open at once
    assert await store.state("t") is BreakerState.OPEN
    clock.now += 2
    assert await store.acquire("t")
    await store.release("t")  # the probe was cancelled: no verdict
    assert await store.acquire("t")
    await store.record("t", True)
    assert await store.state("t") is BreakerState.OPEN


async def test_old_outcomes_leave_the_window():
    clock = Clock()
    store = InMemoryBreakerStore(POLICY, clock)
    for _ in range(3):
        await store.record("t", True)
    clock.now += 11
    await store.record("t", True)
    assert await store.state("t") is BreakerState.CLOSED  # only one outcome is still in the window


async def test_open_target_is_skipped_then_probed(build_runtime, fresh_emulator):
    runtime = build_runtime(extra="retry: {max_attempts: 1}\nbreaker: {min_requests: 2, failure_rate: 0.5, cooldown_s: 30}\n")
    clock = Clock()  # the cooldown passes when the test says, not while a loaded machine is slow
    runtime.pipeline.terminal.breakers._clock = clock
    inject(fresh_emulator, "500", count=2, model="claude-a")
    for _ in range(2):  # claude-a fails, claude-b answers
        answer, ctx = await runtime.handle(messages_request())
        assert ctx.route == "claude/claude-b"
    answer, ctx = await runtime.handle(messages_request())
    assert ctx.route == "claude/claude-b"  # claude-a is open: not even tried
    assert fresh_emulator.stats()["requests_total"] == 5  # 2 failures + 3 answers
    clock.now += 31
    answer, ctx = await runtime.handle(messages_request())
    assert ctx.route == "claude/claude-a"  # half-open probe succeeded: closed again
    assert (await collect(answer)).startswith(b"{")


async def test_a_half_open_target_that_was_not_needed_keeps_its_probe(build_runtime, fresh_emulator):
    runtime = build_runtime(extra="breaker: {cooldown_s: 30}\n")
    breakers = runtime.pipeline.terminal.breakers
    breakers._clock = clock = Clock()
    await breakers.record("claude/claude-b", failed=True, open_now=True)
    clock.now += 31
    assert await breakers.state("claude/claude-b") is BreakerState.HALF_OPEN
    _answer, ctx = await runtime.handle(messages_request())
    assert ctx.route == "claude/claude-a"
    assert await breakers.acquire("claude/claude-b")  # claude-b was never tried, so its probe is still free
