"""The response cache across replicas: an answer stored through one proxy is served by another
(exact and semantic tiers), a replica that starts later replays what was stored, and an
invalidation reaches every replica."""

from __future__ import annotations

import time

import httpx
import openai

from gateway.testing import RunningServer, running_proxy
from tests.helpers import PATIENCE_S, write_policy

PARAPHRASE = ("How do I reset my password?", "How can I reset my password?")


def chat(proxy: RunningServer, text: str):
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-c", max_retries=0)
    return client.chat.completions.with_raw_response.create(model="gpt-4o", messages=[{"role": "user", "content": text}], temperature=0)


def eventually(proxy: RunningServer, text: str, status: str, within_s: float = PATIENCE_S):
    """Ask until the answer has `status` (the design bound is 1 s, which bench/shared_state.py measures;
    here the wait ends at the event, and `within_s` only turns a hang into a failure)."""
    started = time.monotonic()
    while True:
        answer = chat(proxy, text)
        if answer.headers["x-slipstream-cache"] == status:
            return time.monotonic() - started, answer
        assert time.monotonic() - started < within_s, f"no {status} after {within_s}s"
        time.sleep(0.05)


def shared(proxy: RunningServer, events: int, redis_url: str, within_s: float = PATIENCE_S) -> None:
    """Wait until team c's shared stream holds `events` cache events (a proxy shares an answer right
    after sending it, so the client can be faster); the design bound is 1 s (bench/shared_state.py
    measures it), `within_s` only turns a hang into a failure."""
    import redis

    from sdk.state.redis import split_url

    stream = proxy.app.state.registry.services.response_cache().replicator.stream("c")
    started = time.monotonic()
    with redis.Redis.from_url(split_url(redis_url)[0]) as client:
        while client.xlen(stream) < events:
            assert time.monotonic() - started < within_s, f"fewer than {events} cache events after {within_s}s"
            time.sleep(0.02)


def replica(proxy: RunningServer, embedder) -> RunningServer:
    """Replicas in one test process share one loaded cache MiniLM (each would load its own in production)."""
    proxy.app.state.registry.services.response_cache().embedder = embedder
    return proxy


def test_answers_stored_by_one_proxy_are_served_by_the_others(tmp_path, monkeypatch, fresh_emulator, redis_url, cache_embedder):
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))
    write_policy(tmp_path, "c", "sk-c", fresh_emulator.url, extra="semantic_cache: {enabled: true}\n")
    with running_proxy([tmp_path], state_url=redis_url) as a, running_proxy([tmp_path], state_url=redis_url) as b:
        a, b = replica(a, cache_embedder), replica(b, cache_embedder)
        first = chat(a, PARAPHRASE[0])
        assert first.headers["x-slipstream-cache"] == "miss"
        shared(a, 1, redis_url)  # b's first lookup replays it
        hit = chat(b, PARAPHRASE[1])
        assert hit.headers["x-slipstream-cache"] == "semantic-hit"
        assert hit.parse().choices[0].message.content == first.parse().choices[0].message.content
        assert chat(b, PARAPHRASE[0]).headers["x-slipstream-cache"] == "exact-hit"
        assert fresh_emulator.stats()["requests_total"] == 1

        with running_proxy([tmp_path], state_url=redis_url) as late:  # started after the answer was stored
            replica(late, cache_embedder)
            assert chat(late, PARAPHRASE[0]).headers["x-slipstream-cache"] == "exact-hit"

        removed = httpx.request("DELETE", f"{b.url}/v1/slipstream/cache", headers={"authorization": "Bearer sk-c"})
        assert removed.status_code == 200
        eventually(a, PARAPHRASE[0], "miss")  # a's copy is gone too


def test_one_teams_cache_events_do_not_push_another_teams_out_of_redis(tmp_path, monkeypatch, fresh_emulator, redis_url):
    """Redis is the response cache's durable copy: a replica that starts replays it. One stream for
    every team, trimmed by count, let a team push the other teams' answers out of it: here with
    invalidations, which a team key sends without reaching a provider. Each team's events are
    bounded on their own, so a busy team trims only its own."""
    from sdk.cache import replication

    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(replication, "MAX_EVENTS", 100)  # the bound, small enough to reach here
    exact_only = "semantic_cache: {enabled: true, semantic: false}\n"
    write_policy(tmp_path, "c", "sk-c", fresh_emulator.url, extra=exact_only)
    write_policy(tmp_path, "busy", "sk-busy", fresh_emulator.url, extra=exact_only)
    with running_proxy([tmp_path], state_url=redis_url) as a:
        assert chat(a, PARAPHRASE[0]).headers["x-slipstream-cache"] == "miss"
        for i in range(300):  # Redis trims whole nodes of 100 entries: well past the bound
            dropped = httpx.delete(f"{a.url}/v1/slipstream/cache", params={"key": f"{i:064x}"}, headers={"authorization": "Bearer sk-busy"})
            assert dropped.status_code == 200
    with running_proxy([tmp_path], state_url=redis_url) as late:
        assert chat(late, PARAPHRASE[0]).headers["x-slipstream-cache"] == "exact-hit"
    assert fresh_emulator.stats()["requests_total"] == 1


