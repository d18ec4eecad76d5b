"""The store alone: TTL, LRU and size caps per team, persistence, invalidation, isolation, IVF switch."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import numpy as np

from tests.helpers import skip_without_extra, wait_until

skip_without_extra("semantic")  # faiss

from sdk.cache.store import CacheStore, NewEntry, TeamLimits  # noqa: E402

LIMITS = TeamLimits(ttl_s=60, max_entries=100, max_bytes=10**9)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def vec(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(384).astype(np.float32)
    return v / np.linalg.norm(v)


def entry(n: int, team: str = "a", partition: str = "p", size: int = 0) -> NewEntry:
    return NewEntry(team, partition, f"key-{n}", "emu/m", f"question {n}", vec(n), {"n": n, "pad": "x" * size})


def test_ttl_expires_entries(tmp_path: Path):
    clock = Clock()
    store = CacheStore(tmp_path / "c.db", clock=clock)
    store.put(entry(1), LIMITS)
    assert store.get_exact("a", "key-1") is not None
    clock.now += 61
    assert store.get_exact("a", "key-1") is None
    assert store.search("a", "p", vec(1), 4) == []


def test_a_lowered_ttl_applies_to_entries_stored_before(tmp_path: Path):
    """An entry expires at the ttl_s it was stored under; lookups take the team's ttl_s as its policy is
    now (the cache stage passes it), so a reload from 60 s to 10 s stops serving a 30-second-old answer
    (before: served until its own 60 s were up)."""
    clock = Clock()
    store = CacheStore(tmp_path / "c.db", clock=clock)
    store.put(entry(1), LIMITS)
    clock.now += 30
    assert store.get_exact("a", "key-1", max_age_s=60) is not None
    assert store.get_exact("a", "key-1", max_age_s=10) is None
    assert store.search("a", "p", vec(1), 4, max_age_s=10) == []
    assert store.fetch("a", store.search("a", "p", vec(1), 4)[0].id, max_age_s=10) is None


def test_lru_eviction_keeps_recently_used_entries(tmp_path: Path):
    clock = Clock()
    store = CacheStore(tmp_path / "c.db", clock=clock)
    limits = TeamLimits(ttl_s=600, max_entries=3, max_bytes=10**9)
    for n in range(3):
        clock.now += 1
        store.put(entry(n), limits)
    clock.now += 1
    assert store.get_exact("a", "key-0") is not None  # touch the oldest: now the most recent
    clock.now += 1
    store.put(entry(3), limits)
    assert store.count("a") == 3
    assert store.get_exact("a", "key-1") is None  # least recently used went
    assert store.get_exact("a", "key-0") is not None


def test_byte_cap_is_per_team(tmp_path: Path):
    store = CacheStore(tmp_path / "c.db")
    limits = TeamLimits(ttl_s=600, max_entries=100, max_bytes=25_000)
    for n in range(5):
        store.put(entry(n, size=10_000), limits)
        store.put(entry(100 + n, team="b"), LIMITS)
    assert store.count("a") == 2
    assert store.count("b") == 5


def test_entries_and_index_survive_a_restart(tmp_path: Path):
    store = CacheStore(tmp_path / "c.db")
    for n in range(10):
        store.put(entry(n), LIMITS)
    store.close()
    reopened = CacheStore(tmp_path / "c.db")
    assert reopened.get_exact("a", "key-3").response["n"] == 3
    nearest = reopened.search("a", "p", vec(7), 1)[0]
    assert nearest.query == "question 7" and nearest.cosine > 0.999


def test_invalidation_by_key_team_and_all(tmp_path: Path):
    store = CacheStore(tmp_path / "c.db")
    for n in range(3):
        store.put(entry(n), LIMITS)
        store.put(entry(10 + n, team="b"), LIMITS)
    assert store.invalidate(exact_key="key-0") == 1
    assert store.get_exact("a", "key-0") is None and store.search("a", "p", vec(0), 1)[0].query != "question 0"
    assert store.invalidate(team="a") == 2
    assert store.count("a") == 0 and store.count("b") == 3
    assert store.invalidate() == 3
    store.close()
    assert CacheStore(tmp_path / "c.db").count("b") == 0


def test_the_workers_sharing_a_file_see_and_drop_each_others_entries(tmp_path: Path):
    """Two stores on one file, as the workers of `--workers N` without Redis: each looked exact keys
    up in its own map and invalidated only the entries it had stored."""
    one, other = CacheStore(tmp_path / "c.db"), CacheStore(tmp_path / "c.db")
    one.put(entry(1), LIMITS)
    assert other.get_exact("a", "key-1").response["n"] == 1  # an exact hit at once
    other.put(NewEntry("a", "p", "key-1", "emu/m", "question 1", vec(1), {"n": "again"}), LIMITS)  # the same key stored again
    assert one.get_exact("a", "key-1").response["n"] == "again"
    one.put(entry(2), LIMITS)
    assert other.invalidate(team="a") == 2
    assert (one.get_exact("a", "key-2"), one.search("a", "p", vec(2), 1)) == (None, [])
    one.put(entry(3), LIMITS)
    assert other.invalidate(exact_key="key-3") == 1 and one.get_exact("a", "key-3") is None


def test_search_never_crosses_teams_or_partitions(tmp_path: Path):
    store = CacheStore(tmp_path / "c.db")
    store.put(entry(1, team="a"), LIMITS)
    assert store.search("b", "p", vec(1), 4) == []
    assert store.search("a", "other", vec(1), 4) == []
    assert store.get_exact("b", "key-1") is None


def test_large_partitions_switch_to_an_approximate_index(tmp_path: Path):
    store = CacheStore(tmp_path / "c.db", approximate_from=300)
    limits = TeamLimits(ttl_s=600, max_entries=10_000, max_bytes=10**9)
    for n in range(400):
        store.put(entry(n), limits)
    index = store._teams["a"].partitions["p"]
    wait_until(lambda: index.approximate, "the partition's approximate index installed")  # trained in the heavy-work pool
    found = sum(store.search("a", "p", vec(n), 1)[0].query == f"question {n}" for n in range(0, 400, 10))
    assert found >= 36  # IVF may miss a few of 40 at this nprobe; exact search would find all
    store.invalidate(exact_key="key-5")
    assert all(c.query != "question 5" for c in store.search("a", "p", vec(5), 4))


def test_entries_from_another_embedding_space_keep_only_their_exact_tier(tmp_path: Path):
    store = CacheStore(tmp_path / "c.db", space="minilm")
    store.put(entry(1), LIMITS)
    store.close()
    same = CacheStore(tmp_path / "c.db", space="minilm")
    assert [c.id for c in same.search("a", "p", vec(1), 1)] == [1]
    same.close()
    other = CacheStore(tmp_path / "c.db", space="minilm-qqp-0123456789")
    assert other.search("a", "p", vec(1), 1) == []  # its vector is not comparable with the new model's
    assert other.get_exact("a", "key-1") is not None
    other.put(entry(2), LIMITS)
    assert [c.id for c in other.search("a", "p", vec(2), 1)] == [2]


class _Holds:
    """The store's lock, counting the entries each hold of it drops from the in-memory structures."""

    def __init__(self, store: CacheStore) -> None:
        self.lock, self.deleted, self.current = store._lock, [0], 0
        forget = store._forget

        def counted(team: str, ids: list[int], rows: list[tuple[int, int]]) -> None:
            self.current += len(ids)
            forget(team, ids, rows)

        store._forget = counted  # type: ignore[method-assign]

    def __enter__(self) -> None:
        self.lock.acquire()
        self.current = 0

    def __exit__(self, *exc: object) -> None:
        self.deleted.append(self.current)
        self.lock.release()


