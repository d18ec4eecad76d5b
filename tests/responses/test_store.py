"""The response store on its own, SQLite and Redis alike: per-team keys, readable at once, deletes
that stick, chains walked (never copied), item lookup, per-team quota and retention."""

from __future__ import annotations

import asyncio
import multiprocessing
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from sdk.responses.redis_store import RedisResponseStore
from sdk.responses.sqlite_store import SQLiteResponseStore
from sdk.responses.store import ResponseStore, StoreLimits, history
from sdk.state import open_state
from sdk.state.guard import GuardedState
from tests.responses.conftest import MIB, stored_response
from tests.state.conftest import redis_server, redis_url  # noqa: F401  (fixtures)


async def test_records_are_per_team_and_survive_a_reopen(tmp_path):
    store = SQLiteResponseStore(tmp_path / "r.sqlite3")
    put = asyncio.ensure_future(store.put(stored_response("a")))
    await asyncio.sleep(0)  # the write has started, not finished
    assert (await store.get("a", "resp_1")).input == [{"role": "user", "content": "hi"}]
    await put
    assert await store.get("b", "resp_1") is None and not await store.delete("b", "resp_1")
    assert await store.find_items("b", ["msg_resp_1"]) == {}
    reopened = SQLiteResponseStore(tmp_path / "r.sqlite3")
    found = await reopened.get("a", "resp_1")
    assert found is not None and history([found])[-1]["type"] == "message"


async def test_a_delete_during_the_write_sticks(tmp_path):
    store = SQLiteResponseStore(tmp_path / "r.sqlite3")
    put = asyncio.ensure_future(store.put(stored_response("a")))
    await asyncio.sleep(0)
    assert await store.delete("a", "resp_1")
    await put
    assert await store.get("a", "resp_1") is None


async def test_puts_waiting_together_are_written_in_one_transaction_and_fail_alone(tmp_path):
    """A transaction per stored response cost the store's thread a WAL commit each (~100 µs of CPU,
    a third of a millisecond): the puts a team has waiting are written in one now, each answered
    once it has committed; one that cannot be written fails alone, its neighbours stored."""
    store = SQLiteResponseStore(tmp_path / "r.sqlite3")
    commits: list[str] = []
    store._db.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)
    broken = stored_response("a", "resp_broken")
    broken.response["unserializable"] = {1, 2}  # orjson refuses a set
    puts = [store.put(stored_response("a", f"resp_{i}")) for i in range(20)]
    results = await asyncio.gather(*puts[:10], store.put(broken), *puts[10:], return_exceptions=True)
    assert [type(r).__name__ for r in results].count("TypeError") == 1 and results.count(None) == 20
    assert len(commits) < 5  # before: 20
    reopened = SQLiteResponseStore(tmp_path / "r.sqlite3")
    assert all([await reopened.get("a", f"resp_{i}") for i in range(20)]) and await reopened.get("a", "resp_broken") is None
    written = store._put

    def refused(write, *args):  # a record the database refuses, after its neighbours were written in the transaction
        if write.record.id == "resp_refused":
            raise sqlite3.IntegrityError("refused")
        return written(write, *args)

    store._put = refused  # type: ignore[method-assign]
    results = await asyncio.gather(store.put(stored_response("a", "resp_x")), store.put(stored_response("a", "resp_refused")),
                                   store.put(stored_response("a", "resp_y")), return_exceptions=True)
    assert results[0] is None and isinstance(results[1], sqlite3.IntegrityError) and results[2] is None
    assert await reopened.get("a", "resp_x") and await reopened.get("a", "resp_y") and not await reopened.get("a", "resp_refused")
    with sqlite3.connect(store.path) as db:  # the totals count what is stored, the rolled-back attempt not
        assert db.execute("SELECT count FROM stored_response_totals WHERE team = 'a'").fetchone() == (22,)


def _write_a_conversation(path: Path, tag: str, turns: int, start: multiprocessing.synchronize.Barrier,
                          failures: multiprocessing.Queue) -> None:
    """One worker process of `slipstream serve --workers N`: `turns` turns of one conversation
    stored, each continuing the last; the writes that failed, and why, put on `failures`."""
    async def write() -> list[str]:
        store, failed = SQLiteResponseStore(path), []
        start.wait()  # both processes write at once
        for turn in range(turns):
            try:
                await store.put(stored_response("t", f"resp_{tag}_{turn}", f"resp_{tag}_{turn - 1}" if turn else None))
            except sqlite3.OperationalError as exc:
                failed.append(str(exc))
        return failed

    failures.put(asyncio.run(write()))


