"""The Responses API with the official openai client, through the proxy and through the drop-in SDK.

Every test runs against both doors (`door` fixture) and, where the target matters, against a native
Responses upstream (`oai-*`), a Chat-Completions-only upstream (`gpt-*`) and an Anthropic one
(`claude-*`), all served by the emulator.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel

import sdk
from tests.helpers import requires_extra
from tests.responses.conftest import CACHING_KEY, HITS_KEY, KEY, OTHER_KEY

MODELS = ["oai-4o", "gpt-4o", "claude-x"]
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TEXT_EVENTS = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
               "response.output_text.delta", "response.output_text.done", "response.content_part.done",
               "response.output_item.done", "response.completed"]


@pytest.fixture(params=["proxy", "dropin"])
def door(request, proxy, policy_dir, tmp_path_factory, monkeypatch):
    """An openai.OpenAI client for the team, through the proxy or the drop-in SDK."""
    if request.param == "proxy":
        return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path_factory.mktemp("dropin-data")))
    return sdk.OpenAI(policy=policy_dir / "responses.yaml", max_retries=0)


def _collapse(types: list[str]) -> list[str]:
    """Event types with runs of deltas folded into one, to compare with the expected order."""
    return [t for i, t in enumerate(types) if not (t.endswith(".delta") and i and types[i - 1] == t)]


@pytest.mark.parametrize("model", MODELS)
def test_create_chain_retrieve_items_delete(door, model, fresh_emulator):
    first = door.responses.create(model=model, instructions="Be brief.", input="Tell me about fjords.", max_output_tokens=60)
    assert first.status == "completed" and first.output_text and first.id.startswith("resp_")
    assert first.usage.total_tokens == first.usage.input_tokens + first.usage.output_tokens
    second = door.responses.create(model=model, input="And glaciers?", previous_response_id=first.id)
    assert second.previous_response_id == first.id and second.output_text
    assert second.usage.input_tokens > first.usage.input_tokens  # the first turn travelled as history

    assert door.responses.retrieve(second.id).output_text == second.output_text
    items = door.responses.input_items.list(first.id, order="asc")
    assert [part.text for item in items.data for part in item.content] == ["Tell me about fjords."]
    assert items.data[0].role == "user"
    items = door.responses.input_items.list(second.id)  # this request's own input, newest first
    assert [part.text for item in items.data for part in item.content] == ["And glaciers?"]

    door.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        door.responses.retrieve(second.id)
    with pytest.raises(openai.NotFoundError, match="not found"):
        door.responses.create(model=model, input="more", previous_response_id=second.id)


@pytest.mark.parametrize("model", MODELS)
def test_stream_event_sequence_and_usage(door, model, fresh_emulator):
    with door.responses.create(model=model, input="Tell me about fjords.", stream=True) as stream:
        events = list(stream)
    assert _collapse([e.type for e in events]) == TEXT_EVENTS
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1].response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert done.output_text == text and done.usage.output_tokens > 0 and done.usage.input_tokens > 0
    assert door.responses.retrieve(done.id).output_text == text  # stored before the last event went out

    with door.responses.stream(model=model, input="Again, briefly.", previous_response_id=done.id) as helper:
        final = helper.get_final_response()
    assert final.status == "completed" and final.output_text


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("model", MODELS)
def test_function_tool_round_trip(door, model, stream, fresh_emulator):
    ask = dict(model=model, tools=[WEATHER], input="Use the get_weather tool for Oslo.")
    if stream:
        with door.responses.stream(**ask) as helper:
            first = helper.get_final_response()
    else:
        first = door.responses.create(**ask)
    call = next(item for item in first.output if item.type == "function_call")
    assert call.name == "get_weather" and call.arguments.startswith("{") and call.call_id
    follow = door.responses.create(model=model, tools=[WEATHER], previous_response_id=first.id,
                                   input=[{"type": "function_call_output", "call_id": call.call_id, "output": "12°C, rain"}])
    assert follow.status == "completed" and follow.output_text
    # The same turn sent stateless (the whole conversation as input items) is accepted too.
    replay = [{"role": "user", "content": "Use the get_weather tool for Oslo."},
              {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
              {"type": "function_call_output", "call_id": call.call_id, "output": "12°C, rain"}]
    assert door.responses.create(model=model, tools=[WEATHER], input=replay, store=False).output_text


@pytest.mark.parametrize("model", MODELS)
def test_max_output_tokens_ends_incomplete(door, model, fresh_emulator):
    result = door.responses.create(model=model, input="Tell me everything about fjords.", max_output_tokens=16)
    assert result.status == "incomplete" and result.incomplete_details.reason == "max_output_tokens"
    assert result.usage.output_tokens == 16
    with door.responses.create(model=model, input="Tell me everything about fjords.", max_output_tokens=16, stream=True) as stream:
        last = list(stream)[-1]
    assert last.type == "response.incomplete" and last.response.incomplete_details.reason == "max_output_tokens"


def test_untranslatable_is_refused_before_sending(door, fresh_emulator):
    """Refused with the field and the protocol the route's upstream really speaks."""
    with pytest.raises(openai.BadRequestError, match=r"web_search.*for a Chat Completions target"):
        door.responses.create(model="gpt-4o", input="Search the web.", tools=[{"type": "web_search"}])
    with pytest.raises(openai.BadRequestError, match=r"top_logprobs.*for an Anthropic Messages target"):
        door.responses.create(model="claude-x", input="Think.", top_logprobs=5)
    assert fresh_emulator.stats()["requests_total"] == 0


