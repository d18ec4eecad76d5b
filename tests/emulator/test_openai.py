"""OpenAI Chat Completions wire format (reference C.3-C.7) and automatic caching (C.1)."""

from __future__ import annotations

import json

import openai
import pytest

from emulator.caching import openai_prompt_blob
from emulator.text import count_tokens

from .helpers import HTTP, OPENAI_HEADERS, post, sse_events, text_of

MODEL = "gpt-5-mini"
MSGS = [{"role": "user", "content": "Hello there"}]
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_non_streaming_shape(oai):
    raw = oai.chat.completions.with_raw_response.create(model=MODEL, messages=MSGS)
    assert raw.headers["x-request-id"]
    assert raw.headers["x-ratelimit-remaining-requests"] and raw.headers["x-ratelimit-reset-tokens"]
    r = raw.parse()
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == MODEL
    c = r.choices[0]
    assert c.finish_reason == "stop" and c.message.role == "assistant"
    assert r.usage.completion_tokens == 48 == count_tokens(c.message.content)
    assert r.usage.prompt_tokens == len(openai_prompt_blob({"messages": MSGS})) // 4
    assert r.usage.total_tokens == r.usage.prompt_tokens + 48
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_length_and_stop(oai):
    r = oai.chat.completions.create(model=MODEL, messages=MSGS, max_completion_tokens=6)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 6
    full = oai.chat.completions.create(model="gpt-4o-mini", messages=MSGS).choices[0].message.content
    word = full.split()[2]
    s = oai.chat.completions.create(model="gpt-4o-mini", messages=MSGS, stop=[word])
    assert s.choices[0].finish_reason == "stop"
    assert s.choices[0].message.content == full[: full.index(word)]


