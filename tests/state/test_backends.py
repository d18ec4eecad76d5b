"""The contract every state backend keeps, run against the in-process one and a real Redis."""

from __future__ import annotations

import socket
import time
from dataclasses import replace

import pytest

from gateway.testing import RedisServer, free_port
from sdk.state import open_state
from sdk.state.backend import Admission, BudgetCheck, Cap, Rate, Settlement, SpendRecord
from sdk.state.redis import split_url
from tests.helpers import skip_without_redis


@pytest.fixture(params=["local", "redis"])
async def state(request):
    url = "" if request.param == "local" else request.getfixturevalue("redis_url")
    backend = open_state(url)
    yield backend
    await backend.close()


async def test_request_bucket_admits_its_capacity_then_says_when(state):
    rate = Rate("rpm", 3, 1)
    for _ in range(3):
        assert await state.admit(Admission("", (rate,))) is None
    refusal = await state.admit(Admission("", (rate,)))
    assert refusal is not None and refusal.kind == "rate" and refusal.index == 0
    assert 15 < refusal.wait_s <= 20.5  # one request refills in 60/3 s


async def test_token_bucket_goes_into_debt_from_settled_usage(state):
    requests, tokens = Rate("rpm", 100, 1), Rate("tpm", 60, 0)
    assert await state.admit(Admission("", (requests, tokens))) is None
    state.settle(Settlement("", charges=((tokens, 120),)))
    await _settled(state)
    refusal = await state.admit(Admission("", (requests, tokens)))
    assert refusal is not None and refusal.index == 1 and refusal.wait_s > 59  # 60 tokens of debt: a minute
    other = await state.admit(Admission("", (requests,)))
    assert other is None  # a refusal charged nothing: the request bucket still had room


async def test_concurrency_leases_are_released_on_settle(state):
    cap = Cap("conc", 2)
    assert await state.admit(Admission("a", caps=(cap,))) is None
    assert await state.admit(Admission("b", caps=(cap,))) is None
    refusal = await state.admit(Admission("c", caps=(cap,)))
    assert refusal is not None and refusal.kind == "cap" and refusal.value == 2
    state.settle(Settlement("a", caps=(cap.key,)))
    await _settled(state)
    assert await state.admit(Admission("c", caps=(cap,))) is None


async def test_a_weighted_lease_takes_its_slots_until_settled(state):
    """A lease of weight n (Chat's n choices on Claude: n upstream requests) takes n slots of the cap."""
    cap = Cap("conc", 4)
    assert await state.admit(Admission("three", caps=(replace(cap, weight=3),))) is None
    refusal = await state.admit(Admission("two", caps=(replace(cap, weight=2),)))
    assert refusal is not None and refusal.kind == "cap" and refusal.value == 3  # 3 + 2 > 4
    assert await state.admit(Admission("one", caps=(cap,))) is None  # 3 + 1 fits
    assert (await state.admit(Admission("another", caps=(cap,)))).value == 4
    state.settle(Settlement("three", caps=(cap.key,)))  # every slot of it comes back
    await _settled(state)
    assert await state.admit(Admission("two", caps=(replace(cap, weight=2),))) is None
    assert await state.admit(Admission("another", caps=(cap,))) is None
    assert (await state.admit(Admission("more", caps=(cap,)))).value == 4


async def test_budget_refuses_once_the_period_total_is_spent(state):
    record = SpendRecord(0.6, (("spend:t:day:x", 3600),), ("total", "model:m", "key:k"))
    budget = BudgetCheck("spend:t:day:x", 1.0)
    assert await state.admit(Admission("", budget=budget)) is None
    state.settle(Settlement("", spend=record))
    await _settled(state)
    assert await state.admit(Admission("", budget=budget)) is None  # 0.6 < 1.0
    state.settle(Settlement("", spend=record))
    await _settled(state)
    refusal = await state.admit(Admission("", budget=budget))
    assert refusal is not None and refusal.kind == "budget" and refusal.value == pytest.approx(1.2)
    assert await state.spend("spend:t:day:x") == pytest.approx({"total": 1.2, "model:m": 1.2, "key:k": 1.2})


