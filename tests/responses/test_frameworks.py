"""Agent frameworks whose default OpenAI model is the Responses API, unchanged, through both doors.

openai-agents (a Runner with a function tool: the loop ends once the tool's result is answered with
text), pydantic-ai's default OpenAI model (`Agent("openai:…")`), and LangChain's
`ChatOpenAI(use_responses_api=True)`; against native, Chat-only and Anthropic targets of the emulator.
"""

from __future__ import annotations

import openai
import pytest

import sdk
from tests.helpers import skip_without_test_package
from tests.responses.conftest import KEY

for _framework in ("agents", "langchain_openai", "pydantic_ai"):
    skip_without_test_package(_framework)

from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from pydantic_ai import Agent as PydanticAgent  # noqa: E402
from pydantic_ai.models.openai import OpenAIResponsesModel as PydanticResponsesModel  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402

set_tracing_disabled(True)  # the SDK would otherwise export traces to OpenAI


@pytest.fixture(params=["proxy", "dropin"])
def async_client(request, proxy, policy_dir, tmp_path_factory, monkeypatch) -> openai.AsyncOpenAI:
    if request.param == "proxy":
        return openai.AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path_factory.mktemp("dropin-data")))
    return sdk.AsyncOpenAI(policy=policy_dir / "responses.yaml", max_retries=0)


@pytest.mark.parametrize("model", ["oai-4o", "claude-x"])
async def test_openai_agents_runner_with_function_tool(async_client, model, fresh_emulator):
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Weather for a city."""
        cities.append(city)
        return "12°C, rain"

    agent = Agent(name="weather", instructions="Answer with the tools you have.", tools=[get_weather],
                  model=OpenAIResponsesModel(model=model, openai_client=async_client))
    result = await Runner.run(agent, "Use the get_weather tool for Oslo.")
    assert cities and isinstance(result.final_output, str) and result.final_output
    assert fresh_emulator.stats()["requests_total"] == 2  # the tool call, then the answer to its result

    run = Runner.run_streamed(agent, "Use the get_weather tool for Oslo.")
    kinds = {event.name for event in [e async for e in run.stream_events()] if event.type == "run_item_stream_event"}
    assert {"tool_called", "tool_output", "message_output_created"} <= kinds and len(cities) == 2
    await async_client.close()


def test_pydantic_ai_default_openai_model_through_proxy(proxy, monkeypatch, fresh_emulator):
    monkeypatch.setenv("OPENAI_BASE_URL", f"{proxy.url}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    agent = PydanticAgent("openai:gpt-4o")
    assert isinstance(agent.model, PydanticResponsesModel)  # the Responses API is its default
    assert agent.run_sync("Tell me about fjords.").output


def test_pydantic_ai_with_dropin_client(policy_dir, tmp_path, monkeypatch, fresh_emulator):
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path))
    client = sdk.AsyncOpenAI(policy=policy_dir / "responses.yaml")
    agent = PydanticAgent(PydanticResponsesModel("claude-x", provider=OpenAIProvider(openai_client=client)))
    assert agent.run_sync("Tell me about fjords.").output
    assert fresh_emulator.stats()["requests_total"] == 1


def test_langchain_chat_openai_responses_api(proxy, policy_dir, tmp_path, monkeypatch, fresh_emulator):
    through_proxy = ChatOpenAI(model="claude-x", base_url=f"{proxy.url}/v1", api_key=KEY, use_responses_api=True, max_retries=0)
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path))
    sync, asynchronous = sdk.OpenAI(policy=policy_dir / "responses.yaml"), sdk.AsyncOpenAI(policy=policy_dir / "responses.yaml")
    in_process = ChatOpenAI(model="oai-4o", use_responses_api=True, api_key="unused", root_client=sync, root_async_client=asynchronous,
                            client=sync.chat.completions, async_client=asynchronous.chat.completions)
    for llm in (through_proxy, in_process):
        message = llm.invoke("Tell me about fjords.")
        assert message.text and message.response_metadata["id"].startswith("resp_")
        assert message.usage_metadata["output_tokens"] > 0
        assert "".join(chunk.text for chunk in llm.stream("Tell me about fjords."))
