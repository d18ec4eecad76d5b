"""Codex's compaction (a `compaction_trigger` last in the input, one `compaction` item back) through a
translated target: it was a 400 ('a 'compaction_trigger' item cannot be translated'), so a long Codex
session routed to Claude could not compact and ended. And openai 3.x's other conversation-state item,
`configuration_update`. The official OpenAI client through the proxy, the emulator as Claude."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from sdk.routing.translation import compaction
from tests.routing.conftest import routed_proxy
from tests.routing.conftest import sent as _sent

ROUTES = """  - match: {model: "gpt-s46-*"}
    targets: [{provider: claude, model: claude-sonnet-4-6}]
  - match: {model: "gpt-*"}
    targets: [{provider: claude, model: claude-sonnet-4-5}]"""

SHELL: Any = {"type": "function", "name": "shell", "description": "Run a command.",
              "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
CONVERSATION: Any = [{"role": "user", "content": "Rename the config loader."},
                     {"role": "assistant", "content": "Renamed load_config to read_config in three files."},
                     {"role": "user", "content": "Now update the docs."}]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    yield from routed_proxy(tmp_path_factory.mktemp("compaction"), emulator.url, ROUTES)


def test_a_compaction_trigger_gets_one_compaction_item_holding_claudes_summary(oa, fresh_emulator):
    trigger: Any = [*CONVERSATION, {"type": "compaction_trigger"}]
    answer = oa.responses.create(model="gpt-x", input=trigger, tools=[SHELL])
    assert [item.type for item in answer.output] == ["compaction"]
    summary = compaction.summary_of(answer.output[0].model_dump())
    assert summary
    sent = _sent(fresh_emulator)
    assert sent["messages"][-1]["content"][-1] == {"type": "text", "text": compaction.INSTRUCTION}  # the user's turn, last
    assert sent["tool_choice"] == {"type": "none"} and [t["name"] for t in sent["tools"]] == ["shell"]  # the prefix kept
    with oa.responses.stream(model="gpt-x", input=trigger, tools=[SHELL]) as stream:
        kinds = [event.type for event in stream]
        final: Any = stream.get_final_response()
    assert "response.output_text.delta" not in kinds and kinds.count("response.output_item.done") == 1
    assert "response.compaction.compacting" in kinds
    assert [item.type for item in final.output] == ["compaction"]
    assert compaction.summary_of(final.output[0].model_dump()) == summary  # the emulator answers alike
    # The next turn sends the compaction item in place of the conversation: Claude reads the summary.
    later: Any = [answer.output[0].model_dump(exclude_none=True), {"role": "user", "content": "Go on."}]
    assert oa.responses.create(model="gpt-x", input=later, tools=[SHELL]).output_text
    texts = [block["text"] if isinstance(block, dict) else block for message in _sent(fresh_emulator)["messages"]
             for block in (message["content"] if isinstance(message["content"], list) else [message["content"]])]
    assert compaction.SUMMARY_INTRO + summary in texts and "Go on." in texts


def test_an_openai_compaction_or_a_misplaced_trigger_is_the_clients_400(oa, fresh_emulator):
    """OpenAI's compaction content is encrypted for OpenAI's models: dropping it would drop the conversation it
    stands for, so it is refused, naming it. A trigger anywhere but last is the client's error, as OpenAI's."""
    native: Any = [{"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAAABo-encrypted"}, {"role": "user", "content": "Go on."}]
    with pytest.raises(openai.BadRequestError, match="a 'compaction' item made by OpenAI"):
        oa.responses.create(model="gpt-x", input=native)
    misplaced: Any = [{"type": "compaction_trigger"}, *CONVERSATION]
    with pytest.raises(openai.BadRequestError, match="compaction_trigger must be the last input item"):
        oa.responses.create(model="gpt-x", input=misplaced)
    assert not fresh_emulator.app.state.recent


def test_a_translated_compaction_reaches_a_native_openai_target_as_its_summary(proxy, fresh_emulator, tmp_path, emulator):
    """The session goes on at a native OpenAI target (the route's fallback, or a changed route): the gateway's
    compaction item would be OpenAI's 400 (`invalid_encrypted_content`); it is sent as the summary it holds."""
    made = openai.OpenAI(base_url=f"{proxy}/v1", api_key="sk-routing", max_retries=0).responses.create(
        model="gpt-x", input=[*CONVERSATION, {"type": "compaction_trigger"}])
    summary = compaction.summary_of(made.output[0].model_dump())
    assert summary
    native_routes = """  - match: {model: "gpt-*"}
    targets: [{provider: gpt}]"""
    for url in routed_proxy(tmp_path, emulator.url, native_routes):
        native = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-routing", max_retries=0)
        later: Any = [made.output[0].model_dump(exclude_none=True), {"role": "user", "content": "Go on."}]
        assert native.responses.create(model="gpt-4o", input=later).output_text
    got = _sent(fresh_emulator)["input"]
    assert got[0] == {"role": "user", "content": compaction.SUMMARY_INTRO + summary} and got[1]["content"] == "Go on."


def test_a_configuration_update_reaches_claude_as_the_requests_settings(oa, fresh_emulator):
    """openai 3.x's `configuration_update` item changes the reasoning effort or the text format for the responses
    after it, keeping the conversation's prefix (and its cache) as it was: it was a 400 for a translated target.
    The last update of each setting is the request's; the item itself is left out."""
    schema: Any = {"type": "json_schema", "name": "answer", "schema": {
        "type": "object", "properties": {"done": {"type": "boolean"}}, "required": ["done"], "additionalProperties": False}}
    updated: Any = [*CONVERSATION, {"type": "configuration_update", "reasoning": {"effort": "low"}},
                    {"type": "configuration_update", "text": {"format": schema}}]
    assert oa.responses.create(model="gpt-s46-x", input=updated, reasoning={"effort": "high"}).output_text
    sent = _sent(fresh_emulator)
    assert sent["output_config"]["effort"] == "low" and sent["output_config"]["format"]["type"] == "json_schema"
    assert all(isinstance(m["content"], (str, list)) for m in sent["messages"]) and len(sent["messages"]) == 3
