"""The cache stage end to end: TeamRuntime → cache → router → the provider emulator."""

from __future__ import annotations

import anthropic
import httpx2
import orjson
import pytest

from sdk.errors import InvalidRequestError
from sdk.services import Services
from tests.cache.helpers import ask, claude, gpt, text_of

PARAPHRASE = ("How do I reset my password?", "How can I reset my password?")


def upstream_calls(emulator) -> int:
    return emulator.stats()["requests_total"]


async def test_exact_hit_replays_the_body_without_an_upstream_call(runtime_for, fresh_emulator):
    runtime = runtime_for()
    first, status, miss = await ask(runtime, claude("What is the boiling point of water?"))
    assert status == "miss" and "x-slipstream-cache-key" in miss.headers
    again, status, hit = await ask(runtime, claude("What is the boiling point of water?"))
    assert status == "exact-hit" and upstream_calls(fresh_emulator) == 1
    assert {**orjson.loads(again), "id": None} == {**orjson.loads(first), "id": None}  # under an id of its own
    assert orjson.loads(again)["id"] != orjson.loads(first)["id"]
    assert hit.route == "cache/claude/claude-sonnet-4-6" and hit.usage.output_tokens == 0  # nothing billed
    assert orjson.loads(again)["usage"] == orjson.loads(first)["usage"]  # the client sees what it saw


async def test_semantic_hit_on_a_paraphrase(runtime_for, fresh_emulator):
    runtime = runtime_for()
    first, _, _ = await ask(runtime, claude(PARAPHRASE[0]))
    again, status, _ = await ask(runtime, claude(PARAPHRASE[1]))
    assert status == "semantic-hit" and text_of(again) == text_of(first) and upstream_calls(fresh_emulator) == 1


@pytest.mark.parametrize(
    ("stored", "asked"),
    [
        ("How many calories are in 2 eggs?", "How many calories are in 3 eggs?"),
        ("Is it safe to drink coffee while pregnant?", "Is it not safe to drink coffee while pregnant?"),
        ("Is Python faster than Java?", "Is Java faster than Python?"),
        ("How do I install Python on Windows?", "How do I install Python on a Mac?"),
    ],
)
async def test_near_misses_are_not_served(runtime_for, stored, asked):
    runtime = runtime_for()
    await ask(runtime, claude(stored))
    _, status, _ = await ask(runtime, claude(asked))
    assert status == "miss"


async def test_no_hit_ever_crosses_teams(runtime_for, fresh_emulator):
    search, billing = runtime_for("search"), runtime_for("billing")
    await ask(search, claude(PARAPHRASE[0]))
    assert (await ask(billing, claude(PARAPHRASE[0])))[1] == "miss"  # byte-identical, other team
    assert (await ask(search, claude(PARAPHRASE[0])))[1] == "exact-hit"
    assert upstream_calls(fresh_emulator) == 2


async def test_multi_turn_requests_hit_only_with_identical_earlier_turns(runtime_for):
    runtime = runtime_for()
    history = [{"role": "user", "content": "I use Django."}, {"role": "assistant", "content": "Noted."}]
    other = [{"role": "user", "content": "I use Rails."}, {"role": "assistant", "content": "Noted."}]
    await ask(runtime, claude(PARAPHRASE[0], before=history))
    assert (await ask(runtime, claude(PARAPHRASE[1], before=other)))[1] == "miss"
    assert (await ask(runtime, claude(PARAPHRASE[1], before=history)))[1] == "semantic-hit"
    long = runtime_for("longform", "{enabled: true, max_turns_for_semantic: 1}")
    await ask(long, claude(PARAPHRASE[0], before=history))
    assert (await ask(long, claude(PARAPHRASE[1], before=history)))[1] == "miss"  # too long for the semantic tier
    assert (await ask(long, claude(PARAPHRASE[0], before=history)))[1] == "exact-hit"


