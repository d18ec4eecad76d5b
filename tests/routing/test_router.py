"""Retries, fallback, timeouts, deadlines and hedging through a TeamRuntime against the emulator's faults.

Every request must end in a complete answer or a clear error, with no duplicated or spliced output,
and every abandoned upstream call must be cancelled (the emulator counts them).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

import orjson
import pytest

from sdk.errors import UpstreamHTTPError, UpstreamTimeoutError
from tests.helpers import PATIENCE_S, STALL_MS
from tests.routing.conftest import collect, inject, messages_request

T = TypeVar("T")


async def within(call: Awaitable[T]) -> T:
    """`call`, failed if it is not done within PATIENCE_S: where a test proves that a request does not
    wait for a stall (STALL_MS, far longer), it finishes in milliseconds, or waited and fails here."""
    return await asyncio.wait_for(call, PATIENCE_S)


async def cancelled(emulator, count: int) -> dict:
    """The emulator's counters once `count` abandoned upstream calls were cancelled."""
    return await asyncio.to_thread(
        emulator.wait_for, lambda s: s["cancelled_requests"] + s["cancelled_streams"] == count, PATIENCE_S)


def _events(body: bytes) -> list[str]:
    return [line[7:] for line in body.decode().splitlines() if line.startswith("event: ")]


def _complete_stream(body: bytes) -> None:
    events = _events(body)
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert events.count("message_start") == 1 and events.count("message_stop") == 1  # nothing spliced


async def test_retry_after_ms_is_honoured(build_runtime, fresh_emulator):
    runtime = build_runtime(extra="retry: {max_attempts: 3, base_delay_ms: 1, max_delay_ms: 1000}\n")
    inject(fresh_emulator, "429:retry_after_ms=150", model="claude-a")
    inject(fresh_emulator, "429:retry_after_ms=150", model="claude-b")
    started = time.perf_counter()
    answer, ctx = await within(runtime.handle(messages_request()))
    assert time.perf_counter() - started >= 0.15  # the hint was waited for (a lower bound: load only adds)
    # Both targets were busy in the first round; the second round came after the 150 ms hint.
    assert ctx.route == "claude/claude-a"
    assert orjson.loads(await collect(answer))["type"] == "message"


async def test_long_retry_after_falls_back_at_once(build_runtime, fresh_emulator):
    runtime = build_runtime(extra="retry: {max_attempts: 3, base_delay_ms: 1, max_delay_ms: 200}\n")
    inject(fresh_emulator, "429:retry_after=30", model="claude-a")
    answer, ctx = await within(runtime.handle(messages_request(stream=True)))  # not the 30 s hint
    assert ctx.route == "claude/claude-b"
    _complete_stream(await collect(answer))


async def test_stream_failing_at_first_event_is_retried_whole(build_runtime, fresh_emulator):
    runtime = build_runtime(extra="retry: {max_attempts: 2, base_delay_ms: 1, max_delay_ms: 10}\n")
    inject(fresh_emulator, "midstream_error:events=0", model="claude-a")
    answer, _ctx = await runtime.handle(messages_request(stream=True))
    _complete_stream(await collect(answer))
    assert fresh_emulator.stats()["requests_total"] == 2


async def test_no_retry_after_first_byte(build_runtime, fresh_emulator):
    runtime = build_runtime(extra="retry: {max_attempts: 3, base_delay_ms: 1, max_delay_ms: 10}\n")
    inject(fresh_emulator, "midstream_error:events=3", model="claude-a")
    answer, _ctx = await runtime.handle(messages_request(stream=True))
    body = await collect(answer)
    events = _events(body)
    assert events[0] == "message_start" and events[-1] == "error"  # ended with a provider-shaped error event
    assert "message_stop" not in events
    assert fresh_emulator.stats()["requests_total"] == 1  # never retried or spliced with another answer


async def test_stalled_target_is_abandoned_and_cancelled(build_runtime, fresh_emulator):
    # The timeout is far above what a loaded machine takes to answer (claude-b must not time out
    # too) and far below the stall.
    runtime = build_runtime(extra="retry: {max_attempts: 2, first_byte_timeout_ms: 2000}\n")
    inject(fresh_emulator, f"stall:ms={STALL_MS}", model="claude-a")
    answer, ctx = await within(runtime.handle(messages_request(stream=True)))
    assert ctx.route == "claude/claude-b"
    _complete_stream(await collect(answer))
    await cancelled(fresh_emulator, 1)


async def test_deadline_bounds_the_whole_request(build_runtime, fresh_emulator):
    runtime = build_runtime(extra="retry: {max_attempts: 3, deadline_ms: 300}\n")
    inject(fresh_emulator, f"stall:ms={STALL_MS}", count=6)
    with pytest.raises(UpstreamTimeoutError):
        await within(runtime.handle(messages_request()))
    stats = await cancelled(fresh_emulator, 1)  # the stalled call was dropped
    assert stats["cancelled_requests"] == 1


async def test_client_errors_are_not_retried(build_runtime, fresh_emulator):
    runtime = build_runtime()
    inject(fresh_emulator, "400", model="claude-a")
    with pytest.raises(UpstreamHTTPError) as error:
        await runtime.handle(messages_request())
    assert error.value.status == 400
    assert fresh_emulator.stats()["requests_total"] == 1


