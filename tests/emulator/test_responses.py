"""OpenAI Responses API (reference F.1-F.4) through the official client: shapes, the F.3 event
sequence, tools and the agent loop, structured output, caching, the response store, faults."""

from __future__ import annotations

import json

import openai
import pytest
from pydantic import BaseModel

from emulator import EmulatorConfig
from emulator.testing import RunningEmulator, running_emulator
from emulator.text import count_tokens

from .conftest import KEY
from .helpers import OPENAI_HEADERS, post, sse_events, text_of

MODEL = "gpt-4.1-mini"
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"], "additionalProperties": False}}]


def test_create_shape_and_usage(oai):
    raw = oai.responses.with_raw_response.create(model=MODEL, input="Hello", instructions="Be brief")
    assert raw.headers["x-request-id"]
    r = raw.parse()
    assert r.object == "response" and r.id.startswith("resp_") and r.status == "completed"
    assert r.instructions == "Be brief" and r.store is True and r.incomplete_details is None
    msg = r.output[0]
    assert msg.type == "message" and msg.role == "assistant" and msg.content[0].type == "output_text"
    assert r.usage.output_tokens == 48 == count_tokens(r.output_text)
    assert r.usage.total_tokens == r.usage.input_tokens + 48
    assert r.usage.input_tokens_details.cached_tokens == 0
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    # input_tokens counts the same prompt without generating
    n = oai.responses.input_tokens.count(model=MODEL, input="Hello", instructions="Be brief")
    assert n.object == "response.input_tokens" and n.input_tokens == r.usage.input_tokens


def test_stream_event_sequence(emu):
    r = post(emu.url, "/v1/responses", {"model": MODEL, "input": "Hi", "stream": True,
                                        "max_output_tokens": 16}, OPENAI_HEADERS)
    assert r.headers["content-type"].startswith("text/event-stream")
    evs = sse_events(r.text)
    datas = [json.loads(d) for _, d in evs]
    assert all(name == d["type"] for (name, _), d in zip(evs, datas, strict=True))  # no [DONE]
    assert [d["sequence_number"] for d in datas] == list(range(len(datas)))
    types = [d["type"] for d in datas]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    final = datas[-1]["response"]
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["usage"]["output_tokens"] == 16
    deltas = "".join(d["delta"] for d in datas if d["type"] == "response.output_text.delta")
    assert deltas == final["output"][0]["content"][0]["text"]


