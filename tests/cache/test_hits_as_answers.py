"""A cache hit, as the official clients meet it through the proxy, is an answer the request would have
gotten: partitioned by everything that changes the answer, and shaped like a fresh answer of the
client's protocol (its own ids, its own request's echoes)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from gateway.testing import RunningServer, running_proxy
from sdk.promptcache.keys import team_user
from tests.helpers import requires_extra

pytestmark = requires_extra("semantic")

KEY = "sk-cache-answers"
CLAUDE = "claude-sonnet-4-6"
GPT = "gpt-4.1-mini"


def policy(emulator_url: str) -> str:
    return f"""team: answers
api_keys: [{{value: "{KEY}"}}]
providers:
  claude: {{kind: anthropic, base_url: "{emulator_url}", api_key: "up-anthropic"}}
  gpt: {{kind: openai, base_url: "{emulator_url}/v1", api_key: "up-openai", responses: chat}}
  oai: {{kind: openai, base_url: "{emulator_url}/v1", api_key: "up-openai", responses: native}}
  local: {{kind: local, model: demo}}
routes:
  - match: {{model: "claude-*"}}
    targets: [{{provider: claude}}]
  - match: {{model: "gpt-*"}}
    targets: [{{provider: gpt}}]
  - match: {{model: "o4-*"}}
    targets: [{{provider: oai}}]
  - match: {{model: "engine"}}
    targets: [{{provider: local}}, {{provider: gpt, model: {GPT}}}]
  - match: {{model: "step-*"}}
    targets: [{{provider: gpt, model: {GPT}}}, {{provider: gpt, model: gpt-4o}}]
  - match: {{model: "fall-*"}}
    targets: [{{provider: claude, model: {CLAUDE}}}, {{provider: gpt, model: {GPT}}}]
