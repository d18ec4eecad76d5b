"""Process-wide resources that stages share across teams and survive policy reloads.

Heavy things (the embedding model, cache stores, the state backend's client) are created once, lazily, on first use, so a team
whose policy does not enable a feature never pays for it.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sdk.cache.embeddings import EmbeddingCache
    from sdk.cache.response_cache import ResponseCache
    from sdk.embedding import Embedder
    from sdk.responses.store import ResponseStore, StoreLimits
    from sdk.state import StateBackend


# One model load at a time in this process: loads run in worker threads (readiness, the embedder's
# own thread, a request's first use), and transformers' lazy module imports are not thread-safe
# (two threads importing it at once can see "cannot import name 'AutoTokenizer'").
MODEL_LOAD_LOCK = threading.RLock()


def default_data_dir() -> Path:
    return Path(os.environ.get("SLIPSTREAM_DATA_DIR", Path.home() / ".cache" / "slipstream"))


@dataclass
class Services:
    data_dir: Path = field(default_factory=default_data_dir)
    state_url: str | None = None  # None: $SLIPSTREAM_STATE_URL, unset: in process (sdk/state/)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _embedder: Embedder | None = field(default=None, init=False, repr=False)
    _cache_embedder: Embedder | None = field(default=None, init=False, repr=False)
    _response_cache: ResponseCache | None = field(default=None, init=False, repr=False)
    _embedding_cache: EmbeddingCache | None = field(default=None, init=False, repr=False)
    _response_store: ResponseStore | None = field(default=None, init=False, repr=False)
    response_limits: dict[str, StoreLimits] = field(default_factory=dict, init=False, repr=False)  # team → its share (policy responses_store)
    # provider keys more than one served team's policy holds (set by the gateway's TeamRegistry): their
    # account is shared, so what an answer says about the account is not one team's to see
    shared_provider_keys: frozenset[str] = field(default=frozenset(), init=False, repr=False)
    _state: StateBackend | None = field(default=None, init=False, repr=False)

    def state(self) -> StateBackend:
        """Limits, budgets, breakers and key cooldowns: in process, or shared by every replica."""
        with self._lock:
            if self._state is None:
                from sdk.state import open_state

                self._state = open_state(self.state_url)
            return self._state

    def shared_state(self) -> StateBackend | None:
        """The state backend when replicas share it (breakers and key cooldowns then publish flags); else None."""
        state = self.state()
        return state if state.kind != "local" else None

    def embedder(self) -> Embedder:
        """The MiniLM sentence embedder (loaded on its first batch, in its own thread)."""
        with self._lock:
            if self._embedder is None:
                from sdk.embedding import Embedder

                self._embedder = Embedder()
            return self._embedder

    def cache_embedder(self) -> Embedder:
        """MiniLM with the response cache's QQP adapter (a second model: compression keeps the original)."""
        with self._lock:
            if self._cache_embedder is None:
                from sdk.embedding import Embedder

                self._cache_embedder = Embedder.for_cache()
            return self._cache_embedder

    def response_cache(self) -> ResponseCache:
        """The exact + semantic response cache: persisted under data_dir, or, with a shared state
        backend, kept in step with every replica's through Redis (sdk/cache/replication.py)."""
        embedder = self.cache_embedder()
        shared = self.shared_state()
        with self._lock:
            if self._response_cache is None:
                from sdk.cache.response_cache import ResponseCache

                redis = getattr(shared, "shared", None)  # the Redis behind the guard
                self._response_cache = ResponseCache(self.data_dir, embedder, shared=redis)
            return self._response_cache

    def installed_response_cache(self) -> ResponseCache | None:
        """The response cache, or None where the `semantic` extra is missing: no answer can have
        been cached by this install, and building the cache would fail on its imports."""
        from sdk.extras import missing_modules

        return None if missing_modules("semantic") else self.response_cache()

    def embedding_cache(self) -> EmbeddingCache:
        """The exact `/v1/embeddings` cache (in memory, partitioned by team)."""
        with self._lock:
            if self._embedding_cache is None:
                from sdk.cache.embeddings import EmbeddingCache

                self._embedding_cache = EmbeddingCache()
            return self._embedding_cache

    def response_store(self) -> ResponseStore:
        """Stored Responses API responses (previous_response_id, GET/DELETE by id), under data_dir, or
        in Redis when replicas share state (sdk/responses/redis_store.py)."""
        shared = self.shared_state()
        with self._lock:
            if self._response_store is None:
                from sdk.responses.sqlite_store import SQLiteResponseStore
                from sdk.state.guard import GuardedState

                local = SQLiteResponseStore(self.data_dir / "responses.sqlite3", self.response_limits)
                if isinstance(shared, GuardedState):  # what a shared state URL opens (sdk/state/__init__.py)
                    from sdk.responses.redis_store import RedisResponseStore

                    self._response_store = RedisResponseStore(shared, local, self.response_limits)
                else:
                    self._response_store = local
            return self._response_store

    async def close(self) -> None:
        """Release what holds connections (the state backend's clients); the process goes on."""
        with self._lock:
            state, self._state = self._state, None
            replicator = self._response_cache.replicator if self._response_cache is not None else None
            response_store = self._response_store
        from sdk.responses.redis_store import RedisResponseStore

        if isinstance(response_store, RedisResponseStore):
            await response_store.close()  # its own connection (it reconnects if used again)
        if replicator is not None:
            await replicator.close()
        if state is not None:
            await state.close()
