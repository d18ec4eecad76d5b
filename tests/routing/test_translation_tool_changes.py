"""Claude's mid-conversation tool changes (`tool_addition` / `tool_removal` blocks, inline-tools beta) on an OpenAI model.

The anthropic SDK's tool runner sends them in system messages for `add_tools()` / `remove_tools()` (so as not to change
`tools` and miss Claude's prompt cache), and a compaction block's `tool_changes` are the same blocks: toward an OpenAI
model each was refused (a 'tool_addition' block; a compaction's tool_changes), ending the run. The model is offered the
tools in effect at the conversation's end and the blocks are left out. The official anthropic client's tool runner
through the proxy (team key "sk-routing"), the emulator as OpenAI; each test failed on the old code.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from sdk.routing.translation.compaction import SUMMARY_INTRO
from tests.routing.conftest import routed_proxy, sent

ROUTES = """  - match: {model: "claude-*"}
    targets: [{provider: gpt, model: gpt-4o}]"""
CITY: Any = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    yield from routed_proxy(tmp_path_factory.mktemp("tool_changes"), emulator.url, ROUTES)


def _offered(emulator) -> list[str]:
    return [tool["function"]["name"] for tool in sent(emulator).get("tools") or ()]


def test_a_tool_runner_adds_and_removes_tools_on_an_openai_model(an, fresh_emulator):
    ran: list[str] = []

    @anthropic.beta_tool
    def weather(city: str) -> str:
        """The weather in a city."""
        ran.append(f"weather {city}")
        return "18C and sunny"

    @anthropic.beta_tool
    def local_time(city: str) -> str:
        """The local time in a city."""
        ran.append(f"local_time {city}")
        return "12:00"

    runner = an.beta.messages.tool_runner(model="claude-x", max_tokens=256, tools=[weather],
                                          messages=[{"role": "user", "content": "What time is it in Paris? Use local_time."}])
    runner.add_tools(local_time)  # sent with the next request: the time tool in, the weather tool out
    runner.remove_tools("weather")
    ends = [message.stop_reason for message in runner]
    assert ends == ["tool_use", "end_turn"] and ran and ran[0].startswith("local_time")
    first, last = [json.loads(call["body"]) for call in fresh_emulator.state.recent]
    for body in (first, last):  # the tools in effect at the end, the change blocks left out
        assert [tool["function"]["name"] for tool in body["tools"]] == ["local_time"]
        assert all(m["role"] != "system" or isinstance(m["content"], str) for m in body["messages"])


def test_a_compactions_tool_changes_are_the_tools_after_it(an, fresh_emulator):
    """A compaction block's tool_changes take the request's tools to those in effect after it: applied where the
    summary is, where the block was refused."""
    added = {"type": "tool_addition", "tool": {"type": "tool_definition",
                                               "definition": {"name": "local_time", "input_schema": CITY}}}
    removed = {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "weather"}}
    block = {"type": "compaction", "content": "The user asked for the weather in Paris: 18C.", "tool_changes": [added, removed]}
    an.beta.messages.create(model="claude-x", max_tokens=64, tools=[{"name": "weather", "input_schema": CITY}], messages=[
        {"role": "assistant", "content": [block]}, {"role": "user", "content": "And the time there?"}])
    assert _offered(fresh_emulator) == ["local_time"]
    messages = sent(fresh_emulator)["messages"]
    assert messages[0]["content"] == SUMMARY_INTRO + block["content"] and messages[-1]["content"] == "And the time there?"
    with pytest.raises(anthropic.BadRequestError, match=r"mcp_tool_reference"):
        mcp = {"type": "tool_addition", "tool": {"type": "mcp_tool_reference", "server_name": "docs", "name": "search"}}
        an.beta.messages.create(model="claude-x", max_tokens=64, messages=[
            {"role": "user", "content": "Hello"}, {"role": "system", "content": [mcp]}, {"role": "user", "content": "Search."}])