retry: {{max_attempts: 1}}
semantic_cache: {{enabled: true, cache_sampled: true, cache_tool_calls: true}}
"""


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[RunningServer]:
    directory = tmp_path_factory.mktemp("cache-answers")
    (directory / "answers.yaml").write_text(policy(emulator.url))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path_factory.mktemp("cache-answers-data")))
        with running_proxy([directory]) as running:
            yield running


@pytest.fixture
def oa(proxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)


@pytest.fixture
def an(proxy) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)


def _status(raw: Any) -> str:
    return raw.headers["x-slipstream-cache"]


WEATHER: Any = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
WEATHER_TOOL: Any = [{"name": "get_weather", "description": "The weather in a city",
                      "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]


def test_a_hit_carries_fresh_ids_as_every_provider_answer_does(oa, an, fresh_emulator):
    """OpenAI and Anthropic give every answer, and every tool call in it, an id of its own; clients log,
    deduplicate and match tool results by them. A hit re-served the stored answer's ids and its
    `created` time, so two answers (and two tool calls) carried one id."""
    ask: Any = dict(model=GPT, messages=[{"role": "user", "content": "Weather in Oslo?"}], temperature=0, tools=WEATHER,
                    tool_choice="required")
    first = oa.chat.completions.with_raw_response.create(**ask)
    again = oa.chat.completions.with_raw_response.create(**ask)
    assert (_status(first), _status(again)) == ("miss", "exact-hit")
    stored, hit = first.parse(), again.parse()
    assert hit.id != stored.id and hit.id.startswith("chatcmpl-") and hit.created >= stored.created
    call, replayed = stored.choices[0].message.tool_calls[0], hit.choices[0].message.tool_calls[0]
    assert replayed.id != call.id and replayed.id.startswith("call_") and replayed.function == call.function
    streamed = list(oa.chat.completions.create(**ask, stream=True))
    assert {c.id for c in streamed} != {stored.id} and len({c.id for c in streamed}) == 1
    assert streamed[1].choices[0].delta.tool_calls[0].id not in (call.id, replayed.id)

    message: Any = dict(model=CLAUDE, max_tokens=200, messages=[{"role": "user", "content": "Weather in Bergen?"}],
                        tools=WEATHER_TOOL, tool_choice={"type": "any"}, extra_body={"temperature": 0})
    first_m = an.messages.with_raw_response.create(**message)
    again_m = an.messages.with_raw_response.create(**message)
    assert (_status(first_m), _status(again_m)) == ("miss", "exact-hit")
    stored_m, hit_m = first_m.parse(), again_m.parse()
    assert hit_m.id != stored_m.id and hit_m.id.startswith("msg_")
    use, replayed_use = stored_m.content[-1], hit_m.content[-1]
    assert replayed_use.type == use.type == "tool_use" and replayed_use.id != use.id and replayed_use.id.startswith("toolu_")
    assert replayed_use.input == use.input
    with an.messages.stream(**message) as stream:
        final = stream.get_final_message()
    assert final.id not in (stored_m.id, hit_m.id) and final.content[-1].id not in (use.id, replayed_use.id)

    function: Any = [{"type": "function", "name": "get_weather", "parameters": WEATHER[0]["function"]["parameters"]}]
    # (its reasoning carried whole: one the provider reads by id is not stored, sdk/cache/responses.py:completed_safely)
    turn: Any = dict(model="o4-mini", input="Weather in Tromsø?", tools=function, tool_choice="required",
                     include=["reasoning.encrypted_content"])
    first_r, again_r = (oa.responses.create(**turn) for _ in range(2))
    called, recalled = first_r.output[-1], again_r.output[-1]
    assert called.type == recalled.type == "function_call" and recalled.id != called.id
    assert recalled.call_id != called.call_id and recalled.arguments == called.arguments
    assert fresh_emulator.stats()["requests_total"] == 3


def test_a_responses_hit_echoes_its_own_request(oa, fresh_emulator):
    """A response object echoes the request's settings; `metadata`, `user` and `store` do not change the
    answer, so they are not in the key. A hit echoed the stored request's: another caller's metadata
    tags and end-user id, and `store: true` on a response this request asked not to store. (The end
    user is echoed as the provider received it: the team's digest of the id, sdk/promptcache/keys.py.)"""
    ask: Any = dict(model=GPT, input="Name a fjord in Norway.", temperature=0)
    first = oa.responses.create(**ask, metadata={"ticket": "A-1"}, user="alice")
    raw = oa.responses.with_raw_response.create(**ask, metadata={"ticket": "B-2"}, user="bob", store=False)
    hit = raw.parse()
    assert _status(raw) == "exact-hit" and hit.output_text == first.output_text
    assert (hit.metadata, hit.user, hit.store) == ({"ticket": "B-2"}, team_user("answers", "bob"), False)
    assert (first.metadata, first.user, first.store) == ({"ticket": "A-1"}, team_user("answers", "alice"), True)
    assert hit.completed_at is not None and hit.completed_at >= hit.created_at
    with oa.responses.stream(**ask) as stream:
        events = list(stream)
    created, completed = events[0].response, events[-1].response  # type: ignore[union-attr]
    assert (created.metadata, completed.metadata, completed.user, completed.store) == ({}, {}, None, True)
    assert fresh_emulator.stats()["requests_total"] == 1
    with pytest.raises(openai.NotFoundError):
        oa.responses.retrieve(hit.id)  # store: false — the replay was not kept either


def test_responses_fields_a_chat_form_drops_are_in_the_key(oa, fresh_emulator):
    """A Responses request is keyed by its Chat form, which drops what a translated target cannot give
    (`include`, `reasoning.summary`, reasoning items of the input, `truncation`); a native target gives
    them. Codex asks for `include: ["reasoning.encrypted_content"]` with `store: false` to carry its
    reasoning to the next turn: an exact hit on an answer stored without it had no encrypted_content."""
    ask: Any = dict(model="o4-mini", input="Why is the sea salty?")
    plain = oa.responses.create(**ask)
    assert plain.output[0].type == "reasoning" and plain.output[0].encrypted_content is None
    raw = oa.responses.with_raw_response.create(**ask, include=["reasoning.encrypted_content"], store=False)
    assert _status(raw) == "miss" and raw.parse().output[0].encrypted_content
    summarized = oa.responses.with_raw_response.create(**ask, reasoning={"summary": "auto"})
    assert _status(summarized) == "miss" and summarized.parse().output[0].summary
    assert _status(oa.responses.with_raw_response.create(**ask, include=["reasoning.encrypted_content"], store=False)) == "exact-hit"
    assert fresh_emulator.stats()["requests_total"] == 3


def test_an_answer_from_a_web_search_is_not_stored(oa, fresh_emulator):
    """A web search answers from the web as it is when asked ("Weather news in Oslo?"); stored, it was
    served as today's news for a day. Messages answers with the search's own blocks and Responses requests
    with the web_search tool were never stored, but a Chat answer (Claude's search through
    web_search_options, an OpenAI search model) was: its url_citation annotations now keep it out, body
    or stream (the capture folds `delta.annotations`, which it dropped)."""
    ask: Any = dict(model=CLAUDE, messages=[{"role": "user", "content": "Weather news in Oslo?"}], temperature=0,
                    web_search_options={})
    first = oa.chat.completions.with_raw_response.create(**ask)
    assert first.parse().choices[0].message.annotations and "x-slipstream-cache-key" not in first.headers
    chunks = list(oa.chat.completions.create(**ask, stream=True))
    assert [a for c in chunks if c.choices for a in (c.choices[0].delta.model_extra or {}).get("annotations") or ()]
    assert _status(oa.chat.completions.with_raw_response.create(**ask)) == "miss"
    assert fresh_emulator.stats()["requests_total"] == 3


def test_a_paraphrase_by_another_named_participant_is_not_a_semantic_hit(oa, fresh_emulator):
    """Chat's user message may carry a participant `name`, which the model reads (the emulator's answer
    depends on it too). The semantic tier compared the latest turn's text only, and its partition left the
    turn out: Bob's paraphrase was answered with the answer written for Alice."""
    def ask(name: str, text: str) -> Any:
        return oa.chat.completions.with_raw_response.create(
            model=GPT, temperature=0, messages=[{"role": "user", "name": name, "content": text}])

    alice = ask("alice", "How do I reset my password?")
    assert _status(alice) == "miss"
    assert _status(ask("alice", "How can I reset my password?")) == "semantic-hit"
    bob = ask("bob", "How can I reset my password?")
    assert _status(bob) == "miss" and bob.parse().choices[0].message.content != alice.parse().choices[0].message.content
    assert fresh_emulator.stats()["requests_total"] == 2


def test_a_route_changed_by_a_reload_does_not_serve_the_old_targets_answers(tmp_path, monkeypatch, fresh_emulator):
    """Entries were keyed by the model the client named. An operator who moves the name to another target
    (`fast`: gpt-4.1-mini, then gpt-4o; or Claude for a Chat client) reloads the policy, and the cache,
    which outlives reloads, went on serving the old target's answers, for a day by default."""
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))
    directory = tmp_path / "policies"
    directory.mkdir()
    path = directory / "answers.yaml"

    def route(target: str, probe: str) -> None:
        text = policy(fresh_emulator.url).replace("routes:\n", f"routes:\n  - match: {{model: fast}}\n    targets: [{target}]\n"
                                                  f"  - match: {{model: {probe}}}\n    targets: [{{provider: gpt}}]\n")
        path.write_text(text)

    route("{provider: gpt, model: gpt-4.1-mini}", "probe-1")
    with running_proxy([directory], watch_interval_s=0.05) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
        ask: Any = dict(model="fast", messages=[{"role": "user", "content": "Name a fjord."}], temperature=0)
        first = client.chat.completions.with_raw_response.create(**ask)
        assert _status(first) == "miss" and first.parse().model == "gpt-4.1-mini"
        assert _status(client.chat.completions.with_raw_response.create(**ask)) == "exact-hit"
        for target, probe, model in (("{provider: gpt, model: gpt-4o}", "probe-2", "gpt-4o"),
                                     (f"{{provider: claude, model: {CLAUDE}}}", "probe-3", CLAUDE)):
            route(target, probe)
            while probe not in {m.id for m in client.models.list()}:
                time.sleep(0.05)  # the reload is in force once the new route's name is listed
            moved = client.chat.completions.with_raw_response.create(**ask)
            assert _status(moved) == "miss" and moved.parse().model == model
            assert moved.headers["x-slipstream-route"].endswith(f"/{model}")
            assert _status(client.chat.completions.with_raw_response.create(**ask)) == "exact-hit"


