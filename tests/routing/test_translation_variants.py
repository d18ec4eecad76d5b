"""Cross-protocol translation of request and answer variants real clients send.

The official clients through the proxy (team key "sk-variants"), with routes that cross protocols:
`gpt-*` (a Chat Completions or Responses client) is served by an Anthropic target, `claude-*` (a
Messages client) by an OpenAI target. The team keeps the client's own cache breakpoints
(`prompt_cache.breakpoints: client`), so what reaches the emulator is what translation made of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import orjson
import pytest

from gateway.testing import running_proxy
from sdk.errors import SlipstreamError
from sdk.routing.translation.bodies import completion_o2a
from sdk.routing.translation.requests import openai_to_anthropic
from sdk.routing.translation.responses_streams import ChatToResponses
from sdk.routing.translation.streams import AnthropicToOpenAI, OpenAIToAnthropic
from tests.routing.conftest import policy_text, sent

CROSS = """  - match: {model: "claude-*"}
    targets: [{provider: gpt, model: gpt-4o}]
  - match: {model: "gpt-*"}
    targets: [{provider: claude, model: claude-sonnet-4-5}]"""
LONG = "You are the support assistant of ACME. Answer from the manual and cite the section. " * 200
EPHEMERAL = {"type": "ephemeral"}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("variants")
    (directory / "routing.yaml").write_text(policy_text(emulator.url, CROSS, "prompt_cache: {breakpoints: client}"))
    with running_proxy([directory], watch_interval_s=None) as running:
        yield running.url



def test_chat_cache_control_parts_become_anthropic_breakpoints(oa, fresh_emulator):
    """LiteLLM-style `cache_control` on Chat content parts, on a message and on a tool is where the
    client asked for a breakpoint: it reaches Claude there, and the read comes back as cached_tokens."""
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
            "cache_control": EPHEMERAL}
    messages = [{"role": "system", "content": [{"type": "text", "text": LONG, "cache_control": EPHEMERAL}]},
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "How do I reset the pump?"},
                                             {"type": "text", "text": "Section 4 please.", "cache_control": EPHEMERAL}]},
                {"role": "assistant", "content": "Hold the reset key.", "cache_control": EPHEMERAL},
                {"role": "user", "content": "And then?"}]
    answers = [oa.chat.completions.create(model="gpt-x", max_tokens=8, messages=messages, tools=[tool]) for _ in range(2)]
    body = sent(fresh_emulator)
    assert body["tools"][0]["cache_control"] == EPHEMERAL
    assert body["system"][0] == {"type": "text", "text": LONG, "cache_control": EPHEMERAL}
    assert "".join(block["text"] for block in body["system"]) == LONG + "\n\nBe brief."
    assert body["messages"][0]["content"] == [{"type": "text", "text": "How do I reset the pump?"},
                                              {"type": "text", "text": "Section 4 please.", "cache_control": EPHEMERAL}]
    assert body["messages"][1]["content"] == [{"type": "text", "text": "Hold the reset key.", "cache_control": EPHEMERAL}]
    usage = answers[1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens > 1000


EXPLICIT = {"mode": "explicit"}


def test_openai_explicit_cache_breakpoints_become_claudes(oa, fresh_emulator):
    """openai 3.x marks the end of a prefix to cache with `prompt_cache_breakpoint` on a content part (gpt-5.6's
    explicit breakpoints); it reached Claude as nothing, so the client's prefix was never cached. It is Claude's
    `cache_control` on the block made from the part, the latest that fit Claude's four beside the request's own
    markers (OpenAI writes the latest too), from a Chat client and a Responses client alike; the read comes
    back as cached_tokens, and a `ttl`, which Claude has no counterpart for, is named dropped."""
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
            "cache_control": EPHEMERAL}
    turns = [{"role": "user", "content": [{"type": "text", "text": f"Note {i}.", "prompt_cache_breakpoint": EXPLICIT}]}
             for i in range(3)]
    messages: Any = [{"role": "system", "content": [{"type": "text", "text": LONG, "prompt_cache_breakpoint": EXPLICIT}]},
                     *turns, {"role": "user", "content": [{"type": "text", "text": "Which section?",
                                                           "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "12h"}}]}]
    raw = oa.chat.completions.with_raw_response.create(model="gpt-x", max_tokens=8, messages=messages, tools=[tool])
    assert "prompt_cache_breakpoint.ttl" in raw.headers["x-slipstream-dropped-fields"].split(",")
    body = sent(fresh_emulator)
    assert body["tools"][0]["cache_control"] == EPHEMERAL
    assert body["system"] == LONG  # the earliest of five breakpoints: beyond Claude's four with the tool's
    assert [block.get("cache_control") for block in body["messages"][0]["content"]] == [None, EPHEMERAL, EPHEMERAL, EPHEMERAL]
    assert "prompt_cache_breakpoint" not in json.dumps(body)
    developer = {"role": "developer", "content": [{"type": "input_text", "text": LONG, "prompt_cache_breakpoint": EXPLICIT}]}
    answers = [oa.responses.create(model="gpt-x", max_output_tokens=8, input=[developer, {"role": "user", "content": "Hi"}])
               for _ in range(2)]
    assert sent(fresh_emulator)["system"] == [{"type": "text", "text": LONG, "cache_control": EPHEMERAL}]
    usage = answers[1].usage
    assert usage is not None and usage.input_tokens_details.cached_tokens > 1000


def test_a_messages_clients_cache_diagnostics_are_answered_unavailable_by_an_openai_target(an, fresh_emulator):
    """anthropic 2.x's `diagnostics` (why the prompt cache missed the prefix of `previous_message_id`) was a 400 for
    an OpenAI target, a field the gateway did not know. It is not sent; the answer says `cache_miss_reason:
    unavailable` (no diagnosis, the request processed normally), streamed or not, never `null`, which says no
    divergence was found; the first turn's opt-in (no id) is `null`, as Anthropic answers it."""
    ask: Any = [{"role": "user", "content": "Hi"}]
    first = an.messages.create(model="claude-x", max_tokens=16, messages=ask, diagnostics={"previous_message_id": None})
    assert first.content and first.diagnostics is None and "diagnostics" not in sent(fresh_emulator)
    second = an.messages.create(model="claude-x", max_tokens=16, messages=ask, diagnostics={"previous_message_id": first.id})
    assert second.diagnostics is not None and second.diagnostics.cache_miss_reason is not None
    assert second.diagnostics.cache_miss_reason.type == "unavailable"
    with an.messages.stream(model="claude-x", max_tokens=16, messages=ask, diagnostics={"previous_message_id": second.id}) as stream:
        streamed = stream.get_final_message()
    assert streamed.content and streamed.diagnostics is not None and streamed.diagnostics.cache_miss_reason is not None
    assert streamed.diagnostics.cache_miss_reason.type == "unavailable"