def test_stored_responses_are_per_team(proxy, fresh_emulator):
    mine = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
    theirs = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=OTHER_KEY, max_retries=0)
    created = mine.responses.create(model="gpt-4o", input="A secret.")
    for call in (lambda: theirs.responses.retrieve(created.id), lambda: theirs.responses.delete(created.id),
                 lambda: theirs.responses.input_items.list(created.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.NotFoundError, match="not found"):
        theirs.responses.create(model="gpt-4o", input="Go on.", previous_response_id=created.id)
    assert mine.responses.retrieve(created.id).id == created.id


def test_store_false_is_not_kept(door, fresh_emulator):
    result = door.responses.create(model="gpt-4o", input="Forget this.", store=False)
    with pytest.raises(openai.NotFoundError):
        door.responses.retrieve(result.id)


def test_fallback_from_failing_target_to_anthropic(door, fresh_emulator):
    fresh_emulator.inject_fault("500", count=2, model="gpt-primary")
    raw = door.responses.with_raw_response.create(model="fall-x", input="Tell me about fjords.")
    assert raw.headers["x-slipstream-route"] == "claude/claude-backup"
    assert raw.parse().output_text
    with door.responses.stream(model="fall-x", input="Tell me about fjords.") as helper:
        assert helper.get_final_response().output_text
    stats = fresh_emulator.stats()
    assert stats["requests_total"] == 4  # two refused by the fault, two answered by the Anthropic target


@pytest.fixture
def slow_emulator(fresh_emulator):
    """Long, paced answers (seconds), so a stream is still open when the client leaves."""
    config = fresh_emulator.config
    saved = (config.per_output_token_ms, config.default_output_tokens)
    config.per_output_token_ms, config.default_output_tokens = 5.0, 2000
    yield fresh_emulator
    config.per_output_token_ms, config.default_output_tokens = saved


@pytest.mark.parametrize("model", MODELS)
def test_closing_a_stream_cancels_upstream(door, model, slow_emulator):
    stream = door.responses.create(model=model, input="Tell me everything.", stream=True)
    deltas = 0
    for event in stream:
        deltas += event.type == "response.output_text.delta"
        if deltas == 3:
            break
    stream.close()
    stats = slow_emulator.wait_for(lambda s: s["cancelled_streams"] == 1)
    assert stats["completed_streams"] == 0


LONG_INSTRUCTIONS = "You are a careful travel guide for Norway. " + " ".join(
    f"Rule {i}: answer about fjord number {i} with its depth, its length and the nearest town." for i in range(120))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("model", MODELS)
def test_prompt_cache_usage_is_carried(proxy, model, stream, fresh_emulator):
    """Cache reads and writes reach the client as `cached_tokens` / `cache_write_tokens`, whatever the
    target; on the Anthropic one the optimizer's breakpoints on the translated body make them happen."""
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=CACHING_KEY, max_retries=0)

    def ask() -> object:
        request = dict(model=model, instructions=LONG_INSTRUCTIONS, input="Tell me about fjord 7.", max_output_tokens=200)
        if not stream:
            return client.responses.create(**request).usage
        with client.responses.stream(**request) as helper:
            return helper.get_final_response().usage

    first, second = ask(), ask()
    assert first.input_tokens == second.input_tokens > 1024
    assert second.input_tokens_details.cached_tokens > 0
    assert second.input_tokens_details.cached_tokens + second.input_tokens_details.cache_write_tokens <= second.input_tokens
    if model.startswith("claude"):
        assert first.input_tokens_details.cache_write_tokens > 0  # Anthropic bills the write: it shows


