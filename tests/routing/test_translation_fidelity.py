"""What real clients send across protocols reaches the other side whole (a third audit of the translation).

Each test is a request shaped as an official client or a common framework sends it, through the proxy (team key
"sk-routing") with the official client, the emulator as the upstream of the other protocol; each failed on the code
before its fix, where part of the request was left out without a word or refused.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from emulator.app import EmulatorConfig
from emulator.caching import count_input_tokens
from emulator.testing import running_emulator
from gateway.testing import running_proxy
from sdk.routing.translation import truncation
from tests.routing.conftest import policy_text, routed_proxy, sent

ROUTES = """  - match: {model: "claude-sonnet-*"}
    targets: [{provider: claude}]
  - match: {model: "claude-56-*"}
    targets: [{provider: gpt, model: gpt-5.6}]
  - match: {model: "claude-*"}
    targets: [{provider: gpt, model: gpt-4o}]
  - match: {model: "gpt-*"}
    targets: [{provider: claude, model: claude-sonnet-4-5}]"""
EPHEMERAL = {"type": "ephemeral"}
PDF = base64.b64encode(b"%PDF-1.4\n%%EOF\n").decode()


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    yield from routed_proxy(tmp_path_factory.mktemp("fidelity"), emulator.url, ROUTES)


def _user_parts(emulator) -> list[dict[str, Any]]:
    """The content parts of the last user message the upstream was sent."""
    return [m for m in sent(emulator)["messages"] if m["role"] == "user"][-1]["content"]


def test_a_documents_title_and_context_reach_an_openai_model(an, fresh_emulator):
    """The Vercel AI SDK's anthropic provider sends a file as a document titled by its name, with the provider options'
    `context`; Claude is given both with the document. An OpenAI model is given them too: they lead a text document's
    text, and a PDF's context is a text part before the file (named by its title), where both were left out silently.
    For a model that takes explicit breakpoints, the PDF's marker is on the file, where the block ends."""
    notes = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "Ship on Friday."},
             "title": "notes.txt", "context": "Minutes of the planning meeting."}
    report = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
              "title": "report.pdf", "context": "The quarterly report."}
    question = {"type": "text", "text": "When do we ship?"}
    an.messages.create(model="claude-x", max_tokens=32, messages=[{"role": "user", "content": [notes, report, question]}])
    assert _user_parts(fresh_emulator) == [
        {"type": "text", "text": "notes.txt\nMinutes of the planning meeting.\n\nShip on Friday."},
        {"type": "text", "text": "The quarterly report."},
        {"type": "file", "file": {"filename": "report.pdf", "file_data": f"data:application/pdf;base64,{PDF}"}},
        question]

    an.messages.create(model="claude-56-x", max_tokens=32, messages=[{"role": "user", "content": [
        {**report, "cache_control": EPHEMERAL}, question]}])
    parts = _user_parts(fresh_emulator)
    assert parts[0] == {"type": "text", "text": "The quarterly report."}
    assert parts[1]["type"] == "file" and parts[1]["prompt_cache_breakpoint"] == {"mode": "explicit"}


def test_an_image_that_must_not_be_scaled_down_is_refused_for_an_openai_model(an, fresh_emulator):
    """anthropic 2.x's `transformations: {oversized_image: "error"}` asks for a 400 rather than an image scaled down
    without a word, which is what an OpenAI model does with a large one: refused, naming it, where it was dropped and the
    request sent. `downsize`, Claude's default and OpenAI's way, reaches the upstream."""
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/plan.png"}}
    question = {"type": "text", "text": "What does the plan show?"}
    with pytest.raises(anthropic.BadRequestError) as refused:
        an.messages.create(model="claude-x", max_tokens=32, messages=[{"role": "user", "content": [
            {**image, "transformations": {"oversized_image": "error"}}, question]}])
    assert refused.value.body["error"]["message"].startswith("messages.0.content.0.transformations.oversized_image: 'error'")
    assert not fresh_emulator.state.recent
    an.messages.create(model="claude-x", max_tokens=32, messages=[{"role": "user", "content": [
        {**image, "transformations": {"oversized_image": "downsize"}}, question]}])
    assert _user_parts(fresh_emulator) == [{"type": "image_url", "image_url": {"url": "https://example.com/plan.png"}}, question]


