"""Anthropic Messages wire format (reference B.1-B.7) with the official client and raw HTTP."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from emulator.text import count_tokens

from .helpers import ANTHROPIC_HEADERS, HTTP, post, sse_events

MODEL = "claude-sonnet-4-6"
MSGS = [{"role": "user", "content": "Hello there"}]
WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object",
                     "properties": {"city": {"type": "string"},
                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                     "required": ["city", "unit"]},
}


def test_non_streaming_shape_and_usage(anth, emu):
    raw = anth.messages.with_raw_response.create(model=MODEL, max_tokens=100, messages=MSGS)
    assert raw.headers["request-id"].startswith("req_")
    assert raw.headers["anthropic-ratelimit-requests-limit"]
    assert raw.headers["anthropic-ratelimit-tokens-reset"].endswith("Z")
    m = raw.parse()
    assert m.type == "message" and m.role == "assistant" and m.model == MODEL
    assert m.id.startswith("msg_")
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    assert [b.type for b in m.content] == ["text"]
    assert m.usage.output_tokens == 48 == count_tokens(m.content[0].text)
    assert m.usage.input_tokens == count_tokens("Hello there")
    assert m.usage.cache_creation_input_tokens == 0 and m.usage.cache_read_input_tokens == 0
    assert m.usage.cache_creation.ephemeral_5m_input_tokens == 0


def test_reply_is_deterministic(anth):
    a = anth.messages.create(model=MODEL, max_tokens=100, messages=MSGS)
    b = anth.messages.create(model=MODEL, max_tokens=100, messages=MSGS)
    c = anth.messages.create(model=MODEL, max_tokens=100,
                             messages=[{"role": "user", "content": "Something else"}])
    assert a.content[0].text == b.content[0].text != c.content[0].text


def test_max_tokens_and_stop_sequence(anth):
    m = anth.messages.create(model=MODEL, max_tokens=5, messages=MSGS)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 5
    full = anth.messages.create(model=MODEL, max_tokens=100, messages=MSGS).content[0].text
    word = full.split()[3]
    s = anth.messages.create(model=MODEL, max_tokens=100, messages=MSGS, stop_sequences=[word])
    assert s.stop_reason == "stop_sequence" and s.stop_sequence == word
    assert s.content[0].text == full[: full.index(word)]
    assert s.usage.output_tokens == count_tokens(s.content[0].text)


def test_prewarm_max_tokens_zero(anth):
    m = anth.messages.create(model=MODEL, max_tokens=0, messages=MSGS)
    assert m.content == [] and m.stop_reason == "max_tokens" and m.usage.output_tokens == 0


def test_streaming_golden_sequence(emu):
    body = {"model": MODEL, "max_tokens": 20, "messages": MSGS, "stream": True}
    r = post(emu.url, "/v1/messages", body, ANTHROPIC_HEADERS)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    evs = sse_events(r.text)
    names = [n for n, _ in evs]
    n_deltas = names.count("content_block_delta")
    assert n_deltas == 5  # 20 tokens, 4 per delta
    assert names == (["message_start", "content_block_start", "ping"]
                     + ["content_block_delta"] * n_deltas
                     + ["content_block_stop", "message_delta", "message_stop"])
    datas = [json.loads(d) for _, d in evs]
    assert all(d["type"] == n for (n, _), d in zip(evs, datas, strict=True))
    start = datas[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert set(start["usage"]) >= {"input_tokens", "cache_creation_input_tokens",
                                   "cache_read_input_tokens", "output_tokens"}
    assert datas[-2]["usage"] == {"output_tokens": 20}
    assert datas[-2]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    text = "".join(d["delta"]["text"] for d in datas if d["type"] == "content_block_delta")
    assert count_tokens(text) == 20
    assert "[DONE]" not in r.text


def test_streaming_with_sdk_matches_non_streaming(anth, emu):
    full = anth.messages.create(model=MODEL, max_tokens=64, messages=MSGS)
    with anth.messages.stream(model=MODEL, max_tokens=64, messages=MSGS) as s:
        types = [e.type for e in s]
        final = s.get_final_message()
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert final.content[0].text == full.content[0].text
    assert final.usage.output_tokens == full.usage.output_tokens  # overwritten, not added
    assert emu.stats()["completed_streams"] == 1


def test_tool_use_forced_and_streamed(anth):
    m = anth.messages.create(model=MODEL, max_tokens=200, messages=MSGS, tools=[WEATHER],
                             tool_choice={"type": "tool", "name": "get_weather"})
    assert m.stop_reason == "tool_use"
    assert [b.type for b in m.content] == ["tool_use"]
    assert m.content[0].input == {"city": "example_city", "unit": "c"}
    assert m.content[0].id.startswith("toolu_")
    with anth.messages.stream(model=MODEL, max_tokens=200, messages=MSGS, tools=[WEATHER],
                              tool_choice={"type": "any"}) as s:
        types = [e.type for e in s]
        final = s.get_final_message()
    assert "input_json" in types
    assert final.content[0].input == {"city": "example_city", "unit": "c"}
    assert final.stop_reason == "tool_use"


def test_tool_use_auto_rule(anth):
    ask = [{"role": "user", "content": "Please call get_weather for Oslo"}]
    m = anth.messages.create(model=MODEL, max_tokens=200, messages=ask, tools=[WEATHER])
    assert [b.type for b in m.content] == ["text", "tool_use"] and m.stop_reason == "tool_use"
    plain = anth.messages.create(model=MODEL, max_tokens=200, messages=MSGS, tools=[WEATHER])
    assert plain.stop_reason == "end_turn"
    none = anth.messages.create(model=MODEL, max_tokens=200, messages=ask, tools=[WEATHER],
                                tool_choice={"type": "none"})
    assert none.stop_reason == "end_turn"
    follow = ask + [{"role": "assistant", "content": [
        {"type": "tool_use", "id": m.content[1].id, "name": "get_weather", "input": m.content[1].input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": m.content[1].id,
                                      "content": "12C"}]}]
    after = anth.messages.create(model=MODEL, max_tokens=200, messages=follow, tools=[WEATHER])
    assert after.stop_reason == "end_turn"


def test_count_tokens_and_beta_query(anth, emu):
    n = anth.messages.count_tokens(model=MODEL, messages=MSGS, system="Be brief.")
    assert n.input_tokens == count_tokens("Hello there") + count_tokens("Be brief.")
    r = HTTP.post(emu.url + "/v1/messages?beta=true", headers={
        **ANTHROPIC_HEADERS, "anthropic-beta": "extended-cache-ttl-2025-04-11"},
        json={"model": MODEL, "max_tokens": 10, "messages": MSGS})
    assert r.status_code == 200 and r.json()["usage"]["output_tokens"] == 10
    m = anth.beta.messages.create(model=MODEL, max_tokens=10, messages=MSGS, betas=["foo-2025-01-01"])
    assert m.usage.output_tokens == 10


def test_auth_and_version_errors(emu):
    body = {"model": MODEL, "max_tokens": 10, "messages": MSGS}
    r = post(emu.url, "/v1/messages", body, {"anthropic-version": "2023-06-01"})
    assert r.status_code == 401
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "authentication_error"
    assert r.json()["request_id"] == r.headers["request-id"]
    r = post(emu.url, "/v1/messages", body, {"authorization": "Bearer tok"})
    assert r.status_code == 400 and "anthropic-version" in r.json()["error"]["message"]


def test_api_keys_allow_list():
    from emulator import EmulatorConfig
    from emulator.testing import running_emulator

    with running_emulator(EmulatorConfig(api_keys={"good"})) as e:
        ok = post(e.url, "/v1/messages", {"model": MODEL, "max_tokens": 5, "messages": MSGS},
                  {**ANTHROPIC_HEADERS, "x-api-key": "good"})
        with anthropic.Anthropic(base_url=e.url, api_key="bad", max_retries=0) as c, \
                pytest.raises(anthropic.AuthenticationError) as ei:
            c.messages.create(model=MODEL, max_tokens=5, messages=MSGS)
    assert ok.status_code == 200
    assert ei.value.status_code == 401 and ei.value.body["error"]["type"] == "authentication_error"


@pytest.mark.parametrize("body, fragment", [
    ({"max_tokens": 10, "messages": MSGS}, "model: Field required"),
    ({"model": MODEL, "messages": MSGS}, "max_tokens: Field required"),
    ({"model": MODEL, "max_tokens": 10}, "messages: Field required"),
    ({"model": MODEL, "max_tokens": "x", "messages": MSGS}, "max_tokens: Input should be a valid integer"),
    ({"model": MODEL, "max_tokens": 10, "messages": [{"role": "bot", "content": "x"}]},
     "messages.0.role: Input should be 'user' or 'assistant'"),
    ({"model": MODEL, "max_tokens": 10, "messages": MSGS, "temperature": 1.5},
     "temperature: Input should be less than or equal to 1"),
    ({"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": ""}]},
     "messages.0: all messages must have non-empty content"),
    ({"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": [{"type": "text", "text": ""},
                                                                                  {"type": "text", "text": "Hi"}]}]},
     "messages: text content blocks must be non-empty"),
    ({"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": [{"type": "text", "text": "\n\n"}]}]},
     "messages: text content blocks must contain non-whitespace text"),
    ({"model": MODEL, "max_tokens": 0, "messages": MSGS, "stream": True}, "max_tokens: 0"),
    ({"model": MODEL, "max_tokens": 10, "messages": MSGS, "tool_choice": {"type": "any"}},
     "tool_choice may only be specified while providing tools."),
])
def test_validation_errors(emu, body, fragment):
    r = post(emu.url, "/v1/messages", body, ANTHROPIC_HEADERS)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert fragment in err["error"]["message"]


def test_malformed_json_is_provider_shaped(emu):
    r = HTTP.post(emu.url + "/v1/messages", content=b"{not json", headers=ANTHROPIC_HEADERS)
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert "JSON" in r.json()["error"]["message"]


def test_bad_request_through_sdk(anth):
    with pytest.raises(anthropic.BadRequestError) as ei:
        anth.messages.create(model=MODEL, max_tokens=10, messages=MSGS, extra_body={"temperature": 3})
    assert ei.value.status_code == 400 and "temperature" in str(ei.value)


def test_web_search_server_tool(anth):
    """A request holding the web search tool gets one search before its answer: server_tool_use, its
    web_search_tool_result, the text citing the first result; streamed, the same blocks (the query as
    input_json_delta, the citation as citations_delta). A tool not named web_search is the API's 400."""
    tools: Any = [{"type": "web_search_20250305", "name": "web_search", "allowed_domains": ["yr.no"]}]
    ask: Any = [{"role": "user", "content": "Weather in Oslo?"}]
    message = anth.messages.create(model=MODEL, max_tokens=200, messages=ask, tools=tools)
    assert [b.type for b in message.content] == ["server_tool_use", "web_search_tool_result", "text"]
    assert message.content[0].input == {"query": "Weather in Oslo?"} and message.content[1].tool_use_id == message.content[0].id
    assert message.content[2].citations[0].url == message.content[1].content[0].url and message.content[2].citations[0].url.startswith("https://yr.no/")
    assert message.usage.server_tool_use.web_search_requests == 1
    with anth.messages.stream(model=MODEL, max_tokens=200, messages=ask, tools=tools) as stream:
        streamed = stream.get_final_message()
    assert [b.type for b in streamed.content] == ["server_tool_use", "web_search_tool_result", "text"]
    assert streamed.content[0].input == {"query": "Weather in Oslo?"} and streamed.content[2].citations[0].type == "web_search_result_location"
    assert [b.type for b in anth.messages.create(model=MODEL, max_tokens=200, messages=ask, tools=tools,
                                                 tool_choice={"type": "none"}).content] == ["text"]
    with pytest.raises(anthropic.BadRequestError, match=r"tools\.0\.name"):
        anth.messages.create(model=MODEL, max_tokens=200, messages=ask, tools=[{"type": "web_search_20250305", "name": "search"}])
