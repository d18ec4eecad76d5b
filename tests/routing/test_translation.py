"""Cross-protocol fallback through the proxy with the official clients, unchanged.

anthropic client → proxy → OpenAI-shaped emulator endpoint, and openai client → proxy → Anthropic
endpoint: text, tools and tool results, streaming, stop reasons and exact usage; what cannot be
translated is refused before anything is sent.
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from gateway.testing import running_proxy
from tests.routing.conftest import policy_text

CROSS = """  - match: {model: "claude-*"}
    targets: [{provider: gpt, model: gpt-4o}]
  - match: {model: "gpt-*"}
    targets: [{provider: claude, model: claude-target}]"""
WEATHER = {"name": "get_weather", "description": "Weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
ASK = [{"role": "user", "content": "Use the get_weather tool for Oslo."}]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("cross")
    (directory / "routing.yaml").write_text(policy_text(emulator.url, CROSS))
    with running_proxy([directory]) as running:
        yield running.url


@pytest.fixture
def oa_direct(emulator):
    return openai.OpenAI(base_url=f"{emulator.url}/v1", api_key="k", max_retries=0)


@pytest.fixture
def an_direct(emulator):
    return anthropic.Anthropic(base_url=emulator.url, api_key="k", max_retries=0)


def test_anthropic_client_served_by_openai_target(an, oa_direct, fresh_emulator):
    raw = an.messages.with_raw_response.create(model="claude-x", max_tokens=40, system="Be brief.",
                                               messages=[{"role": "user", "content": "Tell me about fjords."}])
    message = raw.parse()
    direct = oa_direct.chat.completions.create(model="gpt-4o", max_completion_tokens=40,
                                               messages=[{"role": "system", "content": "Be brief."},
                                                         {"role": "user", "content": "Tell me about fjords."}])
    assert raw.headers["x-slipstream-route"] == "gpt/gpt-4o"
    assert message.content[0].text == direct.choices[0].message.content
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) == direct.usage.prompt_tokens
    assert message.usage.output_tokens == direct.usage.completion_tokens


def test_anthropic_tool_round_trip_streaming(an, fresh_emulator):
    with an.messages.stream(model="claude-x", max_tokens=200, tools=[WEATHER], messages=ASK) as stream:
        final = stream.get_final_message()
    call = next(block for block in final.content if block.type == "tool_use")
    assert final.stop_reason == "tool_use" and call.name == "get_weather" and isinstance(call.input, dict)
    assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0
    follow = ASK + [{"role": "assistant", "content": final.content},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "12°C, rain"}]}]
    answer = an.messages.create(model="claude-x", max_tokens=40, tools=[WEATHER], messages=follow)
    assert answer.stop_reason in ("end_turn", "max_tokens") and answer.content[0].type == "text"
    assert fresh_emulator.stats()["requests_total"] == 2  # both served by the OpenAI endpoint, no retries


def test_openai_client_served_by_anthropic_target(oa, an_direct, fresh_emulator):
    result = oa.chat.completions.create(model="gpt-x", max_completion_tokens=40,
                                        messages=[{"role": "system", "content": "Be brief."},
                                                  {"role": "user", "content": "Tell me about fjords."}])
    direct = an_direct.messages.create(model="claude-target", max_tokens=40, system="Be brief.",
                                       messages=[{"role": "user", "content": [{"type": "text", "text": "Tell me about fjords."}]}])
    assert result.choices[0].message.content == direct.content[0].text
    assert result.usage.completion_tokens == direct.usage.output_tokens
    assert result.usage.prompt_tokens == direct.usage.input_tokens + (direct.usage.cache_read_input_tokens or 0) + (direct.usage.cache_creation_input_tokens or 0)


def test_openai_tool_round_trip_streaming_with_usage(oa, fresh_emulator):
    tools = [{"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                               "parameters": WEATHER["input_schema"]}}]
    messages = [{"role": "user", "content": "Use the get_weather tool for Oslo."}]
    chunks = list(oa.chat.completions.create(model="gpt-x", messages=messages, tools=tools, stream=True,
                                             stream_options={"include_usage": True}))
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["tool_calls"]
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or ())]
    call_id, name = calls[0].id, calls[0].function.name
    arguments = "".join(tc.function.arguments or "" for tc in calls)
    assert name == "get_weather" and arguments.startswith("{")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    follow = messages + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "12°C, rain"}]
    answer = oa.chat.completions.create(model="gpt-x", messages=follow, tools=tools)
    assert answer.choices[0].finish_reason in ("stop", "length") and answer.choices[0].message.content


def test_untranslatable_is_refused_before_sending(an, oa, fresh_emulator):
    with pytest.raises(anthropic.BadRequestError) as error:
        an.messages.create(model="claude-x", max_tokens=10, messages=ASK, extra_body={"top_k": 5})
    assert "'top_k' cannot be translated for an OpenAI target" in error.value.message
    with pytest.raises(openai.BadRequestError) as oa_error:
        oa.chat.completions.create(model="gpt-x", messages=ASK, presence_penalty=0.5)
    assert "'presence_penalty' cannot be translated" in oa_error.value.message
    assert fresh_emulator.stats()["requests_total"] == 0


def test_upstream_errors_are_reshaped_for_the_client(an, fresh_emulator):
    fresh_emulator.inject_fault("400")
    with pytest.raises(anthropic.BadRequestError) as error:
        an.messages.create(model="claude-x", max_tokens=10, messages=ASK)
    assert error.value.body["type"] == "error" and error.value.body["error"]["type"] == "invalid_request_error"