async def test_the_workers_of_one_host_write_one_file_at_once(tmp_path):
    """Each write was a deferred transaction that read before it wrote: when another process had
    written meanwhile SQLite refused it at once with `database is locked` (no waiting), so under
    --workers N a Responses answer through a translated target failed, and a native one was never
    recorded (its previous_response_id a 404 later). Writes now take the file's lock first."""
    spawn = multiprocessing.get_context("spawn")
    start, failures = spawn.Barrier(2), spawn.Queue()
    path, turns = tmp_path / "r.sqlite3", 300
    made = SQLiteResponseStore(path)
    assert await made.get("t", "resp_none") is None  # the schema (made by the first call), before the writers race to make it
    made.close()
    writers = [spawn.Process(target=_write_a_conversation, args=(path, tag, turns, start, failures)) for tag in "ab"]
    for writer in writers:
        writer.start()
    failed = [failures.get(timeout=300) for _ in writers]
    for writer in writers:
        writer.join()
    assert failed == [[], []]
    reopened = SQLiteResponseStore(path)
    for tag in "ab":
        assert [record.id for record in await reopened.chain("t", f"resp_{tag}_{turns - 1}")] == [f"resp_{tag}_{n}" for n in range(turns)]


async def test_records_expire_with_the_teams_retention(tmp_path):
    store = SQLiteResponseStore(tmp_path / "r.sqlite3", {"a": StoreLimits(ttl_s=1e-6)})
    await store.put(stored_response("a"))
    await store.put(stored_response("b"))  # another team keeps the default retention
    assert await store.get("a", "resp_1") is None and await store.chain("a", "resp_1") == []
    assert await store.get("b", "resp_1") is not None


@pytest.fixture(params=["sqlite", "redis"])
async def store(request, tmp_path: Path) -> AsyncIterator[ResponseStore]:
    limits: dict[str, StoreLimits] = {}
    local = SQLiteResponseStore(tmp_path / "r.sqlite3", limits)
    if request.param == "sqlite":
        yield local
        return
    state = open_state(request.getfixturevalue("redis_url"))
    assert isinstance(state, GuardedState)
    yield RedisResponseStore(state, local, limits)
    await state.close()


async def _stored_bytes(store: ResponseStore, team: str) -> int:
    """What the team's records hold, read from the backend itself (not from the store's own counters)."""
    if isinstance(store, SQLiteResponseStore):
        with sqlite3.connect(store.path) as db:
            return db.execute("SELECT COALESCE(SUM(length(input) + length(response)), 0) FROM stored_responses WHERE team = ?",
                              (team,)).fetchone()[0]
    assert isinstance(store, RedisResponseStore)
    client, base = store.redis.client, store._base(team)
    keys = await client.execute("KEYS", base + "r:*")
    return sum([await client.execute("HSTRLEN", key, "data") for key in keys])


async def test_a_chain_is_walked_not_copied(store):
    """15 turns of 1 MiB each: ~15 MiB stored (a copy of the chain per turn would be 120 MiB), and
    the 15th turn's history is every turn's input and output in order."""
    previous = None
    for turn in range(15):
        await store.put(stored_response("a", f"resp_{turn}", previous, text=f"{turn}:" + "x" * MIB))
        previous = f"resp_{turn}"
    stored = await _stored_bytes(store, "a")
    assert 15 * MIB <= stored < 16 * MIB
    chain = await store.chain("a", "resp_14")
    assert [r.id for r in chain] == [f"resp_{t}" for t in range(15)] and chain[-1].depth == 15
    assert chain[-1].chain_bytes >= 15 * MIB
    assert [item["content"][:3] for item in history(chain) if "content" in item and isinstance(item["content"], str)] == \
        [f"{t}:x"[:3] for t in range(15)]
    assert await store.chain("b", "resp_14") == []


async def test_items_are_found_for_their_team_only(store):
    await store.put(stored_response("a", "resp_1"))
    found = await store.find_items("a", ["msg_resp_1", "msg_nothing"])
    assert list(found) == ["msg_resp_1"] and found["msg_resp_1"][0].id == "resp_1"
    assert await store.find_items("b", ["msg_resp_1"]) == {}
    # what reading them holds, known before they are read: the holding record once, however often named
    held = await store.item_bytes("a", ["msg_resp_1", "msg_nothing", "msg_resp_1"])
    assert held == await store.chain_bytes("a", "resp_1") > 0
    assert await store.item_bytes("b", ["msg_resp_1"]) == 0
    await store.delete("a", "resp_1")
    assert await store.find_items("a", ["msg_resp_1"]) == {}
    assert await store.item_bytes("a", ["msg_resp_1"]) == 0


