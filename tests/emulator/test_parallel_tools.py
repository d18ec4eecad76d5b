"""Parallel tool calls (emulator/parallel.py): a user message that says "in parallel" and names two or more
tools gets one call of each, in each provider's wire format, streamed and not; a request that disables
parallel calls gets one."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai
import orjson

from emulator.testing import RunningEmulator

from .helpers import ANTHROPIC_HEADERS, OPENAI_HEADERS, sse_events

ASK = "Look up the weather and the time in Paris, in parallel: call get_weather and get_time."
_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CLAUDE_TOOLS: list[Any] = [{"name": n, "description": n, "input_schema": _SCHEMA}
                           for n in ("get_weather", "get_time", "get_news")]
CHAT_TOOLS: list[Any] = [{"type": "function", "function": {"name": n, "description": n, "parameters": _SCHEMA}}
                         for n in ("get_weather", "get_time", "get_news")]


def test_claude_answers_one_tool_use_block_per_named_tool(anth: anthropic.Anthropic) -> None:
    msg = anth.messages.create(model="claude-sonnet-4-6", max_tokens=200, tools=CLAUDE_TOOLS,
                               messages=[{"role": "user", "content": ASK}])
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert [b.name for b in uses] == ["get_weather", "get_time"]
    assert len({b.id for b in uses}) == 2 and msg.stop_reason == "tool_use"
    assert all(b.input == {"city": "example_city"} for b in uses)  # the schema's minimal instance
    with anth.messages.stream(model="claude-sonnet-4-6", max_tokens=200, tools=CLAUDE_TOOLS,
                              messages=[{"role": "user", "content": ASK}]) as s:
        final = s.get_final_message()
    assert [(b.type, getattr(b, "name", None), getattr(b, "input", None)) for b in final.content] == \
        [(b.type, getattr(b, "name", None), getattr(b, "input", None)) for b in msg.content]
    assert final.usage.output_tokens == msg.usage.output_tokens


def test_claude_streams_one_block_at_a_time(emu: RunningEmulator) -> None:
    body = {"model": "claude-sonnet-4-6", "max_tokens": 200, "tools": CLAUDE_TOOLS, "stream": True,
            "messages": [{"role": "user", "content": ASK}]}
    r = httpx.post(emu.url + "/v1/messages", headers=ANTHROPIC_HEADERS, content=orjson.dumps(body))
    events = [orjson.loads(d) for name, d in sse_events(r.text) if name not in ("ping",)]
    order = [(e["type"], e.get("index")) for e in events if e["type"].startswith("content_block")]
    open_block: int | None = None
    for typ, i in order:  # no block starts before the one before it stopped
        if typ == "content_block_start":
            assert open_block is None
            open_block = i
        elif typ == "content_block_delta":
            assert i == open_block
        else:
            assert i == open_block
            open_block = None
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert [(b["type"], b.get("name")) for b in starts] == [("text", None), ("tool_use", "get_weather"),
                                                            ("tool_use", "get_time")]


def test_claude_disable_parallel_tool_use_gets_one_call(anth: anthropic.Anthropic) -> None:
    msg = anth.messages.create(model="claude-sonnet-4-6", max_tokens=200, tools=CLAUDE_TOOLS,
                               tool_choice={"type": "auto", "disable_parallel_tool_use": True},
                               messages=[{"role": "user", "content": ASK}])
    assert [b.name for b in msg.content if b.type == "tool_use"] == ["get_weather"]


def test_chat_answers_tool_calls_and_streams_them_openai_style(oai: openai.OpenAI, emu: RunningEmulator) -> None:
    done = oai.chat.completions.create(model="gpt-4.1", tools=CHAT_TOOLS, messages=[{"role": "user", "content": ASK}])
    calls = done.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls if c.type == "function"] == ["get_weather", "get_time"]
    assert done.choices[0].finish_reason == "tool_calls" and len({c.id for c in calls}) == 2
    body = {"model": "gpt-4.1", "tools": CHAT_TOOLS, "stream": True, "messages": [{"role": "user", "content": ASK}]}
    r = httpx.post(emu.openai_url + "/chat/completions", headers=OPENAI_HEADERS, content=orjson.dumps(body))
    deltas = [orjson.loads(d)["choices"][0]["delta"] for _, d in sse_events(r.text) if d != "[DONE]"]
    parts = [tc for d in deltas for tc in d.get("tool_calls") or ()]
    firsts = [p for p in parts if "id" in p]
    assert [(p["index"], p["function"]["name"]) for p in firsts] == [(0, "get_weather"), (1, "get_time")]
    rest = [p for p in parts if "id" not in p]
    assert rest and all(set(p) == {"index", "function"} and set(p["function"]) == {"arguments"} for p in rest)
    assert [p["index"] for p in parts] == sorted(p["index"] for p in parts)  # one call after another
    with oai.chat.completions.stream(model="gpt-4.1", tools=CHAT_TOOLS,
                                     messages=[{"role": "user", "content": ASK}]) as s:
        final = s.get_final_completion()
    got = final.choices[0].message.tool_calls or []
    assert [(c.function.name, c.function.arguments) for c in got] == \
        [(c.function.name, c.function.arguments) for c in calls if c.type == "function"]


def test_chat_parallel_tool_calls_false_gets_one_call(oai: openai.OpenAI) -> None:
    done = oai.chat.completions.create(model="gpt-4.1", tools=CHAT_TOOLS, parallel_tool_calls=False,
                                       messages=[{"role": "user", "content": ASK}])
    assert [c.function.name for c in done.choices[0].message.tool_calls or () if c.type == "function"] == ["get_weather"]


def test_responses_answers_one_function_call_item_per_tool(oai: openai.OpenAI) -> None:
    tools: list[Any] = [{"type": "function", "name": n, "parameters": _SCHEMA, "strict": False}
                        for n in ("get_weather", "get_time", "get_news")]
    done = oai.responses.create(model="gpt-4.1", tools=tools, input=ASK)
    assert [(i.type, getattr(i, "name", None)) for i in done.output] == \
        [("function_call", "get_weather"), ("function_call", "get_time")]
    with oai.responses.stream(model="gpt-4.1", tools=tools, input=ASK) as s:
        final = s.get_final_response()
    assert [(getattr(i, "name", None), getattr(i, "arguments", None)) for i in final.output] == \
        [(getattr(i, "name", None), getattr(i, "arguments", None)) for i in done.output]
    one = oai.responses.create(model="gpt-4.1", tools=tools, input=ASK, parallel_tool_calls=False)
    assert [getattr(i, "name", None) for i in one.output] == ["get_weather"]


def test_no_parallel_turn_right_after_tool_results(oai: openai.OpenAI) -> None:
    msgs: list[Any] = [{"role": "user", "content": ASK},
                       {"role": "assistant", "content": None, "tool_calls": [
                           {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
                       {"role": "tool", "tool_call_id": "call_a", "content": "sunny"}]
    done = oai.chat.completions.create(model="gpt-4.1", tools=CHAT_TOOLS, messages=msgs)
    assert done.choices[0].message.tool_calls is None and done.choices[0].finish_reason == "stop"


def test_chat_stream_interleaves_the_calls_on_request(oai: openai.OpenAI, emu: RunningEmulator) -> None:
    ask = ASK + " Interleave them."
    body = {"model": "gpt-4.1", "tools": CHAT_TOOLS, "stream": True, "messages": [{"role": "user", "content": ask}]}
    r = httpx.post(emu.openai_url + "/chat/completions", headers=OPENAI_HEADERS, content=orjson.dumps(body))
    deltas = [orjson.loads(d)["choices"][0]["delta"] for _, d in sse_events(r.text) if d != "[DONE]"]
    order = [tc["index"] for d in deltas for tc in d.get("tool_calls") or ()]
    assert order[:4] == [0, 1, 0, 1]
    with oai.chat.completions.stream(model="gpt-4.1", tools=CHAT_TOOLS, messages=[{"role": "user", "content": ask}]) as s:
        final = s.get_final_completion()
    calls = final.choices[0].message.tool_calls or []
    assert [(c.function.name, orjson.loads(c.function.arguments)) for c in calls] == \
        [("get_weather", {"city": "example_city"}), ("get_time", {"city": "example_city"})]
