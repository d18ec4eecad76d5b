"""Tool calling that a Claude target has no counterpart for, as real clients send it: Chat Completions'
deprecated function calling (`functions`, `function_call`, `role: "function"`: a 400, though OpenAI still
serves it and older clients send it), and OpenAI's built-in `shell` and `apply_patch` tools, which the client
runs (the OpenAI Agents SDK's ShellTool and ApplyPatchTool: a 400). The official OpenAI client through the
proxy, the emulator as Claude."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.helpers import skip_without_test_package
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


def test_the_agents_sdks_shell_and_apply_patch_tools_reach_claude_and_come_back_as_their_calls(oa, fresh_emulator):
    """The OpenAI Agents SDK's ShellTool and ApplyPatchTool offer OpenAI's built-in `shell` and `apply_patch`
    tools, which the client runs: both were a 400 for a translated target ('the built-in tool 'shell''). Each goes
    as a function of its name taking what its call item holds; Claude's calls come back as `shell_call` and
    `apply_patch_call` items (body and stream), and the history's calls and outputs go as calls and results."""
    tools: Any = [{"type": "shell", "environment": {"type": "local"}}, {"type": "apply_patch"}]
    answer = oa.responses.create(model="gpt-x", input="List the files.", tools=tools, tool_choice="required")
    sent = _sent(fresh_emulator)
    assert [t["name"] for t in sent["tools"]] == ["shell", "apply_patch"]
    assert sent["tools"][1]["input_schema"]["properties"]["type"]["enum"] == ["create_file", "update_file", "delete_file"]
    call: Any = answer.output[-1]
    assert call.type == "shell_call" and call.call_id and isinstance(call.action.commands, list)
    with oa.responses.stream(model="gpt-x", input="List the files.", tools=tools, tool_choice="required") as stream:
        added = [event.item.type for event in stream if event.type == "response.output_item.added"]
        final: Any = stream.get_final_response()
    assert added == ["shell_call"] and final.output[-1].type == "shell_call"
    patch = oa.responses.create(model="gpt-x", input="Fix the typo.", tools=[{"type": "apply_patch"}], tool_choice="required")
    edit: Any = patch.output[-1]
    assert edit.type == "apply_patch_call" and edit.operation.type in ("create_file", "update_file", "delete_file")
    history: Any = [{"role": "user", "content": "List, then fix."},
                    {"type": "shell_call", "call_id": "call_sh", "status": "completed", "action": {"commands": ["ls"]}},
                    {"type": "shell_call_output", "call_id": "call_sh", "output": [
                        {"stdout": "README.md\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]},
                    {"type": "apply_patch_call", "call_id": "call_ap", "status": "completed",
                     "operation": {"type": "update_file", "path": "README.md", "diff": "@@\n-teh\n+the\n"}},
                    {"type": "apply_patch_call_output", "call_id": "call_ap", "status": "completed", "output": "patched"}]
    assert oa.responses.create(model="gpt-x", input=history, tools=tools).output
    messages = _sent(fresh_emulator)["messages"]
    used = [block for m in messages if m["role"] == "assistant" for block in m["content"] if block["type"] == "tool_use"]
    assert [(b["name"], b["input"]) for b in used] == [("shell", {"commands": ["ls"]}),
                                                        ("apply_patch", {"type": "update_file", "path": "README.md", "diff": "@@\n-teh\n+the\n"})]
    results = [block for m in messages if m["role"] == "user" for block in m["content"] if block["type"] == "tool_result"]
    assert "README.md" in json.dumps(results[0]["content"]) and "exit code 0" in json.dumps(results[0]["content"])
    assert "completed: patched" in json.dumps(results[1]["content"])
    container: Any = [{"type": "shell", "environment": {"type": "container_auto"}}]
    with pytest.raises(openai.BadRequestError, match="the built-in tool 'shell'"):  # OpenAI's to run
        oa.responses.create(model="gpt-x", input="List the files.", tools=container)


def test_an_agents_sdk_runner_with_shell_and_apply_patch_tools_runs_on_claude(proxy, fresh_emulator):
    """The real OpenAI Agents SDK: a Runner whose agent has a ShellTool and an ApplyPatchTool, its model
    routed to Claude, runs the shell command Claude asks for and the patch Claude writes, and ends with an
    answer (each was a 400 at the first call)."""
    skip_without_test_package("agents")
    from agents import Agent, ApplyPatchTool, OpenAIResponsesModel, Runner, ShellTool, set_tracing_disabled

    set_tracing_disabled(True)
    ran: list[list[str]] = []
    edits: list[tuple[str, str]] = []

    def shell(request: Any) -> str:
        ran.append(list(request.data.action.commands))
        return "README.md\n"

    class Editor:
        def create_file(self, operation: Any) -> str:
            edits.append(("create_file", operation.path))
            return "created"

        def update_file(self, operation: Any) -> str:
            edits.append(("update_file", operation.path))
            return "updated"

        def delete_file(self, operation: Any) -> str:
            edits.append(("delete_file", operation.path))
            return "deleted"

    client = openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="sk-routing", max_retries=0)
    model = OpenAIResponsesModel(model="gpt-x", openai_client=client)
    agent = Agent(name="fixer", instructions="Be brief.", model=model,
                  tools=[ShellTool(executor=shell, environment={"type": "local"}), ApplyPatchTool(editor=Editor())])
    result = Runner.run_sync(agent, "Use the shell tool to list the files.")
    assert ran and isinstance(ran[0], list) and result.final_output
    result = Runner.run_sync(agent, "Use the apply_patch tool to fix the README.")
    assert edits and edits[0][0] in ("create_file", "update_file", "delete_file") and result.final_output
    assert all(r["path"].endswith("/messages") for r in fresh_emulator.app.state.recent)  # Claude answered each call