async def test_over_quota_the_least_recently_used_go_first(store):
    """Quota of 3 responses: an idle conversation is evicted (its latest turn first), the
    conversation being continued is kept whole, and another team is untouched."""
    assert isinstance(store.limits, dict)
    store.limits["a"] = StoreLimits(max_entries=3)
    await store.put(stored_response("b", "b1"))
    await store.put(stored_response("a", "old1"))
    await store.put(stored_response("a", "old2", "old1"))
    await store.put(stored_response("a", "live1"))
    await store.put(stored_response("a", "live2", "live1"))  # 4 > 3: old2 (the idle conversation's leaf) goes
    assert await store.get("a", "old2") is None and await store.get("a", "old1") is not None
    await store.put(stored_response("a", "live3", "live2"))  # old1 goes; live1 is old but part of the chain written
    assert [r.id for r in await store.chain("a", "live3")] == ["live1", "live2", "live3"]
    assert await store.get("a", "old1") is None
    assert await store.find_items("a", ["msg_old1"]) == {}  # its items went with it
    assert await store.get("b", "b1") is not None


async def test_records_of_the_earlier_format_are_carried_over(tmp_path):
    """The earlier table held each response's whole conversation: opening the store keeps them
    readable and continuable (as chains of one)."""
    with sqlite3.connect(tmp_path / "r.sqlite3") as db:
        db.execute("CREATE TABLE responses (team TEXT, id TEXT, provider TEXT, native INTEGER, created_at REAL, "
                   "context BLOB, response BLOB, own_items INTEGER, PRIMARY KEY (team, id))")
        context = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "one"}, {"role": "user", "content": "second"}]
        response = {"id": "resp_old", "output": [{"type": "message", "id": "msg_old", "content": []}]}
        db.execute("INSERT INTO responses VALUES ('a', 'resp_old', 'claude', 0, ?, ?, ?, 1)",
                   (time.time(), orjson.dumps(context), orjson.dumps(response)))
    store = SQLiteResponseStore(tmp_path / "r.sqlite3")
    chain = await store.chain("a", "resp_old")
    assert [r.id for r in chain] == ["resp_old"] and history(chain)[:3] == context
    assert list(await store.find_items("a", ["msg_old"])) == ["msg_old"]
    assert await store.get("b", "resp_old") is None


def _totals(path: Path) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
    """(the per-team totals the store keeps, the same summed from its records)."""
    with sqlite3.connect(path) as db:
        kept = {team: (count, size) for team, count, size in db.execute("SELECT team, count, size FROM stored_response_totals")
                if count}
        summed = {team: (count, size) for team, count, size in db.execute(
            "SELECT team, COUNT(*), SUM(size) FROM stored_responses GROUP BY team")}
    return kept, summed


async def test_the_quota_totals_follow_every_write_and_a_file_without_them(tmp_path):
    """The quota check reads per-team totals the database keeps on insert and delete: they match the
    records after puts, a replaced record, deletes, evictions and expiry, and a file written before
    they existed starts with them right."""
    path = tmp_path / "r.sqlite3"
    store = SQLiteResponseStore(path, {"a": StoreLimits(max_entries=3), "gone": StoreLimits(ttl_s=1e-6)})
    for i in range(5):
        await store.put(stored_response("a", f"a{i}", text="x" * (10 * i)))  # two evicted
        await store.put(stored_response("b", f"b{i}"))
    await store.put(stored_response("b", "b0", text="longer"))  # replaced
    await store.delete("b", "b1")
    await store.put(stored_response("gone"))
    await store.put(stored_response("gone", "resp_2"))  # the first expired before this write
    kept, summed = _totals(path)
    assert kept == summed and summed["a"][0] == 3 and summed["b"][0] == 4
    with sqlite3.connect(path) as db:  # as a file of an older version: no totals, no triggers
        db.executescript("DROP TRIGGER stored_responses_counted; DROP TRIGGER stored_responses_uncounted;"
                         "DROP TABLE stored_response_totals;")
    reopened = SQLiteResponseStore(path, {"a": StoreLimits(max_entries=3)})
    assert await reopened.get("a", "a4") is not None  # the first call opens the file: its totals recounted
    kept, summed = _totals(path)
    assert kept == summed
    await reopened.put(stored_response("a", "a5"))  # the quota still holds: the oldest goes
    assert await reopened.get("a", "a2") is None and _totals(path)[1]["a"][0] == 3