def test_blank_text_which_claude_refuses_is_left_out_of_a_chat_conversation(oa, fresh_emulator):
    """OpenAI takes empty and whitespace-only text (an empty text part beside an image or another part, a model's
    "\n\n" before its tool calls, an empty user message after tool results); Claude answers such a text block with a
    400 ('text content blocks must be non-empty', '... must contain non-whitespace text'), so every later turn of
    the conversation failed. It says nothing and is left out; a user turn of nothing but that joins the turns around
    it, and one that Claude would read as the assistant's turn to continue (the last, after the assistant's) is a 400
    naming it, before anything is sent."""
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    messages: Any = [{"role": "user", "content": [{"type": "text", "text": ""}, {"type": "text", "text": "Look it up."}]},
                     {"role": "assistant", "content": "\n\n", "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "42"}, {"role": "user", "content": " "}]
    assert oa.chat.completions.create(model="gpt-x", max_tokens=8, messages=messages, tools=[tool]).choices[0].message
    body = sent(fresh_emulator)
    assert body["messages"][0]["content"] == [{"type": "text", "text": "Look it up."}]
    assert [block["type"] for block in body["messages"][1]["content"]] == ["tool_use"]
    assert [block["type"] for block in body["messages"][2]["content"]] == ["tool_result"]
    blank_first = {"role": "user", "content": [{"type": "input_text", "text": "  "}, {"type": "input_text", "text": "Hi"}]}
    assert oa.responses.create(model="gpt-x", max_output_tokens=8, input=[blank_first]).output_text
    assert sent(fresh_emulator)["messages"][0]["content"] == [{"type": "text", "text": "Hi"}]
    before = len(fresh_emulator.state.recent)
    with pytest.raises(openai.BadRequestError, match=r"messages\.2: a user message with no content"):
        oa.chat.completions.create(model="gpt-x", max_tokens=8, messages=[
            {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": ""}])
    assert len(fresh_emulator.state.recent) == before


def test_thinking_blocks_in_messages_history_are_left_out_for_an_openai_target(an, fresh_emulator):
    """A conversation that carries Claude's thinking (and redacted thinking) in earlier assistant turns
    goes to an OpenAI target with the visible turns only, as Responses reasoning items do: another
    model cannot use them, and Anthropic itself ignores earlier turns' thinking."""
    history = [{"role": "user", "content": "What is 2+2?"},
               {"role": "assistant", "content": [{"type": "thinking", "thinking": "Add them.", "signature": "c2ln"},
                                                 {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"},
                                                 {"type": "text", "text": "4"}]},
               {"role": "user", "content": "And 3+3?"}]
    message = an.messages.create(model="claude-x", max_tokens=16, messages=history)
    assert message.content[0].type == "text"
    assert sent(fresh_emulator)["messages"][1] == {"role": "assistant", "content": "4"}


REFUSED = "I can't help with that."


def test_an_openai_refusal_reaches_an_anthropic_client():
    """OpenAI puts a refusal in `message.refusal` (content null); an Anthropic client gets its text and
    stop_reason `refusal`, in a body and in a stream, instead of an empty answer that ended normally."""
    body = orjson.dumps({"id": "c1", "model": "gpt-4o", "choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": None, "refusal": REFUSED}}], "usage": {"prompt_tokens": 5, "completion_tokens": 6}})
    message = orjson.loads(completion_o2a(body))
    assert message["content"] == [{"type": "text", "text": REFUSED}] and message["stop_reason"] == "refusal"
    translator = OpenAIToAnthropic()
    chunks = [{"id": "c1", "model": "gpt-4o", "choices": [{"index": 0, "delta": {"role": "assistant", "content": None, "refusal": ""}}]},
              {"id": "c1", "model": "gpt-4o", "choices": [{"index": 0, "delta": {"refusal": "I can't "}}]},
              {"id": "c1", "model": "gpt-4o", "choices": [{"index": 0, "delta": {"refusal": "help with that."}}]},
              {"id": "c1", "model": "gpt-4o", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
    events = [event for chunk in chunks for event in translator.feed(b"data: " + orjson.dumps(chunk) + b"\n\n")]
    events += translator.feed(b"data: [DONE]\n\n")
    payloads = [orjson.loads(event.split(b"data: ", 1)[1]) for event in events]
    text = "".join(p["delta"]["text"] for p in payloads if p["type"] == "content_block_delta")
    assert text == REFUSED
    assert [p["delta"]["stop_reason"] for p in payloads if p["type"] == "message_delta"] == ["refusal"]


def test_a_stop_string_named_by_a_vllm_style_server_is_an_anthropic_stop_sequence():
    """vLLM and the bundled engine name the stop string that ended a choice in `stop_reason`; an
    Anthropic client gets stop_reason `stop_sequence` and the string, in a body and in a stream. A
    token id there, or none, is a natural end (`end_turn`)."""
    def body(stop: object) -> bytes:
        return orjson.dumps({"id": "c1", "model": "m", "choices": [{"index": 0, "finish_reason": "stop", "stop_reason": stop,
                             "message": {"role": "assistant", "content": "The capital is "}}], "usage": {"prompt_tokens": 5, "completion_tokens": 4}})
    message = orjson.loads(completion_o2a(body("Paris")))
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "Paris")
    for natural in (None, 2):
        message = orjson.loads(completion_o2a(body(natural)))
        assert (message["stop_reason"], message["stop_sequence"]) == ("end_turn", None)
    translator = OpenAIToAnthropic()
    chunks = [{"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "The capital is "}}]},
              {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "stop", "stop_reason": "Paris"}]}]
    events = [event for chunk in chunks for event in translator.feed(b"data: " + orjson.dumps(chunk) + b"\n\n")]
    events += translator.feed(b"data: [DONE]\n\n")
    payloads = [orjson.loads(event.split(b"data: ", 1)[1]) for event in events]
    assert [p["delta"] for p in payloads if p["type"] == "message_delta"] == [{"stop_reason": "stop_sequence", "stop_sequence": "Paris"}]


def test_a_streamed_refusal_reaches_a_responses_client():
    """A Chat upstream's streamed refusal (`delta.refusal`) is a Responses message with a refusal part,
    streamed with OpenAI's refusal events, as the unstreamed answer already is."""
    translator = ChatToResponses({"model": "gpt-4o", "input": "hi", "stream": True}, "resp_1")
    chunks = [{"id": "c1", "model": "gpt-4o", "choices": [{"index": 0, "delta": {"role": "assistant", "content": None, "refusal": ""}}]},
              {"id": "c1", "model": "gpt-4o", "choices": [{"index": 0, "delta": {"refusal": "I can't "}}]},
              {"id": "c1", "model": "gpt-4o", "choices": [{"index": 0, "delta": {"refusal": "help with that."}}]},
              {"id": "c1", "model": "gpt-4o", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
              {"id": "c1", "model": "gpt-4o", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}}]
    events = [event for chunk in chunks for event in translator.feed(b"data: " + orjson.dumps(chunk) + b"\n\n")]
    events += translator.feed(b"data: [DONE]\n\n")
    payloads = [orjson.loads(event.split(b"data: ", 1)[1]) for event in events]
    assert [p["type"] for p in payloads] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.refusal.delta", "response.refusal.delta", "response.refusal.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    assert payloads[3]["part"] == {"type": "refusal", "refusal": ""}
    assert payloads[6]["refusal"] == REFUSED
    assert payloads[-1]["response"]["output"][0]["content"] == [{"type": "refusal", "refusal": REFUSED}]


def test_null_fields_are_not_sent_and_not_refused(oa, fresh_emulator):
    """The official client sends a parameter given as None as JSON null, which OpenAI reads as absent:
    it is neither refused nor sent on as a null Claude would have to accept."""
    answer = oa.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                        reasoning_effort=None, stop=None, temperature=None, top_p=None, seed=None,
                                        tool_choice=None, parallel_tool_calls=None, user=None)
    assert answer.choices[0].message.content
    body = sent(fresh_emulator)
    assert None not in body.values() and set(body) == {"model", "max_tokens", "messages"}


PDF = "JVBERi0xLjQKJcOkw7zDtsOfCjEgMCBvYmoKPDwvVHlwZS9DYXRhbG9nPj4KZW5kb2JqCnRyYWlsZXIKPDwvUm9vdCAxIDAgUj4+CiUlRU9G"


def test_pdf_documents_cross_protocols_both_ways(oa, an, fresh_emulator):
    """A PDF given inline is a Chat `file` part, a Responses `input_file` and an Anthropic `document`
    block: each reaches a target of the other protocol as its own kind, not a 400."""
    question = {"type": "text", "text": "Summarize the attached file."}
    oa.chat.completions.create(model="gpt-x", max_tokens=8, messages=[{"role": "user", "content": [
        {"type": "file", "file": {"filename": "manual.pdf", "file_data": f"data:application/pdf;base64,{PDF}"}}, question]}])
    document = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF}}
    assert sent(fresh_emulator)["messages"][0]["content"] == [document, question]
    oa.responses.create(model="gpt-x", max_output_tokens=8, input=[{"role": "user", "content": [
        {"type": "input_file", "filename": "manual.pdf", "file_data": f"data:application/pdf;base64,{PDF}"},
        {"type": "input_text", "text": question["text"]}]}])
    assert sent(fresh_emulator)["messages"][0]["content"] == [document, question]
    an.messages.create(model="claude-x", max_tokens=8, messages=[{"role": "user", "content": [
        {**document, "title": "manual.pdf"}, question]}])
    assert sent(fresh_emulator)["messages"][0]["content"] == [
        {"type": "file", "file": {"filename": "manual.pdf", "file_data": f"data:application/pdf;base64,{PDF}"}}, question]
    an.messages.create(model="claude-x", max_tokens=8, messages=[{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "Pump manual, section 4."}}, question]}])
    assert sent(fresh_emulator)["messages"][0]["content"] == [{"type": "text", "text": "Pump manual, section 4."}, question]
    # A custom-content document (the client's own chunks) was refused: its text blocks' text, in order.
    chunks = [{"type": "text", "text": "Section 4: pressure."}, {"type": "text", "text": "Section 5: flow."}]
    an.messages.create(model="claude-x", max_tokens=8, messages=[{"role": "user", "content": [
        {"type": "document", "source": {"type": "content", "content": chunks}, "title": "Pump manual"}, question]}])
    assert sent(fresh_emulator)["messages"][0]["content"] == [  # under its title, which Claude is given too
        {"type": "text", "text": "Pump manual\n\nSection 4: pressure.\n\nSection 5: flow."}, question]