class Fjord(BaseModel):
    name: str
    depth_m: int


def test_parse_into_pydantic_model(door, fresh_emulator):
    """Native here: the emulator answers `text.format` schemas with valid JSON on /v1/responses only
    (translated targets carry the schema as `response_format` / `output_config.format`: test_translation_units)."""
    model = "oai-4o"
    parsed = door.responses.parse(model=model, input="Describe a fjord.", text_format=Fjord)
    assert isinstance(parsed.output_parsed, Fjord)
    with door.responses.stream(model=model, input="Describe a fjord.", text_format=Fjord) as helper:
        assert isinstance(helper.get_final_response().output_parsed, Fjord)


def _without_ids(value: object) -> object:
    """A response as JSON with what differs between two identical calls (ids, timestamps) blanked."""
    if isinstance(value, dict):
        return {k: None if k in ("id", "created_at", "completed_at", "encrypted_content") else _without_ids(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_ids(v) for v in value]
    return value


def test_native_target_passes_body_and_bytes(proxy, fresh_emulator):
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
    direct = openai.OpenAI(base_url=fresh_emulator.openai_url, api_key="k", max_retries=0)
    request = dict(model="o4-mini", input="Tell me about fjords.", reasoning={"effort": "low", "summary": "auto"},
                   include=["reasoning.encrypted_content"], store=False, prompt_cache_key="fjords")
    raw = client.responses.with_raw_response.create(**request)
    ours, theirs = raw.http_response.json(), direct.responses.with_raw_response.create(**request).http_response.json()
    assert raw.headers["x-slipstream-route"] == "oai/o4-mini"
    # The client's prompt_cache_key went upstream namespaced to its team (sdk/promptcache/keys.py): the echo shows that.
    assert ours.pop("prompt_cache_key").startswith("team-") and theirs.pop("prompt_cache_key") == "fjords"
    assert _without_ids(ours) == _without_ids(theirs)  # what the provider sent, field for field
    assert ours["usage"]["output_tokens_details"]["reasoning_tokens"] == 8
    reasoning = next(item for item in ours["output"] if item["type"] == "reasoning")
    assert reasoning["encrypted_content"] and reasoning["summary"]
    # Stateless continuation: the reasoning item goes back as the client echoes it.
    follow = client.responses.create(model="o4-mini", store=False, include=["reasoning.encrypted_content"],
                                     input=[{"role": "user", "content": "Tell me about fjords."}, reasoning, *[
                                         item for item in ours["output"] if item["type"] == "message"],
                                         {"role": "user", "content": "And glaciers?"}])
    assert follow.status == "completed" and follow.output_text


def test_reasoning_effort_reaches_a_chat_target_only_if_its_model_reasons(proxy, fresh_emulator):
    """openai-agents sends `reasoning.effort` from its model settings; a Chat Completions target whose
    model does not reason answers reasoning_effort with a 400 (OpenAI's "Unsupported parameter", the
    local engine's unknown field): it is left out there and named; a reasoning model gets it."""
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
    for model, travels in (("gpt-4o", False), ("gpt-5-mini", True)):
        raw = client.responses.with_raw_response.create(model=model, input="Tell me about fjords.", reasoning={"effort": "low"})
        sent = json.loads(fresh_emulator.state.recent[-1]["body"])
        assert ("reasoning_effort" in sent) is travels and sent.get("reasoning_effort", "low") == "low"
        assert ("reasoning.effort" in raw.headers.get("x-slipstream-dropped-fields", "")) is not travels


def test_verbosity_reaches_a_chat_target_as_its_model_takes_it(proxy, fresh_emulator):
    """Codex CLI sends `text.verbosity: "low"` on every request for gpt-5.1 and later; a Chat model
    without verbosity (gpt-4o, the local engine: an unknown field) refuses the field with a 400. It is
    asked for in the system prompt there, as for Claude; gpt-5's family gets the field."""
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
    for model, travels in (("gpt-4o", False), ("gpt-5-mini", True)):
        client.responses.create(model=model, instructions="You are Codex.", input="List the files.", text={"verbosity": "low"})
        sent = json.loads(fresh_emulator.state.recent[-1]["body"])
        assert ("verbosity" in sent) is travels
        assert (sent["messages"][0]["content"] == "You are Codex.") is travels
        assert travels or sent["messages"][0]["content"].startswith("You are Codex.\n\nBe concise")


def test_input_tokens_counted_by_native_target_refused_elsewhere(door, fresh_emulator):
    """A native target counts; a translated one is counted where the gateway can (Claude's own
    count_tokens), and refused, saying why, where it has not the model's tokenizer (gpt-4o's)."""
    counted = door.responses.input_tokens.count(model="oai-4o", input="Tell me about fjords.")
    assert counted.input_tokens > 0
    assert door.responses.input_tokens.count(model="claude-x", input="Tell me about fjords.").input_tokens > 0
    with pytest.raises(openai.BadRequestError, match="o200k_base"):
        door.responses.input_tokens.count(model="gpt-4o", input="Tell me about fjords.")


def _sample(metrics: str, name: str) -> float:
    """One sample's value in Prometheus text (0 when absent)."""
    line = next((line for line in metrics.splitlines() if line.startswith(name + " ")), None)
    return float(line.rsplit(" ", 1)[1]) if line else 0.0


# claude-ttft is a model the policy does not name: it is counted under one label, claude/other.
@pytest.mark.parametrize("model, route", [("oai-ttft", "oai/gpt-4.1-mini"), ("claude-ttft", "claude/other")])
def test_stream_latency_metrics_per_route(proxy, model, route, fresh_emulator):
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
    labels = f'{{route="{route}",team="responses"}}'
    names = [f"slipstream_ttft_seconds_count{labels}", f"slipstream_itl_seconds_count{labels}",
             f'slipstream_tokens_total{{kind="output",route="{route}",team="responses"}}']
    before = [_sample(httpx.get(f"{proxy.url}/metrics").text, name) for name in names]
    with client.responses.stream(model=model, input="Tell me about fjords.") as helper:
        usage = helper.get_final_response().usage
    after = [_sample(httpx.get(f"{proxy.url}/metrics").text, name) for name in names]
    assert after[0] - before[0] == 1  # one first token
    assert after[1] - before[1] > 1  # gaps between the deltas
    assert after[2] - before[2] == usage.output_tokens


def test_auto_discovers_an_upstream_without_responses(proxy, policy_dir, fresh_emulator):
    """`responses: auto` goes native until /responses answers 404 (not about the model), then translates."""
    fresh_emulator.inject_fault("404", path="/v1/responses")
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=OTHER_KEY, max_retries=0)  # a team built fresh here
    assert client.responses.create(model="auto-x", input="Tell me about fjords.").output_text
    assert client.responses.create(model="auto-x", input="And glaciers?").output_text
    assert fresh_emulator.stats()["endpoints"] == {"POST /v1/responses": 1, "POST /v1/chat/completions": 2}


