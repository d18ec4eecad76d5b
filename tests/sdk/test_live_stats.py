"""The status page's recorder: 10-second buckets in a ring, counters, miss causes and percentiles."""

from __future__ import annotations

import random

import numpy as np
import pytest

from sdk.observability import live_stats
from sdk.observability.live_stats import BUCKET_S, BUCKETS, LiveStats, bin_of, merge, percentiles
from sdk.pipeline import CompressionReport, RequestContext
from sdk.types import Endpoint, LLMRequest, Usage


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def ctx(team: str = "alpha", cache: str = "miss", expected: int = 0, cause: str = "",
        compression: tuple[int, int] | None = None) -> RequestContext:
    context = RequestContext(request=LLMRequest(Endpoint.CHAT_COMPLETIONS, {"model": "m"}), team=team, cache_status=cache)
    context.prompt_cache.expected_read, context.prompt_cache.miss_cause = expected, cause
    if compression is not None:
        context.compression = CompressionReport(before=compression[0], after=compression[1])
    return context


def test_counts_land_in_the_bucket_of_their_time_and_age_out():
    clock = Clock()
    stats = LiveStats(clock=clock)
    stats.record(ctx(), "gpt/a", 200, Usage(input_tokens=10), latency=(0.1, 0.2))
    stats.record(ctx(), "gpt/a", 500)
    stats.record(ctx(), "gpt/a", "stream_error")
    stats.record(ctx(), "gpt/a", "cancelled")
    clock.now += BUCKET_S
    stats.record(ctx(), "gpt/a", 429)
    window = stats.window()
    (route,) = window.routes
    assert len(window.times) == BUCKETS and window.times[-1] - window.times[-2] == BUCKET_S
    assert window.times[-1] <= clock.now < window.times[-1] + BUCKET_S
    assert route.counts["requests"][-2:] == [4, 1] and sum(route.counts["requests"]) == 5
    assert route.counts["errors"][-2:] == [2, 1] and route.totals["cancelled"] == 1
    assert route.ttft_ms["p50"][-2] == pytest.approx(100, rel=0.06) and route.ttft_ms["p50"][-1] is None

    clock.now += (BUCKETS - 1) * BUCKET_S  # the first bucket has left the window, the second is the oldest
    assert stats.window().routes[0].totals["requests"] == 1
    clock.now += BUCKET_S
    assert stats.window().routes == []
    stats.record(ctx(), "gpt/a", 200)  # its slot was last used a lap ago: it starts afresh
    assert stats.window().routes[0].totals["requests"] == 1


def test_snapshots_copy_a_past_bucket_once_and_the_current_one_each_time():
    clock = Clock()
    stats = LiveStats(clock=clock)
    stats.record(ctx(), "gpt/a", 200, latency=(0.05, 0.05))
    assert stats.snapshot().window().routes[0].totals["requests"] == 1
    stats.record(ctx(), "gpt/a", 200, latency=(0.5, 0.5))  # the same bucket, still filling: seen next time
    assert stats.window().routes[0].totals["requests"] == 2
    clock.now += BUCKET_S
    first = stats.snapshot()
    (series,) = stats._series.values()
    assert len(series.closed) == 1  # the past bucket, copied once
    stats.record(ctx(), "gpt/a", 500)
    second = stats.snapshot()
    assert first.series[0].rows[0][1] is second.series[0].rows[0][1]
    route = second.window().routes[0]
    assert route.counts["requests"][-2:] == [2, 1] and route.counts["errors"][-2:] == [0, 1]
    assert route.e2e_ms["p99"][-2] == pytest.approx(500, rel=0.06) and route.e2e_total_ms["p50"] == pytest.approx(50, rel=0.06)
    clock.now += BUCKETS * BUCKET_S
    stats.snapshot()
    assert series.closed == {}  # gone with the window


def test_percentiles_are_within_the_bins_error():
    rng = random.Random(7)
    samples = sorted(rng.lognormvariate(-2, 1) for _ in range(5000))  # seconds, median ~0.135 s
    histogram = np.zeros((1, len(live_stats.BIN_VALUES_MS)), np.int64)
    for value in samples:
        histogram[0, bin_of(value)] += 1
    found = percentiles(histogram)
    for name, q in live_stats.QUANTILES.items():
        exact_ms = samples[int(np.ceil(q * len(samples))) - 1] * 1000
        assert found[name][0] == pytest.approx(exact_ms, rel=0.06), name
    assert percentiles(np.zeros((2, len(live_stats.BIN_VALUES_MS)), np.int64))["p99"] == [None, None]
    assert bin_of(0) == 0 and bin_of(1e9) == len(live_stats.BIN_VALUES_MS) - 1