def test_a_limit_on_built_in_tool_calls_reaches_claude_where_it_limits_nothing(oa, fresh_emulator):
    """openai-agents (ModelSettings.max_tool_calls) and the Vercel AI SDK (maxToolCalls) send `max_tool_calls`, which
    limits built-in tools' calls only. With function tools alone it changes nothing: the request reaches Claude, the
    field named dropped and echoed by the response, where it was refused. Beside a built-in tool that the target would
    not limit (here a client-run shell), still refused, naming both."""
    function = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}, "strict": False}
    raw = oa.responses.with_raw_response.create(model="gpt-x", input="Weather in Oslo?", tools=[function], max_tool_calls=2)
    assert "max_tool_calls" in raw.headers["x-slipstream-dropped-fields"].split(",")
    assert raw.parse().max_tool_calls == 2 and "max_tool_calls" not in sent(fresh_emulator)
    with pytest.raises(openai.BadRequestError, match="'max_tool_calls' beside the built-in tool 'shell'"):
        oa.responses.create(model="gpt-x", input="List the files.", max_tool_calls=2,
                            tools=[function, {"type": "shell", "environment": {"type": "local"}}])


def _markers(body: Any) -> int:
    """The `cache_control` markers anywhere in `body`."""
    if isinstance(body, dict):
        return ("cache_control" in body) + sum(_markers(value) for value in body.values())
    return sum(_markers(value) for value in body) if isinstance(body, list) else 0


def test_a_breakpoint_inside_a_chat_tools_function_reaches_claude(oa, fresh_emulator):
    """Clients reaching Claude through OpenAI's format mark the last tool's `function` with `cache_control` (others the
    tool itself, as OpenRouter takes it): Claude's tool gets the marker, so the tool definitions are cached as asked,
    where it was left out without a word. It counts toward Claude's four: beside four explicit breakpoints, the
    latest three of them become Claude's."""
    tools = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object", "properties": {}}}},
             {"type": "function", "function": {"name": "grep", "parameters": {"type": "object", "properties": {}},
                                               "cache_control": EPHEMERAL}}]
    oa.chat.completions.create(model="gpt-x", tools=tools, messages=[{"role": "user", "content": "Find the bug."}])
    assert [tool.get("cache_control") for tool in sent(fresh_emulator)["tools"]] == [None, EPHEMERAL]

    marked = [{"type": "text", "text": f"Part {i}.", "prompt_cache_breakpoint": {"mode": "explicit"}} for i in range(4)]
    oa.chat.completions.create(model="gpt-x", tools=tools, messages=[{"role": "user", "content": marked}])
    body = sent(fresh_emulator)
    assert _markers(body) == 4 and [part.get("cache_control") for part in body["messages"][0]["content"]] == [None, *[EPHEMERAL] * 3]


def test_a_breakpoint_on_a_document_or_tool_reference_in_a_tool_result_reaches_an_openai_model(an, fresh_emulator):
    """A tool result's text document (a RAG tool's page, under its title) and a tool_reference (a client-side tool
    search's answer) become its tool message's text: for a model that takes explicit breakpoints, their `cache_control`
    marks that text as a text block's does, where it was left out and the prefix the client marked was not cached."""
    page = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "Pumps run at 4 bar."},
            "title": "manual.txt", "cache_control": EPHEMERAL}
    found = {"type": "tool_reference", "tool_name": "Grep", "cache_control": EPHEMERAL}
    tools = [{"name": name, "description": name, "input_schema": {"type": "object", "properties": {}}} for name in ("Search", "Grep")]
    for result, text in (([page], "manual.txt\n\nPumps run at 4 bar."), ([found], "Tool loaded: Grep")):
        an.messages.create(model="claude-56-x", max_tokens=32, tools=tools, messages=[
            {"role": "user", "content": "What pressure?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Search", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result}]}])
        tool = next(m for m in sent(fresh_emulator)["messages"] if m["role"] == "tool")
        assert tool["content"] == [{"type": "text", "text": text, "prompt_cache_breakpoint": {"mode": "explicit"}}]


