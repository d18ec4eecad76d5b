"""The Redis backend on a Redis Cluster (three masters) and behind Sentinel (a master, a replica, a
sentinel), each started by the test: limits, budgets and spend, ownership records, the prompt-cache
ledger, stored responses and the response cache's stream work through both, every script's keys in
one hash slot on the Cluster, and a Sentinel failover is followed."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from gateway.testing import RedisClusterServers, RedisSentinelServers
from sdk.responses.redis_store import RedisResponseStore
from sdk.responses.sqlite_store import SQLiteResponseStore
from sdk.responses.store import StoredResponse
from sdk.spend import periods, record_key, spend_record
from sdk.state import open_state
from sdk.state.backend import Admission, BudgetCheck, Cap, Rate, Settlement, team_slot
from sdk.state.guard import GuardedState
from sdk.state.ownership import ownership_of
from sdk.state.redis_client import SLOTS, RedisClient, key_slot
from sdk.state.redis_url import Target
from tests.helpers import PATIENCE_S, skip_without_extra

TEAMS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta")


def _cli(port: int, *args: str) -> str:
    return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True, timeout=30, check=True).stdout.strip()


async def _settled(state: GuardedState) -> None:
    while state._pending:  # the background batches (charges, settlements, ledger entries) reached Redis
        await asyncio.sleep(0.01)


async def _until(check, what: str) -> None:
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < PATIENCE_S, f"no {what} after {PATIENCE_S}s"
        await asyncio.sleep(0.05)


def test_urls_name_a_server_a_sentinel_master_or_a_cluster():
    sentinel = Target.parse("redis+sentinel://u:p%40w@s1,s2:26380/mymaster/3?sentinel_password=sp")
    assert (sentinel.mode, sentinel.nodes, sentinel.service) == ("sentinel", (("s1", 26379), ("s2", 26380)), "mymaster")
    assert (sentinel.auth.username, sentinel.auth.password, sentinel.auth.db, sentinel.sentinel_auth.password) == ("u", "p@w", 3, "sp")
    cluster = Target.parse("redis+cluster://:pw@a:7000,b")
    assert (cluster.mode, cluster.nodes, cluster.auth.username, cluster.auth.password) == ("cluster", (("a", 7000), ("b", 6379)), None, "pw")
    assert Target.parse("rediss+cluster://a:7000?ssl_cert_reqs=none").auth.tls is not None
    for bad, match in (("redis+cluster://a:7000/1", "database 0"), ("redis+sentinel://s1:26379", "names its master"),
                       ("redis://a,b", "several hosts"), ("redis+cluster://a?sentinel_password=x", "unknown option")):
        with pytest.raises(ValueError, match=match):
            Target.parse(bad)
    # Redis' own: CLUSTER KEYSLOT foo is 12182; a hash tag puts keys together
    assert key_slot("foo") == 12182 and key_slot("limit:{alpha}:rpm") == key_slot("spend:{alpha}:day:x") == key_slot("alpha")


async def _limits_budget_and_spend(state: GuardedState, team: str) -> None:
    """Small limits are checked in Redis on every admission: the cap, the budget, the bucket refuse in turn."""
    tag, day = team_slot(team), periods()[0]
    rate, cap = Rate(f"limit:{tag}:rpm", 3, 1), Cap(f"limit:{tag}:conc", 2)
    budget = BudgetCheck(record_key(team, day), 1.0, reserve=0.1)
    admitted = [await state.admit(Admission(f"{team}-{i}", (rate,), (cap,), budget)) for i in range(3)]
    assert admitted[:2] == [None, None]
    assert admitted[2] is not None and admitted[2].kind == "cap"
    for i in range(2):
        state.settle(Settlement(f"{team}-{i}", (cap.key,), (), spend_record(team, "k", "m", 0.6), budget))
    await _settled(state)
    over = await state.admit(Admission(f"{team}-3", (rate,), (cap,), budget))
    assert over is not None and over.kind == "budget"  # 1.20 spent of 1.00
    assert await state.admit(Admission("", (rate,))) is None  # the third request of the bucket's three
    refused = await state.admit(Admission("", (rate,)))
    assert refused is not None and refused.kind == "rate"
    spent = await state.spend(record_key(team, day))
    assert abs(spent["total"] - 1.2) < 1e-9 and abs(spent["key:k"] - 1.2) < 1e-9 and spent.get("held", 0.0) < 1e-9


async def test_limits_spend_ownership_ledger_and_responses_on_a_cluster(redis_cluster: RedisClusterServers, tmp_path: Path):
    state = _guarded(f"{redis_cluster.url}?prefix=c&timeout_ms=5000")
    for team in TEAMS:
        await _limits_budget_and_spend(state, team)
    holding = [Admission(f"held-{team}", (), (Cap(f"limit:{team_slot(team)}:conc", 5),)) for team in TEAMS]
    for admission in holding:
        assert await state.admit(admission) is None
    assert await state.shared.sync() == 1  # the renewal of leases in six teams' slots: one script call per slot

    ownership = ownership_of(state)
    files = [f"file-{i}" for i in range(20)]  # their records hash to slots all over the cluster
    await ownership.own("alpha", "file", files)
    assert await ownership.owned("alpha", "file", [*files, "file-x"]) == set(files)
    assert await ownership.owned("beta", "file", files) == set()
    await ownership.disown("file", "file-3")
    assert not await ownership.is_owner("alpha", "file", "file-3")

    rows = [(f"pc:{{{team}}}:{i}", f"{i * 100}", 300.0, 60.0) for team in TEAMS for i in range(3)]
    state.merge_entries(rows)  # one batch, six scopes' slots
    await _settled(state)
    for team in TEAMS:
        found = await state.shared.read_entries([f"pc:{{{team}}}:{i}" for i in range(3)])
        assert [item[0] for item in found if item is not None] == [b"0 300", b"100 300", b"200 300"]

    store = RedisResponseStore(state, SQLiteResponseStore(tmp_path / "fallback.sqlite3"))
    for team in ("alpha", "beta"):
        previous = None
        for turn in range(3):
            record = StoredResponse(f"resp_{turn}", team, "claude", False, 0.0, [{"role": "user", "content": f"{team} {turn}"}],
                                    {"id": f"resp_{turn}", "output": [{"type": "message", "id": f"msg_{turn}", "content": []}]}, previous)
            await store.put(record)
            previous = record.id
        chain = await store.chain(team, "resp_2")
        assert [r.input[0]["content"] for r in chain] == [f"{team} {t}" for t in range(3)] and chain[-1].depth == 3
        assert set(await store.find_items(team, ["msg_0", "msg_2"])) == {"msg_0", "msg_2"}
    assert await store.delete("alpha", "resp_1") and await store.get("alpha", "resp_1") is None
    assert await store.get("beta", "resp_1") is not None
    assert await store.fallback.get("alpha", "resp_0") is None  # all of it went to the cluster, none to the fallback
    await store.close()
    assert state.status()["mode"] == "shared"
    await state.close()

    holders = [int(_cli(node.port, "DBSIZE")) for node in redis_cluster.nodes]
    assert sum(count > 0 for count in holders) >= 2, holders  # the teams' keys really are spread over the nodes


def _guarded(url: str) -> GuardedState:
    state = open_state(url)
    assert isinstance(state, GuardedState)
    return state


async def test_a_stale_slot_map_is_corrected_by_moved_replies(redis_cluster: RedisClusterServers):
    client = RedisClient(redis_cluster.url, 5.0)
    await client.execute("SET", "warm", "1")  # the slot map is read
    client._slots = [("127.0.0.1", redis_cluster.nodes[0].port)] * SLOTS  # as if every slot had moved to one node
    keys = [f"key-{i}" for i in range(30)]
    await client.pipeline([("SET", key, key) for key in keys])
    assert await client.pipeline([("GET", key) for key in keys]) == [key.encode() for key in keys]
    assert len(set(client._slots)) == 3  # each MOVED reply put its slot back where it lives
    await client.close()


async def _replicated(url: str, tmp_path: Path) -> None:
    """An answer stored through one replica reaches another one's store through the stream."""
    skip_without_extra("semantic")  # the cache's store (faiss)
    from sdk.cache.replication import CacheReplicator
    from sdk.cache.store import DIMENSION, CacheStore, NewEntry, TeamLimits

    states = [_guarded(url) for _ in range(2)]
    stores = [CacheStore(tmp_path / f"cache-{i}.sqlite3") for i in range(2)]
    replicators = [CacheReplicator(state.shared, store) for state, store in zip(states, stores, strict=True)]
    await replicators[1].caught_up("alpha")
    vector = np.ones(DIMENSION, dtype=np.float32) / np.sqrt(DIMENSION)
    entry = NewEntry("alpha", "alpha:gpt", "exact-1", "gpt", "how do I reset my password?", vector,
                     {"id": "chatcmpl-1", "choices": [{"message": {"role": "assistant", "content": "like so"}}]})
    stores[0].put(entry, TeamLimits(3600, 100, 1 << 20))
    replicators[0].added(entry, TeamLimits(3600, 100, 1 << 20))

    async def arrived() -> bool:
        return stores[1].get_exact("alpha", "exact-1") is not None

    await _until(arrived, "replicated cache entry")
    for replicator, state in zip(replicators, states, strict=True):
        await replicator.close()
        await state.close()