def test_a_tool_choice_without_tools_is_not_sent_to_an_openai_target(an, fresh_emulator):
    """Claude takes `tool_choice: auto` (or `none`) with no tools; OpenAI refuses a tool_choice without
    tools, so the translation leaves it out (it chooses among nothing)."""
    for kind in ("auto", "none"):
        message = an.messages.create(model="claude-x", max_tokens=8, tool_choice={"type": kind},
                                     messages=[{"role": "user", "content": "hi"}])
        assert message.content[0].type == "text"
        assert "tool_choice" not in sent(fresh_emulator)


def test_upstream_errors_reach_the_client_in_its_shape_with_status_and_retry_after(oa, an, fresh_emulator):
    """Claude's 529 overloaded reaches a Chat client as a 5xx in OpenAI's shape (its client retries it),
    and a 429's retry-after reaches either client with the error in its own shape."""
    fresh_emulator.inject_fault("529", count=20)
    with pytest.raises(openai.InternalServerError) as overloaded:
        oa.chat.completions.create(model="gpt-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert overloaded.value.body == {"message": "Overloaded", "type": "server_error", "param": None, "code": None}
    for client, error in ((oa, openai.RateLimitError), (an, anthropic.RateLimitError)):
        fresh_emulator.reset()
        fresh_emulator.inject_fault("429:retry_after=30", count=20)
        with pytest.raises(error) as limited:
            if client is oa:
                oa.chat.completions.create(model="gpt-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
            else:
                an.messages.create(model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert limited.value.response.headers["retry-after"] == "30"
        body = limited.value.body
        assert (body["type"] if client is oa else body["error"]["type"]) == "rate_limit_error"


PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8/5+hHgAHggJ/PchI7wAAAABJRU5ErkJggg=="


def test_a_tool_result_with_an_image_reaches_an_openai_target(an, fresh_emulator):
    """A coding agent's tool result can hold a screenshot; Chat's tool messages hold text only, so the
    text stays in the tool message and the image follows in a user message, instead of a 400."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    history = [{"role": "user", "content": "Take a screenshot."},
               {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                             "content": [{"type": "text", "text": "Captured."}, image]},
                                            {"type": "text", "text": "What do you see?"}]}]
    tool = {"name": "screenshot", "input_schema": {"type": "object", "properties": {}}}
    an.messages.create(model="claude-x", max_tokens=8, tools=[tool], messages=history)
    messages = sent(fresh_emulator)["messages"]
    assert messages[2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "Captured."}
    assert messages[3] == {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}, {"type": "text", "text": "What do you see?"}]}


def test_nested_fields_a_target_has_no_use_for_are_named_when_dropped(oa, an, fresh_emulator):
    """Chat's participant `name` (Claude has none) and Claude's block-level `cache_control` (an OpenAI
    target caches by prefix, with prompt_cache_key) are left out and named, as top-level fields are."""
    raw = oa.chat.completions.with_raw_response.create(model="gpt-x", max_tokens=8, messages=[
        {"role": "user", "name": "alice", "content": "hi"}])
    assert raw.headers["x-slipstream-dropped-fields"] == "messages.name"
    assert "name" not in sent(fresh_emulator)["messages"][0]
    raw_an = an.messages.with_raw_response.create(model="claude-x", max_tokens=8, system=[
        {"type": "text", "text": LONG, "cache_control": EPHEMERAL}], messages=[{"role": "user", "content": "hi"}])
    assert raw_an.headers["x-slipstream-dropped-fields"] == "cache_control"
    assert "cache_control" not in json.dumps(sent(fresh_emulator))


def test_a_chat_tool_choice_claude_cannot_follow_is_refused_by_name(oa, fresh_emulator):
    """Chat's `custom` choice naming no custom tool of the request (custom tools reach Claude as tools of one string:
    test_translation_agents) has no Claude counterpart: a 400 naming it before anything is sent, not a named choice
    with no name that Claude refuses.
    (An `allowed_tools` choice is Claude's auto or any over only those tools: test_translation_edges.)"""
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]
    choice = {"type": "custom", "custom": {"name": "lookup"}}
    with pytest.raises(openai.BadRequestError) as refused:
        oa.chat.completions.create(model="gpt-x", max_tokens=8, tools=tools, tool_choice=choice,  # type: ignore[arg-type]
                                   messages=[{"role": "user", "content": "hi"}])
    assert "tool_choice 'custom' cannot be translated for an Anthropic target" in refused.value.message
    assert fresh_emulator.stats()["requests_total"] == 0


def test_a_function_call_output_with_an_image_reaches_claude_in_its_tool_result(oa, fresh_emulator):
    """A Responses function_call_output may hold images (an MCP tool's screenshot, Codex's view_image): Claude takes a
    tool's images in its tool_result, where they reach it, after the text as the output has them. They followed the
    tool_result in the user turn, as an image the user sent rather than the tool's (a Chat model's tool messages hold
    text: there they still follow, test_a_function_call_outputs_image_follows_it_for_a_chat_model)."""
    tool = {"type": "function", "name": "screenshot", "parameters": {"type": "object", "properties": {}}}
    oa.responses.create(model="gpt-x", max_output_tokens=8, tools=[tool], input=[  # type: ignore[arg-type,list-item]
        {"role": "user", "content": "Take a screenshot."},
        {"type": "function_call", "call_id": "call_1", "name": "screenshot", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": [
            {"type": "input_text", "text": "Captured."}, {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"}]}])
    messages = sent(fresh_emulator)["messages"]
    assert messages[2] == {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": [
        {"type": "text", "text": "Captured."},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]}]}


def test_a_function_call_outputs_image_follows_it_for_a_chat_model(tmp_path, fresh_emulator):
    """A Chat-only upstream (`responses: chat`): OpenAI's Chat tool messages hold text, so the output's text is the
    tool message and its image follows in a user message, as before."""
    policy = policy_text(fresh_emulator.url, """  - match: {model: "*"}
    targets: [{provider: chat, model: gpt-4o}]""").replace(
        "routes:", f'  chat: {{kind: openai, base_url: "{fresh_emulator.url}/v1", api_key: "up-openai", responses: chat}}\nroutes:')
    (tmp_path / "routing.yaml").write_text(policy)
    tool = {"type": "function", "name": "screenshot", "parameters": {"type": "object", "properties": {}}}
    with running_proxy([tmp_path], watch_interval_s=None) as running:
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="sk-routing", max_retries=0)
        client.responses.create(model="gpt-4o", max_output_tokens=8, tools=[tool], input=[  # type: ignore[arg-type,list-item]
            {"role": "user", "content": "Take a screenshot."},
            {"type": "function_call", "call_id": "call_1", "name": "screenshot", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": [
                {"type": "input_text", "text": "Captured."}, {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"}]}])
    assert fresh_emulator.state.recent[-1]["path"].endswith("/chat/completions")
    messages = sent(fresh_emulator)["messages"]
    assert messages[2:] == [{"role": "tool", "tool_call_id": "call_1", "content": "Captured."},
                            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]}]


def test_tool_arguments_that_are_not_json_are_a_clear_502_not_an_internal_error():
    """An OpenAI-compatible upstream (a small local model, an answer cut at max_tokens) can return tool
    arguments that are not JSON; Claude's tool_use input must be an object, so the answer is the
    upstream's fault, said as such (502), not a gateway crash (500)."""
    body = orjson.dumps({"id": "c1", "model": "gpt-4o", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                                                              "function": {"name": "lookup", "arguments": '{"city": "Os'}}]}}]})
    with pytest.raises(SlipstreamError, match="arguments of tool call 'call_1' are not JSON") as failed:
        completion_o2a(body)
    assert failed.value.status == 502


