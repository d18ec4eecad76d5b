"""The embedded response store: one SQLite file under the data dir (the `ResponseStore` protocol and
the records it keeps: sdk/responses/store.py).

Durability (SQLite): `put` returns once its record's transaction has committed (WAL, synchronous
NORMAL: a committed record survives the process's crash; a power loss may take the last ones). The
puts a team has waiting for the store's thread are committed together (group commit, WRITES_PER_TURN),
which changes when a put returns, never what a returned put promises.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from sdk.offload import HEAVY_POOL, FairPool
from sdk.responses.sqlite_parts import LargeRead
from sdk.responses.sqlite_schema import (
    CHAIN_PREVIOUS,
    CHAIN_SIZES,
    COLUMNS,
    INSERT,
    RECOUNT,
    SCHEMA,
    id_slices,
    runs_by_bytes,
)
from sdk.responses.store import (
    MAX_CHAIN,
    RETENTION_S,
    StoredResponse,
    StoreLimits,
    pick_items,
)

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


class _OpeningLock:
    """The store's lock (one connection, every team's calls; a call takes it only in the store's thread).
    Whoever takes it first opens the file: its schema, a migration from the older format and a recount
    of every team's totals (a scan of the records table). They ran where the store was made, on the
    event loop every team's requests share, at the first Responses request after a start."""

    def __init__(self, open_file: Callable[[], None]) -> None:
        self._lock = threading.Lock()
        self._open_file: Callable[[], None] | None = open_file

    def acquire(self, opening: bool = True) -> None:
        self._lock.acquire()
        if opening and self._open_file is not None:
            try:
                self._open_file()
            except BaseException:  # the next call tries again
                self._lock.release()
                raise
            self._open_file = None

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class SQLiteResponseStore:
    """The embedded store: one SQLite file, calls run in a worker thread (never on the event loop) as
    their team's turns (`_TURNS`): a chain renewal or read, an item lookup, a large record are
    several turns, one per hold of the lock, so another team's call waits for one of them at most."""

    def __init__(self, path: Path, limits: Mapping[str, StoreLimits] | None = None):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.limits: Mapping[str, StoreLimits] = limits if limits is not None else {}
        self._lock = _OpeningLock(self._open)  # the file is opened by the first call, in the store's thread
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
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
        for part in runs_by_bytes(sized, CHAIN_BYTES_PER_READ):
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

    def _open(self) -> None:
        """(Holding `_lock`, at its first hold.) The schema, the older format migrated, every team's totals recounted."""
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._migrate()
        self._db.executescript(RECOUNT)

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
        if db.execute(INSERT + " ON CONFLICT (team, id) DO NOTHING", row).rowcount == 1:
            count, total = totals[0] + 1, totals[1] + size  # as the insert's trigger counted it
        else:  # a replaced record (its id written again): it goes, with its items
            self._remove(team, record.id)
            db.execute(INSERT, row)
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
            rows = db.execute(CHAIN_PREVIOUS, (response_id, team, now, CHAIN_RECORDS_PER_HOLD - 1, team, now)).fetchall()
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
        for part in id_slices(ids):
            marks = ", ".join("?" * len(part))
            rows += self._db.execute(f"SELECT {COLUMNS} FROM stored_responses WHERE team = ? AND expires_at >= ? AND id IN ({marks})",
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
            for part in id_slices(sorted(set(ids))):
                marks = ", ".join("?" * len(part))
                sized += self._db.execute(f"SELECT id, size FROM stored_responses WHERE team = ? AND expires_at >= ? AND id IN ({marks})",
                                          (team, time.time(), *part)).fetchall()
        return sized

    def _chain_sizes(self, team: str, response_id: str, now: float) -> list[tuple[str, int]]:
        with self._lock:
            return self._db.execute(CHAIN_SIZES, (response_id, team, now, MAX_CHAIN, team, now)).fetchall()

    def _owners(self, team: str, item_ids: list[str]) -> tuple[dict[str, str], list[tuple[str, int]]]:
        """item id → the id of the team's record holding it, and (id, stored bytes) of those records."""
        owners: dict[str, str] = {}
        with self._lock:
            for part in id_slices(item_ids):
                marks = ", ".join("?" * len(part))
                owners |= dict(self._db.execute(f"SELECT item_id, response_id FROM stored_response_items WHERE team = ? AND item_id IN ({marks})",
                                                (team, *part)).fetchall())
        return owners, self._sizes(team, list(owners.values()))

    def _delete(self, team: str, response_id: str) -> bool:
        with self._lock, self._transaction():  # the record and its items together
            return self._remove(team, response_id)

    def close(self) -> None:
        self._lock.acquire(opening=False)  # a store never used is not opened to be closed
        try:
            self._db.close()
        finally:
            self._lock.release()
