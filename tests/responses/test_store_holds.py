"""The response store holds nothing every team shares for long, SQLite and Redis alike: a long chain, a
large record, a renewal or an expiry is read or written a few mebibytes per Redis script or per hold of
the SQLite store's lock, and the teams' calls take turns."""

from __future__ import annotations

import asyncio
import sqlite3

from sdk.responses.redis_store import RedisResponseStore
from sdk.responses.sqlite_store import SQLiteResponseStore
from sdk.responses.store import StoredResponse, StoreLimits
from sdk.state import open_state
from sdk.state.guard import GuardedState
from tests.responses.conftest import MIB, stored_response
from tests.state.conftest import redis_server, redis_url  # noqa: F401  (fixtures)


async def test_a_long_chain_is_read_in_short_scripts(redis_url, tmp_path):  # noqa: F811
    """A script holds Redis, which every replica and team shares, until it ends: a 50 MiB conversation
    read in one script held it for 200 ms, past every other caller's 100 ms timeout (a 1 GiB quota
    allows 4 s). Each script now returns about CHAIN_BYTES_PER_SCRIPT, and the chain is still whole."""
    from sdk.responses import redis_store

    state = open_state(redis_url)
    assert isinstance(state, GuardedState)
    store = RedisResponseStore(state, SQLiteResponseStore(tmp_path / "r.sqlite3"))
    previous = None
    for turn in range(24):
        await store.put(stored_response("a", f"resp_{turn}", previous, text=f"{turn}:" + "x" * MIB))
        previous = f"resp_{turn}"
    replies: list[int] = []
    call = store._call

    async def measured(*args):
        reply = await call(*args)
        if args[0] == "EVAL" and args[1] == redis_store._CHAIN:
            replies.append(sum(len(part) for part in reply if isinstance(part, bytes)))
        return reply

    store._call = measured  # type: ignore[method-assign]
    chain = await store.chain("a", "resp_23")
    assert [r.id for r in chain] == [f"resp_{t}" for t in range(24)]
    assert replies and max(replies) <= redis_store.CHAIN_BYTES_PER_SCRIPT + 2 * MIB  # the budget and the record that crossed it
    await state.close()


class _Held(list):
    """Rows fetched, as a cursor gives them (iterated or fetched all)."""

    rowcount = 0

    def fetchall(self) -> list:
        return list(self)

    def fetchone(self):
        return self[0] if self else None


class _MeasuredHolds:
    """The SQLite store's lock and connection in one: the bytes each hold of the lock reads."""

    def __init__(self, store: SQLiteResponseStore):
        self.lock, self.db, self.reads, self.current = store._lock, store._db, [], 0
        self.renewed: list[int] = []  # records each renewal statement touched
        self.deleted: list[int] = []  # records each hold deleted

    def __enter__(self) -> None:
        self.lock.acquire()
        self.current = self.removed = 0

    def __exit__(self, *exc) -> None:
        self.reads.append(self.current)
        self.deleted.append(self.removed)
        self.lock.release()

    def execute(self, sql: str, params=()) -> _Held:
        cursor = self.db.execute(sql, params)
        rows = _Held(cursor.fetchall())
        rows.rowcount = cursor.rowcount
        if sql.startswith("DELETE FROM stored_responses "):
            self.removed += cursor.rowcount
        self.current += sum(len(value) for row in rows for value in row if isinstance(value, bytes | str))
        return rows

    def executemany(self, sql: str, rows) -> None:
        rows = list(rows)
        if sql.startswith("UPDATE stored_responses SET touched_at"):
            self.renewed.append(len(rows))
        cursor = self.db.executemany(sql, rows)
        if sql.startswith("DELETE FROM stored_responses "):
            self.removed += cursor.rowcount


async def test_a_long_chain_is_read_from_sqlite_a_few_mebibytes_at_a_time(tmp_path):
    """The SQLite store has one connection, under one lock, for every team: a conversation's whole
    chain was read in one statement while holding it (a team's quota allows 1 GiB), and every other
    team's read and write (a Responses answer is stored before the client sees it) waited for it.
    The chain's ids come first; its records are read about CHAIN_BYTES_PER_READ at a time, the lock
    let go between, and the chain is still whole."""
    from sdk.responses import sqlite_store

    store = SQLiteResponseStore(tmp_path / "r.sqlite3")
    previous = None
    for turn in range(24):
        await store.put(stored_response("a", f"resp_{turn}", previous, text=f"{turn}:" + "x" * MIB))
        previous = f"resp_{turn}"
    held = _MeasuredHolds(store)
    store._lock, store._db = held, held  # type: ignore[assignment]
    chain = await store.chain("a", "resp_23")
    assert [r.id for r in chain] == [f"resp_{t}" for t in range(24)]
    assert max(held.reads) <= sqlite_store.CHAIN_BYTES_PER_READ + 2 * MIB  # before: 24 MiB in one hold
    store._lock, store._db = held.lock, held.db


