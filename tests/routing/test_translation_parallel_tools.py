"""Parallel tool calls across protocols: a turn with two tool calls, streamed and not, through the proxy with the
official clients' stream helpers on every translated path (Chat -> Claude, Responses -> Claude, Messages -> OpenAI),
the emulator (emulator/parallel.py) as the upstream. The assembled stream equals the non-stream answer and the native
one; the calls' results go back as the other side takes them; `parallel_tool_calls: false` and Claude's
`tool_choice.disable_parallel_tool_use` stand for each other."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from gateway.testing import running_proxy
from sdk.routing.translation.call_order import CallOrder
from tests.routing.conftest import policy_text, routed_proxy, sent

ROUTES = """  - match: {model: "claude-*"}
    targets: [{provider: gpt, model: gpt-4o}]
  - match: {model: "gpt-*"}
    targets: [{provider: claude, model: claude-sonnet-4-6}]"""
ASK = "Look up the weather and the time in Paris, in parallel: call get_weather and get_time."
NAMES = ["get_weather", "get_time"]
ARGS = {"city": "example_city"}  # the emulator's minimal instance of the schema
_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CLAUDE_TOOLS: list[Any] = [{"name": n, "description": n, "input_schema": _SCHEMA} for n in (*NAMES, "get_news")]
CHAT_TOOLS: list[Any] = [{"type": "function", "function": {"name": n, "description": n, "parameters": _SCHEMA}}
                         for n in (*NAMES, "get_news")]
RESPONSES_TOOLS: list[Any] = [{"type": "function", "name": n, "parameters": _SCHEMA, "strict": False}
                              for n in (*NAMES, "get_news")]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    yield from routed_proxy(tmp_path_factory.mktemp("parallel"), emulator.url, ROUTES)


@pytest.fixture
def native_oa(fresh_emulator) -> openai.OpenAI:
    return openai.OpenAI(base_url=fresh_emulator.openai_url, api_key="sk-native", max_retries=0)


@pytest.fixture
def native_an(fresh_emulator) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=fresh_emulator.url, api_key="sk-native", max_retries=0)


def _chat_calls(completion: Any) -> list[tuple[str, Any]]:
    calls = completion.choices[0].message.tool_calls or []
    assert len({c.id for c in calls}) == len(calls) and all(c.id for c in calls)
    return [(c.function.name, json.loads(c.function.arguments)) for c in calls]


def test_chat_stream_of_two_claude_calls_assembles_to_the_answer(oa, native_oa, fresh_emulator):
    """Claude's two tool_use blocks reach a Chat client as tool_calls[0] and [1], each with its own id; the openai
    stream helper's final completion equals the non-stream answer and OpenAI's own."""
    done = oa.chat.completions.create(model="gpt-x", tools=CHAT_TOOLS, messages=[{"role": "user", "content": ASK}])
    assert _chat_calls(done) == [(n, ARGS) for n in NAMES] and done.choices[0].finish_reason == "tool_calls"
    with oa.chat.completions.stream(model="gpt-x", tools=CHAT_TOOLS,
                                    messages=[{"role": "user", "content": ASK}]) as s:
        chunks = [e.chunk for e in s if e.type == "chunk"]
        final = s.get_final_completion()
    assert _chat_calls(final) == _chat_calls(done) and final.choices[0].finish_reason == "tool_calls"
    firsts = [tc for c in chunks for ch in c.choices for tc in ch.delta.tool_calls or () if tc.id]
    assert [(tc.index, tc.function and tc.function.name) for tc in firsts] == [(0, NAMES[0]), (1, NAMES[1])]
    native = native_oa.chat.completions.create(model="gpt-4o", tools=CHAT_TOOLS,
                                               messages=[{"role": "user", "content": ASK}])
    assert _chat_calls(native) == _chat_calls(done)


def test_chat_results_of_two_calls_reach_claude_in_one_user_turn(oa, fresh_emulator):
    """The two tool messages answering a parallel turn become one user turn of two tool_results, as Claude requires."""
    done = oa.chat.completions.create(model="gpt-x", tools=CHAT_TOOLS, messages=[{"role": "user", "content": ASK}])
    calls = done.choices[0].message.tool_calls or []
    msgs: list[Any] = [{"role": "user", "content": ASK}, done.choices[0].message.model_dump(exclude_none=True)]
    msgs += [{"role": "tool", "tool_call_id": c.id, "content": f"result {i}"} for i, c in enumerate(calls)]
    after = oa.chat.completions.create(model="gpt-x", tools=CHAT_TOOLS, messages=msgs)
    assert after.choices[0].finish_reason == "stop"
    turns = sent(fresh_emulator)["messages"]
    assert [b["name"] for b in turns[1]["content"] if b["type"] == "tool_use"] == NAMES
    results = [b for b in turns[2]["content"] if b["type"] == "tool_result"]
    assert [b["tool_use_id"] for b in results] == [b["id"] for b in turns[1]["content"] if b["type"] == "tool_use"]
    assert len(turns) == 3


def _responses_calls(response: Any) -> list[tuple[str, Any]]:
    calls = [i for i in response.output if i.type == "function_call"]
    assert len({c.call_id for c in calls}) == len(calls) and len({c.id for c in calls}) == len(calls)
    return [(c.name, json.loads(c.arguments)) for c in calls]


def test_responses_stream_of_two_claude_calls_assembles_to_the_answer(oa, native_oa, fresh_emulator):
    """Claude's two tool_use blocks reach a Responses client as two function_call items; the stream helper's final
    response equals the non-stream answer and OpenAI's own, and each item's argument deltas name its own item."""
    done = oa.responses.create(model="gpt-x", tools=RESPONSES_TOOLS, input=ASK)
    assert _responses_calls(done) == [(n, ARGS) for n in NAMES]
    with oa.responses.stream(model="gpt-x", tools=RESPONSES_TOOLS, input=ASK) as s:
        events = list(s)
        final = s.get_final_response()
    assert _responses_calls(final) == _responses_calls(done)
    added = {e.output_index: e.item.id for e in events if e.type == "response.output_item.added"}
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert deltas and all(added[e.output_index] == e.item_id for e in deltas)
    dones = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [json.loads(e.arguments) for e in dones] == [ARGS, ARGS]
    native = native_oa.responses.create(model="gpt-4o", tools=RESPONSES_TOOLS, input=ASK)
    assert _responses_calls(native) == _responses_calls(done)
    # the two outputs go back to Claude as one user turn of two tool_results
    calls = [i for i in final.output if i.type == "function_call"]
    back: list[Any] = [{"role": "user", "content": ASK}, *[c.model_dump(exclude_none=True) for c in calls]]
    back += [{"type": "function_call_output", "call_id": c.call_id, "output": "ok"} for c in calls]
    oa.responses.create(model="gpt-x", tools=RESPONSES_TOOLS, input=back)
    turns = sent(fresh_emulator)["messages"]
    uses = [b["id"] for b in turns[1]["content"] if b["type"] == "tool_use"]
    assert len(uses) == 2 and len(turns) == 3
    assert [b["tool_use_id"] for b in turns[2]["content"] if b["type"] == "tool_result"] == uses


def _claude_calls(message: Any) -> list[tuple[str, Any]]:
    uses = [b for b in message.content if b.type == "tool_use"]
    assert len({b.id for b in uses}) == len(uses)
    return [(b.name, b.input) for b in uses]


def test_messages_stream_of_two_openai_calls_assembles_to_the_answer(an, native_an, fresh_emulator):
    """OpenAI's tool_calls[0] and [1] reach a Messages client as two tool_use blocks, streamed one block at a time;
    the anthropic stream helper's final message equals the non-stream answer and Claude's own."""
    done = an.messages.create(model="claude-x", max_tokens=256, tools=CLAUDE_TOOLS,
                              messages=[{"role": "user", "content": ASK}])
    assert _claude_calls(done) == [(n, ARGS) for n in NAMES] and done.stop_reason == "tool_use"
    with an.messages.stream(model="claude-x", max_tokens=256, tools=CLAUDE_TOOLS,
                            messages=[{"role": "user", "content": ASK}]) as s:
        events = list(s)
        final = s.get_final_message()
    assert _claude_calls(final) == _claude_calls(done) and final.stop_reason == "tool_use"
    opened: int | None = None
    for e in events:  # one block at a time, as Claude streams
        if e.type == "content_block_start":
            assert opened is None
            opened = e.index
        elif e.type in ("content_block_delta", "content_block_stop"):
            assert e.index == opened
            opened = None if e.type == "content_block_stop" else opened
    native = native_an.messages.create(model="claude-sonnet-4-6", max_tokens=256, tools=CLAUDE_TOOLS,
                                       messages=[{"role": "user", "content": ASK}])
    assert _claude_calls(native) == _claude_calls(done)
    # the two results go back to OpenAI as two tool messages
    back: list[Any] = [{"role": "user", "content": ASK}, {"role": "assistant", "content": final.model_dump()["content"]},
                       {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id, "content": "ok"}
                                                    for b in final.content if b.type == "tool_use"]}]
    an.messages.create(model="claude-x", max_tokens=256, tools=CLAUDE_TOOLS, messages=back)
    msgs = sent(fresh_emulator)["messages"]
    ids = [c["id"] for c in msgs[1]["tool_calls"]]
    assert len(ids) == 2 and [(m["role"], m["tool_call_id"]) for m in msgs[2:]] == [("tool", i) for i in ids]


def test_parallel_tool_calls_false_reaches_claude_as_disable_parallel_tool_use(oa, fresh_emulator):
    one = oa.chat.completions.create(model="gpt-x", tools=CHAT_TOOLS, parallel_tool_calls=False,
                                     messages=[{"role": "user", "content": ASK}])
    assert sent(fresh_emulator)["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert _chat_calls(one) == [(NAMES[0], ARGS)]
    forced = oa.chat.completions.create(model="gpt-x", tools=CHAT_TOOLS, parallel_tool_calls=False,
                                        tool_choice="required", messages=[{"role": "user", "content": ASK}])
    assert sent(fresh_emulator)["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert _chat_calls(forced) == [(NAMES[0], ARGS)]
    single = oa.responses.create(model="gpt-x", tools=RESPONSES_TOOLS, input=ASK, parallel_tool_calls=False)
    assert sent(fresh_emulator)["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert _responses_calls(single) == [(NAMES[0], ARGS)] and single.parallel_tool_calls is False
    named = oa.chat.completions.create(model="gpt-x", tools=CHAT_TOOLS, parallel_tool_calls=False, messages=[
        {"role": "user", "content": ASK}], tool_choice={"type": "function", "function": {"name": NAMES[1]}})
    assert sent(fresh_emulator)["tool_choice"] == {"type": "tool", "name": NAMES[1], "disable_parallel_tool_use": True}
    assert _chat_calls(named) == [(NAMES[1], ARGS)]
    oa.chat.completions.create(model="gpt-x", tools=CHAT_TOOLS, messages=[{"role": "user", "content": ASK}])
    assert not sent(fresh_emulator).get("tool_choice", {}).get("disable_parallel_tool_use")


def test_disable_parallel_tool_use_reaches_openai_as_parallel_tool_calls_false(an, fresh_emulator):
    for choice in ({"type": "auto", "disable_parallel_tool_use": True}, {"type": "any", "disable_parallel_tool_use": True},
                   {"type": "tool", "name": NAMES[0], "disable_parallel_tool_use": True}):
        one = an.messages.create(model="claude-x", max_tokens=256, tools=CLAUDE_TOOLS, tool_choice=choice,  # type: ignore[arg-type]
                                 messages=[{"role": "user", "content": ASK}])
        assert sent(fresh_emulator)["parallel_tool_calls"] is False
        assert _claude_calls(one) == [(NAMES[0], ARGS)]
    an.messages.create(model="claude-x", max_tokens=256, tools=CLAUDE_TOOLS, messages=[{"role": "user", "content": ASK}])
    assert sent(fresh_emulator).get("parallel_tool_calls") is not False


def test_an_openai_stream_interleaving_two_calls_reaches_claude_clients_one_block_at_a_time(an, fresh_emulator):
    """An OpenAI-compatible upstream may interleave two calls' argument deltas (each keyed by its index; the emulator
    does on "interleave"). Claude streams one block at a time and clients act on a tool_use block's stop (an agent runs
    the tool then): each block's input must be whole at its stop, with no delta after it. The second call, whose deltas
    arrive while the first is unfinished, is held and sent once the first's arguments are whole JSON. On the old code the
    first block was closed when the second began, its later deltas sent after its stop: its input at the stop was `{}`."""
    ask = ASK + " Interleave them."
    with an.messages.stream(model="claude-x", max_tokens=256, tools=CLAUDE_TOOLS,
                            messages=[{"role": "user", "content": ask}]) as s:
        events = list(s)
        final = s.get_final_message()
    assert _claude_calls(final) == [(n, ARGS) for n in NAMES]
    stopped: set[int] = set()
    for e in events:
        if e.type == "content_block_delta":
            assert e.index not in stopped
        if e.type == "content_block_stop":
            stopped.add(e.index)
            assert e.content_block.type != "tool_use" or e.content_block.input == ARGS
    assert [e.index for e in events if e.type == "content_block_start"] == [0, 1]


def test_a_chat_only_upstream_interleaving_two_calls_reaches_a_responses_client_whole(tmp_path, fresh_emulator):
    """A Responses request to a Chat-only upstream (`responses: chat`: vLLM, the local engine) that interleaves two
    calls' argument deltas: each function_call item is whole at its `output_item.done` and in the final response, as
    in the non-stream answer. On the old code the first item was closed when the second call began and its later
    fragments dropped: its arguments were ''. Calls one after another (OpenAI's way) stream as before."""
    policy = policy_text(fresh_emulator.url, """  - match: {model: "*"}
    targets: [{provider: chat, model: gpt-4o}]""").replace(
        "routes:", f'  chat: {{kind: openai, base_url: "{fresh_emulator.url}/v1", api_key: "up-openai", responses: chat}}\nroutes:')
    (tmp_path / "routing.yaml").write_text(policy)
    with running_proxy([tmp_path], watch_interval_s=None) as running:
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="sk-routing", max_retries=0)
        for ask in (ASK, ASK + " Interleave them."):
            done = client.responses.create(model="gpt-4o", tools=RESPONSES_TOOLS, input=ask)
            with client.responses.stream(model="gpt-4o", tools=RESPONSES_TOOLS, input=ask) as s:
                events = list(s)
                final = s.get_final_response()
            assert _responses_calls(final) == _responses_calls(done) == [(n, ARGS) for n in NAMES]
            items = [e.item for e in events if e.type == "response.output_item.done"]
            assert [json.loads(i.arguments) for i in items if i.type == "function_call"] == [ARGS, ARGS]


def test_call_order_holds_an_interleaved_call_until_the_open_ones_arguments_are_whole():
    """CallOrder alone: the second call waits for the first's whole JSON; one never whole is let go at the end."""
    order = CallOrder()
    assert order.feed({"index": 0, "id": "a", "function": {"name": "f", "arguments": '{"x":'}}) == [
        {"index": 0, "id": "a", "function": {"name": "f", "arguments": '{"x":'}}]
    assert order.feed({"index": 1, "id": "b", "function": {"name": "g", "arguments": '{"y"'}}) == []
    assert order.feed({"index": 1, "function": {"arguments": ":2}"}}) == []
    assert order.feed({"index": 0, "function": {"arguments": "1}"}}) == [
        {"index": 0, "function": {"arguments": "1}"}}, {"index": 1, "id": "b", "function": {"name": "g", "arguments": '{"y":2}'}}]
    unfinished = CallOrder()
    unfinished.feed({"index": 0, "id": "a", "function": {"name": "f", "arguments": "{"}})
    assert unfinished.feed({"index": 1, "id": "b", "function": {"name": "g", "arguments": "{}"}}) == []
    assert unfinished.flush() == [{"index": 1, "id": "b", "function": {"name": "g", "arguments": "{}"}}]
