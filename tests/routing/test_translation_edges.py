"""Cross-protocol requests at the edges a fifth audit found: what real clients send that the
translation refused, mangled or could not map back (test_translation_models' sequel).

The official clients through the proxy (team key "sk-routing"), the emulator upstream.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from emulator.app import EmulatorConfig
from emulator.testing import running_emulator
from gateway.testing import running_proxy
from sdk.promptcache.keys import team_user
from sdk.routing.backoff import TranslationRefused
from sdk.routing.translation.responses_answers import completion_c2r
from sdk.routing.translation.responses_requests import responses_to_chat
from tests.routing.conftest import inject, policy_text, routed_proxy
from tests.routing.conftest import sent as _sent

ROUTES = """  - match: {model: "gpt-s46-*"}
    targets: [{provider: claude, model: claude-sonnet-4-6}]
  - match: {model: "gpt-*"}
    targets: [{provider: claude, model: claude-sonnet-4-5}]
  - match: {model: "claude-41-*"}
    targets: [{provider: gpt, model: gpt-4.1}]
  - match: {model: "claude-o3-*"}
    targets: [{provider: gpt, model: o3}]
  - match: {model: "claude-51-*"}
    targets: [{provider: gpt, model: gpt-5.1}]
  - match: {model: "claude-56-*"}
    targets: [{provider: gpt, model: gpt-5.6}]
  - match: {model: "claude-*"}
    targets: [{provider: gpt, model: gpt-4o}]"""

ASK = [{"role": "user", "content": "Weather in Oslo?"}]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    yield from routed_proxy(tmp_path_factory.mktemp("edges"), emulator.url, ROUTES)



def test_a_seed_reaches_claude_left_out_and_named(oa, fresh_emulator):
    """Eval harnesses (lm-eval, OpenAI's evals) send `seed` on every request; OpenAI itself documents it as
    best effort ("Determinism is not guaranteed"). It was a 400 for every Claude target."""
    raw = oa.chat.completions.with_raw_response.create(model="gpt-x", messages=ASK, seed=1234, temperature=0)
    assert raw.parse().choices[0].message.content
    assert "seed" in raw.headers["x-slipstream-dropped-fields"].split(",")
    sent = _sent(fresh_emulator)
    assert "seed" not in sent and sent["temperature"] == 0


def test_a_json_answer_in_a_code_fence_reaches_the_client_bare(oa, fresh_emulator):
    """Claude 4.6 and later take no prefill and often wrap "JSON and nothing else" in a ```json fence: the
    json_object answer was a 502 (not JSON), and a stream passed the fence on."""
    json_object: Any = {"type": "json_object"}
    answer = oa.chat.completions.create(model="gpt-s46-x", messages=ASK, response_format=json_object)
    assert _sent(fresh_emulator)["messages"][-1]["role"] == "user"  # no prefill for 4.6
    assert isinstance(json.loads(answer.choices[0].message.content or ""), dict)
    stream = oa.chat.completions.create(model="gpt-s46-x", messages=ASK, response_format=json_object, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert "```" not in text and isinstance(json.loads(text), dict)
    response = oa.responses.create(model="gpt-s46-x", input="Weather?", text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(response.output_text), dict)


def test_sampling_settings_reach_a_reasoning_openai_model_left_out_and_stops_it_takes_are_sent(an, fresh_emulator):
    """o3 and gpt-5 sample as they do: a Messages client's temperature 0.3 or top_p came back as OpenAI's 400
    ("Unsupported value: 'temperature' does not support 0.3 with this model"). They are left out and named.
    Up to 4 stop sequences go to a model that takes them (those it would refuse are the gateway's:
    test_translation_client_fields.py)."""
    raw = an.messages.with_raw_response.create(model="claude-o3-x", max_tokens=64, messages=ASK,
                                               extra_body={"temperature": 0.3, "top_p": 0.9})  # anthropic 2.x: no such arguments
    assert raw.parse().content
    assert {"temperature", "top_p"} <= set(raw.headers["x-slipstream-dropped-fields"].split(","))
    sent = _sent(fresh_emulator)
    assert sent["model"] == "o3" and "temperature" not in sent and "top_p" not in sent
    an.messages.create(model="claude-x", max_tokens=64, messages=ASK, stop_sequences=["a", "b", "c", "d"],
                       extra_body={"temperature": 0.3})
    assert _sent(fresh_emulator)["temperature"] == 0.3 and _sent(fresh_emulator)["stop"] == ["a", "b", "c", "d"]


def test_a_prompt_over_the_targets_context_window_is_the_clients_own_providers_overflow(tmp_path):
    """Claude Code compacts on Anthropic's 400 "prompt is too long: N tokens > M maximum", Codex and the
    Agents SDK on OpenAI's code context_length_exceeded. A translated target's overflow reached the
    client as the other provider's message under a plain 400, which neither recognises."""
    windows = {"claude-*": 300, "gpt-4o": 300}
    with running_emulator(EmulatorConfig(context_windows=windows)) as emulator:
        (tmp_path / "routing.yaml").write_text(policy_text(emulator.url, ROUTES))
        with running_proxy([tmp_path], watch_interval_s=None) as proxy:
            oa = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-routing", max_retries=0)
            an = anthropic.Anthropic(base_url=proxy.url, api_key="sk-routing", max_retries=0)
            long = [{"role": "user", "content": "fjord " * 2000}]
            with pytest.raises(openai.BadRequestError) as chat:
                oa.chat.completions.create(model="gpt-x", messages=long)  # type: ignore[arg-type]
            assert chat.value.code == "context_length_exceeded" and chat.value.param == "messages"
            assert re.search(r"This model's maximum context length is 300 tokens\. However, your messages resulted in \d+ tokens",
                            chat.value.message)
            with pytest.raises(openai.BadRequestError) as responses:
                oa.responses.create(model="gpt-x", input="fjord " * 2000, stream=True)
            # the Responses API's own words, naming `input` (Chat's "your messages resulted in", `messages`, before)
            assert responses.value.code == "context_length_exceeded" and responses.value.param == "input"
            assert responses.value.body["message"] == "Your input exceeds the context window of this model. Please adjust your input and try again."  # type: ignore[index]
            with pytest.raises(anthropic.BadRequestError) as messages:
                an.messages.create(model="claude-x", max_tokens=64, messages=long)  # type: ignore[arg-type]
            assert re.fullmatch(r"prompt is too long: \d+ tokens > 300 maximum", messages.value.body["error"]["message"])  # type: ignore[index]
            sent = [json.loads(request["body"])["model"] for request in emulator.state.recent]
            assert sent == ["claude-sonnet-4-5", "claude-sonnet-4-5", "gpt-4o"]  # each refused by its provider


def test_a_failure_mid_stream_reaches_a_responses_client_as_response_failed(oa, fresh_emulator):
    """Claude's mid-stream `overloaded_error` reached a Responses client as a Chat Completions error line
    (`data: {"error": …}`), which the SDK's Responses stream raised as a bare APIError and Codex could not
    read: OpenAI ends a failed Responses stream with an `error` event and the terminal `response.failed`."""
    inject(fresh_emulator, "midstream_error:events=4", model="claude-sonnet-4-5")
    events = list(oa.responses.create(model="gpt-x", input="Tell me about fjords.", stream=True))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-2:] == ["error", "response.failed"]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    failed = events[-1]
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert failed.response.error is not None and failed.response.error.code == "server_error"
    assert failed.response.error.message == "Overloaded"
    assert fresh_emulator.state.recent[-1]["path"] == "/v1/messages"


