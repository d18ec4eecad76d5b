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
from sdk.state.redis import RedisState
from sdk.state.redis_client import RedisClient
from sdk.state.resp import RespError

log = logging.getLogger("slipstream.cache")
MAX_EVENTS = 100_000
_BLOCK_MS = 1000


class CacheReplicator:
    def __init__(self, shared: RedisState, store: CacheStore):
        self.shared = shared
        self.store = store
        self.stream = shared.key("cache:events")
        # Connections of their own: answers and embeddings never queue the limits' calls behind them, and
        # the follower's connection is held by its blocking reads.
        self._writer = RedisClient(shared.url, shared.timeout_s)
        self._follower = RedisClient(shared.url, shared.timeout_s)
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
                await self._writer.execute("XADD", self.stream, "MAXLEN", "~", MAX_EVENTS, "*",
                                           *(part for pair in fields.items() for part in pair))
        except (OSError, TimeoutError, RespError) as exc:
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
            block = ("BLOCK", _BLOCK_MS) if self._caught_up.is_set() else ()  # the replay does not wait for news
            try:
                async with asyncio.timeout(_BLOCK_MS / 1000 + self.shared.timeout_s * 10):
                    replies = await self._follower.execute("XREAD", "COUNT", 500, *block, "STREAMS", self.stream, self._last_id)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("response cache stream unreadable: %s", exc)
                await asyncio.sleep(1.0)
                continue
            # XREAD: [[stream, [[id, [field, value, …]], …]]], or nil when the block ran out
            batch = replies[0][1] if replies else []
            events = [dict(zip(flat[::2], flat[1::2], strict=True)) for _, flat in batch]
            if batch:
                self._last_id = batch[-1][0].decode()
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

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        await self._writer.close()
        await self._follower.close()
