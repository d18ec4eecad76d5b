"""Claude's client-run Anthropic-defined tools (bash, the text editor) for an OpenAI target.

Claude knows such a tool by its type alone; the client runs its calls (Anthropic's computer-use demo, the Vercel AI
SDK's `anthropic.tools.bash_20250124` and `textEditor_*`, agents built on the anthropic SDK). Each was a 400 for an
OpenAI target ('server tool 'bash_20250124''). It goes as a function of the client's name with Anthropic's published
input schema; the call comes back as the tool_use block the client dispatches, streamed or not, and the history's
calls and tool_result blocks go as the function's. The computer-use tool stays refused.

The official anthropic client through the proxy (team key "sk-routing"), the emulator's Chat Completions upstream.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tests.routing.conftest import routed_proxy
from tests.routing.conftest import sent as _sent

ROUTES = """  - match: {model: "claude-*"}
    targets: [{provider: gpt, model: gpt-4o}]"""


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    yield from routed_proxy(tmp_path_factory.mktemp("claude_tools"), emulator.url, ROUTES)


def _calls(content: Any) -> list[tuple[str, Any]]:
    return [(block.name, block.input) for block in content if block.type == "tool_use"]


def _second_turn(an: Any, emulator: Any, tools: Any, ask: str, name: str, arguments: Any, result: Any) -> dict[str, Any]:
    """The turn after the client ran the call: its tool_use and tool_result in the history; what the upstream got."""
    turns: Any = [{"role": "user", "content": ask},
                  {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": name, "input": arguments}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result}]}]
    assert an.messages.create(model="claude-x", max_tokens=256, tools=tools, messages=turns).content
    return _sent(emulator)


def test_the_bash_tool_reaches_an_openai_model_as_a_function_the_client_runs(an, fresh_emulator):
    """bash_20250124 (`bash`: `command`, or `restart: true`) goes as the function `bash` of those inputs, its
    input_examples at the end of the description as a custom tool's; the call comes back as a `bash` tool_use, streamed
    or not; the shell's output goes back as the call's result. The computer-use tool stays refused (its results are
    screenshots of a display, which only a model trained for it acts on), and so does a bash version whose input is
    not known for certain: a 400 naming it, nothing sent."""
    tools: Any = [{"type": "bash_20250124", "name": "bash", "input_examples": [{"command": "ls -la"}]}]
    ask: Any = [{"role": "user", "content": "List the files with bash."}]
    answer = an.messages.create(model="claude-x", max_tokens=256, tools=tools, messages=ask)
    function = _sent(fresh_emulator)["tools"][0]["function"]
    assert function["name"] == "bash" and "persistent bash shell" in function["description"]
    assert function["description"].endswith('Example inputs:\n{"command":"ls -la"}')
    assert function["parameters"]["properties"]["command"]["type"] == "string"
    assert function["parameters"]["properties"]["restart"]["type"] == "boolean"
    assert [name for name, _ in _calls(answer.content)] == ["bash"] and answer.stop_reason == "tool_use"
    with an.messages.stream(model="claude-x", max_tokens=256, tools=tools, messages=ask) as stream:
        streamed = stream.get_final_message()
    assert _calls(streamed.content) == _calls(answer.content) and streamed.stop_reason == "tool_use"
    assert _sent(fresh_emulator)["stream"] and _sent(fresh_emulator)["tools"][0]["function"] == function
    sent = _second_turn(an, fresh_emulator, tools, "List the files with bash.", "bash", {"command": "ls"}, "a.txt\nb.txt")
    assert sent["messages"][1]["tool_calls"][0]["function"] == {"name": "bash", "arguments": '{"command":"ls"}'}
    assert sent["messages"][2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "a.txt\nb.txt"}
    requests = len(fresh_emulator.state.recent)
    computer: Any = [{"type": "computer_20250124", "name": "computer", "display_width_px": 1024, "display_height_px": 768}]
    for refused, beta in ((computer, "computer-use-2025-01-24"), ([{"type": "bash_20241022", "name": "bash"}], "computer-use-2024-10-22")):
        with pytest.raises(anthropic.BadRequestError, match=rf"tools\.0: server tool '{refused[0]['type']}' cannot be translated"):
            an.beta.messages.create(model="claude-x", max_tokens=64, tools=refused, messages=ask, betas=[beta])
    assert len(fresh_emulator.state.recent) == requests


EDITORS = [("text_editor_20250728", "str_replace_based_edit_tool", ["view", "create", "str_replace", "insert"], "insert_text"),
           ("text_editor_20250429", "str_replace_based_edit_tool", ["view", "create", "str_replace", "insert"], "insert_text"),
           ("text_editor_20250124", "str_replace_editor", ["view", "create", "str_replace", "insert", "undo_edit"], "new_str")]


@pytest.mark.parametrize(("kind", "name", "commands", "inserted"), EDITORS)
def test_the_text_editor_reaches_an_openai_model_as_a_function_the_client_runs(an, fresh_emulator, kind, name, commands,
                                                                                inserted):
    """The text editor goes as a function of its name (str_replace_based_edit_tool for Claude 4's versions,
    str_replace_editor for Claude 3.7's, which has undo_edit as well) with its commands and the path they act on, and
    insert's text named as Claude sends it (insert_text from Claude 4); the call comes back as its tool_use,
    streamed or not, and the file's lines go back as the call's result."""
    tools: Any = [{"type": kind, "name": name, "cache_control": {"type": "ephemeral"}}]
    ask: Any = [{"role": "user", "content": f"Fix the bug in primes.py with {name}."}]
    answer = an.messages.create(model="claude-x", max_tokens=256, tools=tools, messages=ask)
    function = _sent(fresh_emulator)["tools"][0]["function"]
    assert function["name"] == name and "str_replace" in function["description"]
    parameters = function["parameters"]
    assert parameters["properties"]["command"]["enum"] == commands and parameters["required"] == ["command", "path"]
    assert {"path", "file_text", "old_str", "new_str", "insert_line", "view_range", inserted} <= set(parameters["properties"])
    assert f"insert (path, {inserted} put after line insert_line" in function["description"]
    calls = _calls(answer.content)
    assert [called for called, _ in calls] == [name] and calls[0][1]["command"] in commands and "path" in calls[0][1]
    with an.messages.stream(model="claude-x", max_tokens=256, tools=tools, messages=ask) as stream:
        assert _calls(stream.get_final_message().content) == calls
    assert _sent(fresh_emulator)["stream"] and _sent(fresh_emulator)["tools"][0]["function"] == function
    viewed = {"command": "view", "path": "/repo/primes.py", "view_range": [1, 2]}
    lines: Any = [{"type": "text", "text": "1: def is_prime(n):\n2:     return n > 1"}]
    sent = _second_turn(an, fresh_emulator, tools, "Fix the bug in primes.py.", name, viewed, lines)
    assert sent["messages"][1]["tool_calls"][0]["function"] == {
        "name": name, "arguments": '{"command":"view","path":"/repo/primes.py","view_range":[1,2]}'}
    assert sent["messages"][2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "1: def is_prime(n):\n2:     return n > 1"}


def test_the_text_editors_max_characters_reaches_an_openai_model_in_its_description(an, fresh_emulator):
    """text_editor_20250728's `max_characters` says how much of a file a view shows (the client cuts it there):
    the model is told so, in the function's description."""
    tools: Any = [{"type": "text_editor_20250728", "name": "str_replace_based_edit_tool", "max_characters": 10000}]
    ask: Any = [{"role": "user", "content": "Read primes.py."}]
    assert an.messages.create(model="claude-x", max_tokens=64, tools=tools, messages=ask).content
    assert "view shows at most 10000 characters of a file" in _sent(fresh_emulator)["tools"][0]["function"]["description"]

