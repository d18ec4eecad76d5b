"""A Chat or Responses client's reasoning effort reaches Claude as thinking (sdk/routing/translation/reasoning.py).

Claude reasons only with `thinking` on; a translated request was sent output_config.effort alone (or nothing, for the
models without effort), so a client asking for reasoning got none, and its usage never said reasoning_tokens. The
official openai client through the proxy (team key "sk-routing"), the emulator upstream.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.routing.conftest import routed_proxy, sent

ROUTES = """  - match: {model: "gpt-sonnet-*"}
    targets: [{provider: claude, model: claude-sonnet-4-5}]
  - match: {model: "gpt-opus-*"}
    targets: [{provider: claude, model: claude-opus-4-6}]
  - match: {model: "gpt-haiku-*"}
    targets: [{provider: claude, model: claude-3-5-haiku-latest}]"""
ASK: Any = [{"role": "user", "content": "Why is the sky blue?"}]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    yield from routed_proxy(tmp_path_factory.mktemp("thinking"), emulator.url, ROUTES)


def _dropped(raw: Any) -> list[str]:
    return str(raw.headers.get("x-slipstream-dropped-fields", "")).split(",")


def test_a_chat_reasoning_effort_turns_claudes_thinking_on(oa, fresh_emulator):
    """Adaptive thinking (with the effort) on Opus 4.6; enabled with the effort's budget, within max_tokens, on Sonnet 4.5
    (which takes no effort: it was dropped, and nothing asked Claude to reason); the thinking tokens are the usage's
    reasoning_tokens, streamed or not."""
    answer = oa.chat.completions.create(model="gpt-opus-x", messages=ASK, reasoning_effort="medium")
    body = sent(fresh_emulator)
    assert body["thinking"] == {"type": "adaptive"} and body["output_config"] == {"effort": "medium"}
    assert answer.usage is not None and answer.usage.completion_tokens_details is not None
    assert 0 < (answer.usage.completion_tokens_details.reasoning_tokens or 0) < answer.usage.completion_tokens
    assert answer.choices[0].message.content  # the thinking itself is not Chat's to return

    raw = oa.chat.completions.with_raw_response.create(model="gpt-sonnet-x", messages=ASK, reasoning_effort="low",
                                                       max_completion_tokens=3000)
    body = sent(fresh_emulator)
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2999} and "output_config" not in body
    assert "reasoning_effort" not in _dropped(raw)
    usage = raw.parse().usage
    assert usage is not None and usage.completion_tokens_details is not None and usage.completion_tokens_details.reasoning_tokens

    chunks = list(oa.chat.completions.create(model="gpt-sonnet-x", messages=ASK, reasoning_effort="high", stream=True,
                                             stream_options={"include_usage": True}))
    assert sent(fresh_emulator)["thinking"] == {"type": "enabled", "budget_tokens": 8191}  # within the default max_tokens
    streamed = chunks[-1].usage
    assert streamed is not None and streamed.completion_tokens_details is not None
    assert streamed.completion_tokens_details.reasoning_tokens == usage.completion_tokens_details.reasoning_tokens


def test_a_responses_reasoning_effort_turns_claudes_thinking_on(oa, fresh_emulator):
    """reasoning.effort (the Agents SDK's ModelSettings.reasoning) on Sonnet 4.5 was dropped and named; it is thinking now,
    its tokens the usage's output_tokens_details.reasoning_tokens."""
    raw = oa.responses.with_raw_response.create(model="gpt-sonnet-x", input="Why is the sky blue?", reasoning={"effort": "medium"})
    assert sent(fresh_emulator)["thinking"] == {"type": "enabled", "budget_tokens": 8191}
    assert "reasoning.effort" not in _dropped(raw)
    response = raw.parse()
    assert response.output_text and response.usage is not None and response.usage.output_tokens_details.reasoning_tokens > 0
    events = list(oa.responses.create(model="gpt-opus-x", input="Why is the sky blue?", reasoning={"effort": "low"}, stream=True))
    assert sent(fresh_emulator)["thinking"] == {"type": "adaptive"}
    usage = events[-1].response.usage  # type: ignore[union-attr]
    assert usage is not None and usage.output_tokens_details.reasoning_tokens > 0


def test_thinking_is_left_off_where_claude_would_refuse_it(oa, fresh_emulator):
    """Where thinking would be Claude's 400 the request goes without it, as before: a tool loop (Chat cannot send back
    the signed thinking block that opened the turn), a forced tool, max_tokens too small for the least
    budget, a prefill; a model that has no thinking drops the effort and names it. A temperature beside thinking, which
    Claude refuses, is left out and named."""
    tools: Any = [{"type": "function", "function": {"name": "look", "parameters": {"type": "object", "properties": {}}}}]
    loop: Any = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "toolu_01", "type": "function", "function": {"name": "look", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "toolu_01", "content": "Rayleigh scattering."}]
    oa.chat.completions.create(model="gpt-sonnet-x", messages=loop, tools=tools, reasoning_effort="high")
    assert "thinking" not in sent(fresh_emulator)
    oa.chat.completions.create(model="gpt-sonnet-x", messages=ASK, tools=tools, tool_choice="required", reasoning_effort="high")
    assert "thinking" not in sent(fresh_emulator)
    oa.chat.completions.create(model="gpt-opus-x", messages=ASK, tools=tools, tool_choice="required", reasoning_effort="high")
    assert "thinking" not in sent(fresh_emulator)
    oa.chat.completions.create(model="gpt-sonnet-x", messages=ASK, reasoning_effort="high", max_completion_tokens=1000)
    assert "thinking" not in sent(fresh_emulator)
    prefill: Any = [*ASK, {"role": "assistant", "content": "Because"}]
    oa.chat.completions.create(model="gpt-sonnet-x", messages=prefill, reasoning_effort="high")
    assert "thinking" not in sent(fresh_emulator)
    raw = oa.chat.completions.with_raw_response.create(model="gpt-haiku-x", messages=ASK, reasoning_effort="high")
    assert "thinking" not in sent(fresh_emulator) and "reasoning_effort" in _dropped(raw)
    raw = oa.chat.completions.with_raw_response.create(model="gpt-sonnet-x", messages=ASK, reasoning_effort="low", temperature=0.2)
    body = sent(fresh_emulator)
    assert body["thinking"]["type"] == "enabled" and "temperature" not in body and "temperature" in _dropped(raw)
    raw = oa.chat.completions.with_raw_response.create(model="gpt-sonnet-x", messages=ASK, reasoning_effort="low", temperature=0.2,
                                                       top_p=0.97)  # the pair Sonnet 4.5 refuses is no pair without temperature
    body = sent(fresh_emulator)
    assert body["thinking"]["type"] == "enabled" and body["top_p"] == 0.97 and "temperature" not in body
    assert _dropped(raw) == ["temperature"]
    raw = oa.chat.completions.with_raw_response.create(model="gpt-sonnet-x", messages=ASK, reasoning_effort="low", top_p=0.5)
    assert "top_p" not in sent(fresh_emulator) and _dropped(raw) == ["top_p"]
