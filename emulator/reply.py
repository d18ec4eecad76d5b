"""Provider-neutral reply planning: text or tool call, stop kind, output token count."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from .text import apply_stop, count_tokens, example_from_schema, reply_text


@dataclass(slots=True)
class Reply:
    text: str  # assistant text ("" for a forced tool call)
    tool_name: str | None
    tool_input: Any
    tool_json: str  # tool input serialised as streamed / sent as OpenAI arguments
    stop: str  # "end" | "max" | "stop_sequence" | "tool"
    stop_sequence: str | None
    output_tokens: int


@dataclass(slots=True)
class ToolPick:
    name: str
    schema: Any
    preface: bool  # emit a short text before the call (auto mode, like real models do)


def make_reply(
    seed: int,
    natural: int,
    max_tokens: int | None,
    stops: list[str],
    tool: ToolPick | None,
) -> Reply:
    """Plan the reply. `natural` is the length the model 'wants'; `max_tokens` caps it."""
    cap = natural if max_tokens is None else min(natural, max_tokens)
    if tool is not None and (max_tokens is None or max_tokens > 0):
        args = example_from_schema(tool.schema)
        args_json = orjson.dumps(args).decode()
        pre = f"I'll use the {tool.name} tool." if tool.preface else ""
        n = count_tokens(pre) + count_tokens(tool.name) + count_tokens(args_json)
        if max_tokens is None or n <= max_tokens:
            return Reply(pre, tool.name, args, args_json, "tool", None, n)
    text = reply_text(seed, cap)
    stop = "max" if max_tokens is not None and max_tokens < natural else "end"
    hit = None
    if stops and text:
        text, hit = apply_stop(text, stops)
        if hit is not None:
            stop = "stop_sequence"
    n = cap if hit is None else count_tokens(text)
    return Reply(text, None, None, "", stop, hit, n)