def test_a_tool_id_over_openais_40_characters_is_shortened_the_same_every_turn(an, fresh_emulator):
    """A Messages history can hold tool ids longer than OpenAI's 40 characters (another server's, e.g. a
    gateway's 64-character ids): OpenAI answered 400 "string too long" on every later turn. Each becomes
    `call_` and 35 hex digits of its SHA-256, the call and its result alike, the same on every turn."""
    long_id = "toolu_vrtx_" + "0123456789abcdef" * 4
    tools: Any = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    history: Any = [{"role": "user", "content": "Weather in Oslo?"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": long_id, "name": "get_weather", "input": {"city": "Oslo"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": long_id, "content": "Rain, 9°C"}]}]
    sent = []
    for _ in range(2):
        assert an.messages.create(model="claude-x", max_tokens=64, messages=history, tools=tools).content
        sent.append(_sent(fresh_emulator)["messages"])
    call_id = sent[0][1]["tool_calls"][0]["id"]
    assert len(call_id) == 40 and call_id.startswith("call_") and sent[0][2]["tool_call_id"] == call_id
    assert sent[1] == sent[0]  # the same prefix every turn
    short = "toolu_01A09q90qw90lq917835lq9"
    history[1]["content"][0]["id"] = history[2]["content"][0]["tool_use_id"] = short
    an.messages.create(model="claude-x", max_tokens=64, messages=history, tools=tools)
    assert _sent(fresh_emulator)["messages"][1]["tool_calls"][0]["id"] == short  # 40 or fewer: as it is