@pytest.mark.parametrize("model", ["oai-4o", "claude-x"])
def test_a_client_that_gives_up_cancels_a_json_request(door, model, slow_emulator):
    # The answer takes 10 s; 2 s leave a loaded machine ample time to deliver the request first.
    with pytest.raises(openai.APITimeoutError):
        door.with_options(timeout=2).responses.create(model=model, input="Tell me everything.")
    stats = slow_emulator.wait_for(lambda s: s["cancelled_requests"] == 1)
    assert stats["open_requests"] == 0


@requires_extra("semantic")
@pytest.mark.parametrize("model", MODELS)
def test_exact_cache_replays_under_a_fresh_id(proxy, model, fresh_emulator):
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=HITS_KEY, max_retries=0)
    ask = dict(model=model, input=f"Tell me about fjords ({model}).", temperature=0)
    first = client.responses.with_raw_response.create(**ask)
    again = client.responses.with_raw_response.create(**ask)
    assert (first.headers["x-slipstream-cache"], again.headers["x-slipstream-cache"]) == ("miss", "exact-hit")
    original, replay = first.parse(), again.parse()
    assert replay.output_text == original.output_text and replay.id != original.id
    assert replay.usage.output_tokens == original.usage.output_tokens  # the usage the provider reported
    with client.responses.stream(**ask) as helper:
        streamed = helper.get_final_response()
    assert streamed.output_text == original.output_text and streamed.id not in (original.id, replay.id)
    assert fresh_emulator.stats()["requests_total"] == 1
    # A replayed response is a response like any other: fetched, continued.
    assert client.responses.retrieve(replay.id).output_text == original.output_text
    follow = client.responses.create(model=model, input="And glaciers?", previous_response_id=streamed.id)
    assert follow.output_text and follow.usage.input_tokens > original.usage.input_tokens