def test_caches_compression_and_miss_causes():
    stats = LiveStats(clock=Clock())
    stats.record(ctx(cache="exact-hit"), "cache/gpt/a", 200, Usage(input_tokens=50))
    stats.record(ctx(cache="semantic-hit"), "cache/gpt/a", 200)
    # answered upstream: prompt-cache tokens read against expected, with the stage's named cause
    stats.record(ctx(expected=800, cause="system_changed@system"), "gpt/a", 200, Usage(input_tokens=200, cache_read_tokens=800))
    # read far less than expected and no cause named: the entry expired or was evicted upstream
    stats.record(ctx(expected=1000, compression=(900, 300)), "gpt/a", 200, Usage(input_tokens=1000, cache_read_tokens=100))
    window = stats.window()
    series, totals, causes = merge(window.of_team("alpha"))
    assert totals["exact_hits"] == 1 and totals["semantic_hits"] == 1 and totals["requests"] == 4
    assert totals["input_tokens"] == 2100  # cache hits read nothing from a provider: not counted
    assert totals["cache_read_tokens"] == 900 and totals["expected_read_tokens"] == 1800
    assert totals["compression_before"] == 900 and totals["compression_after"] == 300
    assert causes == {"system_changed@system": 1, "expired_or_evicted": 1}
    assert series["requests"][-1] == 4 and window.teams() == ["alpha"]


def test_miss_causes_are_capped_per_bucket():
    stats = LiveStats(clock=Clock())
    for i in range(live_stats.MAX_CAUSES + 5):
        stats.record(ctx(cause=f"messages_changed@messages[{i}]"), "gpt/a", 200, Usage(input_tokens=10))
    causes = stats.window().routes[0].causes
    assert len(causes) == live_stats.MAX_CAUSES + 1 and causes["other"] == 5


def test_teams_and_routes_are_separate_series():
    stats = LiveStats(clock=Clock())
    stats.record(ctx("alpha"), "gpt/a", 200)
    stats.record(ctx("alpha"), "claude/b", 200)
    stats.record(ctx("beta"), "gpt/a", 200)
    window = stats.window()
    assert [(r.team, r.route) for r in window.routes] == [("alpha", "claude/b"), ("alpha", "gpt/a"), ("beta", "gpt/a")]
    assert window.teams() == ["alpha", "beta"]


def test_off_until_enabled(monkeypatch):
    monkeypatch.setattr(live_stats, "_recorder", None)
    live_stats.record(ctx(), "gpt/a", 200)  # no recorder: nothing happens, nothing fails
    assert live_stats.recorder() is None
    recorder = live_stats.enable()
    assert live_stats.enable() is recorder and recorder.bucket_s == BUCKET_S
    short = live_stats.enable(LiveStats(bucket_s=1))  # what the browser test installs
    assert live_stats.recorder() is short and live_stats.enable() is short
    recorder = live_stats.enable(LiveStats())
    live_stats.record(ctx(), "gpt/a", 200)
    assert recorder.window().routes[0].totals["requests"] == 1


def test_workers_buckets_add_up_through_their_published_copies():
    """`--workers`: a page adds the other workers' published copies to its own buckets, aligned on
    time, so its counters and percentiles are those of all the traffic."""
    from sdk.observability.live_workers import decode, encode, merged

    clock_a, clock_b, both = Clock(), Clock(), LiveStats(clock=Clock())
    a, b = LiveStats(clock=clock_a), LiveStats(clock=clock_b)
    rng = random.Random(3)
    for step in range(30):
        for stats, clock in ((a, clock_a), (b, clock_b))[:1 if step >= 20 else 2]:  # b stops earlier
            clock.now = both._clock.now = 1_000_000.0 + step * BUCKET_S / 3  # type: ignore[attr-defined]
            latency = (rng.uniform(0.01, 2), rng.uniform(2, 9))
            team = rng.choice(["alpha", "beta"])
            cause = rng.choice(["", "system@0", "tools@0"])
            stats.record(ctx(team=team, expected=10, cause=cause), "gpt/a", 200, Usage(input_tokens=10), latency=latency)
            both.record(ctx(team=team, expected=10, cause=cause), "gpt/a", 200, Usage(input_tokens=10), latency=latency)
    # b's copy was taken three buckets before a's snapshot: the buckets still line up by time
    copy = decode(encode(b.snapshot()))
    assert merged(a.snapshot(), [copy]).window() == both.window()
    assert merged(a.snapshot(), []).window() == a.window()