async def test_a_turn_renews_a_deep_sqlite_chain_a_part_at_a_time_and_keeps_it_whole(tmp_path, monkeypatch):
    """Writing a turn renews its whole conversation. In SQLite that ran in the turn's transaction,
    under the lock every team's store calls take: a conversation of 10,000 turns made each further
    turn hold it for every record of the chain. The chain is renewed CHAIN_RECORDS_PER_HOLD records
    a hold now (4 here), before the turn's transaction, whose eviction takes only responses last used
    before the turn: the conversation stays whole."""
    from sdk.responses import sqlite_store

    monkeypatch.setattr(sqlite_store, "CHAIN_RECORDS_PER_HOLD", 4, raising=False)
    store = SQLiteResponseStore(tmp_path / "r.sqlite3", {"a": StoreLimits(max_entries=13, ttl_s=1000)})
    await store.put(stored_response("a", "idle"))
    previous = None
    for turn in range(12):
        await store.put(stored_response("a", f"resp_{turn}", previous))
        previous = f"resp_{turn}"
    held = _MeasuredHolds(store)
    store._lock, store._db = held, held  # type: ignore[assignment]
    await store.put(stored_response("a", "resp_12", "resp_11"))  # the 14th record: one must go
    store._lock, store._db = held.lock, held.db
    assert sum(held.renewed) == 12 and max(held.renewed) <= 4  # before: 13 in the turn's own hold
    assert [r.id for r in await store.chain("a", "resp_12")] == [f"resp_{t}" for t in range(13)]
    assert await store.get("a", "idle") is None


async def test_records_expiring_together_are_deleted_a_few_mebibytes_per_write(tmp_path):
    """Every write deleted every team's expired records in its transaction, under the lock every team's
    store calls take: a team's burst of records expiring together (here 40 of 256 KiB) was deleted by
    whichever team wrote next, every other call waiting. A write deletes about EXPIRED_BYTES_PER_PUT
    of them now, oldest first; reads never see the rest, and later writes delete them."""
    from sdk.responses import sqlite_store

    store = SQLiteResponseStore(tmp_path / "r.sqlite3")
    for i in range(40):
        await store.put(stored_response("a", f"resp_{i}", text="x" * (256 * 1024)))
    with store._lock:
        store._db.execute("UPDATE stored_responses SET expires_at = 1 WHERE team = 'a'")  # as if written long ago
    held = _MeasuredHolds(store)
    store._lock, store._db = held, held  # type: ignore[assignment]
    await store.put(stored_response("b", "resp_b"))
    store._lock, store._db = held.lock, held.db
    assert 0 < max(held.deleted) <= sqlite_store.EXPIRED_BYTES_PER_PUT // (256 * 1024)  # before: all 40 at once
    assert await store.get("a", "resp_39") is None
    for i in range(3):
        await store.put(stored_response("b", f"resp_b{i}"))
    with sqlite3.connect(store.path) as db:
        assert db.execute("SELECT COUNT(*) FROM stored_responses WHERE team = 'a'").fetchone() == (0,)
        assert db.execute("SELECT COUNT(*) FROM stored_response_items WHERE team = 'a'").fetchone() == (0,)


async def test_the_records_an_item_lookup_needs_are_read_a_few_mebibytes_at_a_time(tmp_path):
    """An item_reference lookup read every record holding a referenced item in one hold of the lock
    every team's store calls take (a turn may name 10,000 items, across a team's 1 GiB of records).
    They are read about CHAIN_BYTES_PER_READ at a time now."""
    from sdk.responses import sqlite_store

    store = SQLiteResponseStore(tmp_path / "r.sqlite3")
    for turn in range(24):
        await store.put(stored_response("a", f"resp_{turn}", text=f"{turn}:" + "x" * MIB))
    held = _MeasuredHolds(store)
    store._lock, store._db = held, held  # type: ignore[assignment]
    found = await store.find_items("a", [f"msg_resp_{turn}" for turn in range(24)])
    store._lock, store._db = held.lock, held.db
    assert sorted(found) == sorted(f"msg_resp_{turn}" for turn in range(24))
    assert max(held.reads) <= sqlite_store.CHAIN_BYTES_PER_READ + 2 * MIB  # before: 24 MiB in one hold


