"""The drop-in clients inside agent frameworks: each takes an OpenAI client object, so handing it
Slipstream's runs the team's policy in process under LangChain, pydantic-ai and the OpenAI Agents SDK.

    python examples/sdk_frameworks.py        # needs langchain-openai, pydantic-ai-slim[openai], openai-agents

(LiteLLM builds its own clients and pins openai<3: point it at the proxy instead, see docs/sdk.md.)
"""

from __future__ import annotations

from _local import emulator_url, policy_file

import sdk


def langchain(policy: str) -> str:
    from langchain_openai import ChatOpenAI

    sync, aio = sdk.OpenAI(policy=policy), sdk.AsyncOpenAI(policy=policy)
    llm = ChatOpenAI(model="gpt-4o", api_key="unused", root_client=sync, root_async_client=aio,
                     client=sync.chat.completions, async_client=aio.chat.completions)
    return llm.invoke("Say hello").content


def pydantic_ai(policy: str) -> str:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("gpt-4o", provider=OpenAIProvider(openai_client=sdk.AsyncOpenAI(policy=policy)))
    return Agent(model, instructions="Be brief.").run_sync("Say hello").output


def openai_agents(policy: str) -> str:
    from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)  # the SDK would otherwise upload traces to OpenAI
    model = OpenAIChatCompletionsModel(model="gpt-4o", openai_client=sdk.AsyncOpenAI(policy=policy))
    return Runner.run_sync(Agent(name="helper", instructions="Be brief.", model=model), "Say hello").final_output


def main() -> None:
    with emulator_url() as upstream:
        policy = str(policy_file(upstream))
        for name, run in (("langchain", langchain), ("pydantic-ai", pydantic_ai), ("openai-agents", openai_agents)):
            print(f"{name}: {run(policy)[:60]}")


if __name__ == "__main__":
    main()
