"""The response store: what a later `previous_response_id`, `item_reference`, GET, DELETE or
input_items needs.

Every stored response is kept per team: each method takes the team, every key includes it, so an
id from another team reads as unknown, exactly like an id nobody made. The embedded default is
SQLite under the data dir (beside the response cache); a shared store (Redis, for several workers)
implements the same `ResponseStore` protocol.

A record keeps only what its own request added: its input items as the client sent them (item
references stay references) and the response object the client got, with a pointer to the response
it continued (`previous`). A conversation is the chain of records, walked on read (one recursive
query, or one Lua call), never copied into each turn: 15 turns of 1 MiB store ~15 MiB, not the
135 MiB a copy per turn would. `native` records the provider that holds the response itself (a
native Responses upstream), where GET, DELETE and input_items are forwarded; the record is also
the team's proof of ownership, checked before anything names that id upstream.

Bounded per team (`StoreLimits`, the policy's `responses_store`): a retention counted from the
conversation's last turn (writing a turn renews its whole chain, so a live conversation never
loses its beginning), and a quota in bytes and responses. Over the quota the least recently used
responses of the team go first (leaves before the turns they continue, so what remains is still a
whole conversation); the chain being written is never evicted: a turn whose own conversation would
not fit, or with more than MAX_TURN_ITEMS input items, is refused before it is sent (`over_quota`).

Durability (SQLite): `put` returns once its record's transaction has committed (WAL, synchronous
NORMAL: a committed record survives the process's crash; a power loss may take the last ones). The
puts a team has waiting for the store's thread are committed together (group commit, WRITES_PER_TURN),
which changes when a put returns, never what a returned put promises.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import orjson

from sdk.offload import HEAVY_POOL, FairPool
from sdk.responses.sqlite_parts import LargeRead

RETENTION_S = 30 * 86400  # OpenAI keeps stored responses for 30 days
# Input items one stored turn may hold: each is a key the store writes, in Redis in one script that
# holds the server every replica and team shares (300,000 one-word messages held it for 6 s).
MAX_TURN_ITEMS = 10_000
MAX_CHAIN = 1_000_000  # a walk never goes further (a guard, not a limit anyone reaches)
# Bytes of records the SQLite store reads under its lock at once (of a chain, or the records an item
# lookup needs): the lock is every team's (one connection), and a team's records may reach its quota
# (1 GiB by default).
CHAIN_BYTES_PER_READ = 4 << 20
# Records of a chain the SQLite store renews under its lock at once when a turn is written: renewed in
# the turn's own transaction, a conversation of 10,000 turns held every team's store calls for each
# further turn, longer with each.
CHAIN_RECORDS_PER_HOLD = 1000
# Bytes of expired records (every team's) one write turn deletes, oldest expiry first; the rest wait for
# later writes (reads never see them). All at once, a team's burst of records expiring together held the
# lock for whichever team's write came next, and every team's store calls behind it.
EXPIRED_BYTES_PER_PUT = 4 << 20
# A team's puts waiting for the store's thread are written together, in one of its turns and one
# transaction (group commit), up to this many records and about this many bytes (at least one record):
# a commit writes every page it changed to the WAL, the pages of the records table, its indexes, the
# items and the team's totals, so a transaction per record cost ~100 µs of CPU and a third of a
# millisecond of the thread each, which bounded a busy team's stored turns to ~3,000 a second. Each put
# still returns only once its own transaction has committed: what a crash can lose is unchanged.
WRITES_PER_TURN = 64
WRITE_BYTES_PER_TURN = 4 << 20
# The thread every SQLite store's calls run in, each hold of the store's lock a turn of its team's
# (`FairPool`): in asyncio's default pool the calls were served first come, first served, so a team
# with many store calls queued (a burst of stored turns, of chain reads) held every other team's
# (a Responses answer is stored before its client sees it) until all of its own had run. One thread:
# the store has one connection, and its calls ran one at a time under its lock anyway.
_TURNS = FairPool(workers=1, name="slipstream-response-store")
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """A team's share of the response store (policy `responses_store`, policies/README.md)."""

    max_entries: int = 100_000
    max_bytes: int = 1024 * 1024 * 1024
    ttl_s: float = RETENTION_S


