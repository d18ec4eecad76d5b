"""How many searches an OpenAI client's web search may run on Claude.

Claude's web search server tool without `max_uses` searches as often as its loop runs (and a paused turn, which the
gateway resumes for an OpenAI client, runs it again), each search billed, where the budget's hold assumed 5 and
OpenAI's Chat search runs one a request. Chat's `web_search_options` reach Claude with `max_uses: 5` now, and a
Responses request's `max_tool_calls` (sent by the Agents SDK as a model setting's extra argument) beside its web search tool, which
was refused ("the target would not limit its calls"), is the tool's `max_uses`. The official openai client and the
OpenAI Agents SDK through the proxy (team key "sk-routing"), the emulator as Claude; each test failed on the old code.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.helpers import skip_without_test_package
from tests.routing.conftest import routed_proxy, sent

ROUTES = """  - match: {model: "gpt-*"}
    targets: [{provider: claude, model: claude-sonnet-4-5}]"""
ASK: Any = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    yield from routed_proxy(tmp_path_factory.mktemp("search_uses"), emulator.url, ROUTES)


def _search_tool(emulator) -> dict[str, Any]:
    return next(tool for tool in sent(emulator)["tools"] if tool["type"] == "web_search_20250305")


def test_chat_web_search_reaches_claude_with_the_searches_the_budget_holds(oa, fresh_emulator):
    answer = oa.chat.completions.create(model="gpt-x", messages=ASK, web_search_options={"search_context_size": "low"})
    assert answer.choices[0].message.annotations  # Claude searched and cited
    assert _search_tool(fresh_emulator)["max_uses"] == 5


def test_a_responses_max_tool_calls_beside_web_search_is_claudes_max_uses(oa, fresh_emulator):
    response = oa.responses.create(model="gpt-x", input=ASK, tools=[{"type": "web_search"}], max_tool_calls=2)
    assert response.status == "completed" and response.max_tool_calls == 2
    assert _search_tool(fresh_emulator)["max_uses"] == 2
    # no built-in call allowed: Claude is offered no search
    oa.responses.create(model="gpt-x", input=ASK, tools=[{"type": "web_search"}], max_tool_calls=0)
    assert "tools" not in sent(fresh_emulator)
    # another built-in tool, whose calls Claude would not limit, is still refused
    with pytest.raises(openai.BadRequestError, match="max_tool_calls"):
        oa.responses.create(model="gpt-x", input=ASK, max_tool_calls=2,
                            tools=[{"type": "web_search"}, {"type": "code_interpreter", "container": {"type": "auto"}}])


def test_an_agents_sdk_web_search_agent_with_a_tool_call_limit_runs_on_claude(proxy, fresh_emulator):
    skip_without_test_package("agents")
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, WebSearchTool, set_tracing_disabled

    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="sk-routing", max_retries=0)
    agent = Agent(name="searcher", instructions="Be brief.", model=OpenAIResponsesModel(model="gpt-x", openai_client=client),
                  tools=[WebSearchTool()], model_settings=ModelSettings(extra_args={"max_tool_calls": 3}))
    result = Runner.run_sync(agent, "What is the weather in Oslo?")
    assert result.final_output
    assert _search_tool(fresh_emulator)["max_uses"] == 3
