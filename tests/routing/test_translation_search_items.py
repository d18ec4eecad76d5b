"""A Responses client's web search on Claude comes back with its web_search_call items (web_search.py).

Claude's searches (its server_tool_use and web_search_tool_result blocks) reached a Responses client as the text's
url_citation annotations only: no web_search_call output item, which OpenAI's answer has before the message and the
OpenAI Agents SDK reads (a run's ToolCallItem, its traces). The official openai client and the Agents SDK through the
proxy (team key "sk-routing"), the emulator as Claude (one search before the answer).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.helpers import skip_without_test_package
from tests.routing.conftest import routed_proxy, sent

ROUTES = """  - match: {model: "gpt-*"}
    targets: [{provider: claude, model: claude-sonnet-4-5}]"""
ASK = "What is the weather in Oslo?"
SEARCH: Any = [{"type": "web_search"}]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    yield from routed_proxy(tmp_path_factory.mktemp("search_items"), emulator.url, ROUTES)



def test_claudes_search_is_a_web_search_call_item_before_the_message(oa, fresh_emulator):
    response = oa.responses.create(model="gpt-x", input=ASK, tools=SEARCH)
    kinds = [item.type for item in response.output]
    assert kinds == ["web_search_call", "message"]
    call = response.output[0]
    assert call.type == "web_search_call" and call.status == "completed" and call.id.startswith("ws_")
    assert call.action.type == "search" and call.action.query  # type: ignore[union-attr]
    assert response.output[1].content[0].annotations  # type: ignore[union-attr]  # the citations, as before

    events = list(oa.responses.create(model="gpt-x", input=ASK, tools=SEARCH, stream=True))
    kinds_streamed = [e.type for e in events]
    at = kinds_streamed.index("response.web_search_call.in_progress")
    assert kinds_streamed[at - 1: at + 4] == ["response.output_item.added", "response.web_search_call.in_progress",
                                              "response.web_search_call.searching", "response.web_search_call.completed",
                                              "response.output_item.done"]
    final = events[-1].response  # type: ignore[union-attr]
    assert [item.type for item in final.output] == ["web_search_call", "message"]
    assert final.output[0].action.query == call.action.query  # type: ignore[union-attr]
    assert [e.sequence_number for e in events] == list(range(len(events)))

    # the item sent back in a later turn is what was searched, as text for Claude
    again: Any = [{"role": "user", "content": ASK}, *[item.model_dump(exclude_none=True) for item in response.output],
                  {"role": "user", "content": "And tomorrow?"}]
    assert oa.responses.create(model="gpt-x", input=again, tools=SEARCH).output_text
    assert "[Searched the web for:" in str(sent(fresh_emulator)["messages"][1])


def test_a_chat_client_gets_no_search_items(proxy, fresh_emulator):
    """The carriage between Claude's answer and the Responses one is the gateway's own: a Chat client's answer,
    streamed or not, has none of it."""
    body = {"model": "gpt-x", "messages": [{"role": "user", "content": ASK}], "web_search_options": {}}
    headers = {"Authorization": "Bearer sk-routing"}
    plain = httpx.post(f"{proxy}/v1/chat/completions", json=body, headers=headers, timeout=30)
    streamed = httpx.post(f"{proxy}/v1/chat/completions", json={**body, "stream": True}, headers=headers, timeout=30)
    assert plain.json()["choices"][0]["message"]["annotations"] and "url_citation" in streamed.text
    assert "web_search_call" not in plain.text + streamed.text


def test_an_agents_sdk_run_on_claude_has_its_web_search_call(proxy, fresh_emulator):
    skip_without_test_package("agents")
    from agents import Agent, OpenAIResponsesModel, Runner, WebSearchTool, set_tracing_disabled
    from agents.items import ToolCallItem

    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="sk-routing", max_retries=0)
    agent = Agent(name="searcher", instructions="Be brief.", model=OpenAIResponsesModel(model="gpt-x", openai_client=client),
                  tools=[WebSearchTool()])
    result = Runner.run_sync(agent, ASK)
    assert result.final_output
    calls = [item.raw_item for item in result.new_items if isinstance(item, ToolCallItem)]
    assert [getattr(call, "type", None) for call in calls] == ["web_search_call"]
