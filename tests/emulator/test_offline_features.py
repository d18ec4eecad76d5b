"""What clients test offline: structured output that validates, logprobs, n > 1 (stream and
not), Anthropic extended thinking with signatures, and agent loops that end."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from pydantic import BaseModel

from tests.helpers import skip_without_test_package

from .helpers import ANTHROPIC_HEADERS, post

GPT = "gpt-4o-mini"
CLAUDE = "claude-sonnet-4-6"
MSGS = [{"role": "user", "content": "Hello there"}]


class Step(BaseModel):
    explanation: str
    output: str


class Solution(BaseModel):
    steps: list[Step]
    final_answer: float
    confidence: int | None = None


def test_chat_parse_with_pydantic_model(oai):
    r = oai.chat.completions.parse(model=GPT, messages=MSGS, response_format=Solution)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Solution) and isinstance(parsed.steps[0], Step)
    obj = oai.chat.completions.create(model=GPT, messages=MSGS, response_format={"type": "json_object"})
    assert isinstance(json.loads(obj.choices[0].message.content), dict)
    with pytest.raises(openai.BadRequestError) as ei:
        oai.chat.completions.create(model=GPT, messages=MSGS, response_format={"type": "yaml"})
    assert ei.value.param == "response_format.type"


def test_chat_logprobs(oai):
    r = oai.chat.completions.create(model=GPT, messages=MSGS, logprobs=True, top_logprobs=3,
                                    max_completion_tokens=10)
    lp = r.choices[0].logprobs.content
    assert "".join(t.token for t in lp) == r.choices[0].message.content and len(lp) == 10
    assert all(len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token for t in lp)
    assert all(t.logprob <= 0 and t.top_logprobs[1].logprob < t.logprob for t in lp)
    chunks = list(oai.chat.completions.create(model=GPT, messages=MSGS, logprobs=True, stream=True,
                                              max_completion_tokens=10))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in lp]
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=GPT, messages=MSGS, top_logprobs=2)


def test_chat_n_choices_stream_and_not(oai):
    r = oai.chat.completions.create(model=GPT, messages=MSGS, n=3, max_completion_tokens=8)
    texts = [c.message.content for c in r.choices]
    assert [c.index for c in r.choices] == [0, 1, 2] and len(set(texts)) == 3
    assert r.usage.completion_tokens == 24
    single = oai.chat.completions.create(model=GPT, messages=MSGS, max_completion_tokens=8)
    assert single.choices[0].message.content == texts[0]
    got: dict[int, str] = {}
    finish: dict[int, str] = {}
    for c in oai.chat.completions.create(model=GPT, messages=MSGS, n=3, max_completion_tokens=8,
                                         stream=True, stream_options={"include_usage": True}):
        for ch in c.choices:
            got[ch.index] = got.get(ch.index, "") + (ch.delta.content or "")
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
        if c.usage:
            assert c.usage.completion_tokens == 24
    assert [got[i] for i in range(3)] == texts and finish == {0: "length", 1: "length", 2: "length"}


def test_anthropic_extended_thinking(anth):
    kw = dict(model=CLAUDE, max_tokens=2000, messages=MSGS,
              thinking={"type": "enabled", "budget_tokens": 1024})
    m = anth.messages.create(**kw)
    think, text = m.content
    assert think.type == "thinking" and think.thinking and think.signature
    assert text.type == "text" and m.stop_reason == "end_turn"
    assert m.usage.output_tokens == 24 + 48
    with anth.messages.stream(**kw) as s:
        kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in s]
        final = s.get_final_message()
    assert ("content_block_delta", "thinking_delta") in kinds
    assert ("content_block_delta", "signature_delta") in kinds
    assert final.content[0].signature == think.signature and final.content[0].thinking == think.thinking
    # The thinking block goes back in the next turn, as clients must send it.
    again = anth.messages.create(**dict(kw, messages=MSGS + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
        {"role": "user", "content": "more"}]))
    assert again.content[0].type == "thinking"
    omitted = anth.messages.create(**dict(kw, thinking={"type": "enabled", "budget_tokens": 1024,
                                                        "display": "omitted"}))
    assert omitted.content[0].thinking == "" and omitted.content[0].signature


def test_anthropic_structured_output(emu):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}},
              "required": ["city", "n"], "additionalProperties": False}
    r = post(emu.url, "/v1/messages", {"model": CLAUDE, "max_tokens": 200, "messages": MSGS,
                                       "output_config": {"format": {"type": "json_schema",
                                                                    "schema": schema}}},
             ANTHROPIC_HEADERS)
    assert json.loads(r.json()["content"][0]["text"]) == {"city": "example_city", "n": 1}


TOOL_OAI = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}
TOOL_ANTH = {"name": "lookup", "input_schema": TOOL_OAI["function"]["parameters"]}


def test_agent_loops_end_after_a_tool_result(oai, anth):
    """A minimal agent loop per API: call the tool the model asks for until it answers in text."""
    msgs = [{"role": "user", "content": "use a tool to answer"}]
    for turn in range(3):  # noqa: B007 - read after the loop
        r = oai.chat.completions.create(model=GPT, messages=msgs, tools=[TOOL_OAI])
        m = r.choices[0].message
        if not m.tool_calls:
            break
        msgs += [m.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "42"}]
    assert turn == 1 and m.content

    amsgs: list = [{"role": "user", "content": "use a tool to answer"}]
    for turn in range(3):  # noqa: B007 - read after the loop
        a = anth.messages.create(model=CLAUDE, max_tokens=300, messages=amsgs, tools=[TOOL_ANTH])
        if a.stop_reason != "tool_use":
            break
        use = next(b for b in a.content if b.type == "tool_use")
        amsgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in a.content]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                "content": "42"}]}]
    assert turn == 1 and a.content[0].type == "text"


def test_thinking_validation(anth):
    with pytest.raises(anthropic.BadRequestError):  # the budget must fit under max_tokens
        anth.messages.create(model=CLAUDE, max_tokens=1000, messages=MSGS,
                             thinking={"type": "enabled", "budget_tokens": 1024})
    with pytest.raises(anthropic.BadRequestError) as ei:
        anth.messages.create(model=CLAUDE, max_tokens=2000, messages=MSGS, tools=[TOOL_ANTH],
                             tool_choice={"type": "any"},
                             thinking={"type": "enabled", "budget_tokens": 1024})
    assert "forces tool use" in ei.value.message


def test_forced_tool_choice_moves_on_after_a_result(oai, anth):
    final = {"type": "function", "function": {"name": "final_result", "parameters": {
        "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}}
    msgs: list = [{"role": "user", "content": "use lookup"}]
    names = []
    for _ in range(2):
        m = oai.chat.completions.create(model=GPT, messages=msgs, tools=[TOOL_OAI, final],
                                        tool_choice="required").choices[0].message
        names.append(m.tool_calls[0].function.name)
        msgs += [m.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "42"}]
    assert names == ["lookup", "final_result"]
    final_anth = {"name": "final_result", "input_schema": final["function"]["parameters"]}
    amsgs: list = [{"role": "user", "content": "use lookup"}]
    names = []
    for _ in range(2):
        a = anth.messages.create(model=CLAUDE, max_tokens=300, messages=amsgs, tools=[TOOL_ANTH, final_anth],
                                 tool_choice={"type": "any"})
        use = a.content[-1]
        names.append(use.name)
        amsgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in a.content]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "42"}]}]
    assert names == ["lookup", "final_result"]


def test_pydantic_ai_agent_with_tool_and_typed_output_terminates(emu):
    skip_without_test_package("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=emu.openai_url, api_key="k")
    for model_cls in (OpenAIChatModel, OpenAIResponsesModel):
        agent = Agent(model_cls(GPT, provider=provider), output_type=Step)
        calls: list[str] = []

        @agent.tool_plain
        def lookup(q: str) -> str:
            calls.append(q)  # noqa: B023 - called only by this iteration's agent, before the loop moves on
            return "42"

        out = agent.run_sync("use lookup to find the answer").output
        assert isinstance(out, Step) and calls == ["example_q"]