async def test_the_response_cache_stream_on_a_cluster(redis_cluster: RedisClusterServers, tmp_path: Path):
    await _replicated(f"{redis_cluster.url}?prefix=rc&timeout_ms=5000", tmp_path)


async def test_the_response_cache_stream_through_sentinel(redis_sentinel: RedisSentinelServers, tmp_path: Path):
    await _replicated(f"{redis_sentinel.url}?prefix=rs&timeout_ms=5000", tmp_path)


async def test_a_sentinel_failover_is_followed(redis_sentinel: RedisSentinelServers):
    state = _guarded(f"{redis_sentinel.url}?prefix=s&timeout_ms=5000")
    await _limits_budget_and_spend(state, "alpha")
    ownership = ownership_of(state)
    await ownership.own("alpha", "batch", ["batch-1"])
    record = f"s:{record_key('alpha', periods()[0])}"
    old = redis_sentinel.master_port()
    assert old == redis_sentinel.master.port

    async def on_the_replica() -> bool:  # what the promoted replica will serve was written before the failover
        return _cli(redis_sentinel.replica.port, "HGET", record, "total") != "" and \
            _cli(redis_sentinel.replica.port, "EXISTS", "s:own:batch:batch-1") == "1"

    await _until(on_the_replica, "replication of the spend record")
    await asyncio.to_thread(redis_sentinel.failover)  # the check-in loop runs on meanwhile
    assert redis_sentinel.master_port() == redis_sentinel.replica.port

    after = Rate(f"limit:{team_slot('alpha')}:after", 3, 1)

    async def served_by_the_new_master() -> bool:
        await state.admit(Admission("", (after,)))
        return bool(state.status()["up"]) and _cli(redis_sentinel.replica.port, "EXISTS", f"s:{after.key}") == "1"

    await _until(served_by_the_new_master, "admissions checked on the promoted master")
    spent = await state.spend(record_key("alpha", periods()[0]))
    assert abs(spent["total"] - 1.2) < 1e-9  # the spend recorded before the failover, read from the new master
    assert await ownership.is_owner("alpha", "batch", "batch-1")
    assert state.status()["mode"] == "shared"
    await state.close()
