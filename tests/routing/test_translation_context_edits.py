"""Anthropic's tool-result clearing (`context_management` edit `clear_tool_uses_20250919`) on an OpenAI target.

Claude clears a long tool loop's old results server-side once the request reaches the edit's trigger; a request for an
OpenAI target that would be cleared was a 400, so an agent using context editing (the Claude Agent SDK, the Vercel AI
SDK's anthropic provider) could not fall back to an OpenAI model. The gateway now clears as Claude does: the results
older than the `keep` most recent tool uses, less those of `exclude_tools`, reach the upstream as a placeholder (with
`clear_tool_inputs`, their calls' inputs as `{}`), unless `clear_at_least` asks for more than that clears; the answer's
`context_management.applied_edits` counts the cleared tool uses and input tokens (body and stream); a token count
counts the cleared conversation and says the whole one's (`original_input_tokens`).

The official anthropic client (beta messages, the context-management beta header) through the proxy (team key
"sk-routing"), the emulator as the OpenAI upstream; tokens are counted as sdk/estimate.py counts Claude's (cl100k × 1.2).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import tiktoken.core

from sdk.estimate import count_texts
from sdk.routing.translation import context_edits
from sdk.types import Protocol
from tests.routing.conftest import routed_proxy
from tests.routing.conftest import sent as _sent

ROUTES = """  - match: {model: "claude-count-*"}
    targets: [{provider: gpt, model: gpt-4}]
  - match: {model: "claude-*"}
    targets: [{provider: gpt, model: gpt-4o}]"""
BETA = ["context-management-2025-06-27"]
PLACEHOLDER = "[Tool result cleared from context]"  # the gateway's wording (context_edits.py; Anthropic's is not published)
# An agent's tool loop, oldest first: id → (tool, input, result). toolu_02 and toolu_03 were called in one turn.
USES: dict[str, tuple[str, dict[str, str], str]] = {
    "toolu_01": ("Read", {"file_path": "src/app.py"}, "import os\n" + "def handler(event):\n    return event\n" * 8),
    "toolu_02": ("Bash", {"command": "ls -la src"}, "total 48\n" + "-rw-r--r-- 1 dev dev 1024 app.py\n" * 6),
    "toolu_03": ("Memory", {"note": "the user prefers tabs"}, "Saved: the user prefers tabs."),
    "toolu_04": ("Read", {"file_path": "tests/test_app.py"}, "def test_handler():\n    assert handler(1) == 1\n" * 5),
    "toolu_05": ("Bash", {"command": "pytest -q"}, "5 passed in 0.12s\n" * 4),
}
TOOLS: Any = [{"name": name, "description": name, "input_schema": {"type": "object", "properties": {}}}
              for name in ("Read", "Bash", "Memory")]


def _turn(*ids: str) -> list[dict[str, Any]]:
    calls = [{"type": "tool_use", "id": i, "name": USES[i][0], "input": USES[i][1]} for i in ids]
    results = [{"type": "tool_result", "tool_use_id": i, "content": USES[i][2]} for i in ids]
    return [{"role": "assistant", "content": calls}, {"role": "user", "content": results}]


TURNS: Any = [{"role": "user", "content": "Run the tests of src/app.py."},
              *_turn("toolu_01"), *_turn("toolu_02", "toolu_03"), *_turn("toolu_04"), *_turn("toolu_05")]
LOW = {"type": "input_tokens", "value": 50}  # the conversation is well past it
KEEP_2 = {"type": "tool_uses", "value": 2}


def _claude_tokens(text: str) -> int:
    return count_texts([text], Protocol.ANTHROPIC)


def _saved(use: str) -> int:
    """The input tokens clearing `use`'s result saves: its result's, less the placeholder's."""
    return _claude_tokens(USES[use][2]) - _claude_tokens(PLACEHOLDER)


def _input(use: str) -> int:
    """The input tokens clearing `use`'s call's input saves (its string values, as the estimate counts them)."""
    return count_texts(list(USES[use][1].values()), Protocol.ANTHROPIC)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[str]:
    yield from routed_proxy(tmp_path_factory.mktemp("context-edits"), emulator.url, ROUTES)


def _upstream(emulator) -> tuple[dict[str, Any], dict[str, str]]:
    """What the upstream was sent last: each tool message's content and each tool call's arguments, by id."""
    messages = _sent(emulator)["messages"]
    results = {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}
    calls = {c["id"]: c["function"]["arguments"] for m in messages for c in m.get("tool_calls") or ()}
    return results, calls


def _create(an, edit: dict[str, Any]) -> Any:
    return an.beta.messages.with_raw_response.create(model="claude-x", max_tokens=64, messages=TURNS, tools=TOOLS,
                                                     context_management={"edits": [edit]}, betas=BETA)


def _applied(answer: Any) -> list[dict[str, Any]]:
    assert answer.context_management is not None
    return [edit.model_dump() for edit in answer.context_management.applied_edits]