async def test_every_target_failing_ends_in_the_last_error(build_runtime, fresh_emulator):
    runtime = build_runtime(extra="retry: {max_attempts: 2, base_delay_ms: 1, max_delay_ms: 5}\n")
    inject(fresh_emulator, "529", count=10)
    with pytest.raises(UpstreamHTTPError) as error:
        await runtime.handle(messages_request())
    assert error.value.status == 529
    assert fresh_emulator.stats()["requests_total"] == 4  # 2 rounds over 2 targets


async def test_hedge_wins_and_loser_is_cancelled(build_runtime, fresh_emulator):
    runtime = build_runtime(extra="hedging: {enabled: true, delay_ms: 50}\n")
    inject(fresh_emulator, f"stall:ms={STALL_MS}", model="claude-a")
    answer, ctx = await within(runtime.handle(messages_request(stream=True)))
    assert ctx.route == "claude/claude-b"
    _complete_stream(await collect(answer))
    await cancelled(fresh_emulator, 1)
    assert fresh_emulator.stats()["requests_total"] == 2


async def test_fast_primary_needs_no_hedge(build_runtime, fresh_emulator):
    runtime = build_runtime(extra="hedging: {enabled: true, delay_ms: 500}\n")
    _answer, ctx = await runtime.handle(messages_request())
    assert ctx.route == "claude/claude-a"
    assert fresh_emulator.stats()["requests_total"] == 1


@pytest.mark.parametrize("strategy", ["weighted", "lowest_latency", "least_busy"])
async def test_strategies_spread_or_pick(build_runtime, fresh_emulator, strategy):
    routes = f"""  - match: {{model: "claude-*"}}
    strategy: {strategy}
    targets: [{{provider: claude, model: claude-a, weight: 1}}, {{provider: claude, model: claude-b, weight: 3}}]"""
    runtime = build_runtime(routes=routes)
    seen = []
    for _ in range(12):
        answer, ctx = await runtime.handle(messages_request())
        await collect(answer)
        seen.append(ctx.route)
    assert set(seen) <= {"claude/claude-a", "claude/claude-b"}
    if strategy == "weighted":
        assert "claude/claude-b" in seen
    if strategy == "lowest_latency":
        assert len(set(seen)) == 2  # each unmeasured target is tried once, then the faster one is kept


async def test_failed_hedge_is_replaced_without_waiting_for_the_stall(build_runtime, fresh_emulator):
    runtime = build_runtime(extra=f"retry: {{max_attempts: 3, base_delay_ms: 1, max_delay_ms: 10, first_byte_timeout_ms: {STALL_MS}}}\n"
                                  "hedging: {enabled: true, delay_ms: 50}\n")
    inject(fresh_emulator, f"stall:ms={STALL_MS}", model="claude-a")
    inject(fresh_emulator, "500", model="claude-b")
    # a stalls; its hedge on b fails at once and is replaced by a fresh leg (whichever target is
    # ready first), not after a's first-byte timeout.
    answer, _ctx = await within(runtime.handle(messages_request(stream=True)))
    _complete_stream(await collect(answer))
    await cancelled(fresh_emulator, 1)
    assert fresh_emulator.stats()["requests_total"] == 3


async def test_a_stalled_hedge_gets_a_third_leg(build_runtime, fresh_emulator):
    runtime = build_runtime(extra=f"retry: {{first_byte_timeout_ms: {STALL_MS}}}\nhedging: {{enabled: true, delay_ms: 100, max_legs: 3}}\n")
    inject(fresh_emulator, f"stall:ms={STALL_MS}", count=2)
    started = time.perf_counter()
    answer, _ctx = await within(runtime.handle(messages_request(stream=True)))
    assert time.perf_counter() - started >= 0.2  # two hedge delays, then the third leg's answer
    _complete_stream(await collect(answer))
    await cancelled(fresh_emulator, 2)
    assert fresh_emulator.stats()["requests_total"] == 3


async def test_two_legs_at_most_by_default(build_runtime, fresh_emulator):
    runtime = build_runtime(extra="retry: {first_byte_timeout_ms: 2000}\nhedging: {enabled: true, delay_ms: 50}\n")
    inject(fresh_emulator, f"stall:ms={STALL_MS}", count=2)
    answer, _ctx = await within(runtime.handle(messages_request()))
    # Both legs stalled: no third until one of them times out, then a fresh attempt answers.
    assert fresh_emulator.stats()["requests_total"] == 3
    assert orjson.loads(await collect(answer))["type"] == "message"


async def test_concurrent_requests_under_mixed_faults_all_complete_unspliced(build_runtime, fresh_emulator):
    runtime = build_runtime(extra="retry: {max_attempts: 4, base_delay_ms: 1, max_delay_ms: 100, first_byte_timeout_ms: 1500}\n"
                                  "hedging: {enabled: true, delay_ms: 100, max_legs: 3}\n")
    faults = {"500": 8, "529": 6, "429:retry_after_ms=30": 6, "reset": 4, "stall:ms=3000": 4, "midstream_error:events=0": 4}
    for fault, count in faults.items():
        inject(fresh_emulator, fault, count=count)
    queue = iter(range(48))

    async def worker() -> int:
        done = 0
        for _ in queue:
            answer, _ = await runtime.handle(messages_request(stream=True))
            _complete_stream(await collect(answer))
            done += 1
        return done

    assert sum(await within(asyncio.gather(*(worker() for _ in range(8))))) == 48
    stats = await asyncio.to_thread(
        fresh_emulator.wait_for, lambda s: s["open_requests"] + s["open_streams"] == 0, PATIENCE_S)  # nothing left running upstream
    assert stats["faults_injected"] == sum(faults.values())
