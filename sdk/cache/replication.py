"""Every replica's response cache in step, through a Redis stream of additions and invalidations per team.

With a shared state backend the streams are the cache's durable copy: each stored answer (its
response, query and embedding, partition and TTL) and each invalidation is appended to its team's
`PREFIX:{cache}:events:TEAM`; every replica follows the streams of the teams it has looked up with
one blocking read and applies what other replicas appended to its own store and faiss index, so an
answer stored through one replica is served by the others well within a second. A team's first
lookup on a replica replays that team's stream first (entries whose TTL has passed are skipped), so
its index holds what the others hold. Each stream is trimmed (oldest first) to about the team's
`max_entries`, at most `MAX_EVENTS`: a team's events push out only its own. (One stream for every
team, trimmed by count, let a busy team push the others' answers out of Redis.) The streams share
one Cluster hash slot, so one XREAD follows them all.

What one read returns is bounded, since Redis builds the whole reply while every team's limits wait
behind it: at most `READ_COUNT` events a stream, each at most `MAX_SHARED_ENTRY` bytes. A larger
answer is served by the replica that stored it only (the others store their own); 500 events a read,
of any size, let a team whose cached answers were large make one read carry hundreds of megabytes.

Nothing here is on a request's path but a team's first lookup on a replica, which waits for the
team's replay (at most the state backend's timeout, once): appends go out in the background, and a
Redis that is away only means other replicas miss what was stored meanwhile (they answer from
upstream, and store it).
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
MAX_EVENTS = 100_000  # a team's stream at most, whatever its max_entries
MAX_SHARED_ENTRY = 1024 * 1024  # bytes of an answer's event (response, question, vector); larger ones are not shared
READ_COUNT = 16  # events per stream per read: a read carries at most READ_COUNT × MAX_SHARED_ENTRY per stream
_BLOCK_MS = 1000


class CacheReplicator:
    def __init__(self, shared: RedisState, store: CacheStore):
        self.shared = shared
        self.store = store
        # Connections of their own: answers and embeddings never queue the limits' calls behind them, and
        # the follower's connection is held by its blocking reads (the writer's also reads the replays).
        self._writer = RedisClient(shared.url, shared.timeout_s)
        self._follower = RedisClient(shared.url, shared.timeout_s)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: asyncio.Task[None] | None = None
        self._replays: dict[str, asyncio.Task[None]] = {}  # team → its replay, started by its first lookup
        self._followed: dict[str, str] = {}  # stream → the last id read, once its team's replay is done
        self._joined = asyncio.Event()  # a stream was added to the followed ones

    def stream(self, team: str) -> str:
        return self.shared.key(f"{{cache}}:events:{team}")

    # --- writing -------------------------------------------------------------------------------

    def added(self, entry: NewEntry, limits: TeamLimits) -> None:
        """Share a stored answer, unless it is too large to (then it stays on this replica only)."""
        vector = b"" if entry.vector is None else np.asarray(entry.vector, dtype=np.float32).tobytes()
        response = orjson.dumps(entry.response)
        if len(response) + len(vector) + len((entry.query or "").encode()) > MAX_SHARED_ENTRY:
            return
        self._append(entry.team, min(limits.max_entries, MAX_EVENTS), {
            "op": "put", "team": entry.team, "partition": entry.partition, "exact_key": entry.exact_key, "route": entry.route,
            "query": entry.query or "", "vector": vector, "response": response,
            "limits": orjson.dumps([limits.ttl_s, limits.max_entries, limits.max_bytes]), "at": repr(time.time()),
        })

    def invalidated(self, team: str | None, exact_key: str | None) -> None:
        """Without a team: in every team's stream this replica follows."""
        for name in [team] if team is not None else list(self._replays):
            self._append(name, MAX_EVENTS, {"op": "invalidate", "team": name, "exact_key": exact_key or ""})

    def _append(self, team: str, keep: int, fields: dict[str, Any]) -> None:
        fields["origin"] = self.shared.replica_id
        call = self._xadd(self.stream(team), keep, fields)
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

    async def _xadd(self, stream: str, keep: int, fields: dict[str, Any]) -> None:
        try:
            async with asyncio.timeout(self.shared.timeout_s):
                await self._writer.execute("XADD", stream, "MAXLEN", "~", keep, "*",
                                           *(part for pair in fields.items() for part in pair))
        except (OSError, TimeoutError, RespError) as exc:
            log.debug("response cache event not shared: %s", exc)

    # --- following -----------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._reader is None or self._reader.done() or self._loop is not loop:
            if self._loop is not loop:  # tasks of another loop: every team replays again here
                self._replays.clear()
                self._followed.clear()
                self._joined = asyncio.Event()
            self._loop = loop
            self._reader = loop.create_task(self._follow(), name="slipstream-cache-follow")

    async def caught_up(self, team: str) -> None:
        """Follow the team's stream; on its first lookup wait (at most the state backend's timeout,
        so a Redis that is away costs that lookup that much once) until the replay of what the other
        replicas stored for it is done: a replica's first lookups must see those answers too."""
        self.start()
        if team not in self._replays:
            replay = self._replays[team] = asyncio.get_running_loop().create_task(self._replay(team))
            try:
                async with asyncio.timeout(self.shared.timeout_s):
                    await asyncio.shield(replay)
            except TimeoutError:
                log.debug("response cache: %s's replay not done within %.3fs; looking up what is here", team, self.shared.timeout_s)

    async def _replay(self, team: str) -> None:
        stream, last = self.stream(team), "0"
        while batch := await self._read(self._writer, (), {stream: last}, 1.0):
            last = batch[-1][1][-1][0].decode()
            await self._apply_batches(batch)
        self._followed[stream] = last
        self._joined.set()

    async def _follow(self) -> None:
        while True:
            if not self._followed:
                self._joined.clear()
                await self._joined.wait()
            replies = await self._read(self._follower, ("BLOCK", _BLOCK_MS), dict(self._followed), _BLOCK_MS / 1000)
            for stream, events in replies:
                self._followed[stream.decode()] = events[-1][0].decode()
            if replies:
                await self._apply_batches(replies)

    async def _read(self, client: RedisClient, block: tuple[Any, ...], streams: dict[str, str], wait_s: float) -> list[Any]:
        """XREAD's answer, `[[stream, [[id, [field, value, …]], …]], …]` (empty when the block ran out),
        retried until Redis answers."""
        while True:
            try:
                async with asyncio.timeout(wait_s + self.shared.timeout_s * 10):
                    return await client.execute("XREAD", "COUNT", READ_COUNT, *block, "STREAMS", *streams, *streams.values()) or []
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("response cache stream unreadable: %s", exc)
                await asyncio.sleep(1.0)

    async def _apply_batches(self, batches: list[Any]) -> None:
        events = [dict(zip(flat[::2], flat[1::2], strict=True)) for _, batch in batches for _, flat in batch]
        await asyncio.to_thread(self._apply_all, events)

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
