"""A Chat request's reasoning_effort (a Responses request's reasoning.effort, which becomes it) as Claude's thinking.

Claude reasons only when `thinking` is on; `output_config.effort` alone sets how much a model that thinks spends, and
on most models thinking is off by default. So a request asking for reasoning is sent `thinking` too, as the model's
family takes it (Anthropic's adaptive-thinking and extended-thinking docs):

- adaptive (`{type: "adaptive"}`, the effort in output_config.effort): Opus and Sonnet 4.6 and every later model
  (Opus 4.7 and later, Fable and Mythos take nothing else: `enabled` is their 400);
- enabled with a budget (`{type: "enabled", budget_tokens}`): the 4.5 models, Opus 4.1, Opus and Sonnet 4, Sonnet 3.7
  (they answer `adaptive` with a 400). The budget is what the effort stands for (the inverse of the Messages → OpenAI
  mapping: low 4,096, medium 16,384, high and xhigh 32,768, minimal the least Claude takes, 1,024), within max_tokens,
  which counts thinking as OpenAI's max_completion_tokens counts reasoning; a limit of 1,024 or less leaves no room
  for the least budget, and the request is sent without thinking;
- other models (Haiku 3.5, Claude 3) have no thinking: the effort is dropped and named (fields.py).

A request is sent without thinking, as before, where thinking would be Claude's 400: a conversation ending with an
assistant turn (a prefill, the gateway's JSON prefill included: "you cannot pre-fill responses when extended thinking
is enabled"), a tool loop (the latest message holds tool results: Claude requires the thinking block that opened the
turn back, signed, and Chat has no place for it, so a Chat client never sends it), and a forced tool choice
(`required`, a named function: "Thinking may not be enabled when tool_choice forces tool use"; Anthropic's tool-workflow
page says adaptive thinking takes one, its extended-thinking page that thinking does not, so neither mode is sent one).
Thinking takes no temperature and a top_p of 0.95 or more only, where OpenAI's reasoning models take neither: as for a
Messages request asking a reasoning OpenAI model to think, the request's temperature (and a top_p below 0.95) is left
out, and named.

Claude's thinking is not returned to a Chat client (Chat Completions has no field for it; its reasoning models do not
return theirs either); its tokens, within output_tokens as OpenAI's reasoning tokens are within completion_tokens,
are the usage's completion_tokens_details.reasoning_tokens (Claude's usage.output_tokens_details.thinking_tokens).
"""

from __future__ import annotations

import re
from typing import Any

from sdk.routing.translation.output_limits import claude_output_limit, default_max_tokens
from sdk.routing.translation.output_modes import json_mode

_ADAPTIVE = re.compile(r"^claude-((opus|sonnet)-4-([6-9]|\d\d)|opus-5|sonnet-5|fable|mythos)")
_BUDGETED = re.compile(r"^claude-((opus|sonnet|haiku)-4-5|opus-4-1|(opus|sonnet)-4(-2|$)|3-7-sonnet)")
_BUDGETS = {"minimal": 1024, "low": 4096, "medium": 16384, "high": 32768, "xhigh": 32768}
_LEAST_BUDGET = 1024  # Claude's least budget_tokens
_LEAST_TOP_P = 0.95  # with thinking, top_p from 0.95 to 1 only


def thinking_mode(model: Any) -> str | None:
    """How the Claude model `model` is asked to think: "adaptive", "enabled" (with a budget), or None (it does not)."""
    name = str(model or "")
    return "adaptive" if _ADAPTIVE.match(name) else "enabled" if _BUDGETED.match(name) else None


def max_tokens_of(body: dict[str, Any]) -> int:
    """The max_tokens a Chat request is sent to Claude with."""
    model, asked = body.get("model"), body.get("max_completion_tokens") or body.get("max_tokens")
    return claude_output_limit(model, asked) if asked else default_max_tokens(model)


def chat_thinking(body: dict[str, Any]) -> dict[str, Any] | None:
    """The `thinking` a Chat request for a Claude model is sent with (None: none)."""
    effort, mode = body.get("reasoning_effort"), thinking_mode(body.get("model"))
    if effort not in _BUDGETS or mode is None or _prefilled(body) or _in_tool_loop(body) or _forced(body.get("tool_choice")):
        return None
    if mode == "adaptive":
        return {"type": "adaptive"}
    limit = max_tokens_of(body)
    budget = min(_BUDGETS[effort], limit - 1)
    return {"type": "enabled", "budget_tokens": budget} if budget >= _LEAST_BUDGET else None


def unsampled(body: dict[str, Any]) -> list[str]:
    """A Chat request's sampling settings that thinking takes none of (left out, and named): temperature, a low top_p."""
    if chat_thinking(body) is None:
        return []
    top_p = body.get("top_p")
    return ["temperature"] * (body.get("temperature") is not None) + ["top_p"] * (isinstance(top_p, (int, float)) and top_p < _LEAST_TOP_P)


def _prefilled(body: dict[str, Any]) -> bool:
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    if isinstance(last, dict) and last.get("role") == "assistant":
        return True
    mode = json_mode(body)
    return mode is not None and bool(mode.prefill)


def _forced(choice: Any) -> bool:
    """Whether a Chat tool_choice is Claude's `any` or `tool` (requests.py)."""
    return choice == "required" or (isinstance(choice, dict) and (choice.get("type") == "function" or (
        choice.get("type") == "allowed_tools" and (choice.get("allowed_tools") or {}).get("mode") == "required")))


def _in_tool_loop(body: dict[str, Any]) -> bool:
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    return isinstance(last, dict) and last.get("role") in ("tool", "function")
