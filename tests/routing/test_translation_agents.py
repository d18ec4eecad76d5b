"""Requests agents send that a translated route refused (a seventh audit of the translation): Chat Completions'
custom tools (OpenAI's freeform-text tools, which Codex-style agents send through Chat) to a Claude target, Anthropic's
context editing (`context_management`) that would not act on the request, and `billing_policy` billing the caller as
usual, to an OpenAI target. Each was a 400.

The official clients through the proxy (team key "sk-routing"), the emulator upstream.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tests.routing.conftest import routed_proxy
from tests.routing.conftest import sent as _sent

ROUTES = """  - match: {model: "claude-*"}
    targets: [{provider: gpt, model: gpt-4o}]
  - match: {model: "gpt-*"}
    targets: [{provider: claude, model: claude-sonnet-4-5}]"""
GRAMMAR = 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\nend_patch: "*** End Patch" LF?'
PATCH: Any = {"type": "custom", "custom": {"name": "apply_patch", "description": "Edit files.",
                                           "format": {"type": "grammar", "grammar": {"syntax": "lark", "definition": GRAMMAR}}}}
SHELL: Any = {"type": "function", "function": {"name": "shell", "description": "Runs a command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
ASK: Any = [{"role": "user", "content": "Fix the typo with apply_patch."}]
CHOICE: Any = {"type": "custom", "custom": {"name": "apply_patch"}}
# An agent's turn after two tool calls (Claude Code's shape): what context editing would clear.
TURNS: Any = [
    {"role": "user", "content": "Read setup.py and list the folder."},
    {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "setup.py"}},
        {"type": "tool_use", "id": "toolu_2", "name": "Bash", "input": {"command": "ls"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "from setuptools import setup"},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "setup.py src tests"}]}]
TOOLS: Any = [{"name": name, "description": name, "input_schema": {"type": "object", "properties": {}}} for name in ("Read", "Bash")]
CONTEXT_BETA = ["context-management-2025-06-27"]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    yield from routed_proxy(tmp_path_factory.mktemp("agents"), emulator.url, ROUTES)


def _dropped(headers: Any) -> list[str]:
    return headers.get("x-slipstream-dropped-fields", "").split(",")


def test_chat_custom_tools_reach_claude_and_their_calls_come_back_as_custom_calls(oa, fresh_emulator):
    """A Chat request offering a custom tool (`{"type": "custom", "custom": {name, description, format}}`) to a
    Claude route was a 400 ("tools.0: a 'custom' tool"), and so was choosing one. It reaches Claude as the Responses
    door's custom tools do, a tool of one string, `input`, its Lark grammar in the description; the call comes back
    as Chat's custom tool call, `{"type": "custom", "custom": {name, input}}`, in a body and a stream alike, and the
    next turn's history (the custom call and its tool result) is a tool_use and its tool_result."""
    answer = oa.chat.completions.create(model="gpt-x", messages=ASK, tools=[SHELL, PATCH], tool_choice=CHOICE)
    body = _sent(fresh_emulator)
    claude_tool = body["tools"][1]
    assert claude_tool["name"] == "apply_patch" and claude_tool["input_schema"]["properties"] == {"input": {"type": "string"}}
    assert GRAMMAR in claude_tool["description"] and body["tool_choice"] == {"type": "tool", "name": "apply_patch"}
    call = (answer.choices[0].message.tool_calls or [])[0]
    assert call.type == "custom" and call.custom.name == "apply_patch"
    assert isinstance(call.custom.input, str) and call.custom.input and answer.choices[0].finish_reason == "tool_calls"

    chunks = list(oa.chat.completions.create(model="gpt-x", messages=ASK, tools=[SHELL, PATCH], tool_choice=CHOICE, stream=True))
    deltas = [d for chunk in chunks for choice in chunk.choices for d in choice.delta.tool_calls or ()]
    first = deltas[0].model_dump()
    assert first["type"] == "custom" and first["custom"] == {"name": "apply_patch", "input": ""} and first["id"]
    assert "".join(d.model_dump()["custom"]["input"] for d in deltas) == call.custom.input
    assert all(d.function is None for d in deltas) and chunks[-1].choices[0].finish_reason == "tool_calls"

    history: Any = [*ASK, answer.choices[0].message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": call.id, "content": "Done!"}]
    oa.chat.completions.create(model="gpt-x", messages=history, tools=[SHELL, PATCH])
    use, result = (message["content"][0] for message in _sent(fresh_emulator)["messages"][1:3])
    assert (use["type"], use["name"], use["input"]) == ("tool_use", "apply_patch", {"input": call.custom.input})
    assert (result["type"], result["content"]) == ("tool_result", "Done!")
    allowed: Any = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [CHOICE]}}
    oa.chat.completions.create(model="gpt-x", messages=ASK, tools=[SHELL, PATCH], tool_choice=allowed)
    body = _sent(fresh_emulator)
    assert [t["name"] for t in body["tools"]] == ["apply_patch"] and body["tool_choice"] == {"type": "any"}