def test_a_teams_bulk_deletes_hold_the_lock_a_few_hundred_entries_at_a_time(tmp_path: Path):
    """The store's one lock is every team's, and lookups and stores take it on the event loop, which
    serves every team: a team's DELETE /v1/slipstream/cache deleted all its entries (up to its
    max_entries, 10,000 by default: about 0.1 s) in one hold, and a store deleted all of the team's
    expired entries in one, so every team's requests waited. Both go a few hundred entries a hold
    now, the rest of the expired ones at later stores."""
    from sdk.cache import store as cache_store

    clock = Clock()
    store = CacheStore(tmp_path / "c.db", clock=clock)
    limits = TeamLimits(ttl_s=60, max_entries=10_000, max_bytes=10**9)
    for n in range(2_000):
        store.put(entry(n), limits)
    holds = _Holds(store)
    store._lock = holds  # type: ignore[assignment]
    assert store.invalidate(team="a") == 2_000 and store.count("a") == 0
    assert max(holds.deleted) <= cache_store.DELETES_PER_HOLD  # before: 2,000 in one

    for n in range(2_000):
        store.put(entry(n), limits)
    clock.now += 61  # every one of them expired
    holds.deleted = [0]
    store.put(entry(5_000), limits)
    assert max(holds.deleted) <= cache_store.DELETES_PER_HOLD  # before: 2,000 in the store's hold
    assert store.get_exact("a", "key-1") is None and store.get_exact("a", "key-5000") is not None
    for n in range(5):
        store.put(entry(6_000 + n), limits)
    assert store.count("a") == 6


