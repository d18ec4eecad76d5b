"""The official openai and anthropic clients, unchanged, through the proxy and directly to the emulator."""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.gateway.conftest import TEAM_KEY

MESSAGES = [{"role": "user", "content": "Tell me about the Oslo fjord."}]
LONG_SYSTEM = "You are a careful assistant. " + "Follow the house style guide in every answer. " * 250
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture
def oa(proxy):
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=TEAM_KEY, max_retries=0)


@pytest.fixture
def oa_direct(emulator):
    return openai.OpenAI(base_url=f"{emulator.url}/v1", api_key="up-openai", max_retries=0)


@pytest.fixture
def an(proxy):
    return anthropic.Anthropic(base_url=proxy.url, api_key=TEAM_KEY, max_retries=0)


@pytest.fixture
def an_direct(emulator):
    return anthropic.Anthropic(base_url=emulator.url, api_key="up-anthropic", max_retries=0)


def test_openai_non_streaming_matches_direct(oa, oa_direct, fresh_emulator):
    raw = oa.chat.completions.with_raw_response.create(model="gpt-4o", messages=MESSAGES)
    via_proxy = raw.parse()
    direct = oa_direct.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert via_proxy.choices[0].message.content == direct.choices[0].message.content
    assert via_proxy.usage.model_dump() == direct.usage.model_dump()
    assert raw.headers["x-slipstream-route"] == "gpt/gpt-4o"
    assert raw.headers["x-slipstream-cache"] == "miss"
    assert float(raw.headers["x-slipstream-overhead-ms"]) >= 0
    assert raw.headers["x-slipstream-prompt-cache"] == "read=0;write=0;expected_read=0"
    assert raw.headers.get("x-request-id")


def test_openai_streaming_passes_events_and_usage(oa, oa_direct, fresh_emulator):
    kwargs = dict(model="gpt-4o", messages=MESSAGES, stream=True, stream_options={"include_usage": True})
    chunks = list(oa.chat.completions.create(**kwargs))
    direct = list(oa_direct.chat.completions.create(**kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "".join(c.choices[0].delta.content or "" for c in direct if c.choices)
    assert len(chunks) == len(direct) > 3
    assert chunks[-1].usage is not None and chunks[-1].usage.model_dump() == direct[-1].usage.model_dump()


def test_openai_cached_tokens_carried_through(oa, fresh_emulator):
    messages = [{"role": "system", "content": LONG_SYSTEM}, *MESSAGES]
    first = oa.chat.completions.create(model="gpt-4o", messages=messages)
    second = oa.chat.completions.create(model="gpt-4o", messages=messages)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 1024 and cached % 128 == 0


def test_openai_tool_call(oa, fresh_emulator):
    tool = {"type": "function", "function": {"name": WEATHER_TOOL["name"], "parameters": WEATHER_TOOL["input_schema"]}}
    result = oa.chat.completions.create(model="gpt-4o", messages=MESSAGES, tools=[tool], tool_choice="required")
    call = result.choices[0].message.tool_calls[0]
    assert result.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather"


def test_anthropic_non_streaming_matches_direct(an, an_direct, fresh_emulator):
    raw = an.messages.with_raw_response.create(model="claude-sonnet-5", max_tokens=64, messages=MESSAGES)
    via_proxy = raw.parse()
    direct = an_direct.messages.create(model="claude-sonnet-5", max_tokens=64, messages=MESSAGES)
    assert via_proxy.content[0].text == direct.content[0].text
    assert via_proxy.usage.model_dump() == direct.usage.model_dump()
    assert raw.headers["x-slipstream-route"] == "claude/claude-sonnet-5"
    assert raw.headers.get("request-id")


def test_anthropic_stream_helper_and_usage_not_double_counted(an, an_direct, fresh_emulator):
    with an.messages.stream(model="claude-sonnet-5", max_tokens=64, messages=MESSAGES) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    direct = an_direct.messages.create(model="claude-sonnet-5", max_tokens=64, messages=MESSAGES)
    assert text == direct.content[0].text
    assert final.usage.output_tokens == direct.usage.output_tokens
    assert final.usage.input_tokens == direct.usage.input_tokens


def test_anthropic_prompt_cache_fields_and_ttl_pass_through(an, proxy, fresh_emulator):
    system = [{"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    first = an.messages.create(model="claude-sonnet-5", max_tokens=16, system=system, messages=MESSAGES)
    raw = an.messages.with_raw_response.create(model="claude-sonnet-5", max_tokens=16, system=system, messages=MESSAGES)
    second = raw.parse()
    assert first.usage.cache_creation_input_tokens > 1024
    assert first.usage.cache_creation.ephemeral_1h_input_tokens == first.usage.cache_creation_input_tokens
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    read = second.usage.cache_read_input_tokens
    assert raw.headers["x-slipstream-prompt-cache"] == f"read={read};write=0;expected_read=0"


def test_anthropic_streaming_cache_usage_from_message_start(an, fresh_emulator):
    system = [{"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral"}}]
    an.messages.create(model="claude-sonnet-5", max_tokens=16, system=system, messages=MESSAGES)
    with an.messages.stream(model="claude-sonnet-5", max_tokens=16, system=system, messages=MESSAGES) as stream:
        final = stream.get_final_message()
    assert final.usage.cache_read_input_tokens > 1024


def test_anthropic_tool_use_round_trip(an, fresh_emulator):
    first = an.messages.create(
        model="claude-sonnet-5", max_tokens=128, tools=[WEATHER_TOOL], tool_choice={"type": "any"}, messages=MESSAGES
    )
    assert first.stop_reason == "tool_use"
    use = next(block for block in first.content if block.type == "tool_use")
    follow_up = [
        *MESSAGES,
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C"}]},
    ]
    second = an.messages.create(model="claude-sonnet-5", max_tokens=64, tools=[WEATHER_TOOL], messages=follow_up)
    assert second.stop_reason in ("end_turn", "max_tokens")
    with an.messages.stream(
        model="claude-sonnet-5", max_tokens=128, tools=[WEATHER_TOOL], tool_choice={"type": "any"}, messages=MESSAGES
    ) as stream:
        streamed = stream.get_final_message()
    assert next(b for b in streamed.content if b.type == "tool_use").input == use.input


def test_anthropic_count_tokens_and_beta_query(an, fresh_emulator):
    counted = an.messages.count_tokens(model="claude-sonnet-5", messages=MESSAGES)
    assert counted.input_tokens > 0
    beta = an.beta.messages.create(model="claude-sonnet-5", max_tokens=16, messages=MESSAGES, betas=["extended-cache-ttl-2025-04-11"])
    assert beta.content


def test_models_list(oa, an):
    assert oa.models.list().data is not None
