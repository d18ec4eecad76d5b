"""Cross-protocol traffic shaped like real clients' (a second audit of the translation).

Claude Code-like Messages requests (system blocks and tools with `cache_control`, thinking,
tool_use / tool_result with `is_error` and content lists, streaming) reach OpenAI targets, and the
Chat Completions and Responses shapes of openai-agents, LangChain and the Vercel AI SDK reach Claude;
the official clients through the proxy (team key "sk-routing"), the emulator upstream.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.testing import running_proxy
from tests.routing.conftest import policy_text

ROUTES = """  - match: {model: "claude-think-*"}
    targets: [{provider: gpt, model: gpt-5}]
  - match: {model: "claude-*"}
    targets: [{provider: gpt, model: gpt-4o}]
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
    directory = tmp_path_factory.mktemp("clients")
    (directory / "routing.yaml").write_text(policy_text(emulator.url, ROUTES))
    with running_proxy([directory], watch_interval_s=None) as running:
        yield running.url


def sent(emulator) -> dict[str, Any]:
    """The body the emulator received last."""
    return json.loads(emulator.state.recent[-1]["body"])


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


def test_the_lowest_openai_reasoning_efforts_reach_claude(oa, fresh_emulator):
    """openai-agents and the Vercel AI SDK send gpt-5's `reasoning_effort: minimal` (and `none`):
    Claude gets its lowest effort for minimal, and nothing for none (it reasons only when thinking
    is on), instead of a 400."""
    ask = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Name a fjord."}]
    oa.chat.completions.create(model="gpt-5-mini", messages=ask, reasoning_effort="minimal", max_completion_tokens=20)
    assert sent(fresh_emulator)["output_config"] == {"effort": "low"}
    raw = oa.chat.completions.with_raw_response.create(model="gpt-5-mini", messages=ask, reasoning_effort="none")
    assert "output_config" not in sent(fresh_emulator) and "reasoning_effort" in _dropped(raw.headers)
    oa.responses.create(model="gpt-5-mini", input="Name a fjord.", reasoning={"effort": "minimal"})
    assert sent(fresh_emulator)["output_config"] == {"effort": "low"}