def test_the_oldest_tool_results_past_the_trigger_reach_the_upstream_cleared_and_the_answer_counts_them(an, fresh_emulator):
    """Past a trigger of 50 input tokens, keeping 2 tool uses and never Memory's: the results of toolu_01 and
    toolu_02 (the oldest) reach gpt-4o as the placeholder; toolu_03 (Memory, excluded) and the two most recent are
    sent as they are, and every call's input too. The answer says 2 tool uses and their tokens were cleared, in a
    body and in a stream (message_delta, and the message the client's stream helper assembles)."""
    edit = {"type": "clear_tool_uses_20250919", "trigger": LOW, "keep": KEEP_2, "exclude_tools": ["Memory"]}
    raw = _create(an, edit)
    results, calls = _upstream(fresh_emulator)
    assert results == {"toolu_01": PLACEHOLDER, "toolu_02": PLACEHOLDER, "toolu_03": USES["toolu_03"][2],
                       "toolu_04": USES["toolu_04"][2], "toolu_05": USES["toolu_05"][2]}
    assert calls == {i: json.dumps(use[1], separators=(",", ":")) for i, use in USES.items()}
    expected: list[dict[str, Any]] = [{"type": "clear_tool_uses_20250919", "cleared_tool_uses": 2, "cleared_input_tokens": _saved("toolu_01") + _saved("toolu_02")}]
    assert expected[0]["cleared_input_tokens"] > 0 and _applied(raw.parse()) == expected
    assert "context_management" not in raw.headers.get("x-slipstream-dropped-fields", "")  # applied, not dropped

    with an.beta.messages.stream(model="claude-x", max_tokens=64, messages=TURNS, tools=TOOLS,
                                 context_management={"edits": [edit]}, betas=BETA) as stream:
        kinds = {event.type: event for event in stream}
        final = stream.get_final_message()
    assert _upstream(fresh_emulator)[0] == results
    assert _applied(kinds["message_delta"]) == expected and _applied(final) == expected


def test_clear_tool_inputs_clears_the_cleared_calls_inputs_too_all_or_the_named_tools(an, fresh_emulator):
    """`clear_tool_inputs: true`: the cleared uses' calls reach the upstream with `{}` as their arguments (an excluded
    or kept use's input stays), their inputs' tokens counted as cleared; a list of names clears only those tools'."""
    edit = {"type": "clear_tool_uses_20250919", "trigger": LOW, "keep": KEEP_2, "exclude_tools": ["Memory"],
            "clear_tool_inputs": True}
    answer = _create(an, edit).parse()
    results, calls = _upstream(fresh_emulator)
    assert calls["toolu_01"] == calls["toolu_02"] == "{}"
    assert calls["toolu_03"] == '{"note":"the user prefers tabs"}' and calls["toolu_04"] == '{"file_path":"tests/test_app.py"}'
    assert results["toolu_01"] == results["toolu_02"] == PLACEHOLDER and results["toolu_03"] == USES["toolu_03"][2]
    cleared = _saved("toolu_01") + _saved("toolu_02") + _input("toolu_01") + _input("toolu_02")
    assert _applied(answer) == [{"type": "clear_tool_uses_20250919", "cleared_tool_uses": 2, "cleared_input_tokens": cleared}]

    answer = _create(an, {**edit, "clear_tool_inputs": ["Read"]}).parse()
    results, calls = _upstream(fresh_emulator)
    assert calls["toolu_01"] == "{}" and calls["toolu_02"] == '{"command":"ls -la src"}'
    assert results["toolu_01"] == results["toolu_02"] == PLACEHOLDER
    cleared = _saved("toolu_01") + _saved("toolu_02") + _input("toolu_01")
    assert _applied(answer)[0]["cleared_input_tokens"] == cleared


def test_clear_at_least_holds_the_clearing_back_when_it_would_clear_too_little(an, fresh_emulator):
    """`clear_at_least` is a minimum: where clearing every eligible use would save fewer tokens, nothing is cleared,
    the whole conversation reaches the upstream, `context_management` is named dropped and `applied_edits` is `[]`.
    Asking for exactly what the clearing saves clears."""
    saved = _saved("toolu_01") + _saved("toolu_02")
    edit = {"type": "clear_tool_uses_20250919", "trigger": LOW, "keep": KEEP_2, "exclude_tools": ["Memory"],
            "clear_at_least": {"type": "input_tokens", "value": saved + 1}}
    raw = _create(an, edit)
    results, _ = _upstream(fresh_emulator)
    assert results == {i: use[2] for i, use in USES.items()}
    assert _applied(raw.parse()) == [] and "context_management" in raw.headers["x-slipstream-dropped-fields"].split(",")
    answer = _create(an, {**edit, "clear_at_least": {"type": "input_tokens", "value": saved}}).parse()
    assert _upstream(fresh_emulator)[0]["toolu_02"] == PLACEHOLDER
    assert _applied(answer) == [{"type": "clear_tool_uses_20250919", "cleared_tool_uses": 2, "cleared_input_tokens": saved}]


