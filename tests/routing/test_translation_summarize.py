"""A Messages compaction request (`compaction: {type: "summarize"}`, anthropic 2.x beta) answered by an OpenAI model.

Claude summarizes the conversation into one `compaction` block (`stop_reason: "compaction"`), which the client sends
first in `messages` from then on. Toward an OpenAI model the parameter was refused ("not a field this gateway knows"),
so a client compacting a long conversation routed there could not go on. It is asked for as Codex's compaction is: the
conversation, then a user message asking for the summary; the text comes back as the one block, in a body and a stream
(one `compaction_delta`, as Claude streams it), and the block, sent back, is the summary the next turn starts from.
Anthropic's `thread` (server-held conversation state) is refused naming it, saying why. The official anthropic client
through the proxy (team key "sk-routing"), the emulator as OpenAI; each test failed on the old code.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from anthropic.types.thread_unsupported_request_error import ThreadUnsupportedRequestError

from sdk.routing.translation.compaction import INSTRUCTION, SUMMARY_INTRO
from tests.routing.conftest import routed_proxy, sent

ROUTES = """  - match: {model: "claude-4t-*"}
    targets: [{provider: gpt, model: gpt-4-turbo}]
  - match: {model: "claude-*"}
    targets: [{provider: gpt, model: gpt-4o}]"""
TOOLS: Any = [{"name": "Read", "description": "Reads a file.", "input_schema": {"type": "object", "properties": {}}}]
# a conversation that ends with the assistant's answer: what a client compacts (a prefill elsewhere, refused)
TURNS: Any = [{"role": "user", "content": "Plan the release of version 2."},
              {"role": "assistant", "content": "Freeze on Monday, tag on Wednesday, ship on Friday."}]
COMPACT: Any = {"type": "summarize"}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    yield from routed_proxy(tmp_path_factory.mktemp("summarize"), emulator.url, ROUTES)


def test_a_compaction_request_is_answered_with_one_compaction_block(an, fresh_emulator):
    answer = an.beta.messages.create(model="claude-x", max_tokens=512, messages=TURNS, tools=TOOLS, compaction=COMPACT)
    asked = sent(fresh_emulator)
    assert asked["messages"][-2] == {"role": "assistant", "content": TURNS[1]["content"]}
    assert asked["messages"][-1] == {"role": "user", "content": INSTRUCTION} and asked["tool_choice"] == "none"
    assert answer.stop_reason == "compaction" and [block.type for block in answer.content] == ["compaction"]
    summary = answer.content[0].content
    assert summary

    with an.beta.messages.stream(model="claude-x", max_tokens=512, messages=TURNS, compaction={**COMPACT, "instructions": "Keep the dates."}) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()
    assert sent(fresh_emulator)["messages"][-1] == {"role": "user", "content": "Keep the dates."}
    assert "compaction" in kinds  # the SDK's event for a compaction_delta
    assert streamed.stop_reason == "compaction" and [block.type for block in streamed.content] == ["compaction"]
    assert streamed.content[0].content and streamed.usage.output_tokens > 0

    # the block sent back: the next turn reads the summary, not the turns it stands for
    block = answer.content[0].model_dump(exclude_none=True)
    an.beta.messages.create(model="claude-x", max_tokens=64, messages=[
        {"role": "user", "content": [block]}, {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "What is next?"}])
    messages = sent(fresh_emulator)["messages"]
    assert messages[0] == {"role": "user", "content": SUMMARY_INTRO + summary}
    assert TURNS[1]["content"] not in str(messages)


def test_a_compaction_requests_token_count_ignores_the_parameter(an, fresh_emulator):
    """Anthropic's count_tokens accepts the parameter and ignores it: the conversation as sent."""
    counted = an.beta.messages.count_tokens(model="claude-4t-x", messages=TURNS, compaction=COMPACT)
    assert counted.input_tokens == an.beta.messages.count_tokens(model="claude-4t-x", messages=TURNS).input_tokens


def test_server_held_thread_state_is_refused_as_anthropic_refuses_what_threads_cannot_serve(an, fresh_emulator):
    """`thread` toward an OpenAI model was refused as an unknown field, and the anthropic SDK's tool runner sends it on
    every run (`client.beta.messages.tool_runner`, threaded by default), so no tool runner could run there. It is refused
    with Anthropic's `thread_unsupported_request`, on which the SDK's thread sends the whole conversation without it:
    the runner runs its tools on the OpenAI model and ends with its answer."""
    with pytest.raises(ThreadUnsupportedRequestError, match=r"'thread' cannot be translated .*server-held conversation"):
        an.beta.messages.create(model="claude-x", max_tokens=64, messages=TURNS[:1], thread={"type": "create"})

    ran: list[str] = []

    @anthropic.beta_tool
    def weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return "18C and sunny"

    runner = an.beta.messages.tool_runner(model="claude-x", max_tokens=256, tools=[weather],
                                          messages=[{"role": "user", "content": "What is the weather in Paris? Use weather."}])
    final = runner.until_done()
    assert ran and final.stop_reason == "end_turn" and final.content[0].type == "text"
    bodies = [json.loads(call["body"]) for call in fresh_emulator.state.recent]
    assert len(bodies) == 2 and "thread" not in str(bodies)  # the call, then its result: each turn whole
    assert bodies[1]["messages"][-1]["role"] == "tool" and bodies[1]["messages"][0]["content"].startswith("What is")


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_runner_compacts_and_carries_on_on_an_openai_model(an, fresh_emulator, stream):
    """The SDK's tool runner compacts when asked (`runner.compact_before_next_turn()`): a compaction request, then the
    loop carries on from the block, sent back alone as the assistant's turn, as Claude resumes a compacted conversation.
    That turn was refused as a prefill, which ended the run; it reads as the summary, and the model answers from it."""

    @anthropic.beta_tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return "18C and sunny"

    runner = an.beta.messages.tool_runner(model="claude-x", max_tokens=256, tools=[weather], stream=stream,
                                          messages=[{"role": "user", "content": "What is the weather in Paris? Use weather."}])
    ends = []
    for message in runner:
        final = message.get_final_message() if stream else message
        ends.append(final.stop_reason)
        if len(ends) == 1:
            runner.compact_before_next_turn()
    assert ends == ["tool_use", "compaction", "end_turn"]
    carried_on = sent(fresh_emulator)["messages"]
    assert len(carried_on) == 1 and carried_on[0]["role"] == "user" and carried_on[0]["content"].startswith(SUMMARY_INTRO)