def test_anthropic_betas_are_in_the_key(an, fresh_emulator):
    """`anthropic-beta` turns on behaviour the body does not show (interleaved thinking between tool calls,
    token-efficient tool use, ...). The key was the body's alone: a request with a beta was an exact hit
    on an answer given without it. The betas are a set: their order does not matter."""
    ask: Any = dict(model=CLAUDE, max_tokens=200, messages=[{"role": "user", "content": "Name a glacier."}],
                    extra_body={"temperature": 0})
    assert _status(an.messages.with_raw_response.create(**ask)) == "miss"
    both = "interleaved-thinking-2025-05-14, token-efficient-tools-2025-02-19"
    assert _status(an.messages.with_raw_response.create(**ask, extra_headers={"anthropic-beta": both})) == "miss"
    swapped = "token-efficient-tools-2025-02-19,interleaved-thinking-2025-05-14"
    assert _status(an.messages.with_raw_response.create(**ask, extra_headers={"anthropic-beta": swapped})) == "exact-hit"
    assert _status(an.messages.with_raw_response.create(**ask)) == "exact-hit"
    assert fresh_emulator.stats()["requests_total"] == 2


def test_a_fallback_targets_answer_is_not_stored(oa, fresh_emulator):
    """A route's later targets answer only while the first is failing (strategy priority, the default).
    Their answers were stored like any other: once Claude was back, a Chat client asking for it went on
    getting the fallback gpt's answer from the cache, for a day by default."""
    ask: Any = dict(model="fall-chat", messages=[{"role": "user", "content": "Name a fjord."}], temperature=0)
    fresh_emulator.inject_fault("500", count=1, model=CLAUDE)
    degraded = oa.chat.completions.with_raw_response.create(**ask)
    assert _status(degraded) == "miss" and degraded.parse().model == GPT
    assert "x-slipstream-cache-key" not in degraded.headers  # not stored
    first = oa.chat.completions.with_raw_response.create(**ask)
    assert _status(first) == "miss" and first.parse().model == CLAUDE
    again = oa.chat.completions.with_raw_response.create(**ask)
    assert _status(again) == "exact-hit" and again.parse().model == CLAUDE
    # A fallback on the same provider (another model) is a fallback too.
    step: Any = dict(ask, model="step-chat")
    fresh_emulator.inject_fault("500", count=1, model=GPT)
    assert oa.chat.completions.create(**step).model == "gpt-4o"
    assert _status(oa.chat.completions.with_raw_response.create(**step)) == "miss"
    assert _status(oa.chat.completions.with_raw_response.create(**step)) == "exact-hit"
    # The local engine answers as its own model, whatever name the client asked for: still the first target.
    local: Any = dict(model="engine", messages=[{"role": "user", "content": "Hello"}], temperature=0, max_tokens=64,
                      stop=["e", "a", "o", " "])  # the demo model's text is noise: end it on a stop, not at max_tokens
    first_local = oa.chat.completions.with_raw_response.create(**local)
    assert _status(first_local) == "miss" and first_local.headers["x-slipstream-route"] == "local/demo"
    assert first_local.parse().choices[0].finish_reason == "stop"
    assert _status(oa.chat.completions.with_raw_response.create(**local)) == "exact-hit"