@dataclass(slots=True)
class StoredResponse:
    id: str
    team: str
    provider: str  # the policy's provider name that answered
    native: bool  # that provider stores the response too (it served the Responses API natively)
    created_at: float
    input: list[dict[str, Any]]  # this request's own input items, as sent
    response: dict[str, Any]  # the response object as the client received it
    previous: str | None = None  # the response this one continued
    depth: int = 1  # responses in its chain, itself included (set by the store)
    chain_bytes: int = 0  # stored bytes of its chain, itself included (set by the store)

    def listed_input(self) -> list[dict[str, Any]]:
        """Its input items, each with an id (the client's, or one derived from the response id)."""
        return [item if isinstance(item.get("id"), str) else {**item, "id": derived_id(self.id, i, item)}
                for i, item in enumerate(self.input)]

    def items(self) -> Iterable[tuple[str, dict[str, Any]]]:
        """(id, item) for every item a later request may reference: its input items, then its output."""
        for item in self.listed_input():
            if item.get("type") != "item_reference":  # a reference's id names another item
                yield item["id"], item
        for item in self.response.get("output") or ():
            if isinstance(item, dict) and isinstance(item.get("id"), str):
                yield item["id"], item


def derived_id(response_id: str, index: int, item: Mapping[str, Any]) -> str:
    """A stable id for an input item the client sent without one (listed by input_items, referable)."""
    kind = item.get("type", "message")
    prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}.get(kind, "item")
    return f"{prefix}_{hashlib.sha256(f'{response_id}/{index}'.encode()).hexdigest()[:48]}"


def history(chain: list[StoredResponse]) -> list[dict[str, Any]]:
    """The input items a next turn continues from: each turn's input, then its output, oldest first."""
    return [item for record in chain for item in (*record.input, *(record.response.get("output") or ()))]