async def test_flags_and_single_claims(state):
    await state.set_flag("breaker:x", time.time() + 60)
    assert state.flags()["breaker:x"] > time.time()
    await state.clear_flag("breaker:x")
    assert "breaker:x" not in state.flags()
    assert await state.claim("probe:x", 5) is True
    assert await state.claim("probe:x", 5) is False


async def test_a_dead_replicas_lease_expires(redis_url, monkeypatch):
    """A replica that dies holding a concurrency slot stops renewing it; the slot comes back."""
    from sdk.state import redis as redis_state

    monkeypatch.setattr(redis_state, "LEASE_TTL_S", 0.5)
    dead, alive = open_state(redis_url), open_state(redis_url)
    cap = Cap("conc", 1)
    assert await dead.admit(Admission("dies-holding-it", caps=(cap,))) is None
    await dead.close()  # never settles
    assert (await alive.admit(Admission("waits", caps=(cap,)))).kind == "cap"
    await _sleep(0.7)
    assert await alive.admit(Admission("waits", caps=(cap,))) is None
    await alive.close()


async def test_a_live_replica_keeps_its_lease_past_the_ttl(redis_url, monkeypatch):
    from sdk.state import redis as redis_state

    monkeypatch.setattr(redis_state, "LEASE_TTL_S", 0.5)
    holder, other = open_state(redis_url), open_state(redis_url)
    holder.sync_interval_s = 0.1
    cap = Cap("conc", 1)
    assert await holder.admit(Admission("long-stream", caps=(cap,))) is None
    await _sleep(1.0)  # twice the TTL: the check-in loop renewed it
    assert (await other.admit(Admission("x", caps=(cap,)))).kind == "cap"
    await holder.close()
    await other.close()


async def test_a_live_replica_keeps_every_slot_of_a_weighted_lease(redis_url, monkeypatch):
    from sdk.state import redis as redis_state

    monkeypatch.setattr(redis_state, "LEASE_TTL_S", 0.5)
    holder, other = open_state(redis_url), open_state(redis_url)
    holder.sync_interval_s = 0.1
    cap = Cap("conc", 3)
    assert await holder.admit(Admission("three-choices", caps=(replace(cap, weight=3),))) is None
    await _sleep(1.0)  # twice the TTL: the check-in renewed all three slots, not only the first
    refusal = await other.admit(Admission("x", caps=(cap,)))
    assert refusal is not None and refusal.kind == "cap" and refusal.value == 3
    holder.settle(Settlement("three-choices", caps=(cap.key,)))
    await _settled(holder)
    assert await other.admit(Admission("x", caps=(replace(cap, weight=3),))) is None
    await holder.close()
    await other.close()


def _admissions(how: str) -> float:
    from sdk.observability.metrics import STATE_ADMISSIONS

    return STATE_ADMISSIONS.labels(how)._value.get()


async def test_far_from_its_limits_an_admission_does_not_wait_for_redis(redis_url):
    """After one checked admission, the next go ahead; their charges and settlements reach Redis in
    batches (one script call per batch for those with the same keys), every lease and cent counted."""
    import asyncio

    import redis

    state = open_state(redis_url)
    rate, cap = Rate("rpm", 1000, 1), Cap("conc", 1000)
    record = SpendRecord(0.25, (("spend:t:day:x", 3600),), ("total", "key:k"))
    checked, ahead = _admissions("checked"), _admissions("ahead")
    started = time.monotonic()
    assert await state.admit(Admission("l0", (rate,), (cap,))) is None
    admitted = await asyncio.gather(*(state.admit(Admission(f"l{i}", (rate,), (cap,))) for i in range(1, 21)))
    assert admitted == [None] * 20
    await _settled(state)
    refill = rate.per_minute / 60 * (time.monotonic() - started)  # what the bucket regained meanwhile, however long
    assert _admissions("checked") - checked == 1 and _admissions("ahead") - ahead == 20
    server, prefix, _ = split_url(redis_url)
    with redis.Redis.from_url(server) as client:
        assert 979 <= float(client.hget(f"{prefix}:rpm", "v")) <= 979 + refill  # all 21 charged
        assert client.zcard(f"{prefix}:conc") == 21  # and their leases held
    for i in range(21):
        state.settle(Settlement(f"l{i}", caps=(cap.key,), spend=record))
    await _settled(state)
    with redis.Redis.from_url(server) as client:
        assert client.zcard(f"{prefix}:conc") == 0
    assert await state.spend("spend:t:day:x") == pytest.approx({"total": 5.25, "key:k": 5.25})
    await state.close()


