"""Stored responses in Redis, so any replica continues a conversation another replica started.

One key per response, `PREFIX:response:TEAM:ID`, holding the record as JSON and expiring with the
retention period. While Redis is unreachable (the state guard is open) responses are stored in and
read from the replica's own SQLite store, and a lookup Redis misses is tried there too: a
conversation begun during an outage continues on the replica that began it.
"""

from __future__ import annotations

from dataclasses import asdict

import orjson

from sdk.responses.store import RETENTION_S, SQLiteResponseStore, StoredResponse
from sdk.state.guard import DOWN, GuardedState


class RedisResponseStore:
    def __init__(self, state: GuardedState, fallback: SQLiteResponseStore, retention_s: float = RETENTION_S):
        self.state = state
        self.redis = state.shared
        self.fallback = fallback
        self.retention_s = retention_s

    def _key(self, team: str, response_id: str) -> str:
        return self.redis.key(f"response:{team}:{response_id}")

    async def put(self, record: StoredResponse) -> None:
        stored = await self.state.try_shared(lambda: self.redis.client.execute(
            "SET", self._key(record.team, record.id), orjson.dumps(asdict(record)), "EX", int(self.retention_s)))
        if stored is DOWN:
            await self.fallback.put(record)

    async def get(self, team: str, response_id: str) -> StoredResponse | None:
        raw = await self.state.try_shared(lambda: self.redis.client.execute("GET", self._key(team, response_id)))
        if raw is DOWN or raw is None:
            return await self.fallback.get(team, response_id)
        return StoredResponse(**orjson.loads(raw))

    async def delete(self, team: str, response_id: str) -> bool:
        removed = await self.state.try_shared(lambda: self.redis.client.execute("DEL", self._key(team, response_id)))
        local = await self.fallback.delete(team, response_id)
        return (removed is not DOWN and removed > 0) or local