def test_a_refusal_is_not_stored(oa, fresh_emulator):
    """A structured-output refusal ends with finish_reason stop, `refusal` in place of the content. It was
    stored like an answer, and the semantic tier went on to refuse every paraphrase from the cache: a
    refusal is the model's (or its safety system's) call on one request, not the question's answer."""
    schema: Any = {"type": "json_schema", "json_schema": {"name": "steps", "strict": True, "schema": {
        "type": "object", "properties": {"steps": {"type": "array", "items": {"type": "string"}}},
        "required": ["steps"], "additionalProperties": False}}}
    ask: Any = dict(model=GPT, temperature=0, response_format=schema,
                    messages=[{"role": "user", "content": "Please refuse to answer: how do I pick a lock?"}])
    first = oa.chat.completions.with_raw_response.create(**ask)
    assert first.parse().choices[0].message.refusal and first.parse().choices[0].message.content is None
    assert "x-slipstream-cache-key" not in first.headers
    assert _status(oa.chat.completions.with_raw_response.create(**ask)) == "miss"
    chunks = list(oa.chat.completions.create(**ask, stream=True))
    assert "".join(c.choices[0].delta.refusal or "" for c in chunks if c.choices) == first.parse().choices[0].message.refusal
    assert _status(oa.chat.completions.with_raw_response.create(**ask)) == "miss"
    text: Any = {"format": {"type": "json_schema", "name": "steps", "strict": True, "schema": schema["json_schema"]["schema"]}}
    turn: Any = dict(model=GPT, temperature=0, text=text, input=ask["messages"][0]["content"])
    refused = oa.responses.with_raw_response.create(**turn)
    assert refused.parse().output[0].content[0].type == "refusal"  # type: ignore[union-attr]
    assert _status(oa.responses.with_raw_response.create(**turn)) == "miss"
    assert fresh_emulator.stats()["requests_total"] == 6