def test_a_translated_messages_answer_reports_the_caching_and_tier_the_openai_upstream_did(an, fresh_emulator):
    """anthropic 2.x reads `usage.cache_creation` (the 5-minute / 1-hour split of the cache writes, which clients price
    at 1.25x and 2x) and `usage.service_tier`. From gpt-5.6, which bills its writes at 1.25x and keeps them 30 minutes
    or more, the writes are 5-minute ones (they were not split at all), the tier OpenAI's default, Anthropic's
    standard (it was not said); a stream's message_delta carries the split with the rest of the upstream's usage."""
    system = "You review pull requests for the payments team. " * 120  # over OpenAI's 1,024 cacheable tokens
    ask = [{"role": "user", "content": "Review this diff."}]
    first = an.messages.create(model="claude-56-x", max_tokens=32, system=system, messages=ask).usage
    assert first.cache_creation_input_tokens and first.cache_creation is not None
    assert first.cache_creation.ephemeral_5m_input_tokens == first.cache_creation_input_tokens
    assert first.cache_creation.ephemeral_1h_input_tokens == 0 and first.service_tier == "standard"
    second = an.messages.create(model="claude-56-x", max_tokens=32, system=system, messages=ask).usage
    assert second.cache_read_input_tokens and second.cache_creation is not None
    assert second.cache_creation.ephemeral_5m_input_tokens == second.cache_creation_input_tokens == 0

    longer = [{"role": "user", "content": "Review this diff. " + "It moves the refund path. " * 60}]
    with an.messages.stream(model="claude-56-x", max_tokens=32, system=system, messages=longer) as stream:
        events = list(stream)
        final = stream.get_final_message().usage
    delta = next(event for event in events if event.type == "message_delta").usage
    written = (delta.model_extra or {}).get("cache_creation")
    assert final.cache_read_input_tokens and final.cache_creation_input_tokens and final.service_tier == "standard"
    assert written == {"ephemeral_5m_input_tokens": final.cache_creation_input_tokens, "ephemeral_1h_input_tokens": 0}


def test_a_breakpoint_on_a_tool_result_with_an_image_ends_after_the_image_for_an_openai_model(an, fresh_emulator):
    """A screenshot tool's result (text and an image) marked with `cache_control` caches all of it on Claude. A Chat tool
    message holds text only, so the image follows it in a user message: for gpt-5.6 the breakpoint goes on that image,
    where the result ends, not on the tool text before it (the prefix cached was shorter than the one marked)."""
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/screen.png"}}
    tools = [{"name": "screenshot", "description": "Takes a screenshot.", "input_schema": {"type": "object", "properties": {}}}]
    an.messages.create(model="claude-56-x", max_tokens=32, tools=tools, messages=[
        {"role": "user", "content": "What is on the screen?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "cache_control": EPHEMERAL,
                                      "content": [{"type": "text", "text": "Captured."}, image]}]}])
    messages = sent(fresh_emulator)["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "user"]
    assert messages[2]["content"] == "Captured."
    assert messages[3]["content"] == [{"type": "image_url", "image_url": {"url": "https://example.com/screen.png"},
                                       "prompt_cache_breakpoint": {"mode": "explicit"}}]


def test_an_earlier_web_search_reaches_a_model_of_the_other_provider_as_text(an, oa, fresh_emulator):
    """A conversation that used Claude's web search, sent on to an OpenAI model (a model switch, a fallback), was refused
    ('a server_tool_use block'); one that used OpenAI's, sent on to Claude, had its search left out. Either way the model
    should see what was searched and what was found: the query and the results (titles, URLs, ages; the pages'
    content is encrypted for their own provider) are text in the assistant turn where the search happened."""
    found = [{"type": "web_search_result", "url": "https://yr.no/oslo", "title": "Oslo forecast", "encrypted_content": "EqQ",
              "page_age": "2 hours ago"}]
    an.messages.create(model="claude-x", max_tokens=32, messages=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "Oslo weather"}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": found},
            {"type": "text", "text": "Rain all day.", "citations": [
                {"type": "web_search_result_location", "url": "https://yr.no/oslo", "title": "Oslo forecast",
                 "encrypted_index": "Eo8", "cited_text": "Rain"}]}]},
        {"role": "user", "content": "And tomorrow?"}])
    assistant = sent(fresh_emulator)["messages"][1]
    assert assistant == {"role": "assistant", "content": "Let me look.\n\n[Searched the web for: Oslo weather]\n\n[Results:]\n"
                                                         "- Oslo forecast: https://yr.no/oslo (2 hours ago)\n\nRain all day."}

    oa.responses.create(model="gpt-x", input=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed",
         "action": {"type": "search", "query": "Oslo weather", "sources": [{"type": "url", "url": "https://yr.no/oslo"}]}},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Rain all day.", "annotations": []}]},
        {"role": "user", "content": "And tomorrow?"}])
    turn = sent(fresh_emulator)["messages"][1]
    assert turn["role"] == "assistant"
    assert [block["text"] for block in turn["content"]] == ["[Searched the web for: Oslo weather]\n[Results:]\n- https://yr.no/oslo",
                                                            "Rain all day."]