def test_tool_call_then_tool_result_ends_the_loop(oai):
    with oai.responses.stream(model=MODEL, input="What is the weather? use get_weather",
                              tools=TOOLS) as s:
        types = [ev.type for ev in s]
        first = s.get_final_response()
    assert "response.function_call_arguments.delta" in types
    assert "response.function_call_arguments.done" in types and types[-1] == "response.completed"
    call = first.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "example_city"}
    # The agent sends the tool result back: the answer is text, so the loop terminates.
    second = oai.responses.create(model=MODEL, previous_response_id=first.id, tools=TOOLS,
                                  tool_choice="auto",
                                  input=[{"type": "function_call_output", "call_id": call.call_id,
                                          "output": "sunny"}])
    assert second.output[0].type == "message" and second.output_text
    assert second.previous_response_id == first.id
    # Stateless replay of the same conversation (items echoed back) gets the same answer.
    replay = oai.responses.create(model=MODEL, tools=TOOLS, store=False, input=[
        {"role": "user", "content": "What is the weather? use get_weather"},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert replay.output_text == second.output_text
    forced = oai.responses.create(model=MODEL, input="hi", tools=TOOLS,
                                  tool_choice={"type": "function", "name": "get_weather"})
    assert forced.output[0].type == "function_call"


class Address(BaseModel):
    street: str
    zip_code: int


class Person(BaseModel):
    name: str
    age: int
    tags: list[str]
    home: Address
    role: str = "member"


def test_parse_with_pydantic_model(oai):
    r = oai.responses.parse(model=MODEL, input="Extract the person", text_format=Person)
    assert isinstance(r.output_parsed, Person) and isinstance(r.output_parsed.home, Address)
    raw = oai.responses.create(model=MODEL, input="x", text={"format": {
        "type": "json_schema", "name": "pick", "strict": True, "schema": {
            "type": "object", "required": ["color", "n"], "additionalProperties": False,
            "properties": {"color": {"type": "string", "enum": ["red", "blue"]},
                           "n": {"type": "integer", "minimum": 3}}}}})
    assert json.loads(raw.output_text) == {"color": "red", "n": 3}
    assert raw.text.format.type == "json_schema"


def test_reasoning_items_and_encrypted_content(oai):
    r = oai.responses.create(model="gpt-5-mini", input="Think", store=False,
                             reasoning={"effort": "high", "summary": "auto"},
                             include=["reasoning.encrypted_content"])
    rs = r.output[0]
    assert rs.type == "reasoning" and rs.encrypted_content and rs.summary[0].text
    assert r.usage.output_tokens_details.reasoning_tokens == 32
    assert r.usage.output_tokens == 32 + count_tokens(r.output_text)
    again = oai.responses.create(model="gpt-5-mini", input=[
        {"role": "user", "content": "Think"}, rs.model_dump(exclude_none=True),
        {"role": "user", "content": "And now?"}], store=False)
    assert again.status == "completed"
    plain = oai.responses.create(model="gpt-5-mini", input="x", reasoning={"effort": "none"})
    assert plain.output[0].type == "message" and plain.usage.output_tokens_details.reasoning_tokens == 0


def test_output_text_logprobs(oai):
    kw = dict(model=MODEL, input="Hi", max_output_tokens=16, top_logprobs=2,
              include=["message.output_text.logprobs"])
    r = oai.responses.create(**kw)
    part = r.output[0].content[0]
    assert "".join(t.token for t in part.logprobs) == part.text and len(part.logprobs) == 16
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in part.logprobs)
    with oai.responses.stream(**kw) as s:
        streamed = [t.token for ev in s if ev.type == "response.output_text.delta" for t in ev.logprobs]
    assert streamed == [t.token for t in part.logprobs]
    assert oai.responses.create(model=MODEL, input="Hi").output[0].content[0].logprobs == []


def test_prompt_caching_follows_chat_rules(oai, emu):
    long = text_of(1400, 5)
    first = oai.responses.create(model=MODEL, instructions=long, input="q1", prompt_cache_key="t")
    assert first.usage.input_tokens_details.cached_tokens == 0
    second = oai.responses.create(model=MODEL, instructions=long, input="q2", prompt_cache_key="t")
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached >= 1024 and cached % 128 == 0 and cached <= second.usage.input_tokens
    other = oai.responses.create(model=MODEL, instructions=long, input="q2", prompt_cache_key="u")
    assert other.usage.input_tokens_details.cached_tokens == 0
    # previous_response_id prepends the earlier turn (instructions are not carried over), so
    # the prefix is read from the cache
    nxt = oai.responses.create(model=MODEL, instructions=long, input=text_of(300, 6),
                               previous_response_id=second.id, prompt_cache_key="t")
    assert nxt.usage.input_tokens_details.cached_tokens >= cached
    alone = oai.responses.create(model=MODEL, input="q3", previous_response_id=second.id)
    assert alone.usage.input_tokens < second.usage.input_tokens


def test_store_retrieve_delete_and_input_items(oai, emu):
    r = oai.responses.create(model=MODEL, input=[
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"}])
    assert oai.responses.retrieve(r.id).output_text == r.output_text
    page = oai.responses.input_items.list(r.id, limit=2)
    assert [i.content[0].text for i in page.data] == ["c", "b"] and page.has_more
    assert page.first_id == page.data[0].id and page.last_id == page.data[1].id
    rest = oai.responses.input_items.list(r.id, after=page.last_id, order="desc")
    assert [i.content[0].text for i in rest.data] == ["a"] and not rest.has_more
    asc = list(oai.responses.input_items.list(r.id, order="asc"))
    assert [i.content[0].text for i in asc] == ["a", "b", "c"]
    with openai.OpenAI(base_url=emu.openai_url, api_key="other-team", max_retries=0) as other:
        with pytest.raises(openai.NotFoundError):
            other.responses.retrieve(r.id)
        with pytest.raises(openai.BadRequestError) as ei:
            other.responses.create(model=MODEL, input="x", previous_response_id=r.id)
        assert ei.value.code == "previous_response_not_found"
    oai.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(r.id)
    unstored = oai.responses.create(model=MODEL, input="x", store=False)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(unstored.id)


def test_validation_errors(oai, emu):
    cases = [({"model": MODEL, "input": "x", "max_output_tokens": 8}, "max_output_tokens"),
             ({"model": MODEL, "input": {"a": 1}}, "input"),
             ({"model": MODEL, "input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
             ({"model": MODEL, "input": [{"type": "function_call_output"}]}, "input[0].call_id"),
             ({"model": MODEL, "input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
             ({"model": MODEL, "input": "x", "text": {"format": {"type": "json_schema"}}},
              "text.format.name"),
             ({"input": "x"}, "model")]
    for body, param in cases:
        r = post(emu.url, "/v1/responses", body, OPENAI_HEADERS)
        assert r.status_code == 400, body
        assert r.json()["error"]["param"] == param and r.json()["error"]["type"] == "invalid_request_error"


def test_faults_apply(oai, emu):
    emu.inject_fault("429", path="/v1/responses")
    with pytest.raises(openai.RateLimitError):
        oai.responses.create(model=MODEL, input="x")
    emu.inject_fault("midstream_error:events=3", path="/v1/responses")
    r = post(emu.url, "/v1/responses", {"model": MODEL, "input": "x", "stream": True}, OPENAI_HEADERS)
    datas = [json.loads(d) for _, d in sse_events(r.text)]
    assert len(datas) == 4 and datas[-1]["type"] == "response.failed"
    assert datas[-1]["sequence_number"] == 3 and datas[-1]["response"]["error"]["code"] == "server_error"
    assert emu.stats()["errored_streams"] == 1


@pytest.fixture(scope="module")
def slow() -> RunningEmulator:
    """Streams of 10 s, so a client leaves long before the end however loaded the machine."""
    with running_emulator(EmulatorConfig(per_output_token_ms=5, default_output_tokens=2000)) as e:
        yield e


def test_client_leaving_a_stream_is_counted(slow):
    slow.reset()
    with openai.OpenAI(base_url=slow.openai_url, api_key=KEY, max_retries=0) as c, \
            c.responses.stream(model=MODEL, input="long story") as s:
        for ev in s:
            if ev.type == "response.output_text.delta":
                break
    st = slow.wait_for(lambda s: s["cancelled_streams"] == 1 and s["open_streams"] == 0)
    assert st["completed_streams"] == 0 and st["endpoints"] == {"POST /v1/responses": 1}
