"""Upstream time is measured once at the upstream-client boundary: overlapping waits (hedged legs) count once."""

from __future__ import annotations

import pytest

from sdk import types
from sdk.types import Timings


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(types.time, "perf_counter", fake)
    return fake


def test_overlapping_waits_count_their_common_time_once(clock: _Clock) -> None:
    timings = Timings()
    first, second = timings.upstream(), timings.upstream()
    first.__enter__()
    clock.now += 1.0
    second.__enter__()  # a hedged leg starts while the first still waits
    clock.now += 2.0
    first.__exit__(None, None, None)
    clock.now += 0.5
    second.__exit__(None, None, None)
    assert timings.upstream_s == pytest.approx(3.5)  # not 3.0 + 2.5


def test_separate_waits_add_up_and_a_failing_wait_still_counts(clock: _Clock) -> None:
    timings = Timings()
    with timings.upstream():
        clock.now += 1.0
    clock.now += 10.0  # the gateway's own time between attempts
    with pytest.raises(RuntimeError), timings.upstream():
        clock.now += 0.25
        raise RuntimeError("upstream reset")
    assert timings.upstream_s == pytest.approx(1.25)