def test_a_trigger_in_tool_uses_clears_once_the_conversation_has_that_many(an, fresh_emulator):
    """A `tool_uses` trigger counts the conversation's tool calls: 5 reach a trigger of 5, and the uses older than the
    3 kept by default (toolu_01, toolu_02) are cleared; a trigger of 6 is not reached and nothing is."""
    edit = {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 5}}
    answer = _create(an, edit).parse()
    results, _ = _upstream(fresh_emulator)
    assert [i for i, content in results.items() if content == PLACEHOLDER] == ["toolu_01", "toolu_02"]
    assert _applied(answer) == [{"type": "clear_tool_uses_20250919", "cleared_tool_uses": 2,
                                 "cleared_input_tokens": _saved("toolu_01") + _saved("toolu_02")}]
    answer = _create(an, {**edit, "trigger": {"type": "tool_uses", "value": 6}}).parse()
    assert _upstream(fresh_emulator)[0] == {i: use[2] for i, use in USES.items()} and _applied(answer) == []


def test_a_token_count_counts_the_cleared_conversation_and_the_whole_one(an, fresh_emulator):
    """`count_tokens` with context editing counts what the model would be sent, as Anthropic's does, and says what the
    input was before the edits (`context_management.original_input_tokens`): for gpt-4 (cl100k, whose count the gateway
    has), the conversation less the cleared results, and the whole one; where no edit acts, the two are one count."""
    edit = {"type": "clear_tool_uses_20250919", "trigger": LOW, "keep": KEEP_2, "exclude_tools": ["Memory"]}
    count = an.beta.messages.count_tokens(model="claude-count-x", messages=TURNS, tools=TOOLS,
                                          context_management={"edits": [edit]}, betas=BETA)
    whole = an.beta.messages.count_tokens(model="claude-count-x", messages=TURNS, tools=TOOLS, betas=BETA)
    assert count.context_management is not None and count.context_management.original_input_tokens == whole.input_tokens
    cl100k = sum(count_texts([USES[i][2]], Protocol.OPENAI) - count_texts([PLACEHOLDER], Protocol.OPENAI) for i in ("toolu_01", "toolu_02"))
    assert count.input_tokens == whole.input_tokens - cl100k
    held = an.beta.messages.count_tokens(model="claude-count-x", messages=TURNS, tools=TOOLS, betas=BETA, context_management={
        "edits": [{**edit, "trigger": {"type": "tool_uses", "value": 6}}]})
    assert held.input_tokens == whole.input_tokens and held.context_management is not None
    assert held.context_management.original_input_tokens == whole.input_tokens


def _encodes(monkeypatch, text: str) -> list[str]:
    """Every time the gateway tokenizes `text` from now on (tiktoken's encoding; the proxy runs in this process)."""
    seen: list[str] = []
    encode = tiktoken.core.Encoding.encode_ordinary

    def spied(self: tiktoken.core.Encoding, given: str) -> list[int]:
        if text in given:
            seen.append(given)
        return encode(self, given)

    monkeypatch.setattr(tiktoken.core.Encoding, "encode_ordinary", spied)
    return seen


def test_a_token_count_with_clearing_counts_the_conversation_once(an, fresh_emulator, monkeypatch):
    """A count whose clearing acts answers two counts (the cleared conversation's and the whole one's), which share
    all but the cleared results: the conversation is tokenized no more often than for a count where nothing is cleared
    (once for the trigger's estimate of Claude's count, once counted), where it was counted a second time whole."""
    edit = {"type": "clear_tool_uses_20250919", "trigger": LOW, "keep": KEEP_2, "exclude_tools": ["Memory"]}
    held = {**edit, "trigger": {"type": "input_tokens", "value": 10**6}}  # estimated, not reached: nothing cleared
    seen = _encodes(monkeypatch, "Run the tests of src/app.py.")  # the first turn, never cleared
    counts = []
    for each in (held, edit):
        seen.clear()
        counts.append(an.beta.messages.count_tokens(model="claude-count-x", messages=TURNS, tools=TOOLS, betas=BETA,
                                                    context_management={"edits": [each]}))
        counts.append(len(seen))
    assert counts[2].input_tokens < counts[0].input_tokens  # cleared
    assert counts[2].context_management.original_input_tokens == counts[0].input_tokens  # the whole one's, as counted
    assert counts[3] == counts[1] == 2


def test_a_requests_edits_are_its_own_worked_out_once_and_not_kept_after_it(an, fresh_emulator, monkeypatch):
    """The clearing is worked out once per request (the field check, the translation and the answer ask for it), and
    nothing of a request stays in the module once it is answered: no memo shared by the teams a server serves."""
    worked: list[int] = []
    cleared = context_edits._cleared

    def spied(edit: dict[str, Any], body: dict[str, Any]) -> Any:
        worked.append(1)
        return cleared(edit, body)

    monkeypatch.setattr(context_edits, "_cleared", spied)
    edit = {"type": "clear_tool_uses_20250919", "trigger": LOW, "keep": KEEP_2, "exclude_tools": ["Memory"]}
    answer = _create(an, edit).parse()
    assert len(worked) == 1 and _applied(answer)[0]["cleared_tool_uses"] == 2
    assert "src/app.py" not in repr(vars(context_edits))
