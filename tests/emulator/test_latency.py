"""The emulator's latency model: deterministic by default, a median-1 lognormal TTFT factor on request."""

from __future__ import annotations

import random
import statistics

import pytest

from emulator.app import EmulatorConfig


def test_ttft_is_deterministic_without_jitter():
    config = EmulatorConfig.realistic(ttft_base_ms=200)
    values = {config.ttft_seconds(100, 0) for _ in range(50)}
    assert len(values) == 1 and values.pop() == pytest.approx(0.2 + 0.05 * 100 / 1000)


def test_ttft_jitter_keeps_the_median_and_stretches_the_tail():
    random.seed(7)
    config = EmulatorConfig(ttft_base_ms=200, ttft_jitter=0.3)
    samples = sorted(config.ttft_seconds(0, 0) for _ in range(4000))
    median, p99 = statistics.median(samples), samples[int(0.99 * len(samples))]
    assert 0.19 < median < 0.21
    assert 1.8 < p99 / median < 2.25  # exp(2.326 * 0.3) = 2.01