def test_charges_still_waiting_when_the_loop_ends_reach_redis(redis_url):
    """An SDK user's asyncio.run() may end 1 ms after an ahead admission: its charge is sent all the same."""
    import asyncio

    import redis

    state = open_state(redis_url)
    rate = Rate("rpm", 1000, 1)

    async def two_admissions() -> None:
        assert await state.admit(Admission("", (rate,))) is None  # checked
        assert await state.admit(Admission("", (rate,))) is None  # ahead: its charge waits for company

    asyncio.run(two_admissions())
    server, prefix, _ = split_url(redis_url)
    with redis.Redis.from_url(server) as client:
        assert 998 <= float(client.hget(f"{prefix}:rpm", "v")) < 999


async def test_near_its_limit_every_admission_is_checked(redis_url):
    """A small limit (under AHEAD_MIN_ROOM) is checked in Redis on every admission: never past it."""
    import redis

    state = open_state(redis_url)
    rate = Rate("rpm", 20, 1)
    ahead = _admissions("ahead")
    admitted = [await state.admit(Admission("", (rate,))) is None for _ in range(30)]
    await _settled(state)
    assert 20 <= sum(admitted) <= 21  # one more if a refill (one per 3 s) came in meanwhile
    assert not any(admitted[22:])
    assert _admissions("ahead") == ahead
    server, prefix, _ = split_url(redis_url)
    with redis.Redis.from_url(server) as client:  # ahead charges are never refused: the bucket would show an overdraft
        assert float(client.hget(f"{prefix}:rpm", "v")) > -0.01
    await state.close()


async def _settled(state) -> None:
    """Let a shared backend's background settlement reach Redis."""
    pending = getattr(state, "_pending", None)
    while pending:
        await _sleep(0.01)


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


async def test_a_password_and_a_database_in_the_url():
    from gateway.testing import running_redis

    with running_redis(password="s3cret") as server:
        state = open_state(server.url.replace("/0", "/3") + "?timeout_ms=500")
        assert await state.admit(Admission("", (Rate("rpm", 1, 1),))) is None
        assert (await state.admit(Admission("", (Rate("rpm", 1, 1),)))).kind == "rate"  # the bucket is in Redis
        assert state.status()["up"] is True
        await state.close()
        wrong = open_state(f"redis://:nope@127.0.0.1:{server.port}/0?timeout_ms=500")
        assert await wrong.admit(Admission("", (Rate("rpm", 1, 1),))) is None  # refused by Redis: served locally
        assert wrong.status()["mode"] == "degraded" and "WRONGPASS" in wrong.status()["last_error"]
        await wrong.close()


def test_a_throwaway_redis_moves_off_a_port_taken_before_it_binds():
    """A port chosen for a test server can be taken by another socket before redis-server binds it
    (what failed a CI run once); the server moves to another port, and a port given to it never moves."""
    skip_without_redis()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1], free_port()])
        server = RedisServer(choose_port=lambda: next(ports))
        server.start()
        try:
            moved = server.port
            assert moved != taken.getsockname()[1]
            server.stop()
            server.start()  # a restart stays where clients were told it is
            assert server.port == moved
        finally:
            server.stop()
        pinned = RedisServer(port=taken.getsockname()[1])
        with pytest.raises(RuntimeError, match="Address already in use"):
            pinned.start()