def test_a_one_hour_cache_marker_reaches_an_openai_model_with_extended_retention_as_24h(an, fresh_emulator):
    """Claude Code marks its prefix `ttl: "1h"` for sessions with gaps; OpenAI's in-memory retention lasts
    minutes. A model with extended retention (gpt-4.1, gpt-5, ...) now gets `prompt_cache_retention: "24h"`;
    one without it (gpt-4o) and a 5-minute marker get nothing, as before."""
    system: Any = [{"type": "text", "text": "You are a weather bot.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    raw = an.messages.with_raw_response.create(model="claude-41-x", max_tokens=32, system=system, messages=ASK)
    assert raw.parse().content and "cache_control" in raw.headers["x-slipstream-dropped-fields"].split(",")
    assert _sent(fresh_emulator)["prompt_cache_retention"] == "24h" and _sent(fresh_emulator)["model"] == "gpt-4.1"
    an.messages.create(model="claude-x", max_tokens=32, system=system, messages=ASK)
    assert "prompt_cache_retention" not in _sent(fresh_emulator)
    an.messages.create(model="claude-41-x", max_tokens=32, messages=ASK, cache_control={"type": "ephemeral"})
    assert "prompt_cache_retention" not in _sent(fresh_emulator)


def test_claude_cache_markers_reach_gpt_5_6_as_its_explicit_breakpoints(an, fresh_emulator):
    """gpt-5.6 and later read a cached prefix only where a breakpoint (`prompt_cache_breakpoint` on a content part) ends
    it; a Messages client's markers were all dropped, so a new session of a coding agent wrote its system prompt again
    instead of reading it. A marker on a system, user or tool-result block is now the breakpoint of the part made from
    it (`ttl: "1h"` as OpenAI's `12h`), the system prompt's parts joining to the same text; one on a tool or an
    assistant block, which OpenAI takes none on, is still dropped and named; gpt-4o gets none, as before."""
    one_hour, five_minutes = {"type": "ephemeral", "ttl": "1h"}, {"type": "ephemeral"}
    system: Any = [{"type": "text", "text": "You are a weather bot."}, {"type": "text", "text": "Be brief.", "cache_control": one_hour}]
    tools: Any = [{"name": "lookup", "input_schema": {"type": "object", "properties": {}}, "cache_control": five_minutes}]
    messages: Any = [{"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?", "cache_control": five_minutes}]},
                     {"role": "assistant", "content": [{"type": "text", "text": "Looking.", "cache_control": five_minutes},
                                                       {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "12 C",
                                                   "cache_control": five_minutes}]}]
    raw = an.messages.with_raw_response.create(model="claude-56-x", max_tokens=32, system=system, tools=tools, messages=messages)
    assert raw.parse().content and "cache_control" in raw.headers["x-slipstream-dropped-fields"].split(",")
    sent = _sent(fresh_emulator)
    assert sent["model"] == "gpt-5.6"
    assert sent["messages"][0] == {"role": "system", "content": [
        {"type": "text", "text": "You are a weather bot."},
        {"type": "text", "text": "\n\nBe brief.", "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "12h"}}]}
    assert sent["messages"][1]["content"] == [{"type": "text", "text": "Weather in Oslo?", "prompt_cache_breakpoint": {"mode": "explicit"}}]
    assert sent["messages"][2]["content"] == "Looking." and "prompt_cache_breakpoint" not in json.dumps(sent["tools"])
    assert sent["messages"][3]["content"] == [{"type": "text", "text": "12 C", "prompt_cache_breakpoint": {"mode": "explicit"}}]
    an.messages.create(model="claude-x", max_tokens=32, system=system, tools=tools, messages=messages)
    assert "prompt_cache_breakpoint" not in json.dumps(_sent(fresh_emulator))


def test_a_tool_name_over_openais_64_characters_is_shortened_and_given_back(an, fresh_emulator):
    """Claude takes tool names of 128 characters (a coding agent's MCP tools, `mcp__server__tool`); OpenAI answers a
    function name over 64 with a 400 ("string too long"), so every request carrying one failed. It goes as its first 55
    characters, `_` and 8 hex digits of its SHA-256, in the tools, the history's calls and tool_choice alike, the same
    every turn; the answer's calls of it carry the client's name again, streamed or not."""
    name = "mcp__knowledge_base_server__search_the_internal_engineering_handbook_pages"
    tools: Any = [{"name": name, "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}},
                  {"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}]
    history: Any = [{"role": "user", "content": "Search the handbook."},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": name, "input": {"query": "x"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Nothing."}]}]
    choice: Any = {"type": "tool", "name": name}
    message = an.messages.create(model="claude-x", max_tokens=64, messages=history, tools=tools, tool_choice=choice)
    assert [block.name for block in message.content if block.type == "tool_use"] == [name]
    sent = _sent(fresh_emulator)
    short = sent["tools"][0]["function"]["name"]
    assert len(short) == 64 and short.startswith(name[:55]) and sent["tools"][1]["function"]["name"] == "get_weather"
    assert sent["messages"][1]["tool_calls"][0]["function"]["name"] == short == sent["tool_choice"]["function"]["name"]
    with an.messages.stream(model="claude-x", max_tokens=64, messages=history, tools=tools, tool_choice=choice) as stream:
        streamed = stream.get_final_message()
    assert [block.name for block in streamed.content if block.type == "tool_use"] == [name]
    assert _sent(fresh_emulator)["tools"][0]["function"]["name"] == short  # the same every turn


def test_a_safety_identifier_reaches_claude_as_its_user_id(oa, fresh_emulator):
    """OpenAI asks clients to name their end user by `safety_identifier` (`user` is deprecated), for its abuse
    detection; Claude's counterpart is metadata.user_id, but the field was dropped, so Claude could tell no end user
    from another and held the whole key to account. It is metadata.user_id when no `user` is sent (Chat and
    Responses alike); beside a `user`, which goes there, it is dropped and named."""
    raw = oa.chat.completions.with_raw_response.create(model="gpt-x", messages=ASK, safety_identifier="user-7f3a")
    assert raw.parse().choices[0].message.content and "safety_identifier" not in raw.headers.get("x-slipstream-dropped-fields", "")
    assert _sent(fresh_emulator)["metadata"] == {"user_id": team_user("routing", "user-7f3a")}
    assert oa.responses.create(model="gpt-x", input="Weather in Oslo?", safety_identifier="user-9c1d").output_text
    assert _sent(fresh_emulator)["metadata"] == {"user_id": team_user("routing", "user-9c1d")}
    raw = oa.chat.completions.with_raw_response.create(model="gpt-x", messages=ASK, user="alice", safety_identifier="user-7f3a")
    assert raw.parse().choices[0].message.content and "safety_identifier" in raw.headers["x-slipstream-dropped-fields"].split(",")
    assert _sent(fresh_emulator)["metadata"] == {"user_id": team_user("routing", "alice")}


def test_thinking_between_tools_reaches_an_openai_model_as_thinking_off(an, fresh_emulator):
    """anthropic 2.x's `thinking: {"type": "between_tools"}` (thinking turned off; the short progress notes a model
    writes between tool calls come back as thinking blocks) was a 400 for every OpenAI target, a thinking type the
    translation did not know. It is thinking off, as `disabled`: left out and named, no reasoning_effort asked of a
    model that reasons (o3) or of one that does not (gpt-4o)."""
    for model, upstream in (("claude-o3-x", "o3"), ("claude-x", "gpt-4o")):
        raw = an.messages.with_raw_response.create(model=model, max_tokens=64, messages=ASK, thinking={"type": "between_tools"})
        assert raw.parse().content and "thinking" in raw.headers["x-slipstream-dropped-fields"].split(",")
        sent = _sent(fresh_emulator)
        assert sent["model"] == upstream and "reasoning_effort" not in sent


def test_prompt_cache_options_reach_claude_left_out_and_named(oa, fresh_emulator):
    """openai 3.x sends `prompt_cache_options` (gpt-5.6's cache mode and 30-minute lifetime): it was not in
    the field table, so a Claude target refused it as unknown. It says how OpenAI caches, not what the
    answer is: left out, and named."""
    raw = oa.chat.completions.with_raw_response.create(model="gpt-x", messages=ASK, prompt_cache_options={"ttl": "30m"})
    assert raw.parse().choices[0].message.content and "prompt_cache_options" in raw.headers["x-slipstream-dropped-fields"]
    raw_response = oa.responses.with_raw_response.create(model="gpt-x", input="Hi", prompt_cache_options={"mode": "implicit"})
    assert raw_response.parse().output_text and "prompt_cache_options" in raw_response.headers["x-slipstream-dropped-fields"]
    assert "prompt_cache_options" not in _sent(fresh_emulator)


def test_a_temperature_reaches_gpt_5_1_at_its_default_effort_none_and_is_left_out_when_it_reasons(an, fresh_emulator):
    """gpt-5.1 to 5.5 take temperature and top_p at reasoning effort none (OpenAI's GPT-5.1/5.2 guides), which is
    sent with them (a Messages request without thinking asks for none); a Messages client's temperature 0 was left out
    for every reasoning model, so its answers were sampled at 1. Asking the model to reason (thinking enabled,
    output_config.effort) still leaves them out, as before."""
    raw = an.messages.with_raw_response.create(model="claude-51-x", max_tokens=64, messages=ASK,
                                               extra_body={"temperature": 0, "top_p": 0.5})
    assert raw.parse().content and "temperature" not in raw.headers.get("x-slipstream-dropped-fields", "")
    sent = _sent(fresh_emulator)
    assert sent["model"] == "gpt-5.1" and sent["temperature"] == 0 and sent["top_p"] == 0.5 and sent["reasoning_effort"] == "none"
    raw = an.messages.with_raw_response.create(model="claude-51-x", max_tokens=2048, messages=ASK,
                                               thinking={"type": "enabled", "budget_tokens": 1024}, extra_body={"temperature": 0})
    assert "temperature" in raw.headers["x-slipstream-dropped-fields"].split(",")
    sent = _sent(fresh_emulator)
    assert sent["reasoning_effort"] == "low" and "temperature" not in sent


def test_a_file_by_url_reaches_claude_as_a_url_document(oa, fresh_emulator):
    """Codex and the Agents SDK send a PDF as `input_file` with `file_url`; Claude reads PDFs by URL (a document's
    `url` source), but the request was refused for every translated target. A Chat target still refuses it (Chat
    Completions takes files inline only), naming the part."""
    url = "https://example.com/report.pdf"
    ask: Any = [{"role": "user", "content": [{"type": "input_text", "text": "Summarize this."},
                                             {"type": "input_file", "file_url": url}]}]
    assert oa.responses.create(model="gpt-x", input=ask).output_text
    content = _sent(fresh_emulator)["messages"][0]["content"]
    assert content[1] == {"type": "document", "source": {"type": "url", "url": url}}
    with pytest.raises(TranslationRefused, match=r"input\.0\.content\.1: a 'input_file' part given by file_id or URL"):
        responses_to_chat({"model": "gpt-4.1", "input": ask}, "Chat Completions")


def test_web_search_reaches_claude_as_its_web_search_tool_and_its_citations_come_back(oa, fresh_emulator):
    """Codex, the Agents SDK's WebSearchTool and the Vercel AI SDK send the Responses `web_search` tool; Claude has
    the same in its web search server tool, but the request was refused for every translated target. It reaches
    Claude as web_search_20250305 (user location and allowed domains carried), and Claude's citations come back as
    url_citation annotations, streamed or not; a later turn's web_search_call item is left out, not refused; Chat's
    web_search_options take the same way. A Chat Completions target still refuses the tool."""
    tools: Any = [{"type": "web_search", "user_location": {"type": "approximate", "city": "Oslo", "country": "NO"},
                   "filters": {"allowed_domains": ["yr.no"]}},
                  {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}]
    raw = oa.responses.with_raw_response.create(model="gpt-x", input="Weather news in Oslo?", tools=tools,
                                                include=["web_search_call.action.sources"])
    sent = _sent(fresh_emulator)
    assert sent["tools"][-1] == {"type": "web_search_20250305", "name": "web_search", "max_uses": 5, "allowed_domains": ["yr.no"],
                                 "user_location": {"type": "approximate", "city": "Oslo", "country": "NO"}}
    assert [tool.get("name") for tool in sent["tools"]] == ["get_weather", "web_search"]
    assert "include.web_search_call.action.sources" in raw.headers["x-slipstream-dropped-fields"]
    part = raw.parse().output[-1].content[0]  # type: ignore[union-attr]  # after the search's web_search_call item
    cited = part.annotations[0]  # type: ignore[union-attr]
    assert cited.type == "url_citation" and cited.url.startswith("https://yr.no/")  # type: ignore[union-attr]
    assert (cited.start_index, cited.end_index) == (0, len(part.text))  # type: ignore[union-attr]
    events = list(oa.responses.create(model="gpt-x", input="Weather news in Oslo?", tools=tools, stream=True))
    added = [e for e in events if e.type == "response.output_text.annotation.added"]
    final = events[-1].response.output[-1].content[0]  # type: ignore[union-attr]
    assert len(added) == 1 and added[0].annotation.url == cited.url  # type: ignore[union-attr]
    assert final.annotations[0].url == cited.url and not any("function_call" in e.type for e in events)  # type: ignore[union-attr]
    history: Any = [{"role": "user", "content": "Weather news in Oslo?"},
                    {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "Oslo"}},
                    {"role": "assistant", "content": [{"type": "output_text", "text": "Rain.", "annotations": []}]},
                    {"role": "user", "content": "And tomorrow?"}]
    assert oa.responses.create(model="gpt-x", input=history, tools=tools).output_text
    assert [m["role"] for m in _sent(fresh_emulator)["messages"]] == ["user", "assistant", "user"]
    chat = oa.chat.completions.with_raw_response.create(model="gpt-x", messages=ASK, web_search_options={"search_context_size": "low"})
    assert chat.parse().choices[0].message.annotations[0].url_citation.url.startswith("https://")  # type: ignore[index]
    assert chat.headers["x-slipstream-dropped-fields"] == "web_search_options.search_context_size"
    function: Any = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    chunks = list(oa.chat.completions.create(model="gpt-x", messages=ASK, web_search_options={}, tools=function, stream=True))
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)  # the search's query is not a call of f
    with pytest.raises(TranslationRefused, match=r"tools\.0: the built-in tool 'web_search'"):
        responses_to_chat({"model": "gpt-4.1", "input": "news?", "tools": tools}, "Chat Completions")


def test_an_openai_models_reasoning_reaches_a_messages_client_as_thinking_tokens(an, fresh_emulator):
    """A reasoning model's hidden reasoning (completion_tokens_details.reasoning_tokens) is Claude's
    output_tokens_details.thinking_tokens, within output_tokens as it is within completion_tokens: it was left
    out, so a Messages client (Claude Code asks for thinking on every turn) could not tell reasoning from answer."""
    ask: dict[str, Any] = {"model": "claude-o3-x", "max_tokens": 4096, "messages": ASK,
                           "thinking": {"type": "enabled", "budget_tokens": 2048}}  # low: 8 reasoning tokens
    answer = an.messages.create(**ask)
    assert _sent(fresh_emulator)["reasoning_effort"] == "low"
    details = answer.usage.output_tokens_details
    assert details is not None and details.thinking_tokens == 8 and answer.usage.output_tokens > 8
    deltas = [e for e in an.messages.create(**ask, stream=True) if e.type == "message_delta"]
    streamed = deltas[-1].usage.output_tokens_details
    assert streamed is not None and streamed.thinking_tokens == 8
    plain = an.messages.create(model="claude-41-x", max_tokens=64, messages=ASK)  # no reasoning: no breakdown
    assert plain.usage.output_tokens_details is None


def test_openai_3x_request_options_reach_claude_dropped_and_named_and_moderation_is_refused(oa, fresh_emulator):
    """openai 3.x's Responses options that say how OpenAI runs a request (server-side compaction, image
    compression, its Cyber access programs, a background run's options) are left out and named; they were 400s
    as fields the gateway did not know. `moderation` (Chat and Responses), whose `block` withholds a flagged
    answer, is a 400 naming it: dropping it would pass text the client asked to have moderated."""
    raw = oa.responses.with_raw_response.create(
        model="gpt-x", input="Weather in Oslo?", context_management=[{"type": "compaction", "compact_threshold": 200000}],
        image={"context_compression": "auto"}, access_programs={"cyber": "standard"},
        background_options={"completion_window": "soonest"})
    assert raw.parse().output_text
    named = raw.headers["x-slipstream-dropped-fields"].split(",")
    assert {"context_management", "image", "access_programs", "background_options"} <= set(named)
    assert not {"context_management", "image", "access_programs", "background_options"} & set(_sent(fresh_emulator))
    moderation: Any = {"model": "omni-moderation-latest", "policy": {"output": {"mode": "block"}}}
    with pytest.raises(openai.BadRequestError, match=r"'moderation' cannot be translated"):
        oa.chat.completions.create(model="gpt-x", messages=ASK, moderation=moderation)
    with pytest.raises(openai.BadRequestError, match=r"'moderation' cannot be translated"):
        oa.responses.create(model="gpt-x", input="Weather in Oslo?", moderation=moderation)


def test_an_empty_stop_sequences_list_reaches_a_reasoning_openai_model_left_out(an, fresh_emulator):
    """`stop_sequences: []` stops nothing; it went on as `stop: []`, a parameter OpenAI's reasoning models answer
    with a 400 ('Unsupported parameter: 'stop' is not supported with this model'), whatever its value."""
    raw = an.messages.with_raw_response.create(model="claude-o3-x", max_tokens=64, messages=ASK, stop_sequences=[])
    assert raw.parse().stop_reason == "end_turn" and "stop_sequences" in raw.headers["x-slipstream-dropped-fields"].split(",")
    assert "stop" not in _sent(fresh_emulator)


def test_codex_namespace_tools_reach_claude_and_their_calls_come_back_namespaced(oa, fresh_emulator):
    """openai 3.x's namespace tools (Codex groups its collaboration tools and each MCP app's tools so) were a 400
    for every translated target ('the built-in tool 'namespace''). Each tool of a namespace reaches Claude as a
    tool of its own, NAMESPACE__NAME; Claude's call of it comes back as the tool's name and its namespace, in a
    body and a stream, and the history's namespaced calls go back by the joined name."""
    spawn = {"type": "function", "name": "spawn_agent", "description": "Spawns an agent.",
             "parameters": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}}
    tools: Any = [{"type": "namespace", "name": "collaboration", "description": "Work with other agents.", "tools": [spawn]}]
    answer = oa.responses.create(model="gpt-x", input="Hand this to a helper.", tools=tools, tool_choice="required")
    sent_tools = _sent(fresh_emulator)["tools"]
    assert [t["name"] for t in sent_tools] == ["collaboration__spawn_agent"]
    assert "Work with other agents." in sent_tools[0]["description"]
    call = answer.output[-1]
    assert call.type == "function_call" and (call.name, call.namespace) == ("spawn_agent", "collaboration")
    with oa.responses.stream(model="gpt-x", input="Hand this to a helper.", tools=tools, tool_choice="required") as stream:
        added = [e.item for e in stream if e.type == "response.output_item.added" and e.item.type == "function_call"]
        final = stream.get_final_response()
    assert (added[0].name, added[0].namespace) == ("spawn_agent", "collaboration")
    assert (final.output[-1].name, final.output[-1].namespace) == ("spawn_agent", "collaboration")  # type: ignore[union-attr]
    history: Any = [{"role": "user", "content": "Hand this to a helper."},
                    {"type": "function_call", "call_id": call.call_id, "name": "spawn_agent", "namespace": "collaboration",
                     "arguments": call.arguments},
                    {"type": "function_call_output", "call_id": call.call_id, "output": "agent started"}]
    assert oa.responses.create(model="gpt-x", input=history, tools=tools).output_text
    used = [b for m in _sent(fresh_emulator)["messages"] for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_use"]
    assert [b["name"] for b in used] == ["collaboration__spawn_agent"]


def test_claude_codes_tool_search_results_reach_an_openai_model(an, fresh_emulator):
    """Claude Code defers its MCP and rarer tools (`defer_loading: true`) and loads them with its ToolSearch tool,
    whose result holds `tool_reference` blocks; from then on every request of the session was a 400 for an OpenAI
    target ('a 'tool_reference' block cannot be translated'). The tools go from the start, and the reference says
    which was loaded, by the name the model knows it by."""
    long_name = "mcp__" + "workspace_files_" * 4 + "grep"  # over OpenAI's 64 characters: shortened
    tools: Any = [{"name": "ToolSearch", "description": "Load deferred tools", "input_schema": {
                       "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}},
                  {"name": long_name, "description": "Search files", "defer_loading": True, "input_schema": {
                       "type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]}}]
    turns: Any = [{"role": "user", "content": "Find the TODOs."},
                  {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "ToolSearch",
                                                     "input": {"query": f"select:{long_name}"}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                "content": [{"type": "tool_reference", "tool_name": long_name}]}]}]
    assert an.messages.create(model="claude-x", max_tokens=64, messages=turns, tools=tools).content
    sent = _sent(fresh_emulator)
    known = [t["function"]["name"] for t in sent["tools"]]
    assert known[0] == "ToolSearch" and len(known[1]) == 64 and "defer_loading" not in sent["tools"][1]["function"]
    assert sent["messages"][-1] == {"role": "tool", "tool_call_id": "toolu_1", "content": f"Tool loaded: {known[1]}"}


def test_a_claude_tools_input_examples_reach_an_openai_model_in_its_description(an, fresh_emulator):
    """Claude shows a tool's `input_examples` to the model (the Vercel AI SDK sends a tool's inputExamples so);
    they were left out without a word for an OpenAI target. They end the function's description."""
    tools: Any = [{"name": "get_weather", "description": "Weather for a city", "input_examples": [{"city": "Oslo"}, {"city": "Lima"}],
                   "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    assert an.messages.create(model="claude-x", max_tokens=64, messages=ASK, tools=tools).content
    described = _sent(fresh_emulator)["tools"][0]["function"]["description"]
    assert described == 'Weather for a city\n\nExample inputs:\n{"city":"Oslo"}\n{"city":"Lima"}'


def test_search_results_reach_an_openai_model_as_their_text(an, fresh_emulator):
    """Claude takes a RAG tool's (or the client's own) sources as search_result blocks; they were a 400 for an
    OpenAI target. Without citations, which a Chat model cannot give, each is its text under its title and source."""
    found: Any = {"type": "search_result", "source": "https://wiki.example/oslo", "title": "Oslo climate",
                  "content": [{"type": "text", "text": "Mild summers."}, {"type": "text", "text": "Snowy winters."}]}
    turns: Any = [{"role": "user", "content": [found, {"type": "text", "text": "Summarize."}]}]
    assert an.messages.create(model="claude-x", max_tokens=64, messages=turns).content
    expected = "Oslo climate\nSource: https://wiki.example/oslo\n\nMild summers.\n\nSnowy winters."
    assert _sent(fresh_emulator)["messages"][-1]["content"][0] == {"type": "text", "text": expected}
    cited = {**found, "citations": {"enabled": True}}
    with pytest.raises(anthropic.BadRequestError, match="a search result with citations cannot be translated"):
        an.messages.create(model="claude-x", max_tokens=64, messages=[{"role": "user", "content": [cited]}])


def test_an_allowed_tools_choice_reaches_claude_as_only_those_tools(oa, fresh_emulator):
    """OpenAI's allowed_tools choice (the model may call only these, `required`: one of them; GPT-5's guide keeps
    the whole tool list for the cache and narrows it so) was a 400 for a Claude target, which has no such choice.
    Claude is sent only the allowed tools, with auto or any; a Responses client's too."""
    def function(name: str) -> Any:
        return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
    choice: Any = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "get_time"}}]}}
    answer = oa.chat.completions.create(model="gpt-x", messages=ASK, tools=[function("get_weather"), function("get_time")],
                                        tool_choice=choice)
    sent = _sent(fresh_emulator)
    assert [t["name"] for t in sent["tools"]] == ["get_time"] and sent["tool_choice"] == {"type": "any"}
    assert [c.function.name for c in answer.choices[0].message.tool_calls or ()] == ["get_time"]  # type: ignore[union-attr]
    tools: Any = [{"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}
                  for name in ("get_weather", "get_time")]
    oa.responses.create(model="gpt-x", input="Weather in Oslo?", tools=tools,
                        tool_choice={"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "get_weather"}]})
    sent = _sent(fresh_emulator)
    assert [t["name"] for t in sent["tools"]] == ["get_weather"] and sent["tool_choice"] == {"type": "auto"}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tools", [True, "search", {"type": "function"}])
def test_tools_that_are_not_an_array_are_the_clients_400(oa, fresh_emulator, tools, stream):
    """A Responses `tools` that is not an array reached a translated target as no tools at all (the
    namespace flattening skipped it) and the answer's echo of it then failed: a 500 (found by the
    fuzz test). It is the client's 400 again, naming `tools`, before anything is sent."""
    with pytest.raises(openai.BadRequestError) as refused:
        oa.responses.create(model="gpt-x", input="hi", tools=tools, stream=stream)
    assert "tools" in refused.value.message
    assert not fresh_emulator.app.state.recent


SEARCH: Any = {"type": "tool_search", "execution": "client", "description": "Search the MCP tools.",
               "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}
SHELL: Any = {"type": "function", "name": "shell", "description": "Run a command.",
              "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}


def test_codexs_client_run_tool_search_reaches_claude_and_its_calls_come_back_as_searches(oa, fresh_emulator):
    """Codex (0.144 and later) offers its MCP tools behind a tool search it runs itself (`{"type": "tool_search",
    "execution": "client"}`), on every request: every Codex request was a 400 for a translated target ('the
    built-in tool 'tool_search''). The search goes as a function `tool_search`; Claude's call of it comes back as
    a `tool_search_call` item (body and stream), and the history's search and its output go as that function's
    call and result, the tools it loaded offered from then on."""
    answer = oa.responses.create(model="gpt-x", input="List the open issues.", tools=[SEARCH, SHELL], tool_choice="required")
    sent = _sent(fresh_emulator)
    assert [t["name"] for t in sent["tools"]] == ["tool_search", "shell"]
    assert sent["tools"][0]["description"] == "Search the MCP tools." and sent["tools"][0]["input_schema"]["required"] == ["query"]
    call: Any = answer.output[-1]
    assert (call.type, call.execution, call.status) == ("tool_search_call", "client", "completed")
    assert isinstance(call.arguments, dict) and "query" in call.arguments and call.call_id
    with oa.responses.stream(model="gpt-x", input="List the open issues.", tools=[SEARCH, SHELL], tool_choice="required") as stream:
        added = [e.item.type for e in stream if e.type == "response.output_item.added"]
        final: Any = stream.get_final_response()
    assert added == ["tool_search_call"] and final.output[-1].type == "tool_search_call"
    assert isinstance(final.output[-1].arguments, dict) and "query" in final.output[-1].arguments
    # The next turn: the search and what it loaded (an MCP app's namespace, as Codex loads them) in the history.
    tracker = {"type": "namespace", "name": "mcp__tracker", "description": "The issue tracker.", "tools": [
        {"type": "function", "name": "list_issues", "defer_loading": True,
         "parameters": {"type": "object", "properties": {"state": {"type": "string"}}, "required": ["state"]}}]}
    history: Any = [{"role": "user", "content": "List the open issues."},
                    {"type": "tool_search_call", "call_id": "call_s1", "execution": "client", "status": "completed",
                     "arguments": {"query": "issues"}},
                    {"type": "tool_search_output", "call_id": "call_s1", "execution": "client", "status": "completed",
                     "tools": [tracker]}]
    assert oa.responses.create(model="gpt-x", input=history, tools=[SEARCH, SHELL]).output
    sent = _sent(fresh_emulator)
    assert [t["name"] for t in sent["tools"]] == ["tool_search", "shell", "mcp__tracker__list_issues"]
    assert "defer_loading" not in sent["tools"][2]
    used = sent["messages"][1]["content"][0]
    assert (used["type"], used["name"], used["input"]) == ("tool_use", "tool_search", {"query": "issues"})
    result = sent["messages"][2]["content"][0]
    assert result["tool_use_id"] == used["id"] and "Tools loaded: mcp__tracker__list_issues" in json.dumps(result["content"])
    # Claude's call of a loaded namespace tool comes back by the tool's name and its namespace.
    chat = {"choices": [{"message": {"tool_calls": [{"id": "call_2", "type": "function", "function": {
        "name": "mcp__tracker__list_issues", "arguments": '{"state": "open"}'}}]}, "finish_reason": "tool_calls"}]}
    item = json.loads(completion_c2r({"model": "gpt-x", "input": history, "tools": [SEARCH]}, "resp_1", json.dumps(chat).encode()))
    assert [(o["type"], o["name"], o["namespace"]) for o in item["output"]] == [("function_call", "list_issues", "mcp__tracker")]


def test_a_provider_run_tool_search_reaches_claude_with_its_deferred_tools_from_the_start(oa, fresh_emulator):
    """OpenAI's hosted tool search (execution server, its default) has no counterpart on Claude through Chat: it
    was a 400. It is left out and named, and the tools it would have searched are offered from the start; the
    history's searches run by the provider hold nothing another model reads. Tools an `additional_tools` item adds
    mid-conversation (a 400 too) are offered from the start. A function named `tool_search` beside a client-run
    search is refused: its calls could not be told apart."""
    deferred = {**SHELL, "defer_loading": True}
    history: Any = [{"role": "user", "content": "Run ls."},
                    {"type": "tool_search_call", "id": "tsc_1", "execution": "server", "status": "completed", "arguments": {"q": "sh"}},
                    {"type": "tool_search_output", "id": "tso_1", "execution": "server", "status": "completed", "tools": [deferred]}]
    raw = oa.responses.with_raw_response.create(model="gpt-x", input=history, tools=[{"type": "tool_search"}, deferred])
    assert raw.parse().output and "tools.tool_search" in raw.headers["x-slipstream-dropped-fields"].split(",")
    sent = _sent(fresh_emulator)
    assert [t["name"] for t in sent["tools"]] == ["shell"] and "defer_loading" not in sent["tools"][0]
    assert [m["role"] for m in sent["messages"]] == ["user"]
    added: Any = [{"role": "user", "content": "Run ls."}, {"type": "additional_tools", "role": "developer", "tools": [SHELL]}]
    assert oa.responses.create(model="gpt-x", input=added).output  # tools added mid-conversation: offered from the start
    assert [t["name"] for t in _sent(fresh_emulator)["tools"]] == ["shell"]
    clash = {**SHELL, "name": "tool_search"}
    with pytest.raises(openai.BadRequestError, match="a tool named 'tool_search' beside the built-in tool_search tool"):
        oa.responses.create(model="gpt-x", input="Run ls.", tools=[SEARCH, clash])


def test_anthropics_tool_search_reaches_an_openai_model_with_its_deferred_tools_from_the_start(an, fresh_emulator):
    """Anthropic's tool search server tool loads `defer_loading` tools as Claude asks for them; a Messages request
    offering it was a 400 for an OpenAI target ('server tool 'tool_search_tool_regex_20251119''). It is left out
    and named, the deferred tools are offered from the start, and the history's searches are left out."""
    weather = {"name": "get_weather", "description": "Weather for a city", "defer_loading": True,
               "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    tools: Any = [{"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"}, weather]
    turns: Any = [{"role": "user", "content": "Weather in Oslo?"},
                  {"role": "assistant", "content": [
                      {"type": "server_tool_use", "id": "srvtoolu_1", "name": "tool_search_tool_regex", "input": {"query": "weather"}},
                      {"type": "tool_search_tool_result", "tool_use_id": "srvtoolu_1", "content": {
                          "type": "tool_search_tool_search_result", "tool_references": [{"type": "tool_reference", "tool_name": "get_weather"}]}},
                      {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Mild."}]}]
    raw = an.messages.with_raw_response.create(model="claude-x", max_tokens=64, messages=turns, tools=tools)
    assert raw.parse().content and "tools.tool_search_tool_regex_20251119" in raw.headers["x-slipstream-dropped-fields"].split(",")
    sent = _sent(fresh_emulator)
    assert [t["function"]["name"] for t in sent["tools"]] == ["get_weather"] and "defer_loading" not in sent["tools"][0]["function"]
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "tool"]
    assert [c["function"]["name"] for c in sent["messages"][1]["tool_calls"]] == ["get_weather"]
