"""Parallel tool calls: a turn that calls several tools at once.

Real models call tools in parallel when a request is naturally several independent calls; the emulator
does it on an explicit cue so tests can drive the N-call wire format of each provider: the user's last
own message says "in parallel" and names two or more of the offered tools (whole words). Every named
tool is then called, once each, in the order the tools were offered. It never happens where the request
disables parallel calls (Anthropic `tool_choice.disable_parallel_tool_use: true`, OpenAI
`parallel_tool_calls: false`), where it names the one tool to call, or right after tool results (the
tool rule's auto answer there is text, so an agent loop still ends)."""

from __future__ import annotations

import re
from typing import Any

_CUE = "in parallel"


def parallel_names(text: str, names: list[str], disabled: bool) -> list[str]:
    """The tools a turn calls at once (two or more), or [] for the one-call rule."""
    low = text.lower()
    if disabled or _CUE not in low:
        return []
    named = [n for n in names if n and re.search(r"(?<![\w-])" + re.escape(n.lower()) + r"(?![\w-])", low)]
    return named if len(named) > 1 else []


def interleaves(text: str) -> bool:
    """Whether a Chat Completions stream of a parallel turn interleaves its calls' argument fragments (the user's
    last own message says "interleave"). OpenAI's own API streams one call after another; the Chat format keys every
    delta by its call's `index`, so an OpenAI-compatible server may interleave them, and a translator must cope."""
    return "interleave" in text.lower()


def extra_calls(names: list[str], schemas: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """(name, schema) of the calls after the first, for ToolPick.more."""
    return tuple((n, schemas[n]) for n in names[1:])