async def test_a_chain_cut_while_it_is_read_ends_at_the_cut(tmp_path):
    """A record removed between two reads of a chain (deleted, evicted, expired) ends the chain there,
    as one statement would have found it: the newer part is returned, never a chain with a hole."""
    from sdk.responses import sqlite_store

    store = SQLiteResponseStore(tmp_path / "r.sqlite3")
    previous = None
    for turn in range(12):
        await store.put(stored_response("a", f"resp_{turn}", previous, text="x" * MIB))
        previous = f"resp_{turn}"
    reads = store._rows

    def cut_after_the_first_read(team: str, ids: list[str]) -> list:
        rows = reads(team, ids)
        store._remove("a", "resp_5")
        return rows

    store._rows = cut_after_the_first_read  # type: ignore[method-assign]
    chain = await store.chain("a", "resp_11")
    assert sqlite_store.CHAIN_BYTES_PER_READ < 8 * MIB
    assert [r.id for r in chain] == [f"resp_{t}" for t in range(6, 12)]


async def test_the_records_an_item_lookup_needs_are_read_from_redis_in_short_scripts(redis_url, tmp_path):  # noqa: F811
    """One script looked up up to 1,000 items and returned every record holding one of them: a lookup
    naming items across a team's large records (its quota allows 1 GiB) held Redis, which every
    replica and team shares, for the whole reply. The owners come first; the records follow about
    CHAIN_BYTES_PER_SCRIPT a script."""
    from sdk.responses import redis_store

    state = open_state(redis_url)
    assert isinstance(state, GuardedState)
    store = RedisResponseStore(state, SQLiteResponseStore(tmp_path / "r.sqlite3"))
    for turn in range(24):
        await store.put(stored_response("a", f"resp_{turn}", text=f"{turn}:" + "x" * MIB))
    replies: list[int] = []
    call = store._call

    async def measured(*args):
        reply = await call(*args)
        if args[0] == "EVAL":
            replies.append(sum(len(part) for part in _flat(reply) if isinstance(part, bytes)))
        return reply

    store._call = measured  # type: ignore[method-assign]
    found = await store.find_items("a", [f"msg_resp_{turn}" for turn in range(24)])
    assert sorted(found) == sorted(f"msg_resp_{turn}" for turn in range(24))
    assert max(replies) <= redis_store.CHAIN_BYTES_PER_SCRIPT + 2 * MIB  # before: 24 MiB in one reply
    await state.close()


def _flat(reply) -> list:
    return [part for item in reply for part in _flat(item)] if isinstance(reply, list) else [reply]


async def test_a_turn_does_not_renew_every_item_of_its_conversation(redis_url, tmp_path):  # noqa: F811
    """Writing a turn renews its conversation's retention. Each earlier item had a key of its own, renewed
    one by one in the write's script: 40 turns of 10,000 items made every further one-line turn hold
    Redis, which every replica and team shares, for 150 ms (400,000 EXPIREs). The items are one hash
    per team now, renewed with one EXPIRE, and still found and dropped with their responses."""
    state = open_state(redis_url)
    assert isinstance(state, GuardedState)
    store = RedisResponseStore(state, SQLiteResponseStore(tmp_path / "r.sqlite3"))
    client = store.redis.client

    def msg(turn: int, i: int) -> dict:
        return {"type": "message", "id": f"msg_{turn}_{i}", "role": "user", "content": "x"}

    previous = None
    for turn in range(4):
        record = StoredResponse(f"resp_{turn}", "a", "claude", False, 0.0, [msg(turn, i) for i in range(1000)],
                                {"id": f"resp_{turn}", "output": []}, previous)
        await store.put(record)
        previous = record.id

    async def commands() -> int:
        stats = (await client.execute("INFO", "commandstats")).decode()
        return sum(int(line.split("calls=")[1].split(",")[0]) for line in stats.splitlines() if line.startswith("cmdstat_"))

    before = await commands()
    await store.put(stored_response("a", "resp_last", previous))
    assert await commands() - before < 200  # about a dozen per turn of the chain, not one per item
    found = await store.find_items("a", ["msg_0_0", "msg_3_999"])
    assert sorted(r.id for r, _ in found.values()) == ["resp_0", "resp_3"]
    await store.delete("a", "resp_0")
    assert await store.find_items("a", ["msg_0_0"]) == {}
    assert await store.find_items("b", ["msg_3_999"]) == {}
    await state.close()