def test_truncation_auto_drops_the_oldest_turns_until_the_conversation_fits_claude(tmp_path: Path):
    """openai-agents and the Vercel AI SDK send `truncation: "auto"`: over the model's context window, OpenAI drops items
    from the start of the conversation. To Claude it was dropped (named), and an overlong conversation was Claude's 400.
    Now the gateway, told the window and the prompt's size by Claude's own 400, sends it again without its oldest turns
    (the developer message kept, the input kept beginning at a user turn), streamed or not; disabled, still the 400."""
    turns: list[Any] = [{"role": "developer", "content": "Answer briefly."}]
    for i in range(6):
        turns += [{"role": "user", "content": f"Part {i}: " + "fjord " * 400},
                  {"type": "function_call", "call_id": f"call_{i}", "name": "lookup", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": f"call_{i}", "output": "fjell " * 100},
                  {"role": "assistant", "content": [{"type": "output_text", "text": "Noted.", "annotations": []}]}]
    turns.append({"role": "user", "content": "Summarise the last part."})
    tools: Any = [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}]
    with running_emulator(EmulatorConfig(context_windows={"claude-*": 3000})) as emulator:
        (tmp_path / "routing.yaml").write_text(policy_text(emulator.url, ROUTES))
        with running_proxy([tmp_path], watch_interval_s=None) as proxy:
            oa = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-routing", max_retries=0)
            with pytest.raises(openai.BadRequestError) as refused:
                oa.responses.create(model="gpt-x", input=turns, tools=tools)
            assert refused.value.code == "context_length_exceeded"
            raw = oa.responses.with_raw_response.create(model="gpt-x", input=turns, tools=tools, truncation="auto")
            assert raw.parse().output_text and raw.parse().truncation == "auto"
            assert "truncation" not in raw.headers.get("x-slipstream-dropped-fields", "")
            messages = json.loads(emulator.state.recent[-1]["body"])["messages"]
            parts = [m["content"][0]["text"][:6] for m in messages if m["role"] == "user" and m["content"][0]["type"] == "text"]
            assert messages[0]["role"] == "user" and 1 < len(parts) - 1 < 6  # some of the oldest turns went, not all
            assert parts == [f"Part {i}" for i in range(7 - len(parts), 6)] + ["Summar"]
            assert json.loads(emulator.state.recent[-1]["body"])["system"][0]["text"].startswith("Answer briefly.")
            events = list(oa.responses.create(model="gpt-x", input=turns, tools=tools, truncation="auto", stream=True))
            assert events[-1].type == "response.completed"


def test_a_conversation_claude_compacted_reaches_an_openai_model_from_its_summary(an, fresh_emulator):
    """The Claude Agent SDK compacts with context_management's compact_20260112: Claude's answer holds a `compaction`
    block with the summary in the clear, sent back in the history, and Claude reads the conversation on from it. To an
    OpenAI model (a fallback, a model switch) such a history was a 400 ('a compaction block'); it goes as Claude reads
    it: the summary as a user message, what followed the block, and nothing before it. A failed compaction (no summary)
    is left out, as Claude ignores it."""
    messages: Any = [
        {"role": "user", "content": "Fix the flaky payment test."},
        {"role": "assistant", "content": [{"type": "compaction", "content": None}, {"type": "text", "text": "Looking."}]},
        {"role": "user", "content": "Any luck?"},
        {"role": "assistant", "content": [{"type": "compaction", "content": "The test races the clock; mock it next."},
                                          {"type": "text", "text": "Mocking the clock now."}]},
        {"role": "user", "content": "Go on."}]
    an.messages.create(model="claude-x", max_tokens=32, messages=messages)
    assert sent(fresh_emulator)["messages"] == [
        {"role": "user", "content": "The conversation so far was compacted into this summary:\n\n"
                                    "The test races the clock; mock it next."},
        {"role": "assistant", "content": "Mocking the clock now."},
        {"role": "user", "content": "Go on."}]
    an.messages.create(model="claude-x", max_tokens=32, messages=messages[:3])
    assert [m["content"] for m in sent(fresh_emulator)["messages"]] == ["Fix the flaky payment test.", "Looking.", "Any luck?"]