@requires_extra("semantic")
def test_semantic_cache_answers_a_paraphrase(proxy, fresh_emulator):
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=HITS_KEY, max_retries=0)
    first = client.responses.with_raw_response.create(model="gpt-4o", input="How do I reset my password?", temperature=0)
    again = client.responses.with_raw_response.create(model="gpt-4o", input="How can I reset my password?", temperature=0)
    assert (first.headers["x-slipstream-cache"], again.headers["x-slipstream-cache"]) == ("miss", "semantic-hit")
    assert again.parse().output_text == first.parse().output_text and fresh_emulator.stats()["requests_total"] == 1



@requires_extra("semantic")
def test_the_cache_does_not_answer_one_conversation_with_anothers_turn(proxy, fresh_emulator):
    """The cache keys a Responses request by its Chat form, which has no `previous_response_id`, so a
    continued conversation is never cached: else the same follow-up in two conversations (two end
    users of one team key) would be one key, and the second would get the answer the first one's
    history produced."""
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=HITS_KEY, max_retries=0)
    first = client.responses.create(model="gpt-4o", input="My locker code is 4417.", temperature=0)
    second = client.responses.create(model="gpt-4o", input="My locker code is 9902.", temperature=0)
    ask = dict(model="gpt-4o", input="What is my locker code?", temperature=0)
    for previous in (first.id, second.id, first.id):
        answer = client.responses.with_raw_response.create(**ask, previous_response_id=previous)
        assert answer.headers["x-slipstream-cache"] == "miss"


def test_prompt_cache_retention_reaches_a_chat_target(proxy, fresh_emulator):
    """Codex and the Agents SDK ask gpt-5.1 and later for `prompt_cache_retention: "24h"` (the prefix outlives
    OpenAI's minutes in memory); a Chat Completions target takes the same field, but it was left out. It travels
    (24h only to a model with extended retention, as OpenAI takes it), and never to Claude."""
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
    for model, retention, travels in (("gpt-5.1", "24h", True), ("gpt-4o", "in_memory", True), ("gpt-4o", "24h", False),
                                      ("claude-sonnet-4-5", "24h", False)):
        raw = client.responses.with_raw_response.create(model=model, input="Tell me about fjords.",
                                                        prompt_cache_retention=retention)  # type: ignore[arg-type]
        assert raw.parse().output_text
        sent = json.loads(fresh_emulator.state.recent[-1]["body"])
        assert sent.get("prompt_cache_retention") == (retention if travels else None)
        assert ("prompt_cache_retention" in raw.headers.get("x-slipstream-dropped-fields", "").split(",")) is not travels