def as_items(value: Any) -> list[dict[str, Any]]:
    """A request's `input` as items (a string is one user message)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return list(value or [])


def over_quota(previous: StoredResponse | None, request_bytes: int, limits: StoreLimits, items: int = 0) -> str | None:
    """Why a turn cannot be stored whole (its conversation alone exceeds the team's quota, or it has
    more than MAX_TURN_ITEMS input items of its own), or None."""
    if items > MAX_TURN_ITEMS:
        return (f"this turn has {items} input items; a turn to be stored may hold at most {MAX_TURN_ITEMS} items of its own "
                "(continue with previous_response_id to send only the new ones)")
    depth = (previous.depth if previous else 0) + 1
    size = (previous.chain_bytes if previous else 0) + request_bytes
    if depth > limits.max_entries:
        return f"this conversation would hold {depth} responses, over the team's quota of {limits.max_entries} (policy responses_store.max_entries)"
    if size > limits.max_bytes:
        return f"this conversation would store about {size} bytes, over the team's quota of {limits.max_bytes} (policy responses_store.max_bytes)"
    return None


class ResponseStore(Protocol):
    """A record is readable by `get` and `chain` as soon as `put` has been called, before the write
    completes. `limits` maps a team to its share; a team it does not name gets `StoreLimits()`."""

    limits: Mapping[str, StoreLimits]

    async def put(self, record: StoredResponse) -> None: ...
    async def get(self, team: str, response_id: str) -> StoredResponse | None: ...
    async def chain(self, team: str, response_id: str) -> list[StoredResponse]:
        """The conversation ending at `response_id`, oldest first: empty when the id is unknown; when
        the first record still names a `previous`, that one is gone (deleted or expired)."""
        ...
    async def find_items(self, team: str, item_ids: list[str]) -> dict[str, tuple[StoredResponse, dict[str, Any]]]:
        """item id → (the team's record holding it, the item), for the ids the team's records hold."""
        ...
    async def delete(self, team: str, response_id: str) -> bool: ...
    async def chain_bytes(self, team: str, response_id: str) -> int:
        """Stored bytes of the conversation ending at `response_id` (0 when the id is unknown): what a
        continuation sends the provider besides its own turn, read without reading the records."""
        ...
    async def item_bytes(self, team: str, item_ids: list[str]) -> int:
        """Stored bytes of the team's records holding these items, each record once: a bound on what
        `find_items` reads, known without reading the records (so it can be held first)."""
        ...


def _parts(ids: list[str], size: int = 500) -> Iterator[list[str]]:
    """`ids` in slices SQLite takes as one statement's variables (at most 32,766; 999 before 3.32):
    300,000 item references in one `IN (...)` failed the request with a 500."""
    for start in range(0, len(ids), size):
        yield ids[start:start + size]


def _by_bytes(sized: list[tuple[str, int]], budget: int) -> Iterator[list[str]]:
    """Ids in order, in runs of about `budget` bytes (a run holds at least one)."""
    part: list[str] = []
    size = 0
    for rid, bytes_ in sized:
        if part and size + bytes_ > budget:
            yield part
            part, size = [], 0
        part.append(rid)
        size += bytes_
    if part:
        yield part


def pick_items(records: Mapping[str, StoredResponse], owners: Mapping[str, str]) -> dict[str, tuple[StoredResponse, dict[str, Any]]]:
    """`find_items`' answer from item id → owning response id and the records read."""
    found: dict[str, tuple[StoredResponse, dict[str, Any]]] = {}
    for item_id, owner in owners.items():
        record = records.get(owner)
        item = dict(record.items()).get(item_id) if record is not None else None
        if record is not None and item is not None:
            found[item_id] = (record, item)
    return found


_SCHEMA = """
CREATE TABLE IF NOT EXISTS stored_responses (
    team TEXT NOT NULL,
    id TEXT NOT NULL,
    previous TEXT,
    provider TEXT NOT NULL,
    native INTEGER NOT NULL,
    created_at REAL NOT NULL,
    touched_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    depth INTEGER NOT NULL,
    size INTEGER NOT NULL,
    chain_bytes INTEGER NOT NULL,
    input BLOB NOT NULL,
    response BLOB NOT NULL,
    PRIMARY KEY (team, id)
);
CREATE INDEX IF NOT EXISTS stored_responses_lru ON stored_responses (team, touched_at, depth);
CREATE INDEX IF NOT EXISTS stored_responses_expiry ON stored_responses (expires_at);
CREATE TABLE IF NOT EXISTS stored_response_items (
    team TEXT NOT NULL,
    item_id TEXT NOT NULL,
    response_id TEXT NOT NULL,
    PRIMARY KEY (team, item_id)
);
CREATE INDEX IF NOT EXISTS stored_response_items_owner ON stored_response_items (team, response_id);
-- Each team's count and bytes, kept by the database itself on every insert and delete: the quota
-- check of every put reads one row instead of summing the team's records (at 3,000 records that
-- sum was two thirds of a put, and a put holds the store's one connection).
CREATE TABLE IF NOT EXISTS stored_response_totals (
    team TEXT PRIMARY KEY,
    count INTEGER NOT NULL,
    size INTEGER NOT NULL
);
CREATE TRIGGER IF NOT EXISTS stored_responses_counted AFTER INSERT ON stored_responses BEGIN
    INSERT INTO stored_response_totals VALUES (NEW.team, 1, NEW.size)
        ON CONFLICT (team) DO UPDATE SET count = count + 1, size = size + NEW.size;
END;
CREATE TRIGGER IF NOT EXISTS stored_responses_uncounted AFTER DELETE ON stored_responses BEGIN
    UPDATE stored_response_totals SET count = count - 1, size = size - OLD.size WHERE team = OLD.team;
END;
"""
# Run at open: a file written before the totals existed (or by an older version) starts right.
_RECOUNT = """
BEGIN IMMEDIATE;
DELETE FROM stored_response_totals;
INSERT INTO stored_response_totals SELECT team, COUNT(*), SUM(size) FROM stored_responses GROUP BY team;
COMMIT;
"""
_INSERT = "INSERT INTO stored_responses VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_COLUMNS = "id, team, provider, native, created_at, input, response, previous, depth, chain_bytes"
_CHAIN = """
WITH RECURSIVE chain(id, n) AS (
    SELECT ?, 0
    UNION ALL
    SELECT r.previous, chain.n + 1 FROM stored_responses r JOIN chain ON r.team = ? AND r.id = chain.id
    WHERE r.previous IS NOT NULL AND r.expires_at >= ? AND chain.n < ?
)
SELECT %s FROM chain JOIN stored_responses r ON r.team = ? AND r.id = chain.id AND r.expires_at >= ? ORDER BY chain.n
"""
_CHAIN_SIZES = _CHAIN % "r.id, r.size"  # newest first; parameters: id, team, now, most steps back, team, now
_CHAIN_PREVIOUS = _CHAIN % "r.id, r.previous"


@dataclass(slots=True, eq=False)  # hashed by identity: a turn keys its failures by write
class _Write:
    """A put waiting for its team's write turn, and the future of its caller's loop it answers."""

    record: StoredResponse
    limits: StoreLimits
    now: float  # its conversation was renewed at `now`: the eviction it runs takes only what was used before
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future[None] = field(init=False)

    def __post_init__(self) -> None:
        self.done = self.loop.create_future()


def _answer(settled: list[tuple[asyncio.Future[None], BaseException | None]]) -> None:
    """On a caller's loop: its puts of one write turn answered (a caller gone by then is skipped)."""
    for done, failure in settled:
        if done.done():
            continue
        if failure is None:
            done.set_result(None)
        else:
            done.set_exception(failure)


def _row(row: tuple[Any, ...]) -> StoredResponse:
    rid, team, provider, native, created_at, input_, response, previous, depth, chain_bytes = row
    return StoredResponse(rid, team, provider, bool(native), created_at, orjson.loads(input_), orjson.loads(response),
                          previous, depth, chain_bytes)


class SQLiteResponseStore:
    """The embedded store: one SQLite file, calls run in a worker thread (never on the event loop) as
    their team's turns (`_TURNS`): a chain renewal or read, an item lookup, a large record are
    several turns, one per hold of the lock, so another team's call waits for one of them at most."""

    def __init__(self, path: Path, limits: Mapping[str, StoreLimits] | None = None):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.limits: Mapping[str, StoreLimits] = limits if limits is not None else {}
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._migrate()
        self._db.executescript(_RECOUNT)
        self._pending: dict[tuple[str, str], StoredResponse] = {}  # put, not yet written
        # team → its puts waiting for a write turn (one is submitted while the list is not empty);
        # appended on the callers' loops, taken in the store's thread, under `_queued_lock`.
        self._queued: dict[str, list[_Write]] = {}
        self._queued_lock = threading.Lock()

    async def _turn(self, team: str, fn: Callable[..., _T], *args: Any) -> _T:
        """`fn(*args)` in the store's thread, as one of `team`'s turns."""
        return await asyncio.wrap_future(_TURNS.submit(functools.partial(fn, *args), tenant=team))

    async def _written(self, write: _Write) -> None:
        """`write` committed, with whatever else its team has queued by its turn (group commit)."""
        team = write.record.team
        with self._queued_lock:
            queued = self._queued.setdefault(team, [])
            queued.append(write)
            first = len(queued) == 1
        if first:  # the queue's turn; a write queued behind it is taken by the same turn or the next one
            _TURNS.submit(functools.partial(self._write_turn, team), tenant=team)
        await write.done

    async def put(self, record: StoredResponse) -> None:
        key, team, now = (record.team, record.id), record.team, time.time()
        self._pending[key] = record  # readable at once, while the write waits for its turns
        try:
            limits = self.limits.get(team, StoreLimits())
            cursor, walked = record.previous, 0
            while cursor is not None and walked < MAX_CHAIN:  # the conversation it continues is renewed first
                cursor, renewed = await self._turn(team, self._renew, team, cursor, now, limits)
                walked += renewed
            await self._written(_Write(record, limits, now, asyncio.get_running_loop()))
        finally:
            if self._pending.get(key) is record:
                del self._pending[key]

    async def get(self, team: str, response_id: str) -> StoredResponse | None:
        pending = self._pending.get((team, response_id))
        if pending is not None:
            return pending
        sized = await self._turn(team, self._sizes, team, [response_id])
        return next(iter([found async for _, records in self._read(team, sized) for found in records.values()]), None)

    async def chain_bytes(self, team: str, response_id: str) -> int:
        pending = self._pending.get((team, response_id))
        if pending is not None:  # not written yet: its conversation before it
            return await self.chain_bytes(team, pending.previous) if pending.previous else 0
        return await self._turn(team, self._chain_bytes, team, response_id)

    async def chain(self, team: str, response_id: str) -> list[StoredResponse]:
        pending = self._pending.get((team, response_id))
        if pending is None:
            return await self._chain(team, response_id)
        return [*(await self._chain(team, pending.previous) if pending.previous else []), pending]

    async def find_items(self, team: str, item_ids: list[str]) -> dict[str, tuple[StoredResponse, dict[str, Any]]]:
        if not item_ids:
            return {}
        owners, sized = await self._turn(team, self._owners, team, item_ids)
        records: dict[str, StoredResponse] = {}
        async for _, found in self._read(team, sized):
            records |= found
        return pick_items(records, owners)

    async def item_bytes(self, team: str, item_ids: list[str]) -> int:
        if not item_ids:
            return 0
        _, sized = await self._turn(team, self._owners, team, item_ids)
        return sum(size for _, size in sized)

    async def delete(self, team: str, response_id: str) -> bool:
        pending = self._pending.pop((team, response_id), None)
        return await self._turn(team, self._delete, team, response_id) or pending is not None

    async def _chain(self, team: str, response_id: str) -> list[StoredResponse]:
        """The chain's ids and sizes first, then its records; a record gone meanwhile ends the chain
        there (the newer part kept)."""
        now = time.time()
        sized = await self._turn(team, self._chain_sizes, team, response_id, now)
        newest_first: list[StoredResponse] = []
        async for part, records in self._read(team, sized):
            whole = [records[rid] for rid in itertools.takewhile(records.__contains__, part)]
            newest_first += whole
            if len(whole) < len(part):
                break
        return newest_first[::-1]

    async def _read(self, team: str, sized: list[tuple[str, int]]) -> AsyncIterator[tuple[list[str], dict[str, StoredResponse]]]:
        """The records named, in runs of about CHAIN_BYTES_PER_READ, one turn each: (the run's ids, the
        records of them still stored). A record larger than that is read a part a turn (LargeRead)."""
        sizes = dict(sized)
        for part in _by_bytes(sized, CHAIN_BYTES_PER_READ):
            if len(part) > 1 or sizes[part[0]] <= CHAIN_BYTES_PER_READ:
                yield part, await self._turn(team, self._records, team, part)
                continue
            reader = await self._turn(team, LargeRead.open, self.path, team, part[0], time.time(), CHAIN_BYTES_PER_READ)
            if reader is None:
                yield part, {}
                continue
            try:
                while not reader.done:
                    await self._turn(team, reader.read_part)
            finally:
                if not reader.done:  # cancelled: its connection is closed at the team's next turn
                    _TURNS.submit(reader.close, tenant=team)
            record = await asyncio.wrap_future(HEAVY_POOL.submit(functools.partial(_row, reader.row()), tenant=team))
            yield part, {record.id: record}

    def _migrate(self) -> None:
        """Records of the earlier format (table `responses`, each holding its whole conversation) become
        chains of one, so conversations in flight go on after an upgrade (input_items then lists the
        whole conversation); they keep their 30 days from creation."""
        old_format = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'responses'"
        if self._db.execute(old_format).fetchone() is None:
            return
        with self._transaction() as db:
            if db.execute(old_format).fetchone() is None:
                return  # another worker of `--workers N` migrated it meanwhile
            for team, rid, provider, native, created_at, context, response in db.execute(
                    "SELECT team, id, provider, native, created_at, context, response FROM responses").fetchall():
                record = StoredResponse(rid, team, provider, bool(native), created_at, orjson.loads(context), orjson.loads(response))
                size = len(context) + len(response)
                db.execute("INSERT OR IGNORE INTO stored_responses VALUES (?, ?, NULL, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?)",
                           (team, rid, provider, native, created_at, created_at, created_at + RETENTION_S, size, size, context, response))
                db.executemany("INSERT OR IGNORE INTO stored_response_items VALUES (?, ?, ?)",
                               [(team, item_id, rid) for item_id, _ in record.items()])
            db.execute("DROP TABLE responses")

    # --- in the worker thread --------------------------------------------------------------------

    def _write_turn(self, team: str) -> None:
        """One turn of `team`'s queued puts: up to WRITES_PER_TURN of them, about WRITE_BYTES_PER_TURN,
        in one transaction, each in a savepoint of its own (one that fails fails alone); every put's
        caller is answered once the transaction has committed (or failed)."""
        with self._queued_lock:
            taken = self._queued.get(team, [])[:WRITES_PER_TURN]
        serialized: list[tuple[_Write, bytes, bytes]] = []
        failed: dict[_Write, BaseException] = {}
        size = 0
        try:
            for write in taken:
                if serialized and size >= WRITE_BYTES_PER_TURN:
                    break
                try:
                    input_, response = orjson.dumps(write.record.input), orjson.dumps(write.record.response)
                except Exception as exc:  # this put's caller's to handle
                    failed[write] = exc
                    input_ = response = b""
                serialized.append((write, input_, response))
                size += len(input_) + len(response)
        finally:
            with self._queued_lock:  # what this turn took leaves the queue; any left gets the team's next turn
                queued = self._queued.get(team, [])
                del queued[:len(serialized)]
                if queued:
                    _TURNS.submit(functools.partial(self._write_turn, team), tenant=team)
                else:
                    self._queued.pop(team, None)
        try:
            self._write_all([entry for entry in serialized if entry[0] not in failed], failed)
        except BaseException as exc:  # the transaction did not commit: nothing of it was written
            failed = dict.fromkeys((write for write, _, _ in serialized), exc)
        answers: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[None], BaseException | None]]] = {}
        for write, _, _ in serialized:
            answers.setdefault(write.loop, []).append((write.done, failed.get(write)))
        for loop, settled in answers.items():  # one wake-up of each caller's loop for the whole turn
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits there any more
                loop.call_soon_threadsafe(_answer, settled)

    def _write_all(self, serialized: list[tuple[_Write, bytes, bytes]], failed: dict[_Write, BaseException]) -> None:
        """The records in one transaction. Should one fail, that transaction is rolled back and they are
        written again each in a savepoint, so that it fails alone (a savepoint apiece costs two more
        statements a record, each a hand-over of the GIL with the event loop's thread)."""
        if not serialized:
            return
        with self._lock:
            try:
                with self._transaction():
                    self._write_records(serialized, failed, alone=False)
            except Exception:
                with self._transaction():
                    self._write_records(serialized, failed, alone=True)

    def _write_records(self, serialized: list[tuple[_Write, bytes, bytes]], failed: dict[_Write, BaseException],
                       alone: bool) -> None:
        db, team = self._db, serialized[0][0].record.team  # a turn writes one team's records
        self._expire(min(write.now for write, _, _ in serialized))
        totals = self._totals(team)
        for write, input_, response in serialized:
            if self._pending.get((team, write.record.id)) is not write.record:
                continue  # deleted (or replaced) while waiting for this thread: writing it would resurrect it
            if not alone:
                totals = self._put(write, input_, response, totals)
                continue
            db.execute("SAVEPOINT put")
            try:
                totals = self._put(write, input_, response, totals)
            except Exception as exc:  # this put's caller's to handle; the others commit
                db.execute("ROLLBACK TO put")
                failed[write] = exc
                totals = self._totals(team)
            db.execute("RELEASE put")

    def _totals(self, team: str) -> tuple[int, int]:
        """The team's stored responses and bytes (kept by the database's triggers)."""
        row = self._db.execute("SELECT count, size FROM stored_response_totals WHERE team = ?", (team,)).fetchone()
        return (row[0], row[1]) if row else (0, 0)

    def _put(self, write: _Write, input_: bytes, response: bytes, totals: tuple[int, int]) -> tuple[int, int]:
        """One record written in the open transaction (`_write_turn`); the team's totals before it, and
        after it and its eviction."""
        record, limits, now, db = write.record, write.limits, write.now, self._db
        team, size = record.team, len(input_) + len(response)
        parent = db.execute("SELECT depth, chain_bytes FROM stored_responses WHERE team = ? AND id = ?",
                            (team, record.previous)).fetchone() if record.previous else None
        record.depth, record.chain_bytes = (parent[0] + 1, parent[1] + size) if parent else (1, size)
        row = (team, record.id, record.previous, record.provider, int(record.native), record.created_at, now,
               now + limits.ttl_s, record.depth, size, record.chain_bytes, input_, response)
        if db.execute(_INSERT + " ON CONFLICT (team, id) DO NOTHING", row).rowcount == 1:
            count, total = totals[0] + 1, totals[1] + size  # as the insert's trigger counted it
        else:  # a replaced record (its id written again): it goes, with its items
            self._remove(team, record.id)
            db.execute(_INSERT, row)
            count, total = self._totals(team)
        db.executemany("INSERT OR REPLACE INTO stored_response_items VALUES (?, ?, ?)",
                       [(team, item_id, record.id) for item_id, _ in record.items()])
        return self._evict(team, limits, now, count, total)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (hold `_lock`). IMMEDIATE: it takes the file's write lock before
        reading, waiting out another process's (the workers of `--workers N` share the file). A
        deferred one read first and failed at its first write with `database is locked`, without
        waiting, whenever another process had committed since its read: SQLite cannot move a read
        snapshot forward inside a transaction."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _expire(self, now: float) -> None:
        """Expired records, oldest expiry first, about EXPIRED_BYTES_PER_PUT of them (at least one)."""
        expired: list[tuple[str, str]] = []
        size = 0
        for team, rid, bytes_ in self._db.execute("SELECT team, id, size FROM stored_responses WHERE expires_at < ? "
                                                  "ORDER BY expires_at LIMIT 1000", (now,)):
            if expired and size + bytes_ > EXPIRED_BYTES_PER_PUT:
                break
            expired.append((team, rid))
            size += bytes_
        self._db.executemany("DELETE FROM stored_response_items WHERE team = ? AND response_id = ?", expired)
        self._db.executemany("DELETE FROM stored_responses WHERE team = ? AND id = ?", expired)

    def _renew(self, team: str, response_id: str, now: float, limits: StoreLimits) -> tuple[str | None, int]:
        """CHAIN_RECORDS_PER_HOLD records of the conversation a turn continues, from `response_id` back,
        renewed (its retention counts from its last turn): (where the next part starts, or None at the
        chain's start; the records renewed). A turn renews its chain in parts before its transaction."""
        with self._lock, self._transaction() as db:
            rows = db.execute(_CHAIN_PREVIOUS, (response_id, team, now, CHAIN_RECORDS_PER_HOLD - 1, team, now)).fetchall()
            db.executemany("UPDATE stored_responses SET touched_at = ?, expires_at = ? WHERE team = ? AND id = ?",
                           [(now, now + limits.ttl_s, team, rid) for rid, _ in rows])
        return (rows[-1][1] if len(rows) == CHAIN_RECORDS_PER_HOLD else None), len(rows)

    def _evict(self, team: str, limits: StoreLimits, before: float, count: int, total: int) -> tuple[int, int]:
        """Least recently used first, and within a conversation touched at once its latest turn first;
        only responses last used before the turn being written (its conversation was renewed at `before`).
        Takes and returns the team's totals (responses, bytes)."""
        wanted = 1
        while count > limits.max_entries or total > limits.max_bytes:
            # As many as the count says must go, doubling while the bytes say more (at most 64 a read): a
            # team at its quota evicts one response a put, and reading 64 (each a lookup of its row) for
            # it was the most of the put.
            wanted = min(64, max(wanted, count - limits.max_entries))
            victims = self._db.execute("SELECT id, size FROM stored_responses WHERE team = ? AND touched_at < ? "
                                       "ORDER BY touched_at, depth DESC LIMIT ?", (team, before, wanted)).fetchall()
            if not victims:
                break  # only the conversation being written is left: `over_quota` bounds it
            wanted *= 2
            for rid, size in victims:
                if count <= limits.max_entries and total <= limits.max_bytes:
                    break
                self._remove(team, rid)
                count, total = count - 1, total - size
        return count, total

    def _remove(self, team: str, response_id: str) -> bool:
        self._db.execute("DELETE FROM stored_response_items WHERE team = ? AND response_id = ?", (team, response_id))
        return self._db.execute("DELETE FROM stored_responses WHERE team = ? AND id = ?", (team, response_id)).rowcount > 0

    def _records(self, team: str, ids: list[str]) -> dict[str, StoredResponse]:
        with self._lock:
            rows = self._rows(team, ids)
        return {row[0]: _row(row) for row in rows}

    def _rows(self, team: str, ids: list[str]) -> list[tuple[Any, ...]]:
        rows = []
        for part in _parts(ids):
            marks = ", ".join("?" * len(part))
            rows += self._db.execute(f"SELECT {_COLUMNS} FROM stored_responses WHERE team = ? AND expires_at >= ? AND id IN ({marks})",
                                     (team, time.time(), *part)).fetchall()
        return rows

    def _chain_bytes(self, team: str, response_id: str) -> int:
        with self._lock:
            row = self._db.execute("SELECT chain_bytes FROM stored_responses WHERE team = ? AND id = ? AND expires_at >= ?",
                                   (team, response_id, time.time())).fetchone()
        return int(row[0]) if row else 0

    def _sizes(self, team: str, ids: list[str]) -> list[tuple[str, int]]:
        """(id, stored bytes) of the team's records among `ids`."""
        sized: list[tuple[str, int]] = []
        with self._lock:
            for part in _parts(sorted(set(ids))):
                marks = ", ".join("?" * len(part))
                sized += self._db.execute(f"SELECT id, size FROM stored_responses WHERE team = ? AND expires_at >= ? AND id IN ({marks})",
                                          (team, time.time(), *part)).fetchall()
        return sized

    def _chain_sizes(self, team: str, response_id: str, now: float) -> list[tuple[str, int]]:
        with self._lock:
            return self._db.execute(_CHAIN_SIZES, (response_id, team, now, MAX_CHAIN, team, now)).fetchall()

    def _owners(self, team: str, item_ids: list[str]) -> tuple[dict[str, str], list[tuple[str, int]]]:
        """item id → the id of the team's record holding it, and (id, stored bytes) of those records."""
        owners: dict[str, str] = {}
        with self._lock:
            for part in _parts(item_ids):
                marks = ", ".join("?" * len(part))
                owners |= dict(self._db.execute(f"SELECT item_id, response_id FROM stored_response_items WHERE team = ? AND item_id IN ({marks})",
                                                (team, *part)).fetchall())
        return owners, self._sizes(team, list(owners.values()))

    def _delete(self, team: str, response_id: str) -> bool:
        with self._lock, self._transaction():  # the record and its items together
            return self._remove(team, response_id)

    def close(self) -> None:
        with self._lock:
            self._db.close()
