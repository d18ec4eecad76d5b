"""The response store: what a later `previous_response_id`, GET, DELETE or input_items needs.

Every stored response is kept per team: each method takes the team, every key includes it, so an
id from another team reads as unknown. The embedded default is SQLite under the data dir (beside the
response cache); a shared store (Redis, for several workers) implements the same `ResponseStore`
protocol.

A record keeps the conversation that produced the response (`context`: every input item up to and
including this request's own, previous turns expanded) and the response object the client got, so
the next turn's history is `context + response.output` whichever provider answers it. `native`
records the provider that holds the response itself (a native Responses upstream), where GET,
DELETE and input_items are forwarded.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson

RETENTION_S = 30 * 86400  # OpenAI keeps stored responses for 30 days


@dataclass(slots=True)
class StoredResponse:
    id: str
    team: str
    provider: str  # the policy's provider name that answered
    native: bool  # that provider stores the response too (it served the Responses API natively)
    created_at: float
    context: list[dict[str, Any]]  # the conversation's input items, this request's own last
    response: dict[str, Any]  # the response object as the client received it
    own_items: int  # how many of the context's last items this request sent itself (its input_items)

    def input_items(self) -> list[dict[str, Any]]:
        return self.context[len(self.context) - self.own_items :]

    def history(self) -> list[dict[str, Any]]:
        """The input items a next turn continues from: the context, then this response's output."""
        return [*self.context, *self.response.get("output", [])]


def as_items(value: Any) -> list[dict[str, Any]]:
    """A request's `input` as items (a string is one user message)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return list(value or [])


class ResponseStore(Protocol):
    """A record is readable by `get` as soon as `put` has been called, before the write completes."""

    async def put(self, record: StoredResponse) -> None: ...
    async def get(self, team: str, response_id: str) -> StoredResponse | None: ...
    async def delete(self, team: str, response_id: str) -> bool: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    team TEXT NOT NULL,
    id TEXT NOT NULL,
    provider TEXT NOT NULL,
    native INTEGER NOT NULL,
    created_at REAL NOT NULL,
    context BLOB NOT NULL,
    response BLOB NOT NULL,
    own_items INTEGER NOT NULL,
    PRIMARY KEY (team, id)
);
CREATE INDEX IF NOT EXISTS responses_age ON responses (created_at);
"""


class SQLiteResponseStore:
    """The embedded store: one SQLite file, calls run in a worker thread (never on the event loop)."""

    def __init__(self, path: Path, retention_s: float = RETENTION_S):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.retention_s = retention_s
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._pending: dict[tuple[str, str], StoredResponse] = {}  # put, not yet written

    async def put(self, record: StoredResponse) -> None:
        key = (record.team, record.id)
        self._pending[key] = record  # readable at once, while the write runs in a worker thread
        try:
            await asyncio.to_thread(self._put, record)
        finally:
            if self._pending.get(key) is record:
                del self._pending[key]

    async def get(self, team: str, response_id: str) -> StoredResponse | None:
        pending = self._pending.get((team, response_id))
        return pending if pending is not None else await asyncio.to_thread(self._get, team, response_id)

    async def delete(self, team: str, response_id: str) -> bool:
        pending = self._pending.pop((team, response_id), None)
        return await asyncio.to_thread(self._delete, team, response_id) or pending is not None

    def _put(self, record: StoredResponse) -> None:
        row = (record.team, record.id, record.provider, int(record.native), record.created_at,
               orjson.dumps(record.context), orjson.dumps(record.response), record.own_items)
        with self._lock:
            if self._pending.get((record.team, record.id)) is not record:
                return  # deleted (or replaced) while waiting for this thread: writing it would resurrect it
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)
            self._db.execute("DELETE FROM responses WHERE created_at < ?", (time.time() - self.retention_s,))

    def _get(self, team: str, response_id: str) -> StoredResponse | None:
        with self._lock:
            row = self._db.execute(
                "SELECT provider, native, created_at, context, response, own_items FROM responses WHERE team = ? AND id = ? AND created_at >= ?",
                (team, response_id, time.time() - self.retention_s),
            ).fetchone()
        if row is None:
            return None
        provider, native, created_at, context, response, own_items = row
        return StoredResponse(response_id, team, provider, bool(native), created_at, orjson.loads(context),
                              orjson.loads(response), own_items)

    def _delete(self, team: str, response_id: str) -> bool:
        with self._lock:
            return self._db.execute("DELETE FROM responses WHERE team = ? AND id = ?", (team, response_id)).rowcount > 0

    def close(self) -> None:
        with self._lock:
            self._db.close()
