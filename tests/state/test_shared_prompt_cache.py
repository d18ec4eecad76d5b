"""The prompt-cache ledger across replicas: a prefix cached through one proxy is an expected read on
another (the emulator keeps one cache per upstream key, as a provider keeps one per workspace)."""

from __future__ import annotations

import anthropic
import openai

from tests.helpers import skip_without_redis, write_policy

skip_without_redis()

import redis  # noqa: E402

from gateway.testing import free_port, running_proxy  # noqa: E402
from sdk.state.redis import split_url  # noqa: E402

KEY = "sk-pc-shared"
STATIC = "You are the support assistant.\n" + "Answer from the manual and cite the section. " * 150


def fields(header: str) -> dict[str, int]:
    return {name: int(value) for name, value in (part.split("=") for part in header.split(";")) if value.isdigit()}


def ask_anthropic(proxy_url: str, question: str) -> dict[str, int]:
    client = anthropic.Anthropic(base_url=proxy_url, api_key=KEY, max_retries=0)
    raw = client.messages.with_raw_response.create(model="claude-sonnet-5", max_tokens=8, system=STATIC,
                                                   messages=[{"role": "user", "content": question}])
    return fields(raw.headers["x-slipstream-prompt-cache"])


def test_prefix_cached_through_one_proxy_is_expected_on_another(tmp_path, fresh_emulator, redis_url):
    write_policy(tmp_path, "pcshared", KEY, fresh_emulator.url, extra="prompt_cache: {ttl: 1h}\n")
    with running_proxy([tmp_path], state_url=redis_url) as a, running_proxy([tmp_path], state_url=redis_url) as b:
        first = ask_anthropic(a.url, "How do I reset the device?")
        assert first["read"] == 0 and first["write"] > 1000 and first["expected_read"] == 0
        second = ask_anthropic(b.url, "How do I pair it?")  # another replica, the same cached prefix
        assert second["read"] > 1000 and second["expected_read"] == second["read"]

        openai_client = openai.OpenAI(base_url=f"{b.url}/v1", api_key=KEY, max_retries=0)
        messages = [{"role": "system", "content": STATIC}, {"role": "user", "content": "Hello"}]
        openai_client.chat.completions.create(model="gpt-4o", messages=messages)
        raw = openai.OpenAI(base_url=f"{a.url}/v1", api_key=KEY, max_retries=0).chat.completions.with_raw_response.create(
            model="gpt-4o", messages=messages)
        seen = fields(raw.headers["x-slipstream-prompt-cache"])
        assert seen["read"] >= 1024 and seen["expected_read"] >= 1024

    # The entries expire in Redis when the provider's do: 1 h for the Anthropic breakpoint this policy
    # asks for, 5 min for OpenAI's in-memory retention.
    server, prefix, _ = split_url(redis_url)
    client = redis.Redis.from_url(server)
    lives = sorted(client.pttl(name) / 1000 for name in client.scan_iter(f"{prefix}:pc:*"))
    assert lives and 290 < lives[0] <= 300 and 3590 < lives[-1] <= 3600


def test_a_conversation_that_moves_replicas_expects_what_its_last_turn_cached(tmp_path, fresh_emulator, redis_url):
    write_policy(tmp_path, "pcturns", KEY, fresh_emulator.url)
    history = [{"role": "user", "content": "Question one: how do I reset the device? " * 40}]
    with running_proxy([tmp_path], state_url=redis_url) as a, running_proxy([tmp_path], state_url=redis_url) as b:
        first = anthropic.Anthropic(base_url=a.url, api_key=KEY, max_retries=0).messages.with_raw_response.create(
            model="claude-sonnet-5", max_tokens=8, system=STATIC, messages=history)
        history += [{"role": "assistant", "content": "Hold the button."}, {"role": "user", "content": "And then?"}]
        second = anthropic.Anthropic(base_url=b.url, api_key=KEY, max_retries=0).messages.with_raw_response.create(
            model="claude-sonnet-5", max_tokens=8, system=STATIC, messages=history)
    wrote, seen = fields(first.headers["x-slipstream-prompt-cache"]), fields(second.headers["x-slipstream-prompt-cache"])
    assert seen["read"] == wrote["write"] and seen["expected_read"] == seen["read"]  # through the first turn's question


def test_without_redis_the_local_ledger_still_predicts(tmp_path, fresh_emulator):
    write_policy(tmp_path, "pclocal", KEY, fresh_emulator.url)
    nowhere = f"redis://127.0.0.1:{free_port()}/0?timeout_ms=200"
    with running_proxy([tmp_path], state_url=nowhere) as proxy:
        ask_anthropic(proxy.url, "How do I reset the device?")
        again = ask_anthropic(proxy.url, "How do I pair it?")
        assert again["read"] > 1000 and again["expected_read"] == again["read"]
