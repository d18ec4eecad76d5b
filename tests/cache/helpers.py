"""Requests and answer readers for the cache tests."""

from __future__ import annotations

from typing import Any

import orjson

from sdk.runtime import TeamRuntime
from sdk.types import Answer, Endpoint, LLMRequest, LLMResponse

CLAUDE = "claude-sonnet-4-6"  # takes temperature 0 (Opus 4.7+ and Sonnet 5 answer it with a 400: the emulator too)
GPT = "gpt-4.1-mini"  # takes temperature 0 (reasoning models answer it with a 400: the emulator too)


def claude(text: str, *, stream: bool = False, temperature: float | None = 0, before: list[dict[str, Any]] | None = None, **extra: Any) -> LLMRequest:
    body: dict[str, Any] = {"model": CLAUDE, "max_tokens": 200, "messages": [*(before or []), {"role": "user", "content": text}], **extra}
    if temperature is not None:
        body["temperature"] = temperature
    if stream:
        body["stream"] = True
    return LLMRequest(Endpoint.MESSAGES, body)


def gpt(text: str, *, stream: bool = False, include_usage: bool = False, **extra: Any) -> LLMRequest:
    body: dict[str, Any] = {"model": GPT, "temperature": 0, "messages": [{"role": "user", "content": text}], **extra}
    if stream:
        body["stream"] = True
        if include_usage:
            body["stream_options"] = {"include_usage": True}
    return LLMRequest(Endpoint.CHAT_COMPLETIONS, body)


async def read(answer: Answer) -> bytes:
    if isinstance(answer, LLMResponse):
        return answer.body
    return b"".join([event async for event in answer.events])


async def ask(runtime: TeamRuntime, request: LLMRequest) -> tuple[bytes, str, Answer]:
    """(body or stream bytes, cache status, answer) of one request through the team's pipeline."""
    answer, ctx = await runtime.handle(request)
    return await read(answer), ctx.cache_status, answer


def text_of(body: bytes) -> str:
    data = orjson.loads(body)
    if "choices" in data:
        return data["choices"][0]["message"]["content"]
    return "".join(block.get("text", "") for block in data["content"])