def test_context_editing_that_would_not_act_reaches_an_openai_target_and_says_nothing_was_applied(an, fresh_emulator):
    """Tool-result clearing and compaction act only past their trigger (100,000 and 150,000 input tokens by default)
    and with tool uses to clear beyond `keep`; Anthropic applies them before the prompt reaches Claude. For an OpenAI
    target they were a 400 on every request: below the trigger they change nothing Claude is sent, so they are
    dropped and named, and the answer's `context_management.applied_edits` is `[]`, as Claude's would be (a body;
    a stream's message_delta). Compaction whose trigger the request reaches is refused, naming it and why (tool-result
    clearing past its trigger is applied: tests/routing/test_translation_context_edits.py)."""
    edits: Any = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}, {"type": "clear_tool_uses_20250919"},
                            {"type": "compact_20260112"}]}
    raw = an.beta.messages.with_raw_response.create(model="claude-x", max_tokens=64, messages=TURNS, tools=TOOLS,
                                                   context_management=edits, betas=CONTEXT_BETA)
    answer = raw.parse()
    assert "context_management" in _dropped(raw.headers) and "context_management" not in _sent(fresh_emulator)
    assert answer.context_management is not None and answer.context_management.applied_edits == []
    with an.beta.messages.stream(model="claude-x", max_tokens=64, messages=TURNS, tools=TOOLS, context_management=edits,
                                 betas=CONTEXT_BETA) as stream:
        kinds = {event.type: event for event in stream}
        final = stream.get_final_message()
    assert kinds["message_delta"].context_management is not None and kinds["message_delta"].context_management.applied_edits == []
    assert final.context_management is not None and final.context_management.applied_edits == []
    keep_all: Any = {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 10},
                                "keep": {"type": "tool_uses", "value": 2}}]}  # nothing beyond the kept two to clear
    assert an.beta.messages.create(model="claude-x", max_tokens=64, messages=TURNS, tools=TOOLS, context_management=keep_all,
                                   betas=CONTEXT_BETA).content
    requests = len(fresh_emulator.state.recent)
    compact = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 10}}
    with pytest.raises(anthropic.BadRequestError, match=r"context_management\.edits\.0: compact_20260112 \(.*reaches its trigger of 10"):
        an.beta.messages.create(model="claude-x", max_tokens=64, messages=TURNS, tools=TOOLS,
                                context_management={"edits": [compact]}, betas=CONTEXT_BETA)
    assert len(fresh_emulator.state.recent) == requests  # nothing sent


def test_a_billing_policy_billing_the_caller_reaches_an_openai_target(an, fresh_emulator):
    """`billing_policy` (anthropic 2.x's beta param) names who Anthropic bills: `bill_to: "self"`, the default, changes
    nothing and was a 400 ('not a field this gateway knows'); it is dropped and named. `bill_to: "user_profile"` bills
    the customer behind the `anthropic-user-profile-id` header, which Anthropic refuses rather than bill the caller:
    an OpenAI target cannot bill that customer, so it stays refused, naming the field."""
    raw = an.beta.messages.with_raw_response.create(model="claude-x", max_tokens=64, messages=TURNS,
                                                   billing_policy={"type": "billing_policy", "bill_to": "self"})
    assert raw.parse().content and "billing_policy" in _dropped(raw.headers) and "billing_policy" not in _sent(fresh_emulator)
    with pytest.raises(anthropic.BadRequestError, match=r"billing_policy.{1,4} cannot be translated for an OpenAI target \(which organization"):
        an.beta.messages.create(model="claude-x", max_tokens=64, messages=TURNS,
                                billing_policy={"type": "billing_policy", "bill_to": "user_profile"})