def test_a_streamed_tool_call_without_input_has_arguments_of_an_empty_object():
    """Claude may stream a tool_use with no input deltas (a tool without parameters); OpenAI's arguments
    are then `{}`, which clients parse, never the empty string."""
    translator = AnthropicToOpenAI(include_usage=False)

    def event(payload: dict[str, Any]) -> bytes:
        return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    events = [{"type": "message_start", "message": {"id": "msg_1", "model": "claude", "usage": {"input_tokens": 5, "output_tokens": 1}}},
              {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}},
              {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": ""}},
              {"type": "content_block_stop", "index": 0},
              {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 3}},
              {"type": "message_stop"}]
    chunks = [orjson.loads(out[6:]) for payload in events for out in translator.feed(event(payload)) if out != b"data: [DONE]\n\n"]
    arguments = "".join(call["function"].get("arguments") or "" for chunk in chunks for call in chunk["choices"][0]["delta"].get("tool_calls") or ())
    assert arguments == "{}"


def test_an_echoed_assistant_refusal_stays_in_the_history_for_claude(oa, fresh_emulator):
    """`messages.append(completion.choices[0].message)` echoes a refusal as `refusal` (content null),
    or as a `refusal` content part: it is the assistant's turn, sent as its text, not an empty turn."""
    for assistant in ({"role": "assistant", "content": None, "refusal": REFUSED},
                      {"role": "assistant", "content": [{"type": "refusal", "refusal": REFUSED}]}):
        oa.chat.completions.create(model="gpt-x", max_tokens=8, messages=[  # type: ignore[list-item]
            {"role": "user", "content": "hi"}, assistant, {"role": "user", "content": "Why not?"}])
        assert sent(fresh_emulator)["messages"][1] == {"role": "assistant", "content": [{"type": "text", "text": REFUSED}]}