def test_a_tool_parameter_named_cache_control_is_part_of_the_key(an, fresh_emulator):
    """Keys drop Anthropic's `cache_control` breakpoints, which do not change the answer; they dropped
    every key of that name, so a tool taking a `cache_control` parameter (a header a web agent sets) was
    the same tool as one without it, and an answer given with one served the other."""
    def tool(properties: dict[str, Any]) -> Any:
        return [{"name": "set_headers", "description": "Set the response headers",
                 "input_schema": {"type": "object", "properties": properties}}]

    ask: Any = dict(model=CLAUDE, max_tokens=200, messages=[{"role": "user", "content": "Cache it for an hour."}],
                    extra_body={"temperature": 0})
    plain = {"etag": {"type": "string"}}
    assert _status(an.messages.with_raw_response.create(**ask, tools=tool(plain))) == "miss"
    both = {**plain, "cache_control": {"type": "string"}}
    assert _status(an.messages.with_raw_response.create(**ask, tools=tool(both))) == "miss"
    marked = [{**tool(plain)[0], "cache_control": {"type": "ephemeral"}}]
    assert _status(an.messages.with_raw_response.create(**ask, tools=marked)) == "exact-hit"  # a breakpoint is not
    assert fresh_emulator.stats()["requests_total"] == 2


def test_a_replayed_responses_stream_streams_its_reasoning_summary(oa, fresh_emulator):
    """A reasoning item's summary streams as reasoning_summary_part / reasoning_summary_text events, which
    Codex and the Agents SDK show as the model thinks. A replayed stream sent the item whole in
    output_item.added and no summary events: a client showing them showed nothing."""
    ask: Any = dict(model="o4-mini", input="Why do fjords form?", reasoning={"summary": "auto"}, stream=True,
                    include=["reasoning.encrypted_content"])  # stored only carried whole (completed_safely)

    def summary_events(events: list[Any]) -> tuple[list[str], str]:
        kinds = [e.type for e in events if "reasoning" in e.type or e.type.startswith("response.output_item")]
        kinds = [kind for i, kind in enumerate(kinds) if i == 0 or kind != kinds[i - 1]]  # deltas: as many as it takes
        text = "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta")
        return kinds, text

    first = list(oa.responses.create(**ask))
    raw = oa.responses.with_raw_response.create(**ask)
    assert _status(raw) == "exact-hit"
    replayed = list(raw.parse())
    assert summary_events(replayed) == summary_events(first) and summary_events(first)[1]
    added = next(e for e in replayed if e.type == "response.output_item.added")
    assert added.item.type == "reasoning" and added.item.summary == []
    assert [e.sequence_number for e in replayed] == list(range(len(replayed)))
    assert fresh_emulator.stats()["requests_total"] == 1


