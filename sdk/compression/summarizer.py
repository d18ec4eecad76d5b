"""The cheap route that writes history summaries: one of the team's providers, called directly.

It bypasses the team's pipeline on purpose: a summary is the gateway's own work, so it must not be
cached, compressed or answered from a cache. It is still the team's spend on the provider account:
each call is admitted by the team's limits and budget and by the per-key limits of the team key whose
request asked for it (a refusal leaves the conversation uncompacted), and charged with its usage to
both, so compaction cannot carry a team past its token limit or budget, nor a key past its own.
"""

from __future__ import annotations

from typing import Any

import orjson

from sdk.errors import SlipstreamError
from sdk.limits.stage import LimitsStage
from sdk.providers.base import Provider
from sdk.types import Endpoint, LLMRequest, LLMResponse, Protocol, Timings

INSTRUCTIONS = (
    "You compact the earlier part of a conversation between a user and an assistant so that the assistant "
    "can continue it without the original turns. Write a faithful, compact summary in the third person. "
    "Keep every fact, number, name, identifier, decision, constraint, request and open question; keep code "
    "and exact values verbatim; drop pleasantries and repetition. Output only the summary."
)


class Summarizer:
    def __init__(self, provider: Provider, model: str, max_tokens: int, limits: LimitsStage, hosted: bool = True):
        self.provider = provider
        self.model = model
        self.max_tokens = max_tokens
        self.limits = limits  # the team's: the same buckets and budget as its requests
        self.hosted = hosted  # False for the bundled engine, which costs nothing per token

    async def __call__(self, transcript: str, key_id: str = "") -> str:
        user = {"role": "user", "content": f"Conversation to summarize:\n\n{transcript}"}
        if self.provider.protocol is Protocol.ANTHROPIC:
            body = {"model": self.model, "max_tokens": self.max_tokens, "temperature": 0, "system": INSTRUCTIONS, "messages": [user]}
            request = LLMRequest(Endpoint.MESSAGES, body)
        else:
            messages = [{"role": "system", "content": INSTRUCTIONS}, user]
            body = {"model": self.model, "max_tokens": self.max_tokens, "temperature": 0, "messages": messages}
            request = LLMRequest(Endpoint.CHAT_COMPLETIONS, body)
        reserve = self.limits.own_call_reservation(request, self.model) if self.hosted else 0.0
        admission = await self.limits.admit(key_id, budget=self.hosted, reserve=reserve)  # a refusal raises its 429
        try:
            answer = await self.provider.send(request, Timings())
        except BaseException:
            self.limits.settle(admission, key_id, self.model, None)
            raise
        self.limits.settle(admission, key_id, self.model, answer.usage, rate=1.0 if self.hosted else 0.0)
        if not isinstance(answer, LLMResponse):  # we never ask for a stream; close one defensively
            await answer.aclose()
            raise SlipstreamError("summarizer answered with a stream", status=502)
        if answer.status != 200:
            raise SlipstreamError(f"summarizer answered {answer.status}", status=502)
        return _text(self.provider.protocol, orjson.loads(answer.body))


def _text(protocol: Protocol, body: dict[str, Any]) -> str:
    if protocol is Protocol.ANTHROPIC:
        return "".join(block.get("text", "") for block in body.get("content", []) if block.get("type") == "text")
    choices = body.get("choices") or [{}]
    return choices[0].get("message", {}).get("content") or ""
