"""The Responses ↔ Chat translation on its own: request fields, the stream's event order, usage."""

from __future__ import annotations

import orjson
import pytest

from sdk.routing.backoff import TranslationRefused
from sdk.routing.translation.requests import openai_to_anthropic
from sdk.routing.translation.responses_answers import completion_c2r
from sdk.routing.translation.responses_requests import responses_to_chat
from sdk.routing.translation.responses_streams import ChatToResponses

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"], "additionalProperties": False}


def test_request_fields_map_to_chat():
    chat = responses_to_chat({
        "model": "o4-mini", "instructions": "Be brief.", "max_output_tokens": 50, "stream": True, "store": True,
        "reasoning": {"effort": "low"}, "parallel_tool_calls": False, "prompt_cache_key": "k",
        "text": {"format": {"type": "json_schema", "name": "fjord", "schema": SCHEMA, "strict": True}},
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": True}],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city":"Bergen"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "12C"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "9C"}]},
        ],
    })
    assert chat["max_completion_tokens"] == 50 and chat["stream_options"] == {"include_usage": True}
    assert chat["reasoning_effort"] == "low" and chat["parallel_tool_calls"] is False and chat["prompt_cache_key"] == "k"
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "fjord", "schema": SCHEMA, "strict": True}}
    assert chat["tools"] == [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}, "strict": True}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool"]  # reasoning dropped, both calls on one turn
    assert [c["id"] for c in chat["messages"][2]["tool_calls"]] == ["c1", "c2"] and chat["messages"][2]["content"] == "Checking."
    assert chat["messages"][4] == {"role": "tool", "tool_call_id": "c2", "content": "9C"}
    anthropic = openai_to_anthropic({**chat, "model": "claude-opus-4-6"})  # and on to an Anthropic target: the schema as structured output
    assert anthropic["output_config"] == {"format": {"type": "json_schema", "schema": SCHEMA}, "effort": "low"}
    assert anthropic["system"] == "Be brief." and anthropic["max_tokens"] == 50


@pytest.mark.parametrize("body, field", [
    ({"tools": [{"type": "web_search"}]}, "web_search"),
    ({"tool_choice": {"type": "file_search"}}, "file_search"),
    ({"include": ["message.output_text.logprobs"]}, "logprobs"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input_file"),
    ({"background": True}, "background"),
    ({"top_logprobs": 3}, "top_logprobs"),
])
def test_untranslatable_fields_are_named(body, field):
    with pytest.raises(TranslationRefused, match=field):
        responses_to_chat({"model": "m", "input": "hi", **body})


def _events(translator: ChatToResponses, *chunks: object) -> list[dict]:
    out = []
    for chunk in chunks:
        raw = b"data: [DONE]\n\n" if chunk == "[DONE]" else b"data: " + orjson.dumps(chunk) + b"\n\n"
        for event in translator.feed(raw):
            name, data = event.split(b"\n", 1)
            payload = orjson.loads(data.removeprefix(b"data: "))
            assert name == b"event: " + payload["type"].encode()
            out.append(payload)
    return out


def _chunk(delta: dict | None = None, finish: str | None = None, usage: dict | None = None) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "up", "choices": choices, "usage": usage}


USAGE = {"prompt_tokens": 2100, "completion_tokens": 7, "total_tokens": 2107,
         "prompt_tokens_details": {"cached_tokens": 2048, "cache_write_tokens": 12},
         "completion_tokens_details": {"reasoning_tokens": 3}}


def test_stream_waits_for_usage_and_keeps_it_exact():
    translator = ChatToResponses({"model": "m", "input": "hi"}, "resp_1")
    events = _events(translator, _chunk({"role": "assistant", "content": "Hel"}), _chunk({"content": "lo"}),
                     _chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"a"'}}]}),
                     _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}, "tool_calls"))
    assert events[-1]["type"] == "response.function_call_arguments.delta"  # no terminal event before the usage
    events += _events(translator, _chunk(usage=USAGE), "[DONE]")
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    response = events[-1]["response"]
    assert [item["type"] for item in response["output"]] == ["message", "function_call"]
    assert response["output"][0]["content"][0]["text"] == "Hello" and response["output"][1]["arguments"] == '{"a":1}'
    assert response["usage"] == {"input_tokens": 2100, "input_tokens_details": {"cached_tokens": 2048, "cache_write_tokens": 12},
                                 "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 3}, "total_tokens": 2107}


def test_length_ends_incomplete_both_ways():
    translator = ChatToResponses({"model": "m", "input": "hi", "max_output_tokens": 16}, "resp_2")
    events = _events(translator, _chunk({"content": "a"}), _chunk({}, "length"), _chunk(usage=USAGE), "[DONE]")
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    body = {"id": "c", "model": "up", "created": 1, "usage": USAGE,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "a"}, "finish_reason": "length"}]}
    response = orjson.loads(completion_c2r({"model": "m", "input": "hi"}, "resp_3", orjson.dumps(body)))
    assert response["status"] == "incomplete" and response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["usage"]["input_tokens_details"]["cached_tokens"] == 2048


def test_malformed_items_are_the_clients_400(proxy, fresh_emulator):
    import openai

    from tests.responses.conftest import KEY

    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="malformed request"):
        client.responses.create(model="claude-x", input=[{"type": "function_call_output", "output": "no call id"}])