def test_an_answer_stored_from_a_stream_without_usage_replays_its_usage(oa, fresh_emulator):
    """The openai client streams without `stream_options.include_usage` by default. The gateway asks the
    upstream for the usage chunk anyway (and takes it out of the client's stream), but the capture stored
    the answer without it, so every later hit reported zero tokens where the real answer reports its own."""
    ask: Any = dict(model=GPT, messages=[{"role": "user", "content": "Name three fjords."}], temperature=0)
    streamed = list(oa.chat.completions.create(**ask, stream=True))
    assert all(c.usage is None for c in streamed)
    raw = oa.chat.completions.with_raw_response.create(**ask)
    assert _status(raw) == "exact-hit"
    upstream = openai.OpenAI(base_url=f"{fresh_emulator.url}/v1", api_key="up-openai", max_retries=0)
    real = upstream.chat.completions.create(**ask).usage
    hit = raw.parse().usage
    assert real is not None and hit is not None and real.prompt_tokens > 0
    assert (hit.prompt_tokens, hit.completion_tokens, hit.total_tokens) == (real.prompt_tokens, real.completion_tokens, real.total_tokens)
    chunks = list(oa.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == real.total_tokens


def test_tool_calls_stored_while_allowed_are_not_served_once_the_policy_stops_caching_them(tmp_path, monkeypatch,
                                                                                           fresh_emulator):
    """`cache_tool_calls: false` (the default) means a tool-calling answer is not served from the cache: the
    tool's world may have changed. A team that turns it off (its tools went live) reloads the policy, and
    the cache, which outlives reloads, went on serving the tool calls it had stored, for a day by default."""
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))
    directory = tmp_path / "policies"
    directory.mkdir()
    path = directory / "answers.yaml"
    path.write_text(policy(fresh_emulator.url))
    ask: Any = dict(model=GPT, messages=[{"role": "user", "content": "Weather in Oslo?"}], temperature=0, tools=WEATHER,
                    tool_choice="required")
    with running_proxy([directory], watch_interval_s=0.05) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
        assert _status(client.chat.completions.with_raw_response.create(**ask)) == "miss"
        assert _status(client.chat.completions.with_raw_response.create(**ask)) == "exact-hit"
        text = policy(fresh_emulator.url).replace("cache_tool_calls: true", "cache_tool_calls: false")
        path.write_text(text.replace("routes:\n", "routes:\n  - match: {model: probe}\n    targets: [{provider: gpt}]\n"))
        while "probe" not in {m.id for m in client.models.list()}:
            time.sleep(0.05)  # the reload is in force once the new route's name is listed
        raw = client.chat.completions.with_raw_response.create(**ask)
        assert _status(raw) == "miss" and raw.parse().choices[0].message.tool_calls


