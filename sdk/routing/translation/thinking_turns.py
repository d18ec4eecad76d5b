"""A Claude conversation with extended thinking whose tool-use turn another provider answered.

With `thinking: {type: "enabled"}`, Claude requires a conversation in a tool loop (ending with tool results) to send
back the thinking block that opened the assistant's turn, signature and all: the first assistant message after the
user's last own message must start with a `thinking` or `redacted_thinking` block, or the request is Anthropic's 400
("When `thinking` is enabled, a final `assistant` message must start with a thinking block ... To avoid this
requirement, disable `thinking`": Anthropic's extended-thinking docs, "Preserving thinking blocks").

A turn an OpenAI model answered (a fallback of the route, a switch of model, through this gateway or not) has no
thinking block and can never have one: its calls come back as `tool_use` blocks without one (streams.py, bodies.py),
and no one but Claude can sign a block. Sent to Claude when the client returns the results, the loop stopped at that
400. The gateway does what the 400 advises, for that request only: `thinking` is left out (and named in
`x-slipstream-dropped-fields`), so Claude answers the results without thinking first, and thinks again from the
user's next own message, whose turn no longer holds the foreign calls.

Only a turn whose calls Claude did not make is taken this way: Claude's tool_use ids begin `toolu_` (the API's,
Bedrock's `toolu_bdrk_`, Vertex's `toolu_vrtx_`), an OpenAI model's `call_`. A Claude turn whose thinking the client
left out stays Claude's 400, which is the client's to mend. Leaving `thinking` out changes the request's cached
prefix from the messages on (Claude's cache keys thinking's settings before the messages), once.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sdk.providers.base import Provider
from sdk.routing.translation.fields import mark_dropped
from sdk.types import Answer, Endpoint, LLMRequest, Protocol, Timings

_THOUGHT = ("thinking", "redacted_thinking")


def _blocks(message: Any) -> list[dict[str, Any]]:
    content = message.get("content") if isinstance(message, dict) else None
    return [block for block in content if isinstance(block, dict)] if isinstance(content, list) else []


def _own(message: Any) -> bool:
    """A user message of the user's own (not only tool results): a turn of the assistant begins after it."""
    return isinstance(message, dict) and message.get("role") == "user" and (
        isinstance(message.get("content"), str) or any(block.get("type") != "tool_result" for block in _blocks(message)))


def foreign_tool_turn(request: LLMRequest) -> bool:
    """Whether `request` (a Messages request for Claude) asks for thinking in a tool loop whose turn another
    provider opened: its first assistant message has no thinking block and calls Claude did not make."""
    body = request.body
    thinking, messages = body.get("thinking"), body.get("messages")
    if request.endpoint is not Endpoint.MESSAGES or not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return False
    if not isinstance(messages, list) or not messages or not any(b.get("type") == "tool_result" for b in _blocks(messages[-1])):
        return False
    first: Any = None
    for message in reversed(messages[:-1]):
        if _own(message):
            break
        if isinstance(message, dict) and message.get("role") == "assistant":
            first = message
    blocks = _blocks(first)
    if not blocks or blocks[0].get("type") in _THOUGHT:
        return False
    return any(b.get("type") == "tool_use" and not str(b.get("id") or "").startswith("toolu_") for b in blocks)


class WithoutThinking:
    """`inner` (a Claude target) sent the request without `thinking`, which its answer names as dropped."""

    def __init__(self, inner: Provider) -> None:
        self.inner = inner
        self.name = inner.name

    @property
    def protocol(self) -> Protocol:
        return self.inner.protocol

    async def list_models(self) -> list[dict[str, Any]]:
        return await self.inner.list_models()

    async def send(self, request: LLMRequest, timings: Timings) -> Answer:
        body = {key: value for key, value in request.body.items() if key != "thinking"}
        answer = await self.inner.send(replace(request, body=body), timings)
        mark_dropped(answer.headers, ["thinking"])
        return answer
