"""`slipstream state migrate`: keys an older version wrote without the team hash tag are renamed to the
names the current code reads, on a real redis-server."""

from __future__ import annotations

import asyncio

import pytest

from gateway.cli import main
from sdk.spend import Period, record_key
from sdk.state.migrate import new_name
from sdk.state.redis import RedisState, split_url
from sdk.state.redis_client import RedisClient


def test_new_names():
    assert new_name("p", "spend", "p:spend:team-a:month:2026-11") == "p:spend:{team-a}:month:2026-11"
    assert new_name("p", "responses", "p:responses:team-a:resp_1") == "p:responses:{team-a}:resp_1"
    assert new_name("p", "limit", "p:limit:team-a") == "p:limit:{team-a}"
    assert new_name("p", "spend", "p:spend:{team-a}:month:2026-11") is None  # already current


async def test_old_keys_are_carried_over(redis_url, capsys):
    server, prefix, timeout_s = split_url(redis_url)
    client = RedisClient(server, timeout_s)
    month = Period("month", "2026-11", 3600)
    old_spend = f"{prefix}:spend:team-a:month:2026-11"
    await client.execute("HSET", old_spend, "total", "12.5", "model:m", "12.5")
    await client.execute("SET", f"{prefix}:responses:team-a:resp_1", "stored")
    # Written since the upgrade under the new name: kept, and the old key reported, not merged over it.
    await client.execute("SET", f"{prefix}:responses:team-b:resp_2", "old")
    await client.execute("SET", f"{prefix}:responses:{{team-b}}:resp_2", "new")
    await client.execute("SET", f"{prefix}:other:team-a", "untouched")

    # The command runs its own event loop, as from a shell: here, in a thread.
    assert await asyncio.to_thread(main, ["state", "migrate", redis_url, "--dry-run"]) == 0
    assert "would rename" in capsys.readouterr().out
    assert await client.execute("EXISTS", old_spend) == 1  # a dry run changes nothing

    assert await asyncio.to_thread(main, ["state", "migrate", redis_url]) == 0
    out = capsys.readouterr().out
    assert "2 keys renamed, 1 left as they were" in out
    state = RedisState(redis_url)
    try:
        # What the current code reads for team-a's month: the spend written before the upgrade.
        assert await state.spend(record_key("team-a", month)) == pytest.approx({"total": 12.5, "model:m": 12.5})
    finally:
        await state.close()
    assert await client.execute("GET", f"{prefix}:responses:{{team-a}}:resp_1") == b"stored"
    assert await client.execute("GET", f"{prefix}:responses:{{team-b}}:resp_2") == b"new"
    assert await client.execute("GET", f"{prefix}:responses:team-b:resp_2") == b"old"
    assert await client.execute("GET", f"{prefix}:other:team-a") == b"untouched"
    await client.close()


def test_a_cluster_is_refused(capsys):
    assert main(["state", "migrate", "redis+cluster://127.0.0.1:1"]) == 1
    assert "Cluster holds no keys from before the hash tags" in capsys.readouterr().err