def test_explicit_cache_breakpoints_and_options_reach_a_chat_target_that_takes_them(proxy, fresh_emulator):
    """openai 3.x's `prompt_cache_options` and an input part's `prompt_cache_breakpoint` (gpt-5.6's explicit caching,
    which reads a prefix only where a breakpoint ends it) were left out for a Chat Completions target, which takes the
    same fields, the breakpoints without a word. They travel to a model that takes them, a tool output's as its one
    text part; to an earlier model (gpt-4o) they are left out and named."""
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
    explicit = {"mode": "explicit"}
    tools: Any = [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}, "strict": False}]
    items: Any = [{"role": "developer", "content": [{"type": "input_text", "text": "Be brief.", "prompt_cache_breakpoint": explicit}]},
                  {"role": "user", "content": "Tell me about fjords."},
                  {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "call_1",
                   "output": [{"type": "input_text", "text": "Geirangerfjord.", "prompt_cache_breakpoint": explicit}]}]
    for model, travels in (("gpt-5.6", True), ("gpt-4o", False)):
        raw = client.responses.with_raw_response.create(model=model, input=items, tools=tools, prompt_cache_options=explicit)
        assert raw.parse().output is not None
        sent = json.loads(fresh_emulator.state.recent[-1]["body"])
        assert sent["model"] == model and sent.get("prompt_cache_options") == (explicit if travels else None)
        marked = [part.get("prompt_cache_breakpoint") for message in sent["messages"] if isinstance(message["content"], list)
                  for part in message["content"]]
        assert marked == ([explicit, explicit] if travels else [None, None])
        assert sent["messages"][-1]["role"] == "tool" and sent["messages"][-1]["content"][0]["text"] == "Geirangerfjord."
        dropped = raw.headers.get("x-slipstream-dropped-fields", "").split(",")
        assert ({"prompt_cache_options", "prompt_cache_breakpoint"} <= set(dropped)) is not travels


def test_a_text_file_input_reaches_claude_as_a_text_document_and_a_chat_model_as_its_text(proxy, fresh_emulator):
    """The Responses API takes text files (.txt, .md, .json, code) as input_file and gives the model their text; a
    translated target refused every one but a PDF ("a 'text/markdown' file"), and a Chat target was sent a file part
    Chat takes as a PDF only. Claude gets a document with a text source named by the file name, a Chat model the text;
    a file that is not text (a .docx) is still a 400 naming it."""
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
    notes = "# Fjords\nGeirangerfjord is 15 km long."
    data = "data:text/markdown;base64," + base64.b64encode(notes.encode()).decode()

    def ask(model: str, file: dict[str, Any]) -> Any:
        return client.responses.create(model=model, input=[{"role": "user", "content": [
            {"type": "input_text", "text": "Summarize the notes."}, {"type": "input_file", **file}]}])  # type: ignore[list-item]

    assert ask("claude-sonnet-4-5", {"filename": "notes.md", "file_data": data}).output_text
    content = json.loads(fresh_emulator.state.recent[-1]["body"])["messages"][0]["content"]
    assert content[1] == {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": notes}, "title": "notes.md"}
    assert ask("gpt-4o", {"filename": "notes.md", "file_data": data}).output_text
    content = json.loads(fresh_emulator.state.recent[-1]["body"])["messages"][0]["content"]
    assert content == [{"type": "text", "text": "Summarize the notes."}, {"type": "text", "text": notes}]
    docx = "data:application/vnd.openxmlformats-officedocument.wordprocessingml.document;base64,UEsDBA=="
    with pytest.raises(openai.BadRequestError, match=r"wordprocessingml\.document' file"):
        ask("claude-sonnet-4-5", {"filename": "notes.docx", "file_data": docx})