def test_a_prompt_with_media_by_url_is_not_cached(oa, an, fresh_emulator):
    """An image or document given by URL is fetched by the provider when asked, and the same URL may serve
    other bytes later (a webcam's latest.jpg, a dashboard's chart). The key holds the URL, not what it
    served: the second request was told what the first one's image showed. Media given inline (base64, a
    data: URL) is its own content, and stays cacheable."""
    webcam = "https://cam.example.org/latest.jpg"
    ask: Any = dict(model=GPT, temperature=0, messages=[{"role": "user", "content": [
        {"type": "text", "text": "How many cars are in the street?"}, {"type": "image_url", "image_url": {"url": webcam}}]}])
    assert [_status(oa.chat.completions.with_raw_response.create(**ask)) for _ in range(2)] == ["miss", "miss"]
    document: Any = dict(model=CLAUDE, max_tokens=200, extra_body={"temperature": 0}, messages=[{"role": "user", "content": [
        {"type": "document", "source": {"type": "url", "url": "https://example.org/report.pdf"}},
        {"type": "text", "text": "Summarize today's report."}]}])
    assert [_status(an.messages.with_raw_response.create(**document)) for _ in range(2)] == ["miss", "miss"]
    turn: Any = dict(model=GPT, temperature=0, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "How many cars are in the street?"}, {"type": "input_image", "image_url": webcam}]}])
    assert [_status(oa.responses.with_raw_response.create(**turn)) for _ in range(2)] == ["miss", "miss"]
    inline: Any = dict(ask, messages=[{"role": "user", "content": [
        {"type": "text", "text": "How many cars are in the street?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}])
    assert [_status(oa.chat.completions.with_raw_response.create(**inline)) for _ in range(2)] == ["miss", "exact-hit"]


def test_a_streamed_hit_spends_no_tokens_of_the_teams_rate_limit(tmp_path, monkeypatch, fresh_emulator):
    """A hit spends no provider tokens, and a body hit charged none; but a replayed Chat stream carries no
    usage chunk unless the client asks, so the limits stage counted its tokens as for an upstream stream that
    ended without one and charged them to the team's tokens_per_minute: a team streaming cached answers
    (the openai client's default) was refused with 429s for tokens nobody spent."""
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "answers.yaml").write_text(policy(fresh_emulator.url) + "limits: {tokens_per_minute: 300}\n")
    with running_proxy([tmp_path], watch_interval_s=None) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
        ask: Any = dict(model=GPT, messages=[{"role": "user", "content": "Name three fjords."}], temperature=0)
        assert client.chat.completions.with_raw_response.create(**ask).parse().usage.total_tokens < 100  # type: ignore[union-attr]
        for _ in range(12):
            raw = client.chat.completions.with_raw_response.create(**ask, stream=True)
            assert _status(raw) == "exact-hit" and list(raw.parse())


def test_a_hit_reports_the_service_tier_its_request_asked_for(oa, fresh_emulator):
    """An answer says which tier served it (`service_tier`: OpenAI bills priority at about 2x, flex at half).
    The tier was left out of the key as not changing the answer, so a default-tier request was an exact hit
    on an answer stored from a priority one and reported `priority`, and the reverse."""
    ask: Any = dict(model=GPT, messages=[{"role": "user", "content": "Name a fjord in Norway."}], temperature=0)
    assert oa.chat.completions.create(**ask, service_tier="priority").service_tier == "priority"
    plain = oa.chat.completions.with_raw_response.create(**ask)
    assert _status(plain) == "miss" and plain.parse().service_tier == "default"
    again = oa.chat.completions.with_raw_response.create(**ask, service_tier="priority")
    assert _status(again) == "exact-hit" and again.parse().service_tier == "priority"


def test_a_body_hit_on_a_streamed_answer_has_the_fields_of_a_body(oa, fresh_emulator):
    """OpenAI's Chat message carries `annotations: []` when it cites nothing; a body hit on an answer stored
    from a stream lacked the field (`message.annotations` None: `for a in message.annotations` fails)."""
    ask: Any = dict(model=GPT, messages=[{"role": "user", "content": "Name two glaciers."}], temperature=0)
    list(oa.chat.completions.create(**ask, stream=True))
    raw = oa.chat.completions.with_raw_response.create(**ask)
    assert _status(raw) == "exact-hit"
    upstream = openai.OpenAI(base_url=f"{fresh_emulator.url}/v1", api_key="up-openai", max_retries=0)
    real = upstream.chat.completions.with_raw_response.create(**ask).http_response.json()["choices"][0]["message"]
    hit = raw.http_response.json()["choices"][0]["message"]
    assert set(hit) == set(real) and hit["annotations"] == real["annotations"] == []