@pytest.mark.parametrize(("message", "told"), [
    ("prompt is too long: 208310 tokens > 200000 maximum", (208310, 200000)),
    ("input length and `max_tokens` exceed context limit: 188059 + 20000 > 200000", (188059, 180000)),
    ("This model's maximum context length is 300 tokens. However, your messages resulted in 1200 tokens.", (1200, 300)),
    ("This model's maximum context length is 4096 tokens. However, your prompt has 5000 tokens.", (5000, 4096)),
    ("This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the prompt, "
     "1000 in the completion). Please reduce the length of the prompt or 'max_tokens'.", (4000, 3096)),
    ("This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens. Please reduce "
     "the length of the input messages.", (5000, 4096)),
    ("'max_tokens' or 'max_completion_tokens' is too large: 1000. This model's maximum context length is 4096 tokens "
     "and your request has 4000 input tokens (1000 > 4096 - 4000).", (4000, 3096)),
    ("Invalid value for 'model'.", None)])
def test_truncation_reads_each_targets_overflow(message: str, told: tuple[int, int] | None):
    """What `truncation: "auto"` reads from an overflow 400, in the words of Claude, OpenAI, vLLM and the bundled engine
    (a Chat upstream): the prompt's tokens and the most it may be (the window less the completion asked for)."""
    assert truncation.overflow(json.dumps({"error": {"message": message}}).encode()) == told


def test_a_translated_chat_answer_names_the_tier_claude_served_it_on(oa, fresh_emulator):
    """openai 3.x reads `service_tier` on a completion and on each chunk (LangChain splits priority and flex usage by
    it); OpenAI always says it. A Claude answer's `usage.service_tier` (standard) is OpenAI's `default`, where a
    translated answer said nothing."""
    ask: Any = [{"role": "user", "content": "Hello"}]
    assert oa.chat.completions.create(model="gpt-x", messages=ask).service_tier == "default"
    chunks = list(oa.chat.completions.create(model="gpt-x", messages=ask, stream=True, stream_options={"include_usage": True}))
    assert {chunk.service_tier for chunk in chunks} == {"default"}


