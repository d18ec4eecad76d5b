"""Cross-protocol requests as current clients send them (a sixth audit of the translation): Anthropic's
server-side fallback fields (Zed, pi and OpenClaw send `fallbacks` with every Fable 5 request, and a client
echoes the `fallback` blocks of an answer in the history), Anthropic's cache warming (`max_tokens: 0`), its memory
tool (which the client runs) and Chat's predicted outputs were 400s for a target of the other protocol; a task budget, which has no OpenAI
counterpart, was refused without being named.

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

ASK = [{"role": "user", "content": "Weather in Oslo?"}]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    yield from routed_proxy(tmp_path_factory.mktemp("current"), emulator.url, ROUTES)


def test_server_side_fallbacks_reach_an_openai_model_left_out_and_named(an, fresh_emulator):
    """`fallbacks` asks Anthropic to retry on other Claude models when the requested one's classifiers decline;
    `fallback_credit_token` is the billing credit of a retry after such a refusal; a `fallback` block in an
    assistant turn marks where a fallback model took over, and Anthropic renders it into no prompt. Each was a 400
    for an OpenAI target ('not a field this gateway knows', 'a 'fallback' block')."""
    turns: Any = [{"role": "user", "content": "Weather in Oslo?"},
                  {"role": "assistant", "content": [
                      {"type": "text", "text": "Oslo is"},
                      {"type": "fallback", "from": {"model": "claude-fable-5"}, "to": {"model": "claude-opus-4-8"},
                       "trigger": {"type": "refusal"}},
                      {"type": "text", "text": " mild today."}]},
                  {"role": "user", "content": "And Bergen?"}]
    raw = an.beta.messages.with_raw_response.create(model="claude-x", max_tokens=64, messages=turns,
                                                   fallbacks=[{"model": "claude-opus-4-8"}],
                                                   betas=["server-side-fallback-2026-07-01"])
    assert raw.parse().content and "fallbacks" in raw.headers["x-slipstream-dropped-fields"].split(",")
    sent = _sent(fresh_emulator)
    assert "fallbacks" not in sent
    assert sent["messages"][1] == {"role": "assistant", "content": "Oslo is mild today."}
    raw = an.beta.messages.with_raw_response.create(model="claude-x", max_tokens=64, messages=ASK,
                                                   fallback_credit_token="fct_0123456789",
                                                   betas=["server-side-fallback-2026-07-01"])
    assert raw.parse().content and "fallback_credit_token" in raw.headers["x-slipstream-dropped-fields"].split(",")
    assert "fallback_credit_token" not in _sent(fresh_emulator)


def test_a_task_budget_is_refused_for_an_openai_model_naming_it(an, fresh_emulator):
    """`output_config.task_budget` (Opus 4.7 and later; docker-agent, defog and others send it) is a countdown Claude is
    shown as a task goes: an OpenAI model has none. It was refused as the whole `output_config`, which left the client
    guessing which of its settings; the 400 names it now, and nothing is sent."""
    config: Any = {"effort": "high", "task_budget": {"type": "tokens", "total": 64000}}
    with pytest.raises(anthropic.BadRequestError, match=r"output_config\.task_budget \(a token budget for a whole task"):
        an.beta.messages.create(model="claude-x", max_tokens=64, messages=ASK, output_config=config,
                                betas=["task-budgets-2026-03-13"])
    assert not fresh_emulator.state.recent


def test_a_cache_warming_reaches_an_openai_model_and_answers_as_claudes(an, fresh_emulator):
    """`max_tokens: 0` is Anthropic's cache pre-warming (pi's, agents' before a burst): the prompt is read into the
    cache and nothing is written. It went on as `max_completion_tokens: 0`, OpenAI's 400. OpenAI caches every
    prompt it reads but takes no limit under 1: the warming goes with 1 and answers as Claude's does, nothing
    written, stop_reason max_tokens; what Anthropic refuses with it (a stream) is its 400, before sending."""
    answer = an.messages.create(model="claude-x", max_tokens=0, messages=ASK)
    assert answer.content == [] and answer.stop_reason == "max_tokens"
    assert answer.usage.input_tokens > 0 and answer.usage.output_tokens <= 1  # the one token OpenAI bills
    assert _sent(fresh_emulator)["max_completion_tokens"] == 1
    requests = len(fresh_emulator.state.recent)
    with pytest.raises(anthropic.BadRequestError, match=r"max_tokens: 0 is not supported with stream=true"):
        an.messages.create(model="claude-x", max_tokens=0, messages=ASK, stream=True)
    assert len(fresh_emulator.state.recent) == requests  # refused before anything was sent


def test_anthropics_memory_tool_reaches_an_openai_model_as_a_function_the_client_runs(an, fresh_emulator):
    """The memory tool (`{"type": "memory_20250818", "name": "memory"}`: the anthropic SDK's BetaAbstractMemoryTool and
    tool runner, the Vercel AI SDK's memory tool) is run by the client; Claude knows its schema by its type. It was a
    400 for an OpenAI target ('server tool 'memory_20250818''). It goes as a function `memory` of the commands the
    client takes, the memory protocol in its description; the call comes back as the tool_use the client dispatches,
    and the history's calls and results go as the function's."""
    tools: Any = [{"type": "memory_20250818", "name": "memory"}]
    answer = an.beta.messages.create(model="claude-x", max_tokens=256, tools=tools,
                                     messages=[{"role": "user", "content": "Check your memory first."}])
    function = _sent(fresh_emulator)["tools"][0]["function"]
    assert function["name"] == "memory" and "/memories" in function["description"]
    assert function["parameters"]["properties"]["command"]["enum"] == ["view", "create", "str_replace", "insert", "delete", "rename"]
    call = next(block for block in answer.content if block.type == "tool_use")
    assert call.name == "memory" and call.input["command"] in function["parameters"]["properties"]["command"]["enum"]
    turns: Any = [{"role": "user", "content": "Check your memory first."},
                  {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "memory",
                                                     "input": {"command": "view", "path": "/memories"}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "progress.md"}]}]
    assert an.beta.messages.create(model="claude-x", max_tokens=256, tools=tools, messages=turns).content
    sent = _sent(fresh_emulator)
    assert sent["messages"][1]["tool_calls"][0]["function"] == {"name": "memory", "arguments": '{"command":"view","path":"/memories"}'}
    assert sent["messages"][2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "progress.md"}


def test_a_predicted_output_reaches_claude_left_out_and_named(oa, fresh_emulator):
    """A predicted output (`prediction: {type: content}`, which the Vercel AI SDK and editors send when rewriting
    a file) only speeds up an answer the model writes the same without it: it was a 400 for every Claude target."""
    prediction: Any = {"type": "content", "content": "Oslo is mild today."}
    raw = oa.chat.completions.with_raw_response.create(model="gpt-x", messages=ASK, prediction=prediction)
    assert raw.parse().choices[0].message.content
    assert "prediction" in raw.headers["x-slipstream-dropped-fields"].split(",")
    assert "prediction" not in _sent(fresh_emulator)
