"""Two proxies on one Redis behave as one gateway: limits, budget and spend, breakers and key
cooldowns; and losing Redis degrades to local state without failing a request, then heals."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from gateway.testing import RunningServer, running_proxy
from tests.helpers import PATIENCE_S, wait_until, write_policy
from tests.state.conftest import prefixed_url

PRICED = 'pricing: {"claude-*": {input: 1000, output: 1000}}\n'  # USD per million tokens: cents per call


@contextlib.contextmanager
def two_proxies(policy_dir: Path, state_url: str) -> Iterator[tuple[RunningServer, RunningServer]]:
    with running_proxy([policy_dir], state_url=state_url) as a, running_proxy([policy_dir], state_url=state_url) as b:
        yield a, b


def ask(proxy: RunningServer, key: str, **options) -> anthropic.types.Message:
    client = anthropic.Anthropic(base_url=proxy.url, api_key=key, max_retries=0, **options)
    return client.messages.create(model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}])


def admitted(proxies: tuple[RunningServer, ...], key: str, n: int) -> int:
    """Send n requests round-robin; count those not refused with a 429."""
    count = 0
    for i in range(n):
        try:
            ask(proxies[i % len(proxies)], key)
            count += 1
        except anthropic.RateLimitError:
            pass
    return count


def test_team_limit_holds_across_two_proxies(tmp_path, fresh_emulator, redis_url):
    write_policy(tmp_path, "t", "sk-t", fresh_emulator.url, extra="limits: {requests_per_minute: 4, per_key: {max_concurrent: 2}}\n")
    with two_proxies(tmp_path, redis_url) as proxies:
        assert admitted(proxies, "sk-t", 10) == 4  # per replica it would have been 8
    assert fresh_emulator.stats()["requests_total"] == 4


def test_budget_and_spend_are_shared_by_two_proxies(tmp_path, fresh_emulator, redis_url):
    write_policy(tmp_path, "t", "sk-t", fresh_emulator.url, extra=PRICED + "budget: {usd: 0.001, period: day}\n")
    with two_proxies(tmp_path, redis_url) as (a, b):
        ask(a, "sk-t")  # each call costs more than the budget: the first spends it all
        spend = httpx.get(f"{b.url}/v1/slipstream/spend", headers={"authorization": "Bearer sk-t"}).json()
        assert spend["day"]["total"] > 0.001 and spend["day"]["by_model"]["claude-x"] == spend["day"]["total"]
        assert spend["budget"]["remaining"] == 0 and spend["month"]["total"] == spend["day"]["total"]
        with pytest.raises(anthropic.RateLimitError) as refused:
            ask(b, "sk-t")
        assert "budget" in refused.value.body["error"]["message"]
        metrics = httpx.get(f"{a.url}/metrics").text
        assert 'slipstream_spend_usd_total{key="' in metrics and 'model="claude-x",team="t"}' in metrics
    assert fresh_emulator.stats()["requests_total"] == 1


def test_spend_needs_a_team_key(tmp_path, fresh_emulator, redis_url):
    write_policy(tmp_path, "t", "sk-t", fresh_emulator.url)
    write_policy(tmp_path, "u", "sk-u", fresh_emulator.url, extra=PRICED)
    with running_proxy([tmp_path], state_url=redis_url) as proxy:
        ask(proxy, "sk-u")
        assert httpx.get(f"{proxy.url}/v1/slipstream/spend").status_code == 401
        own = httpx.get(f"{proxy.url}/v1/slipstream/spend", headers={"x-api-key": "sk-t"}).json()
        assert own["team"] == "t" and own["day"]["total"] == 0  # team u's spend is not t's to see


def test_redis_killed_and_restarted_mid_traffic(tmp_path, fresh_emulator, own_redis, own_redis_url, caplog):
    """No request fails or hangs while Redis is gone; limits are shared again once it is back."""
    write_policy(tmp_path, "busy", "sk-busy", fresh_emulator.url, extra="limits: {requests_per_minute: 100000}\n")
    write_policy(tmp_path, "tight", "sk-tight", fresh_emulator.url, extra="limits: {requests_per_minute: 3}\n")
    with two_proxies(tmp_path, own_redis_url) as proxies:

        def traffic(n: int) -> None:
            # A hang would end in the client's timeout (an error): every request must be answered.
            for i in range(n):
                ask(proxies[i % 2], "sk-busy", timeout=PATIENCE_S)

        traffic(6)
        own_redis.stop()
        traffic(20)
        assert _ready(proxies[0])["up"] is False and "slipstream_state_backend_up 0.0" in httpx.get(f"{proxies[0].url}/metrics").text
        ready = httpx.get(f"{proxies[0].url}/readyz")
        assert ready.status_code == 200 and ready.json()["state"]["mode"] == "degraded"  # degraded still serves
        own_redis.start()

        def healed() -> bool:
            traffic(2)
            return all(_ready(p)["up"] for p in proxies)

        wait_until(healed, "the guard healed on both proxies")
        assert admitted(proxies, "sk-tight", 6) == 3  # one shared bucket again, not one per proxy
    transitions = [r.getMessage() for r in caplog.records if r.name == "slipstream.state"]
    assert sum("degraded to local state" in m for m in transitions) == 2  # one line per proxy per transition
    assert sum("is back after" in m for m in transitions) == 2


def test_a_hung_redis_costs_one_timeout_once(tmp_path, fresh_emulator, own_redis, monkeypatch):
    """While Redis hangs, at most one request waits on it (for the URL's timeout); the guard then
    opens and every later request is served from local state without calling Redis at all."""
    write_policy(tmp_path, "t", "sk-t", fresh_emulator.url, extra="limits: {requests_per_minute: 100000}\n")
    with running_proxy([tmp_path], state_url=prefixed_url(own_redis, timeout_ms=1000)) as proxy:
        ask(proxy, "sk-t")
        guard = _state(proxy)
        waited: list[str] = []  # the calls a request made to the hung Redis (background ones excluded)
        shared_call = guard._shared

        async def counting(call, probe: bool = False, background: bool = False):
            if guard.up and not (probe or background):
                waited.append("request")
            return await shared_call(call, probe=probe, background=background)

        monkeypatch.setattr(guard, "_shared", counting)
        own_redis.pause()
        for _ in range(5):
            ask(proxy, "sk-t", timeout=PATIENCE_S)  # answered, never the client's timeout
        wait_until(lambda: not guard.up, "the guard opened on the hung Redis")
        for _ in range(5):
            ask(proxy, "sk-t", timeout=PATIENCE_S)
    assert len(waited) <= 1, waited  # one timeout, once; then local state without waiting on Redis again


def _ready(proxy: RunningServer) -> dict:
    return _state(proxy).status()


def test_a_breaker_opened_by_one_proxy_is_seen_by_the_other(tmp_path, fresh_emulator, redis_url):
    routes = """  - match: {model: "claude-*"}
    targets: [{provider: claude, model: claude-a}, {provider: claude, model: claude-b}]
"""
    (tmp_path / "t.yaml").write_text(f"""team: t
api_keys: [{{value: "sk-t"}}]
providers:
  claude: {{kind: anthropic, base_url: "{fresh_emulator.url}", api_key: "up"}}
routes:
{routes}breaker: {{min_requests: 2, failure_rate: 0.5, cooldown_s: 30}}
""")
    fresh_emulator.inject_fault("500", count=2, model="claude-a")
    with two_proxies(tmp_path, redis_url) as (a, b):
        for _ in range(2):  # claude-a fails on proxy a, claude-b answers; the second failure opens a's breaker
            assert ask_raw(a).headers["x-slipstream-route"] == "claude/claude-b"
        wait_until(lambda: any(name.startswith("breaker:t:") for name in _state(b).flags()), "proxy b saw the open breaker")
        # claude-a is healthy again, but b skips it: its breaker is open for the whole gateway
        assert ask_raw(b).headers["x-slipstream-route"] == "claude/claude-b"


async def test_a_key_cooled_down_by_one_replica_is_tried_last_by_another(redis_url):
    from sdk.providers.keys import KeyRing
    from sdk.state import open_state

    one, other = open_state(redis_url), open_state(redis_url)
    ring_one, ring_other = KeyRing(("key-a", "key-b"), one), KeyRing(("key-a", "key-b"), other)
    ring_one.refused(0, 429, {"retry-after": "30"})
    assert ring_one.order() == [1, 0]
    deadline = time.monotonic() + PATIENCE_S
    while ring_other.order() != [1, 0]:  # polled on this loop: the replica's mirror is refreshed by a task on it
        assert time.monotonic() < deadline, "the other replica never saw the cooldown"
        await asyncio.sleep(0.05)
    await one.close()
    await other.close()


def ask_raw(proxy: RunningServer) -> httpx.Response:
    return httpx.post(f"{proxy.url}/v1/messages", headers={"x-api-key": "sk-t", "anthropic-version": "2023-06-01"},
                      json={"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}, timeout=10)


def _state(proxy: RunningServer):
    return proxy.app.state.registry.services.state()


def test_the_drop_in_sdk_and_a_proxy_share_one_limit(tmp_path, fresh_emulator, redis_url):
    import sdk

    policy = write_policy(tmp_path, "t", "sk-t", fresh_emulator.url, extra="limits: {requests_per_minute: 3}\n")
    app = sdk.Anthropic(policy=policy, state_url=redis_url, max_retries=0)
    with running_proxy([tmp_path], state_url=redis_url) as proxy:
        for _ in range(2):
            app.messages.create(model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        ask(proxy, "sk-t")
        with pytest.raises(anthropic.RateLimitError):
            app.messages.create(model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}])


def test_a_lease_above_a_replicas_share_is_too_large_while_redis_is_away(tmp_path, fresh_emulator, own_redis, own_redis_url):
    """Chat's n choices on Claude are n upstream requests, n slots of `max_concurrent`: more than the cap
    is refused at once as too large (no retry-after). While Redis is away each of two replicas admits its
    share, 2 of the team's 4, and a lease of 3 was answered "retry in 1s" (saying 0 of 4 were in flight),
    which no wait made fit for as long as Redis stayed away; it is too large there now, as it is above the cap."""
    write_policy(tmp_path, "choices", "sk-choices", fresh_emulator.url, extra="limits: {max_concurrent: 4}\nretry: {max_attempts: 1}\n")
    with two_proxies(tmp_path, own_redis_url) as proxies:
        client = openai.OpenAI(base_url=f"{proxies[0].url}/v1", api_key="sk-choices", max_retries=0)

        def choices(n: int) -> int:
            asked = client.chat.completions.create(model="claude-sonnet-4-5", messages=[{"role": "user", "content": "hi"}],
                                                   max_completion_tokens=5, n=n)
            return len(asked.choices)

        wait_until(lambda: _state(proxies[0]).shared.replicas == 2, "both replicas checked in")
        assert choices(3) == 3  # within the team's cap while Redis counts every replica's leases
        own_redis.stop()
        assert choices(1) == 1  # served from local state
        assert _state(proxies[0]).up is False
        with pytest.raises(openai.RateLimitError) as refused:
            choices(3)
        assert "request too large" in refused.value.message and "2 of team choices's limit of 4" in refused.value.message
        assert "retry-after" not in refused.value.response.headers  # no wait makes it fit
        assert choices(2) == 2  # the replica's share
        with pytest.raises(openai.RateLimitError, match="request too large"):
            choices(5)  # above the cap itself: the same answer


def test_a_request_limit_under_the_replicas_count_still_admits_while_redis_is_away(tmp_path, fresh_emulator, own_redis,
                                                                                  own_redis_url):
    """While Redis is away each replica admits its share of a request bucket: 1 request a minute over two
    replicas was half a request, a bucket that never filled to one request's cost, so the team had none
    through ("retry in 60s", then again, for as long as Redis stayed away). A replica admits at least one
    request a minute, as it keeps at least one slot of a cap; a request of more than its share (n choices
    on Claude) is too large there at once."""
    write_policy(tmp_path, "slow", "sk-slow", fresh_emulator.url, extra="limits: {requests_per_minute: 1}\nretry: {max_attempts: 1}\n")
    write_policy(tmp_path, "three", "sk-three", fresh_emulator.url, extra="limits: {requests_per_minute: 3}\nretry: {max_attempts: 1}\n")
    with two_proxies(tmp_path, own_redis_url) as proxies:
        wait_until(lambda: _state(proxies[0]).shared.replicas == 2, "both replicas checked in")
        own_redis.stop()
        assert ask(proxies[0], "sk-three").content  # the guard opens; served from local state
        assert _state(proxies[0]).up is False
        assert ask(proxies[0], "sk-slow").content  # refused on the old code, and every minute after
        with pytest.raises(anthropic.RateLimitError, match="over its limit of 1 requests per minute"):
            ask(proxies[0], "sk-slow")  # its one request this minute
        client = openai.OpenAI(base_url=f"{proxies[0].url}/v1", api_key="sk-three", max_retries=0)
        with pytest.raises(openai.RateLimitError) as refused:  # 2 requests, more than this replica's 1.5 a minute
            client.chat.completions.create(model="claude-sonnet-4-5", messages=[{"role": "user", "content": "hi"}],
                                           max_completion_tokens=5, n=2)
        assert "request too large" in refused.value.message and "retry-after" not in refused.value.response.headers