def test_a_thinking_claude_loop_whose_tool_turn_an_openai_model_answered_goes_on_at_claude(an, fresh_emulator):
    """A Messages agent with extended thinking whose turn was answered by an OpenAI model (a fallback, a switch of model)
    gets calls with no thinking block, which only Claude can sign; sending their results to Claude was Anthropic's 400
    ('a final assistant message must start with a thinking block'), so the loop stopped. Claude now answers them with
    thinking left out for that request, as the 400 itself advises, and named; a Claude turn whose thinking the client
    left out stays Claude's 400."""
    thinking = {"type": "enabled", "budget_tokens": 1024}
    tools = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    question = {"role": "user", "content": "What is the weather in Paris? Use get_weather."}
    turn = an.messages.create(model="claude-x", max_tokens=2048, thinking=thinking, tools=tools, messages=[question])
    call = next(block for block in turn.content if block.type == "tool_use")
    assert turn.stop_reason == "tool_use" and turn.content[0].type != "thinking"
    history = [question, {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in turn.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18C"}]}]

    answer = an.messages.with_raw_response.create(model="claude-sonnet-4-6", max_tokens=2048, thinking=thinking,
                                                  tools=tools, messages=history)
    assert answer.parse().stop_reason == "end_turn"
    assert "thinking" not in sent(fresh_emulator) and answer.headers["x-slipstream-dropped-fields"] == "thinking"
    with an.messages.stream(model="claude-sonnet-4-6", max_tokens=2048, thinking=thinking, tools=tools, messages=history) as stream:
        assert stream.get_final_message().content[0].type == "text"

    # Claude's own turn, its thinking block left out by the client: Claude's 400, as without the gateway.
    own = an.messages.create(model="claude-sonnet-4-6", max_tokens=2048, thinking=thinking, tools=tools, messages=[question])
    assert own.content[0].type == "thinking"
    claude_call = next(block for block in own.content if block.type == "tool_use")
    stripped = [question, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in own.content[1:]]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": claude_call.id, "content": "18C"}]}]
    with pytest.raises(anthropic.BadRequestError, match="must start with a thinking block"):
        an.messages.create(model="claude-sonnet-4-6", max_tokens=2048, thinking=thinking, tools=tools, messages=stripped)
    # and sent whole, the loop goes on with thinking
    whole = [*stripped[:1], {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in own.content]}, stripped[2]]
    assert an.messages.create(model="claude-sonnet-4-6", max_tokens=2048, thinking=thinking, tools=tools,
                              messages=whole).content[0].type == "thinking"
    assert sent(fresh_emulator)["thinking"] == thinking


def test_a_turn_claude_paused_is_resumed_for_an_openai_client(oa, fresh_emulator):
    """Claude pauses a long-running turn of its server tools (stop_reason `pause_turn`: here after its web search) for
    the caller to send it back; OpenAI's models do not pause, and a Chat or Responses client got `stop` with no answer
    yet (the content null). The gateway sends the paused turn back as Anthropic's docs ask, and the client gets the
    whole turn: its answer, `stop`, the two requests' usage summed; in a body, a stream, and through Responses."""
    question = [{"role": "user", "content": "Please search at length for the Rust release notes."}]
    answer = oa.chat.completions.create(model="gpt-x", web_search_options={}, messages=question)
    first, resumed = [json.loads(call["body"]) for call in list(fresh_emulator.state.recent)[-2:]]
    assert resumed["messages"][:-1] == first["messages"]
    assert [block["type"] for block in resumed["messages"][-1]["content"]] == ["server_tool_use", "web_search_tool_result"]
    assert answer.choices[0].finish_reason == "stop" and answer.choices[0].message.content
    # each request's prompt billed (the second's holds the first's and the search), each one's output: 8 + 48
    assert answer.usage.prompt_tokens > 2 * count_input_tokens(first) and answer.usage.completion_tokens == 8 + 48

    with oa.chat.completions.stream(model="gpt-x", web_search_options={}, messages=question,
                                    stream_options={"include_usage": True}) as stream:
        streamed = stream.get_final_completion()
    assert streamed.choices[0].finish_reason == "stop" and streamed.choices[0].message.content
    assert streamed.usage == answer.usage

    with oa.responses.stream(model="gpt-x", tools=[{"type": "web_search"}], input=question) as stream:
        response = stream.get_final_response()
    assert response.status == "completed" and response.output_text and "search at length" not in response.output_text
    assert response.usage.input_tokens == answer.usage.prompt_tokens and response.usage.output_tokens == 56


def test_a_forced_tool_call_from_an_openai_model_ends_tool_use(an, fresh_emulator):
    """Claude's tool forcing (`tool_choice: {type: tool}`, how clients get structured output from Claude) reaches
    OpenAI as the named function, and OpenAI ends a call of a named function `stop`, not `tool_calls`; the answer said
    `end_turn` with a tool_use in it, where Claude says `tool_use`, which agents loop on. Body and stream."""
    tools = [{"name": "record", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    asked = {"model": "claude-x", "max_tokens": 256, "tools": tools, "tool_choice": {"type": "tool", "name": "record"},
             "messages": [{"role": "user", "content": "Paris, please."}]}
    answer = an.messages.create(**asked)
    assert [block.type for block in answer.content] == ["tool_use"] and answer.stop_reason == "tool_use"
    with an.messages.stream(**asked) as stream:
        assert stream.get_final_message().stop_reason == "tool_use"
    # the emulator ends it as OpenAI does: the named function's call `stop`, a call `required` forced `tool_calls`
    upstream = openai.OpenAI(base_url=f"{fresh_emulator.url}/v1", api_key="up-openai", max_retries=0)
    functions = [{"type": "function", "function": {"name": "record", "parameters": tools[0]["input_schema"]}}]
    for choice, finish in (({"type": "function", "function": {"name": "record"}}, "stop"), ("required", "tool_calls")):
        called = upstream.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Paris"}],
                                                  tools=functions, tool_choice=choice).choices[0]  # type: ignore[arg-type]
        assert called.message.tool_calls and called.finish_reason == finish


def test_a_tool_messages_image_reaches_claude_in_its_tool_result(oa, fresh_emulator):
    """Coding agents on OpenAI's format return a tool's screenshot as an `image_url` part of the `tool` message; Claude
    takes images in a tool_result, and the request was a 400 ('a 'image_url' part'). The image now reaches Claude in
    the tool's result, after its text, where the agent put it."""
    image = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
    tools = [{"type": "function", "function": {"name": "screenshot", "parameters": {"type": "object", "properties": {}}}}]
    messages: list[Any] = [
        {"role": "user", "content": "What is on the screen?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "screenshot", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": [
            {"type": "text", "text": "The screen:"}, {"type": "image_url", "image_url": {"url": image}}]}]
    answer = oa.chat.completions.create(model="gpt-x", tools=tools, messages=messages)
    assert answer.choices[0].message.content
    result = sent(fresh_emulator)["messages"][-1]["content"]
    assert result == [{"type": "tool_result", "tool_use_id": "call_1", "content": [
        {"type": "text", "text": "The screen:"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": image.split(",", 1)[1]}}]}]