def test_a_jpg_data_url_is_sent_to_claude_as_image_jpeg():
    """`data:image/jpg;...` (a data URL built from a file's extension) is a JPEG to OpenAI; Claude takes
    only `image/jpeg`."""
    body = openai_to_anthropic({"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/jpg;base64,/9j/4AAQ"}}]}]})
    assert body["messages"][0]["content"][0]["source"] == {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ"}


def test_default_sampling_values_do_not_make_claude_refuse_the_request(oa, fresh_emulator):
    """Claude 4.1 and later refuse `temperature` and `top_p` together; `temperature=1, top_p=1` (the
    OpenAI playground's snippet) only restates both protocols' defaults, so neither is sent, both are named."""
    raw = oa.chat.completions.with_raw_response.create(model="gpt-x", max_tokens=8, temperature=1, top_p=1,
                                                       messages=[{"role": "user", "content": "hi"}])
    assert raw.parse().choices[0].message.content
    assert raw.headers["x-slipstream-dropped-fields"] == "temperature,top_p"
    body = sent(fresh_emulator)
    assert "temperature" not in body and "top_p" not in body


def test_a_temperature_and_a_top_p_reach_a_claude_model_that_takes_one_as_the_temperature(oa, fresh_emulator):
    """OpenAI takes temperature and top_p together; Claude Opus 4.1 and later take one of the two (both: Anthropic's 400
    'cannot both be specified', which every such Chat or Responses request got). Both providers advise altering one:
    the temperature goes, the top_p is left out and named; a top_p alone still goes."""
    hi: Any = [{"role": "user", "content": "hi"}]
    raw = oa.chat.completions.with_raw_response.create(model="gpt-x", max_tokens=8, temperature=0.5, top_p=0.9, messages=hi)
    assert raw.parse().choices[0].message.content and raw.headers["x-slipstream-dropped-fields"] == "top_p"
    body = sent(fresh_emulator)
    assert body["temperature"] == 0.5 and "top_p" not in body
    raw_response = oa.responses.with_raw_response.create(model="gpt-x", input="hi", temperature=0.2, top_p=0.8)
    assert raw_response.parse().output_text and "top_p" in raw_response.headers["x-slipstream-dropped-fields"].split(",")
    assert sent(fresh_emulator)["temperature"] == 0.2 and "top_p" not in sent(fresh_emulator)
    oa.chat.completions.create(model="gpt-x", max_tokens=8, top_p=0.9, messages=hi)
    assert sent(fresh_emulator)["top_p"] == 0.9


def test_a_chat_request_without_a_limit_gets_a_limit_the_claude_model_takes():
    """Chat may leave the output limit out; Claude needs one, and Claude 3 models take at most 4096
    (more is Anthropic's 400), later ones 8192 and more."""
    hi = [{"role": "user", "content": "hi"}]
    assert openai_to_anthropic({"model": "claude-3-haiku-20240307", "messages": hi})["max_tokens"] == 4096
    assert openai_to_anthropic({"model": "claude-3-opus-latest", "messages": hi})["max_tokens"] == 4096
    assert openai_to_anthropic({"model": "claude-3-5-haiku-latest", "messages": hi})["max_tokens"] == 8192
    assert openai_to_anthropic({"model": "claude-sonnet-4-5", "messages": hi})["max_tokens"] == 8192


def test_a_system_message_later_in_the_conversation_keeps_its_place_both_ways(oa, an, fresh_emulator):
    """A Chat client's system/developer message after the first turn reaches Claude in its place (it
    was a 400): Sonnet 4.5 takes no mid-conversation system message, so it is a system reminder in the
    user turn (test_translation_models: a model that takes one); a Messages client's `role: "system"`
    message (Claude Code sends them) reaches an OpenAI target as a system message there."""
    oa.chat.completions.create(model="gpt-x", max_tokens=8, messages=[
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."}, {"role": "developer", "content": "Answer in French from now on."},
        {"role": "user", "content": "How are you?"}])
    body = sent(fresh_emulator)
    assert body["system"] == "You are terse."
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][2]["content"][0] == {"type": "text", "text": "<system-reminder>\nAnswer in French from now on.\n</system-reminder>"}
    an.messages.create(model="claude-x", max_tokens=8, system="You are terse.", messages=[
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
        {"role": "system", "content": [{"type": "text", "text": "Answer in French from now on."}]},  # type: ignore[misc, list-item]
        {"role": "user", "content": "How are you?"}])
    chat = sent(fresh_emulator)["messages"]
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "system", "user"]
    assert chat[3]["content"] in ("Answer in French from now on.", [{"type": "text", "text": "Answer in French from now on."}])