def test_eviction_holds_the_lock_a_few_hundred_entries_at_a_time(tmp_path: Path):
    """A store evicts on the event loop every team's requests share, under the lock every team's lookups
    take. Over the byte cap it evicted one entry per statement until the team fit (a large answer
    beside a team's many small ones: a query and a delete each, 1,709 here), and over a
    lowered max_entries (a policy reload) every entry over it in one hold. A store evicts at most
    DELETES_PER_HOLD entries now, chosen in one read, and later stores evict the rest."""
    from sdk.cache import store as cache_store

    store = CacheStore(tmp_path / "c.db")
    roomy = TeamLimits(ttl_s=600, max_entries=10_000, max_bytes=10**9)
    for n in range(2_000):
        store.put(entry(n, size=1_000), roomy)
    holds = _Holds(store)
    store._lock = holds  # type: ignore[assignment]
    reads = []
    store._writer.set_trace_callback(lambda sql: reads.append(sql) if "ORDER BY last_used_at" in sql else None)
    big = TeamLimits(ttl_s=600, max_entries=10_000, max_bytes=2_000 * 1_500)
    store.put(entry(5_000, size=1_500 * 1_500), big)  # room for about 500 of the small ones beside it
    assert max(holds.deleted) <= cache_store.DELETES_PER_HOLD and len(reads) == 1  # before: 1,709 evicted in one hold, one read each
    while store._team("a").bytes > big.max_bytes:
        store.put(entry(len(holds.deleted) + 6_000), big)
    assert max(holds.deleted) <= cache_store.DELETES_PER_HOLD
    assert store.get_exact("a", "key-5000") is not None and store.get_exact("a", "key-1999") is not None

    holds.deleted = [0]
    fewer = TeamLimits(ttl_s=600, max_entries=10, max_bytes=10**9)
    store.put(entry(9_000), fewer)
    assert max(holds.deleted) <= cache_store.DELETES_PER_HOLD  # before: every entry over 10 in one hold
    while store.count("a") > 10:
        store.put(entry(len(holds.deleted) + 9_000), fewer)
    assert store.get_exact("a", "key-9000") is not None


def test_a_hit_reads_while_another_worker_writes(tmp_path: Path):
    """The workers of `--workers N` share the file, and a lookup runs on the event loop every team's
    requests share: a hit wrote its LRU stamp there, and so waited (up to SQLite's busy timeout,
    5 s, then failed) while another worker wrote. A lookup only reads now; the stamp is written
    with the next store, in time for its eviction."""
    store = CacheStore(tmp_path / "c.db", clock=(clock := Clock()))
    roomy = TeamLimits(ttl_s=60, max_entries=2, max_bytes=10**9)
    store.put(entry(1), roomy)
    clock.now += 1
    store.put(entry(2), roomy)
    other = sqlite3.connect(tmp_path / "c.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another worker in the middle of a write
    store._db.execute("PRAGMA busy_timeout = 0")  # a wait on the reading connection fails at once
    try:
        clock.now += 1
        hit = store.get_exact("a", "key-1")  # before: sqlite3.OperationalError: database is locked
        assert hit is not None and [c.id for c in store.search("a", "p", vec(1), 1)] == [hit.id]
    finally:
        other.execute("ROLLBACK")
    clock.now += 1
    store.put(entry(3), roomy)  # over max_entries: the least recently used goes, key-2, not the hit key-1
    assert store.get_exact("a", "key-1") is not None and store.get_exact("a", "key-2") is None


async def test_the_loop_goes_on_while_a_store_waits_for_another_worker(services):
    """`ResponseCache.put` stores in a thread: on the loop, a store that waited for another worker's
    write held every team's requests until it got the file or failed."""
    from sdk.cache.keys import cache_keys
    from sdk.policy import SemanticCachePolicy
    from sdk.types import Endpoint, LLMRequest

    cache = services.response_cache()
    keys = cache_keys("a", LLMRequest(Endpoint.MESSAGES, {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}))
    other = sqlite3.connect(cache.store.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another worker in the middle of a write
    try:
        stored = asyncio.create_task(cache.put("a", keys, "emu/m", {"content": []}, None, SemanticCachePolicy(enabled=True)))
        for _ in range(5):
            await asyncio.sleep(0.02)  # the loop turns while the store waits
        assert not stored.done()
    finally:
        other.execute("ROLLBACK")
    assert await stored > 0
    assert cache.store.get_exact("a", keys.exact) is not None


def test_a_hit_on_another_workers_deleted_entry_does_not_stamp_another_teams(tmp_path: Path):
    """The workers of `--workers N` share the file, and SQLite gives a new row the largest row id plus one,
    so a deleted entry's id can come back as another team's. A hit's LRU stamp waits in its worker
    until that worker's next store, and was written by id alone: team a's hit on an entry another
    worker deleted aged team b's new entry that took the id, which b's own eviction then took first."""
    clock = Clock()
    one, two = CacheStore(tmp_path / "c.db", clock=clock), CacheStore(tmp_path / "c.db", clock=clock)
    two.put(entry(1, team="b"), LIMITS)
    reused = two.put(entry(2, team="a"), LIMITS)
    clock.now += 2
    assert one.get_exact("a", "key-2") is not None  # a's hit: its stamp waits in worker one
    clock.now += 1
    assert two.invalidate(team="a") == 1  # taken by worker two
    assert two.get_exact("b", "key-1") is not None  # b uses its older entry
    clock.now += 5
    assert two.put(entry(3, team="b"), LIMITS) == reused  # b's newest entry has a's old id
    clock.now += 1
    one.put(entry(4, team="a"), LIMITS)  # worker one writes the stamps it holds
    two.put(entry(5, team="b"), TeamLimits(ttl_s=60, max_entries=2, max_bytes=10**9))  # b over its cap: its least recently used goes
    assert two.get_exact("b", "key-3") is not None  # b's newest stays
    assert two.get_exact("b", "key-1") is None