async def test_sampled_requests_and_tool_calls_are_not_cached_by_default(runtime_for, fresh_emulator):
    runtime = runtime_for()
    for _ in range(2):
        assert (await ask(runtime, claude("Tell me a joke.", temperature=None)))[1] == "miss"
    tools = [{"name": "get_weather", "description": "w", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    for _ in range(2):
        assert (await ask(runtime, claude("Use get_weather for Oslo.", tools=tools)))[1] == "miss"
    allowed = runtime_for("tools", "{enabled: true, cache_sampled: true, cache_tool_calls: true}")
    await ask(allowed, claude("Use get_weather for Oslo.", tools=tools, temperature=None))
    assert (await ask(allowed, claude("Use get_weather for Oslo.", tools=tools, temperature=None)))[1] == "exact-hit"


async def test_a_request_can_raise_the_precision_bar_but_not_lower_it(runtime_for):
    runtime = runtime_for("strict", "{enabled: true, min_precision: 0.999}")
    await ask(runtime, claude(PARAPHRASE[0]))
    assert (await ask(runtime, claude(PARAPHRASE[1], slipstream={"min_precision": 0.5})))[1] == "miss"
    loose = runtime_for()
    await ask(loose, claude(PARAPHRASE[0]))
    strict = claude(PARAPHRASE[1])
    strict.forward_headers["x-slipstream-min-precision"] = "1.0"
    assert (await ask(loose, strict))[1] == "miss"
    assert (await ask(loose, claude(PARAPHRASE[0], slipstream={"min_precision": 1.0})))[1] == "exact-hit"
    with pytest.raises(InvalidRequestError):
        await ask(loose, claude(PARAPHRASE[0], slipstream={"min_precision": "high"}))


async def test_anthropic_stream_is_stored_once_finished_and_replayed_as_events(runtime_for, fresh_emulator):
    runtime = runtime_for()
    streamed, status, _ = await ask(runtime, claude("Name three prime numbers.", stream=True))
    assert status == "miss"
    replay, status, _ = await ask(runtime, claude("Name three prime numbers.", stream=True))
    assert status == "exact-hit" and upstream_calls(fresh_emulator) == 1
    kinds = [line for line in replay.split(b"\n") if line.startswith(b"event: ")]
    assert kinds[0] == b"event: message_start" and kinds[-2:] == [b"event: message_delta", b"event: message_stop"]
    client = anthropic.Anthropic(
        api_key="k", base_url="http://cache.test",
        http_client=httpx2.Client(transport=httpx2.MockTransport(lambda _: httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=replay))),
    )  # fmt: skip
    with client.messages.stream(model="m", max_tokens=10, messages=[{"role": "user", "content": "q"}]) as stream:
        replayed = stream.get_final_message()
    body, status, _ = await ask(runtime, claude("Name three prime numbers."))
    assert status == "exact-hit" and replayed.content[0].text == text_of(body)
    assert b"".join(line for line in streamed.split(b"\n") if b"text_delta" in line) != b""


async def test_openai_non_stream_entry_replays_as_a_stream_with_usage(runtime_for, fresh_emulator):
    runtime = runtime_for()
    body, _, _ = await ask(runtime, gpt("What is the speed of light?"))
    replay, status, _ = await ask(runtime, gpt("What is the speed of light?", stream=True, include_usage=True))
    assert status == "exact-hit" and upstream_calls(fresh_emulator) == 1
    chunks = [orjson.loads(line[6:]) for line in replay.split(b"\n") if line.startswith(b"data: {")]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == text_of(body)
    assert chunks[-1]["usage"] == orjson.loads(body)["usage"] and replay.endswith(b"data: [DONE]\n\n")


async def test_cache_survives_a_restart_and_invalidation_clears_it(runtime_for, services, cache_embedder):
    runtime = runtime_for()
    await ask(runtime, claude(PARAPHRASE[0]))
    _, _, miss = await ask(runtime, claude("What is a lighthouse?"))
    services.response_cache().close()
    restarted = Services(data_dir=services.data_dir)
    restarted._cache_embedder = cache_embedder
    runtime = runtime_for(services=restarted)
    assert (await ask(runtime, claude(PARAPHRASE[1])))[1] == "semantic-hit"
    cache = restarted.response_cache()
    assert cache.invalidate_key(miss.headers["x-slipstream-cache-key"]) == 1
    assert (await ask(runtime, claude("What is a lighthouse?")))[1] == "miss"
    assert cache.invalidate_team("search") == 2
    assert (await ask(runtime, claude(PARAPHRASE[1])))[1] == "miss"
    assert cache.invalidate_all() == 1
