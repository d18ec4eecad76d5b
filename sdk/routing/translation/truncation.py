"""A Responses request's `truncation: "auto"` on a translated target (Claude, or a Chat Completions upstream).

OpenAI's reference: "auto: If the input to this Response exceeds the model's context window size, the model will
truncate the response to fit the context window by dropping items from the beginning of the conversation."
("disabled", the default, fails the request with a 400.) A translated target has no such setting, so the gateway
does it, and needs two numbers it can trust: the target's context window and the conversation's size in the target's
tokens. It has neither ahead of time: the spend hold's table (sdk/estimate.py:CONTEXT_WINDOW_BY_MODEL) holds only the
OpenAI windows larger than a page limit, Claude's window depends on the model and on beta headers (1M tokens for
some), and Claude's tokenizer is not public (the gateway's count, cl100k × 1.2, leans high). The target's own overflow
400 says both exactly (Anthropic's "prompt is too long: 208310 tokens > 200000 maximum", OpenAI's "maximum context
length is 128000 tokens. However, your messages resulted in 130000 tokens", vLLM's and the bundled engine's "your
prompt has N tokens" or "you requested N tokens (M in the prompt, C in the completion)"). So the request is sent as it is; only when the target answers that it is too
long are the oldest items dropped (`fitted`) and the request sent again (a 400 is not billed, and a conversation
that fits pays nothing). What is dropped is sized by the gateway's estimate of each item, scaled to the target's
exact count, with a margin; a second overflow (the estimate was low) is answered the same way, a few times at most.

Items go from the start in whole turns: the input kept begins at a user message, so no tool output is left without
its call (which both Chat and Claude refuse); a leading system or developer message (the opening instructions) is
kept, and so is the last user message and what follows it: a conversation whose last turn alone does not fit gets
the target's overflow, as OpenAI's answers one.
"""

from __future__ import annotations

import math
import re
from typing import Any

from sdk.estimate import input_tokens
from sdk.routing.translation.bodies import error_message
from sdk.types import Endpoint, LLMRequest

AUTO = "auto"
TRIES = 3  # overflows answered by truncating, in one request
_MARGIN = 1.1  # drop a tenth more than the estimate says is over: one more round trip costs more than an old turn
_SLACK = 256  # tokens, on top: the estimate is by length, item by item

# (prompt tokens, the most the prompt may be) in each provider's words; the groups' meaning is each pattern's own.
# OpenAI's "your messages resulted in N tokens"; vLLM's (and the bundled engine's) "your request has N input tokens",
# "'max_tokens' or 'max_completion_tokens' is too large: C. ... context length is W tokens and your request has P input
# tokens", and older vLLM's "your prompt has N tokens", "you requested N tokens (P in the messages|prompt, C in the
# completion)".
_RESULTED = re.compile(r"maximum context length is (\d+) tokens\. However, (?:your messages resulted in|your prompt has|"
                       r"your request has) (\d+) (?:input )?tokens")
_REQUESTED = re.compile(r"maximum context length is (\d+) tokens\. However, you requested \d+ tokens \((\d+) in the "
                        r"(?:messages|prompt), (\d+) in the completion\)")
_TOO_LARGE = re.compile(r"is too large: (\d+)\. This model's maximum context length is (\d+) tokens and your "
                        r"request has (\d+) input tokens")
_TOO_LONG = re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum")
_WITH_OUTPUT = re.compile(r"exceed context limit: (\d+) \+ (\d+) > (\d+)")


def overflow(body: bytes) -> tuple[int, int] | None:
    """(the prompt's tokens, the most it may be) from a context-overflow error body, or None."""
    message = error_message(body)
    if match := _RESULTED.search(message):
        return int(match[2]), int(match[1])
    if match := _REQUESTED.search(message):
        return int(match[2]), int(match[1]) - int(match[3])
    if match := _TOO_LARGE.search(message):
        return int(match[3]), int(match[2]) - int(match[1])
    if match := _TOO_LONG.search(message):
        return int(match[1]), int(match[2])
    if match := _WITH_OUTPUT.search(message):
        return int(match[1]), int(match[3]) - int(match[2])
    return None


def _estimate(value: dict[str, Any]) -> int:
    """The gateway's count of a Responses body (or one item of it), by length: only the shares matter."""
    return input_tokens(LLMRequest(Endpoint.RESPONSES, value), exact=0)


def _user(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type", "message") == "message" and item.get("role") == "user"


def _instructions(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type", "message") == "message" and item.get("role") in ("system", "developer")


def fitted(body: dict[str, Any], items: list[dict[str, Any]], tokens: int, most: int) -> list[dict[str, Any]] | None:
    """`items` (the request's whole input) less its oldest turns, enough that a prompt the target counted as `tokens`
    fits in `most`; None where nothing can go (the last user turn would)."""
    lead = 0
    while lead < len(items) and _instructions(items[lead]):
        lead += 1
    last_user = max((i for i, item in enumerate(items) if _user(item)), default=-1)
    sizes = [_estimate({"input": [item]}) for item in items]
    whole = _estimate({**body, "input": []}) + sum(sizes)
    scale = tokens / max(1, whole)  # the target's tokens per token of the estimate
    over = math.ceil((tokens - most) * _MARGIN) + _SLACK
    dropped, cut = 0.0, lead
    while cut < last_user and dropped < over:
        dropped += sizes[cut] * scale
        cut += 1
    while cut < last_user and not _user(items[cut]):  # a whole turn: never a tool output without its call
        cut += 1
    # Too little may have gone where the last user turn was reached: the target says so again, and then nothing can go.
    return items[:lead] + items[cut:] if cut > lead else None