async def test_a_deep_chain_is_renewed_in_short_scripts_and_kept_whole(redis_url, tmp_path, monkeypatch):  # noqa: F811
    """Writing a turn renews its whole conversation, one script walking the chain: a 10,000-turn
    conversation made every further turn hold Redis, which every replica and team shares, for about
    120 ms, more with each turn. The chain is renewed CHAIN_RECORDS_PER_SCRIPT records a script now
    (4 here), before the turn's own script, whose eviction takes only responses last used before
    the turn: the conversation stays whole, however far back it goes."""
    from sdk.responses import redis_store

    monkeypatch.setattr(redis_store, "CHAIN_RECORDS_PER_SCRIPT", 4)
    state = open_state(redis_url)
    assert isinstance(state, GuardedState)
    store = RedisResponseStore(state, SQLiteResponseStore(tmp_path / "r.sqlite3"), {"a": StoreLimits(max_entries=13, ttl_s=1000)})
    await store.put(stored_response("a", "idle"))
    previous = None
    for turn in range(12):
        await store.put(stored_response("a", f"resp_{turn}", previous))
        previous = f"resp_{turn}"
    client = store.redis.client
    base = store._base("a")
    for turn in range(12):
        await client.execute("EXPIRE", f"{base}r:resp_{turn}", 10)  # as if written long ago
    renewing: list[int] = []
    call = store._call

    async def counted(*args):
        reply = await call(*args)
        if args[0] == "EVAL" and args[1] == redis_store._RENEW:
            renewing.append(int(args[8]))
        return reply

    store._call = counted  # type: ignore[method-assign]
    await store.put(stored_response("a", "resp_12", previous))  # 14 > 13: the idle one goes, no turn of the chain
    assert renewing == [4, 4, 4]  # 12 earlier turns, 4 a script
    assert min([await client.execute("TTL", f"{base}r:resp_{turn}") for turn in range(12)]) > 900
    assert await store.get("a", "idle") is None
    assert [r.id for r in await store.chain("a", "resp_12")] == [f"resp_{t}" for t in range(13)]
    await state.close()


async def _finishing_order(store: SQLiteResponseStore, calls: list[tuple[str, str]]) -> list[str]:
    """The teams of `calls` ((team, response id) reads, queued in this order while the store is busy),
    in the order they finished."""
    finished: list[str] = []

    async def read(team: str, response_id: str) -> None:
        found = await store.get(team, response_id)
        assert found is not None and found.id == response_id
        finished.append(team)

    store._lock.acquire()  # the store busy: every call below queues behind it
    try:
        tasks = []
        for team, response_id in calls:
            tasks.append(asyncio.create_task(read(team, response_id)))
            await asyncio.sleep(0)  # queued before the next
    finally:
        store._lock.release()
    await asyncio.gather(*tasks)
    return finished


async def test_one_teams_many_store_calls_do_not_hold_another_teams(tmp_path):
    """The SQLite store's calls ran in asyncio's default thread pool behind its one lock, first come,
    first served: a team with many store calls queued (here 20 reads) held another team's read until
    all of them had run. Each hold of the lock is a turn of its team's now (sdk/offload.py:FairPool),
    and the teams take turns."""
    store = SQLiteResponseStore(tmp_path / "r.sqlite3")
    await store.put(stored_response("a"))
    await store.put(stored_response("b"))
    finished = await _finishing_order(store, [("a", "resp_1")] * 20 + [("b", "resp_1")])
    assert finished.index("b") <= 2  # after at most two of team a's (16 before)


async def test_a_large_record_is_read_a_part_a_turn(tmp_path, monkeypatch):
    """One stored response was read whole in one hold of the store's lock (a team's record may be as
    large as its body limit, 32 MiB by default): another team's read queued behind it waited for all
    of it. A record over CHAIN_BYTES_PER_READ is read that much a turn now, on a connection of its own
    in one read transaction, so a record deleted while it is read still comes back whole."""
    from sdk.responses import sqlite_store

    store = SQLiteResponseStore(tmp_path / "r.sqlite3")
    text = "x" * (24 * MIB)
    await store.put(stored_response("a", "resp_big", text=text))
    await store.put(stored_response("b"))
    assert 24 * MIB > 4 * sqlite_store.CHAIN_BYTES_PER_READ
    assert await _finishing_order(store, [("a", "resp_big"), ("b", "resp_1")]) == ["b", "a"]  # ["a", "b"] before

    read_part = sqlite_store.LargeRead.read_part
    parts: list[int] = []

    def deleted_after_the_first_part(reader: sqlite_store.LargeRead) -> None:
        read_part(reader)
        parts.append(reader.parts_read)
        if reader.parts_read == 1:
            with store._lock:
                assert store._remove("a", "resp_big")

    monkeypatch.setattr(sqlite_store.LargeRead, "read_part", deleted_after_the_first_part)
    found = await store.get("a", "resp_big")
    assert found is not None and found.input == [{"role": "user", "content": text}]
    assert len(parts) >= 6 and await store.get("a", "resp_big") is None
