"""sdk.lru.LRU: the bounded map the per-team memories share (least recently used dropped first)."""

from __future__ import annotations

import pytest

from sdk.lru import LRU


def test_the_least_recently_used_entry_is_dropped_first() -> None:
    lru: LRU[str, int] = LRU(3)
    for i, key in enumerate("abc"):
        lru.put(key, i)
    assert lru.get("a") == 0  # a read makes "a" the most recently used: "b" is now the oldest
    lru.put("d", 3)
    assert "b" not in lru
    assert len(lru) == 3
    lru.put("c", 20)  # a write of a known key refreshes it too: "a" is now the oldest
    lru.put("e", 4)
    assert "a" not in lru
    assert [lru.get(k) for k in "cde"] == [20, 3, 4]


def test_pop_and_a_miss_leave_the_order_alone() -> None:
    lru: LRU[str, int] = LRU(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("x") is None
    assert lru.pop("x") is None
    assert lru.pop("b") == 2
    assert len(lru) == 1
    lru.put("c", 3)
    lru.put("d", 4)  # over the bound: "a", the oldest left, goes
    assert "a" not in lru
    assert "c" in lru
    assert "d" in lru


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError):
        LRU(0)
