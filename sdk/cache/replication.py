"""Every replica's response cache in step, through one Redis stream of additions and invalidations.

With a shared state backend the stream is the cache's durable copy: each stored answer (its
response, query and embedding, partition and TTL) and each invalidation is appended to
`PREFIX:cache:events`; every replica follows the stream with a blocking read and applies what other
replicas appended to its own store and faiss index, so an answer stored through one replica is
served by the others well within a second. A replica that starts replays the stream first (entries
whose TTL has passed are skipped), so its index holds what the others hold. The stream is trimmed to
about `MAX_EVENTS` (oldest first): that bounds what Redis keeps, like each team's `max_entries`.

Nothing here is on a request's path but a replica's first lookup, which waits for the replay (at
most the state backend's timeout, once): appends go out in the background, and a Redis that is away
only means other replicas miss what was stored meanwhile (they answer from upstream, and store it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from typing import Any

import numpy as np
import orjson

from sdk.cache.store import CacheStore, NewEntry, TeamLimits
from sdk.extras import missing_extra_message
from sdk.state.redis import RedisState

log = logging.getLogger("slipstream.cache")
MAX_EVENTS = 100_000
_BLOCK_MS = 1000


class CacheReplicator:
    def __init__(self, shared: RedisState, store: CacheStore):
        missing = missing_extra_message("redis", "a response cache shared through Redis")
        if missing:
            raise RuntimeError(missing)
        self.shared = shared
        self.store = store
        self.stream = shared.key("cache:events")
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: asyncio.Task[None] | None = None
        self._last_id = "0"
        self._caught_up = asyncio.Event()
        self._waited = False  # only the first lookup waits for the replay

    # --- writing -------------------------------------------------------------------------------

    def added(self, entry: NewEntry, limits: TeamLimits) -> None:
        vector = b"" if entry.vector is None else np.asarray(entry.vector, dtype=np.float32).tobytes()
        self._append({
            "op": "put", "team": entry.team, "partition": entry.partition, "exact_key": entry.exact_key, "route": entry.route,
            "query": entry.query or "", "vector": vector, "response": orjson.dumps(entry.response),
            "limits": orjson.dumps([limits.ttl_s, limits.max_entries, limits.max_bytes]), "at": repr(time.time()),
        })

    def invalidated(self, team: str | None, exact_key: str | None) -> None:
        self._append({"op": "invalidate", "team": team or "", "exact_key": exact_key or ""})

    def _append(self, fields: dict[str, Any]) -> None:
        fields["origin"] = self.shared.replica_id
        call = self._xadd(fields)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None:
            self.start()
            running.create_task(call)
        elif self._loop is not None and self._loop.is_running():  # a worker thread (the admin endpoint)
            future = asyncio.run_coroutine_threadsafe(call, self._loop)
            try:
                future.result(timeout=self.shared.timeout_s * 5)
            except (concurrent.futures.TimeoutError, Exception):
                log.warning("response cache: an invalidation did not reach the other replicas")
        else:
            call.close()

    async def _xadd(self, fields: dict[str, Any]) -> None:
        try:
            async with asyncio.timeout(self.shared.timeout_s):
                await self._redis().xadd(self.stream, fields, maxlen=MAX_EVENTS, approximate=True)
        except (OSError, TimeoutError, self._errors()) as exc:
            log.debug("response cache event not shared: %s", exc)

    # --- following -----------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._reader is None or self._reader.done() or self._loop is not loop:
            self._loop = loop
            self._reader = loop.create_task(self._follow(), name="slipstream-cache-follow")

    async def caught_up(self) -> None:
        """Start following, and on the first call wait (at most the state backend's timeout, so a
        Redis that is away costs one lookup that much once) until the replay of what the other
        replicas stored before is done: a replica's first lookups must see those answers too."""
        self.start()
        if not self._waited:
            self._waited = True
            try:
                async with asyncio.timeout(self.shared.timeout_s):
                    await self._caught_up.wait()
            except TimeoutError:
                log.debug("response cache: replay not done within %.3fs; looking up what is here", self.shared.timeout_s)

    async def _follow(self) -> None:
        while True:
            try:
                block = _BLOCK_MS if self._caught_up.is_set() else None  # the replay does not wait for news
                replies = await self._redis(blocking=True).xread({self.stream: self._last_id}, count=500, block=block)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("response cache stream unreadable: %s", exc)
                await asyncio.sleep(1.0)
                continue
            events = [fields for _, batch in replies for _, fields in batch]
            if replies:
                self._last_id = replies[-1][1][-1][0]
            if events:
                await asyncio.to_thread(self._apply_all, events)
            if not events:
                self._caught_up.set()

    def _apply_all(self, events: list[dict[bytes, bytes]]) -> None:
        me = self.shared.replica_id.encode()
        for fields in events:
            if fields.get(b"origin") != me:
                try:
                    self._apply(fields)
                except Exception:
                    log.exception("response cache: could not apply a shared event")

    def _apply(self, fields: dict[bytes, bytes]) -> None:
        def text(name: str) -> str | None:
            return fields[name.encode()].decode() or None

        def required(name: str) -> str:
            return fields[name.encode()].decode()

        if fields[b"op"] == b"invalidate":
            self.store.invalidate(team=text("team"), exact_key=text("exact_key"))
            return
        ttl_s, max_entries, max_bytes = orjson.loads(fields[b"limits"])
        left = ttl_s - (time.time() - float(fields[b"at"]))
        if left <= 0:
            return
        vector = np.frombuffer(fields[b"vector"], dtype=np.float32) if fields[b"vector"] else None
        entry = NewEntry(required("team"), required("partition"), required("exact_key"), required("route"), text("query"),
                         vector, orjson.loads(fields[b"response"]))
        self.store.put(entry, TeamLimits(left, max_entries, max_bytes))

    # --- plumbing ------------------------------------------------------------------------------

    def _redis(self, blocking: bool = False) -> Any:
        """Bytes in and out (embeddings are binary); the follower's blocking reads get their own client."""
        import redis.asyncio as aioredis

        if self._client is None or self._client[0] is not asyncio.get_running_loop():
            timeout = self.shared.timeout_s
            plain = aioredis.Redis.from_url(self.shared.url, socket_timeout=timeout, socket_connect_timeout=timeout)
            follower = aioredis.Redis.from_url(self.shared.url, socket_timeout=_BLOCK_MS / 1000 + timeout * 10,
                                               socket_connect_timeout=timeout)
            self._client = (asyncio.get_running_loop(), plain, follower)
        return self._client[2] if blocking else self._client[1]

    @staticmethod
    def _errors() -> type[BaseException]:
        from redis.exceptions import RedisError

        return RedisError

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        if self._client is not None:
            _, plain, follower = self._client
            self._client = None
            await plain.aclose()
            await follower.aclose()
