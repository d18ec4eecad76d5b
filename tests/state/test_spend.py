"""Pricing: a team's globs before the built-in table, the most specific built-in glob first, cache
tokens at their own prices; spend records per UTC day and month."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sdk.policy import Price
from sdk.spend import cost_usd, periods, price_of, spend_record
from sdk.types import Usage


def test_built_in_prices_pick_the_most_specific_family():
    assert price_of("gpt-5-mini-2025-08-07", {}).output == 2
    assert price_of("gpt-5", {}).output == 10
    assert price_of("claude-opus-4-1-20250805", {}).input == 15
    assert price_of("claude-opus-4-5", {}).input == 5
    assert price_of("my-finetune", {}) is None


def test_a_team_price_wins_and_cache_tokens_have_their_own():
    team = {"claude-sonnet-4*": Price(input=3, output=15, cache_read=0.3, cache_write=6)}
    price = price_of("claude-sonnet-4-5", team)
    assert price.cache_write == 6  # the team's (1h writes), not the built-in 3.75
    usage = Usage(input_tokens=1_000_000, output_tokens=100_000, cache_read_tokens=2_000_000, cache_write_tokens=500_000)
    assert cost_usd(usage, price) == pytest.approx(3 + 1.5 + 0.6 + 3)
    assert Price(input=2, output=8).cache_read == 2  # unspecified cache prices default to the input price


def test_spend_records_are_per_utc_day_and_month():
    at = datetime(2026, 12, 31, 23, 0, tzinfo=UTC).timestamp()
    day, month = periods(at)
    assert (day.id, month.id) == ("2026-12-31", "2026-12")
    assert day.keep_s == pytest.approx(3600 + 86_400) and month.keep_s == pytest.approx(3600 + 86_400)
    record = spend_record("search", "k1", "gpt-5", 0.5)
    assert record.fields == ("total", "model:gpt-5", "key:k1") and len(record.records) == 2
