"""Chat Completions' deprecated function calling (`functions`, `function_call`, `role: "function"`) through a
Claude target: it was a 400 ('functions' cannot be translated), though OpenAI still serves it and older
clients send it. The official OpenAI client through the proxy, the emulator as Claude."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.routing.conftest import routed_proxy
from tests.routing.conftest import sent as _sent

ROUTES = """  - match: {model: "gpt-*"}
    targets: [{provider: claude, model: claude-sonnet-4-5}]"""

WEATHER: Any = {"name": "get_weather", "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
ASK: Any = [{"role": "user", "content": "Weather in Oslo?"}]


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    yield from routed_proxy(tmp_path_factory.mktemp("legacy"), emulator.url, ROUTES)


def test_functions_reach_claude_as_tools_and_come_back_as_a_function_call(oa, fresh_emulator):
    answer = oa.chat.completions.create(model="gpt-x", messages=ASK, functions=[WEATHER], function_call={"name": "get_weather"})
    sent = _sent(fresh_emulator)
    assert [t["name"] for t in sent["tools"]] == ["get_weather"] and sent["tool_choice"] == {"type": "tool", "name": "get_weather"}
    choice = answer.choices[0]
    assert choice.finish_reason == "function_call" and not choice.message.tool_calls
    call = choice.message.function_call
    assert call is not None and call.name == "get_weather" and "city" in json.loads(call.arguments)
    stream = oa.chat.completions.create(model="gpt-x", messages=ASK, functions=[WEATHER], function_call={"name": "get_weather"},
                                        stream=True)
    name, arguments, finish = "", "", None
    for chunk in stream:
        for each in chunk.choices:
            assert not each.delta.tool_calls
            if each.delta.function_call is not None:
                name += each.delta.function_call.name or ""
                arguments += each.delta.function_call.arguments or ""
            finish = each.finish_reason or finish
    assert (name, finish) == ("get_weather", "function_call") and "city" in json.loads(arguments)
    # The next turn: the call and its result as legacy messages reach Claude as a tool call and its result.
    history: Any = [*ASK, {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
                    {"role": "function", "name": "get_weather", "content": "Mild, 12 C."}]
    assert oa.chat.completions.create(model="gpt-x", messages=history, functions=[WEATHER]).choices[0].message.content
    messages = _sent(fresh_emulator)["messages"]
    used, result = messages[1]["content"][0], messages[2]["content"][0]
    assert (used["type"], used["name"], used["input"]) == ("tool_use", "get_weather", {"city": "Oslo"})
    assert result["type"] == "tool_result" and result["tool_use_id"] == used["id"]


def test_a_function_result_without_its_call_or_beside_tools_is_the_clients_400(oa, fresh_emulator):
    orphan: Any = [*ASK, {"role": "function", "name": "get_weather", "content": "Mild."}]
    with pytest.raises(openai.BadRequestError, match="which no earlier assistant message called"):
        oa.chat.completions.create(model="gpt-x", messages=orphan, functions=[WEATHER])
    with pytest.raises(openai.BadRequestError, match="either tools or the deprecated functions"):
        oa.chat.completions.create(model="gpt-x", messages=ASK, functions=[WEATHER], tools=[{"type": "function", "function": WEATHER}])
    assert not fresh_emulator.app.state.recent