def test_an_invalidation_by_a_key_no_entry_can_have_is_refused_and_not_shared(tmp_path, monkeypatch, fresh_emulator, redis_url):
    """An invalidation goes to every replica through the team's stream, in the Redis every team's limits
    and spend use, and `DELETE /v1/slipstream/cache?key=` appended the key as the client wrote it: a key
    of up to the 64 KiB head limit, kept 100,000 events deep, let a team key hold gigabytes of that
    Redis for free (no provider call, no answer stored). A key is an entry's SHA-256 in hex: anything
    else names no entry and is refused with a 400 before anything is shared; an entry's key still works."""
    import redis

    from sdk.state.redis import split_url

    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))
    write_policy(tmp_path, "c", "sk-c", fresh_emulator.url, extra="semantic_cache: {enabled: true, semantic: false}\n")
    with running_proxy([tmp_path], state_url=redis_url) as a:
        first = chat(a, PARAPHRASE[0])
        key = first.headers["x-slipstream-cache-key"]
        shared(a, 1, redis_url)
        for bad in ["x" * 32_768, key + "0", key.upper(), "k1", f"{key[:-1]}g"]:
            refused = httpx.delete(f"{a.url}/v1/slipstream/cache", params={"key": bad}, headers={"authorization": "Bearer sk-c"})
            assert refused.status_code == 400, (bad[:70], refused.text)
            assert "not an entry's key" in refused.json()["error"]["message"]
        stream = a.app.state.registry.services.response_cache().replicator.stream("c")
        with redis.Redis.from_url(split_url(redis_url)[0]) as client:
            assert client.xlen(stream) == 1  # the stored answer's event only
        assert chat(a, PARAPHRASE[0]).headers["x-slipstream-cache"] == "exact-hit"
        removed = httpx.delete(f"{a.url}/v1/slipstream/cache", params={"key": key}, headers={"authorization": "Bearer sk-c"})
        assert removed.json() == {"removed": 1}
        shared(a, 2, redis_url)  # an entry's key goes to the other replicas as before
        assert chat(a, PARAPHRASE[0]).headers["x-slipstream-cache"] == "miss"


def test_a_read_of_the_shared_streams_is_bounded_in_events_and_bytes(tmp_path, monkeypatch, fresh_emulator, redis_url):
    """Redis builds a read's whole reply while every team's limits wait: a read carries at most
    READ_COUNT events of a stream, and an answer larger than MAX_SHARED_ENTRY is not shared (500
    events of any size a read let a team's large answers make one reply hundreds of megabytes)."""
    import redis

    from sdk.cache import replication
    from sdk.state.redis import split_url

    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(replication, "READ_COUNT", 3)
    write_policy(tmp_path, "c", "sk-c", fresh_emulator.url, extra="semantic_cache: {enabled: true, semantic: false}\n")
    questions = [f"Question number {i}: what is {i} squared?" for i in range(8)]
    with running_proxy([tmp_path], state_url=redis_url) as a:
        for question in questions:
            assert chat(a, question).headers["x-slipstream-cache"] == "miss"
        shared(a, len(questions), redis_url)
        stream = a.app.state.registry.services.response_cache().replicator.stream("c")
        with redis.Redis.from_url(split_url(redis_url)[0]) as client:
            largest = max(sum(len(v) for v in fields.values()) for _, fields in client.xrange(stream))
        monkeypatch.setattr(replication, "MAX_SHARED_ENTRY", largest // 2)  # every answer from here on is "large"
        assert chat(a, "A question with a large answer?").headers["x-slipstream-cache"] == "miss"
        assert chat(a, "A question with a large answer?").headers["x-slipstream-cache"] == "exact-hit"  # kept here
    with running_proxy([tmp_path], state_url=redis_url) as late:  # replays 8 events, 3 a read
        for question in questions:
            assert chat(late, question).headers["x-slipstream-cache"] == "exact-hit"
        assert chat(late, "A question with a large answer?").headers["x-slipstream-cache"] == "miss"
    with redis.Redis.from_url(split_url(redis_url)[0]) as client:
        assert client.xlen(stream) == len(questions)  # neither replica shared its large answer
