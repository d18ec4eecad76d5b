"""The embedded response store on its own: per-team keys, readable at once, deletes that stick."""

from __future__ import annotations

import asyncio

from sdk.responses.store import SQLiteResponseStore, StoredResponse


def _record(team: str, response_id: str = "resp_1") -> StoredResponse:
    return StoredResponse(response_id, team, "claude", False, 0.0, [{"role": "user", "content": "hi"}],
                          {"id": response_id, "output": [{"type": "message", "content": []}]}, 1)


async def test_records_are_per_team_and_survive_a_reopen(tmp_path):
    store = SQLiteResponseStore(tmp_path / "r.sqlite3", retention_s=1e12)
    put = asyncio.ensure_future(store.put(_record("a")))
    await asyncio.sleep(0)  # the write has started, not finished
    assert (await store.get("a", "resp_1")).context == [{"role": "user", "content": "hi"}]
    await put
    assert await store.get("b", "resp_1") is None and not await store.delete("b", "resp_1")
    reopened = SQLiteResponseStore(tmp_path / "r.sqlite3", retention_s=1e12)
    found = await reopened.get("a", "resp_1")
    assert found is not None and found.history()[-1]["type"] == "message" and found.input_items() == found.context


async def test_a_delete_during_the_write_sticks(tmp_path):
    store = SQLiteResponseStore(tmp_path / "r.sqlite3", retention_s=1e12)
    put = asyncio.ensure_future(store.put(_record("a")))
    await asyncio.sleep(0)
    assert await store.delete("a", "resp_1")
    await put
    assert await store.get("a", "resp_1") is None


async def test_old_records_expire(tmp_path):
    store = SQLiteResponseStore(tmp_path / "r.sqlite3", retention_s=60)
    await store.put(_record("a"))  # created_at 0: long past the retention
    assert await store.get("a", "resp_1") is None