def test_streaming_golden_sequence_with_usage(emu):
    body = {"model": MODEL, "messages": MSGS, "stream": True, "max_tokens": 12,
            "stream_options": {"include_usage": True}}
    r = post(emu.url, "/v1/chat/completions", body, OPENAI_HEADERS)
    assert r.headers["content-type"].startswith("text/event-stream")
    evs = sse_events(r.text)
    assert all(name is None for name, _ in evs)
    assert evs[-1][1] == "[DONE]"
    chunks = [json.loads(d) for _, d in evs[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = list(chunks[1:-2])
    assert len(content) == 3 and all("content" in c["choices"][0]["delta"] for c in content)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert all(c["usage"] is None for c in chunks[:-1])
    last = chunks[-1]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 12
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_streaming_without_usage_has_no_usage_chunk(oai):
    chunks = list(oai.chat.completions.create(model=MODEL, messages=MSGS, stream=True))
    assert all(c.choices for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert count_tokens(text) == 48


def test_tool_calls(oai):
    r = oai.chat.completions.create(model=MODEL, messages=MSGS, tools=[TOOL], tool_choice="required")
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    tc = c.message.tool_calls[0]
    assert tc.function.name == "get_weather" and json.loads(tc.function.arguments) == {"city": "example_city"}
    auto = oai.chat.completions.create(model=MODEL, tools=[TOOL],
                                       messages=[{"role": "user", "content": "use get_weather for Oslo"}])
    assert auto.choices[0].finish_reason == "tool_calls"
    plain = oai.chat.completions.create(model=MODEL, messages=MSGS, tools=[TOOL])
    assert plain.choices[0].finish_reason == "stop"
    named = {"type": "function", "function": {"name": "get_weather"}}
    stream = oai.chat.completions.create(model=MODEL, messages=MSGS, tools=[TOOL], stream=True,
                                         tool_choice=named)
    chunks = list(stream)
    first = chunks[0].choices[0].delta.tool_calls[0]
    assert first.id.startswith("call_") and first.function.name == "get_weather"
    args = "".join(c.choices[0].delta.tool_calls[0].function.arguments
                   for c in chunks if c.choices[0].delta.tool_calls)
    assert json.loads(args) == {"city": "example_city"}
    assert chunks[-1].choices[0].finish_reason == "stop"  # a named function's call ends `stop`, as OpenAI's do


def test_models_list(oai):
    ids = [m.id for m in oai.models.list()]
    assert "gpt-5-mini" in ids and "gpt-4o" in ids


def test_errors(emu, oai):
    r = post(emu.url, "/v1/chat/completions", {"model": MODEL, "messages": MSGS}, {})
    assert r.status_code == 401 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    with pytest.raises(openai.BadRequestError) as ei:
        oai.chat.completions.create(model=MODEL, messages=MSGS, temperature=3)
    assert ei.value.code == "decimal_above_max_value" and ei.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as ei:
        oai.chat.completions.create(model=MODEL, messages=[])
    assert ei.value.code == "empty_array"
    with pytest.raises(openai.BadRequestError) as ei:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "robot", "content": "x"}])
    assert ei.value.param == "messages[0].role"
    long_name = {"type": "function", "function": {"name": "f" * 65, "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(openai.BadRequestError) as ei:  # OpenAI's function names: at most 64 characters
        oai.chat.completions.create(model=MODEL, messages=MSGS, tools=[long_name])  # type: ignore[list-item]
    assert ei.value.code == "string_above_max_length" and ei.value.param == "tools[0].function.name"
    for opts in ([1], "x", 3):  # a malformed body is a provider-shaped 400, never a 500
        r = post(emu.url, "/v1/chat/completions", {"model": MODEL, "messages": MSGS, "stream": True,
                                                   "stream_options": opts}, OPENAI_HEADERS)
        assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options"
    bad = HTTP.post(emu.openai_url + "/chat/completions", content=b"{oops", headers=OPENAI_HEADERS)
    assert bad.status_code == 400 and "could not parse the JSON body" in bad.json()["error"]["message"]


def _long_prompt(tokens: int, seed: int = 1) -> list[dict]:
    return [{"role": "system", "content": text_of(tokens, seed)}]


def test_cache_1024_and_128_rule(oai):
    short = _long_prompt(900) + MSGS
    oai.chat.completions.create(model=MODEL, messages=short)
    again = oai.chat.completions.create(model=MODEL, messages=short)
    assert again.usage.prompt_tokens < 1024 and again.usage.prompt_tokens_details.cached_tokens == 0

    long = _long_prompt(1500) + MSGS
    first = oai.chat.completions.create(model=MODEL, messages=long)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    p = first.usage.prompt_tokens
    second = oai.chat.completions.create(model=MODEL, messages=long)
    assert second.usage.prompt_tokens == p  # prompt_tokens includes cached tokens
    assert second.usage.prompt_tokens_details.cached_tokens == (p // 128) * 128 >= 1024

    grown = long + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": text_of(300, 9)}]
    third = oai.chat.completions.create(model=MODEL, messages=grown)
    assert third.usage.prompt_tokens_details.cached_tokens == (p // 128) * 128


def test_cache_scoped_by_prompt_cache_key_and_key(oai, emu):
    long = _long_prompt(1300, 2) + MSGS
    oai.chat.completions.create(model=MODEL, messages=long, prompt_cache_key="a")
    b = oai.chat.completions.create(model=MODEL, messages=long, prompt_cache_key="b")
    assert b.usage.prompt_tokens_details.cached_tokens == 0
    a = oai.chat.completions.create(model=MODEL, messages=long, prompt_cache_key="a")
    assert a.usage.prompt_tokens_details.cached_tokens >= 1024
    with openai.OpenAI(base_url=emu.openai_url, api_key="another", max_retries=0) as other:
        o = other.chat.completions.create(model=MODEL, messages=long, prompt_cache_key="a")
    assert o.usage.prompt_tokens_details.cached_tokens == 0


def test_streaming_usage_reports_cache(oai):
    long = _long_prompt(1200, 3) + MSGS
    oai.chat.completions.create(model=MODEL, messages=long)
    chunks = list(oai.chat.completions.create(model=MODEL, messages=long, stream=True,
                                              stream_options={"include_usage": True}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 1152


def test_reasoning_models_take_sampling_only_at_effort_none(oai):
    """gpt-5, the o-series and gpt-5.1+ reasoning at any effort refuse temperature and top_p other than 1;
    gpt-5.1 to 5.5 take them at reasoning effort none, their default (OpenAI's GPT-5.1/5.2 guides)."""
    for model, effort in (("gpt-5", None), ("o3", None), ("gpt-5.1", "low"), ("gpt-5.1-codex", None)):
        with pytest.raises(openai.BadRequestError) as ei:
            oai.chat.completions.create(model=model, messages=MSGS, temperature=0.2, reasoning_effort=effort)  # type: ignore[arg-type]
        assert ei.value.code == "unsupported_value" and ei.value.param == "temperature"
    for model, effort in (("gpt-5.1", None), ("gpt-5.2", "none"), ("gpt-5.4-mini", None)):
        assert oai.chat.completions.create(model=model, messages=MSGS, temperature=0.2, top_p=0.5,
                                           reasoning_effort=effort).choices  # type: ignore[arg-type]


def test_a_reasoning_effort_is_billed_as_reasoning_tokens(oai):
    """A reasoning model asked for an effort reports its hidden reasoning in completion_tokens_details, within
    completion_tokens (as the Responses endpoint does); a model that does not reason, or no effort, reports none."""
    plain = oai.chat.completions.create(model="o3", messages=MSGS)
    low = oai.chat.completions.create(model="o3", messages=MSGS, reasoning_effort="low")
    assert plain.usage.completion_tokens_details.reasoning_tokens == 0
    assert low.usage.completion_tokens_details.reasoning_tokens == 8
    assert low.usage.completion_tokens == plain.usage.completion_tokens + 8
    chunks = list(oai.chat.completions.create(model="o3", messages=MSGS, reasoning_effort="high", stream=True,
                                              stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 32
    assert oai.chat.completions.create(model="gpt-4o", messages=MSGS, reasoning_effort="low").usage.completion_tokens_details.reasoning_tokens == 0


def test_a_reasoning_model_refuses_the_stop_parameter_even_empty(oai):
    with pytest.raises(openai.BadRequestError) as ei:
        oai.chat.completions.create(model="o3", messages=MSGS, stop=[])
    assert ei.value.code == "unsupported_parameter" and ei.value.param == "stop"
    assert oai.chat.completions.create(model="gpt-4o", messages=MSGS, stop=[]).choices
