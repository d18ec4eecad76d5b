"""The process-wide response cache: store + embedder + verifier, shared by every team's cache stage.

Created once by `Services.response_cache()`; teams differ only in the limits and precision they
pass in. The invalidation methods are the admin surface (the gateway exposes them over HTTP).
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sdk.cache.keys import CacheKeys, is_entry_key
from sdk.cache.replication import CacheReplicator
from sdk.cache.store import CacheStore, Entry, NewEntry, TeamLimits
from sdk.cache.verifier import Verifier
from sdk.embedding import Embedder
from sdk.offload import FairPool, is_large, off_loop
from sdk.policy import SemanticCachePolicy
from sdk.state.redis import RedisState

CANDIDATES = 4  # neighbours the verifier sees: the nearest is often a near-miss, the right one close behind

# Stores take turns by team. One thread: every store holds the store's one writer lock anyway. Not
# asyncio's default pool, first come, first served and shared with every `to_thread` caller (a batch's
# budget hold without Redis, policy reloads, /metrics): a team's many stores, each perhaps waiting on SQLite
# for another worker's write, held another team's answer (stored before its client gets it) behind them.
_STORES = FairPool(workers=1, name="slipstream-response-cache")


@dataclass(frozen=True, slots=True)
class Lookup:
    entry: Entry | None
    status: str  # miss | exact-hit | semantic-hit
    vector: np.ndarray | None  # the query's embedding, reused when the answer is stored


class ResponseCache:
    def __init__(self, data_dir: Path, embedder: Embedder, verifier: Verifier | None = None, approximate_from: int = 20_000,
                 shared: RedisState | None = None):
        """With `shared`, Redis holds the durable copy (sdk/cache/replication.py) and this replica's
        store lives in memory, rebuilt from the shared stream when it starts."""
        path = Path(":memory:") if shared is not None else data_dir / "response-cache.sqlite3"
        self.embedder = embedder
        self.verifier = verifier or Verifier.for_embedder(embedder.model_id)
        self.store = CacheStore(path, space=embedder.model_id, approximate_from=approximate_from)
        self.replicator = CacheReplicator(shared, self.store) if shared is not None else None

    async def lookup(self, team: str, keys: CacheKeys, exact: bool, semantic: bool, min_precision: float,
                     max_age_s: float | None = None) -> Lookup:
        """The team's entry for `keys`: exact, else the verifier's choice among the nearest; entries older
        than `max_age_s` (the team's ttl_s now) are not served."""
        if self.replicator is not None:
            await self.replicator.caught_up(team)  # follow what the other replicas store for the team
        if exact and (entry := self.store.get_exact(team, keys.exact, max_age_s)) is not None:
            return Lookup(await _parsed(entry), "exact-hit", None)
        if not semantic or keys.query is None:
            return Lookup(None, "miss", None)
        vector = await self.embedder.embed(keys.query, team)
        if self.verifier.threshold(min_precision) is None:
            return Lookup(None, "miss", vector)  # no calibrated threshold is that precise: exact tier only
        candidates = self.store.search(team, keys.partition, vector, CANDIDATES, max_age_s)
        chosen = self.verifier.best(keys.query, vector, [(c.query, c.vector) for c in candidates], min_precision)
        if chosen is not None and (entry := self.store.fetch(team, candidates[chosen].id, max_age_s)) is not None:
            return Lookup(await _parsed(entry), "semantic-hit", vector)
        return Lookup(None, "miss", vector)

    async def put(self, team: str, keys: CacheKeys, route: str, response: dict[str, Any], vector: np.ndarray | None, config: SemanticCachePolicy) -> int:
        """Store an answer in a thread: a store can wait for another worker's write to the shared file
        (SQLite's busy timeout), which on the loop would hold every team's requests."""
        limits = TeamLimits(ttl_s=config.ttl_s, max_entries=config.max_entries, max_bytes=config.max_bytes)
        entry = NewEntry(team, keys.partition, keys.exact, route, keys.query if vector is not None else None, vector, response)
        entry_id = await asyncio.wrap_future(_STORES.submit(functools.partial(self.store.put, entry, limits), tenant=team))
        if self.replicator is not None:
            self.replicator.added(entry, limits)
        return entry_id

    # -- admin -----------------------------------------------------------------------------------

    async def invalidate(self, team: str, key: str | None = None) -> int:
        """`invalidate_key(key, team)`, or `invalidate_team(team)` without a key, as one of the team's turns in
        the stores' thread (it holds the store's writer lock, as a store does); the other replicas told here."""
        if key is not None and not is_entry_key(key):
            return 0
        removed = await asyncio.wrap_future(_STORES.submit(functools.partial(self.store.invalidate, team=team, exact_key=key),
                                                           tenant=team))
        if self.replicator is not None:
            self.replicator.invalidated(team, key)
        return removed

    def invalidate_team(self, team: str) -> int:
        return self._invalidate(team, None)

    def invalidate_key(self, key: str, team: str | None = None) -> int:
        """Drop the entry with this key (the `x-slipstream-cache-key` header of the answer it produced).
        A key no entry can have drops nothing, and goes to no other replica: the events share the Redis
        every team's limits use, and a client-written key of kilobytes, 100,000 times, was gigabytes."""
        if not is_entry_key(key):
            return 0
        return self._invalidate(team, key)

    def invalidate_all(self) -> int:
        return self._invalidate(None, None)

    def _invalidate(self, team: str | None, exact_key: str | None) -> int:
        removed = self.store.invalidate(team=team, exact_key=exact_key)
        if self.replicator is not None:
            self.replicator.invalidated(team, exact_key)  # every replica drops it, whether or not this one had it
        return removed

    def close(self) -> None:
        self.store.close()


async def _parsed(entry: Entry) -> Entry:
    """`entry` with its response parsed: a large one (a long answer) in the heavy-work pool, as the
    team's work, not on the loop every team's requests share."""
    if is_large(len(entry.raw)):
        await off_loop(entry.parse)
    return entry
