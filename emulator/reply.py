"""Provider-neutral reply planning: text or tool call, stop kind, output token count."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from .text import apply_stop, count_tokens, example_from_schema, reply_text, truncate_tokens, wants_tool


@dataclass(slots=True)
class Reply:
    text: str  # assistant text ("" for a forced tool call)
    tool_name: str | None
    tool_input: Any
    tool_json: str  # tool input serialised as streamed / sent as OpenAI arguments
    stop: str  # "end" | "max" | "stop_sequence" | "tool"
    stop_sequence: str | None
    output_tokens: int
    more: tuple[ToolCall, ...] = ()  # calls after the first in a parallel turn (parallel.py)

    def calls(self) -> list[ToolCall]:
        """Every tool call of the reply, in order (none for a text reply)."""
        first = [ToolCall(self.tool_name, self.tool_input, self.tool_json)] if self.tool_name else []
        return first + list(self.more)


@dataclass(slots=True)
class ToolCall:
    name: str
    input: Any
    json: str  # `input` serialised as streamed / sent as OpenAI arguments


@dataclass(slots=True)
class ToolPick:
    name: str
    schema: Any
    preface: bool  # emit a short text before the call (auto mode, like real models do)
    more: tuple[tuple[str, Any], ...] = ()  # (name, schema) of further calls in a parallel turn (parallel.py)


def choose_tool(names: list[str], forced: bool, text: str, after_result: bool,
                called: set[str]) -> str | None:
    """The tool rule both providers share. `text` is the user's last own message, `called` the
    tools already called since it, `after_result` whether the conversation ends with tool results.

    auto: call the tool the text names (or the first on "use a tool"), never right after a result,
    so an agent loop ends with a text answer. forced (`required` / `any`): the tool the text names
    or the first; right after a result, the first tool not yet called in this turn, so a loop
    that must end by calling an output tool (pydantic-ai's `final_result`) reaches it.
    """
    named = wants_tool(text, names)
    if not forced:
        return None if after_result else named
    if after_result:
        fresh = [n for n in names if n not in called]
        if fresh:
            return fresh[0]
    return named or names[0]


def make_reply(
    seed: int,
    natural: int,
    max_tokens: int | None,
    stops: list[str],
    tool: ToolPick | None,
    json_schema: Any = None,
    cut_calls: bool = False,
) -> Reply:
    """Plan the reply. `natural` is the length the model 'wants'; `max_tokens` caps it.

    With `json_schema` (structured output) the text is a minimal JSON instance of that schema
    whatever its length; `max_tokens` still cuts it (then it is invalid JSON, as real models' is).
    A tool call longer than `max_tokens` is cut mid-arguments with `cut_calls` (OpenAI's Chat
    Completions: finish_reason `length`, arguments that are not yet JSON); without it the reply is text.
    """
    cap = natural if max_tokens is None else min(natural, max_tokens)
    if tool is not None and (max_tokens is None or max_tokens > 0):
        args = example_from_schema(tool.schema)
        args_json = orjson.dumps(args).decode()
        pre = f"I'll use the {tool.name} tool." if tool.preface else ""
        more = tuple(ToolCall(name, a, orjson.dumps(a).decode())
                     for name, a in ((name, example_from_schema(schema)) for name, schema in tool.more))
        n = count_tokens(pre) + count_tokens(tool.name) + count_tokens(args_json)
        n += sum(count_tokens(c.name) + count_tokens(c.json) for c in more)
        if max_tokens is None or n <= max_tokens:
            return Reply(pre, tool.name, args, args_json, "tool", None, n, more)
        if cut_calls:
            cut = truncate_tokens(args_json, max(1, max_tokens - count_tokens(tool.name)))
            return Reply("", tool.name, None, cut, "max", None, max_tokens)
    if json_schema is not None:
        return _json_reply(json_schema, max_tokens)
    text = reply_text(seed, cap)
    stop = "max" if max_tokens is not None and max_tokens < natural else "end"
    hit = None
    if stops and text:
        text, hit = apply_stop(text, stops)
        if hit is not None:
            stop = "stop_sequence"
    n = cap if hit is None else count_tokens(text)
    return Reply(text, None, None, "", stop, hit, n)


def _json_reply(schema: Any, max_tokens: int | None) -> Reply:
    text = orjson.dumps(example_from_schema(schema)).decode()
    n = count_tokens(text)
    if max_tokens is not None and n > max_tokens:
        text = truncate_tokens(text, max_tokens)
        return Reply(text, None, None, "", "max", None, count_tokens(text))
    return Reply(text, None, None, "", "end", None, n)


_JSON_OBJECT = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


def output_schema(response_format: Any) -> Any:
    """The schema a chat `response_format` asks the reply to follow (None: free text)."""
    if not isinstance(response_format, dict):
        return None
    if response_format.get("type") == "json_schema":
        js = response_format.get("json_schema")
        schema = js.get("schema") if isinstance(js, dict) else None
        return schema if isinstance(schema, dict) else {}
    if response_format.get("type") == "json_object":
        return _JSON_OBJECT
    return None
