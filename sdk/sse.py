"""Server-sent events: split a byte stream into whole events and watch them as they pass.

Events are forwarded as the exact bytes the provider sent; only the few that carry usage or errors
are parsed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson

from sdk.errors import account_limit_message
from sdk.types import Endpoint, Protocol, Timings, Usage
from sdk.usage import chat_usage, merge_anthropic_usage, responses_usage


async def split_event_batches(chunks: AsyncIterator[bytes]) -> AsyncIterator[list[bytes]]:
    """The complete events (each ending in a blank line) each chunk completes, as one list per chunk.

    Events that arrive together leave together: the door writes one batch with one send. An event's
    start that arrives without its end waits in pieces, joined once the end comes: adding each chunk
    to a buffer and searching it from its start made an event of megabytes (a Responses event echoes
    the request's `instructions`) cost its size squared over the chunk size, on the loop.
    """
    pending: list[bytes] = []  # the start of an event whose end has not arrived, as it came
    async for chunk in chunks:
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n")
        batch = []
        start = 0
        if pending and chunk.startswith(b"\n") and pending[-1].endswith(b"\n"):  # a blank line across two chunks
            batch.append(b"".join(pending) + b"\n")
            pending, start = [], 1
        while (end := chunk.find(b"\n\n", start)) >= 0:
            batch.append(b"".join((*pending, chunk[start:end + 2])) if pending else chunk[start:end + 2])
            pending, start = [], end + 2
        if start < len(chunk):
            pending.append(chunk[start:] if start else chunk)
        if batch:
            yield batch
    buffer = b"".join(pending)
    if buffer.strip():
        yield [buffer if buffer.endswith(b"\n\n") else buffer.rstrip(b"\n") + b"\n\n"]


def events_of(item: bytes) -> list[bytes]:
    """The whole events in one item of an LLMStream (which may carry several that arrived together)."""
    if item.count(b"\n\n") <= 1:
        return [item]
    return [part + b"\n\n" for part in item.split(b"\n\n") if part]


def event_data(event: bytes) -> bytes:
    """The payload of an event's `data:` line (b"" when it has none)."""
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            return line[5:].strip()
    return b""


# The errors of a provider's rate or quota limits (Anthropic's type; OpenAI's code, its Responses events' too)
_ACCOUNT_LIMITS = frozenset({"rate_limit_error", "rate_limit_exceeded", "insufficient_quota"})
_ERROR_EVENTS = (b"event: error", b'data: {"error"', b"event: response.failed")


def may_name_an_account_limit(event: bytes) -> bool:
    """Whether `event` may be an in-band error about the provider account's limits (a cheap check
    before `account_limit_event` parses it)."""
    return event.startswith(_ERROR_EVENTS) and (b"rate_limit" in event or b"insufficient_quota" in event)


def account_limit_event(event: bytes, provider: str) -> bytes:
    """`event`, an in-band error of a stream on a provider account other teams share, as a team's
    client gets it: a rate or quota limit's message (which names the account and how much of its limit
    every team has used: "Rate limit reached for gpt-4o in organization org-…: Limit 30000, Used 29000")
    is replaced by the one a 429 gets (sdk/errors.py:account_rate_limited); the rest is the provider's."""
    try:
        data = orjson.loads(event_data(event))
    except orjson.JSONDecodeError:
        return event
    if not isinstance(data, dict):
        return event
    response = data.get("response")
    # Anthropic's and Chat's {"error": {...}}, a Responses `error` event itself, a `response.failed`'s response
    places = (data, data.get("error"), response.get("error") if isinstance(response, dict) else None)
    limits = [error for error in places if isinstance(error, dict) and isinstance(error.get("message"), str)
              and any(isinstance(kind, str) and kind in _ACCOUNT_LIMITS for kind in (error.get("type"), error.get("code")))]
    if not limits:
        return event
    for error in limits:
        error["message"] = account_limit_message(provider, error["message"].startswith("Request too large for "), in_band=True)
    head = b"".join(line + b"\n" for line in event.split(b"\n") if line and not line.startswith(b"data:"))
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


async def without_account_limits(chunks: AsyncIterator[bytes], provider: str) -> AsyncIterator[bytes]:
    """A stream passed on as it comes (whole events, as they complete), each in-band account-limit error
    as `account_limit_event` makes it: for a pass-through stream from an account other teams share."""
    async for batch in split_event_batches(chunks):
        yield b"".join([account_limit_event(event, provider) if may_name_an_account_limit(event) else event for event in batch])


# Responses API events that carry output tokens, and the terminal ones that carry the full usage.
_RESPONSES_TOKENS = (b"event: response.output_text.delta", b"event: response.function_call_arguments.delta",
                     b"event: response.refusal.delta", b"event: response.reasoning")
_RESPONSES_END = (b"event: response.completed", b"event: response.incomplete", b"event: response.failed")


class StreamObserver:
    """Tracks usage, token timing, finish reasons and in-band errors of one stream without changing it."""

    def __init__(self, endpoint: Endpoint, usage: Usage, timings: Timings):
        self.endpoint = endpoint
        self.protocol = endpoint.protocol  # the shape of the error event that ends a failed stream
        self.usage = usage
        self.timings = timings
        self.finish_reasons: list[str] = []  # the stream's LLMStream shares this list
        self.error: bytes | None = None  # the provider's in-band error event, if one arrived
        self.finished = False  # saw message_stop / [DONE] / the terminal response.* event

    @property
    def awaiting_usage(self) -> bool:
        """The answer has finished and its usage has yet to come: a Chat stream's usage chunk follows its
        finish chunks (Claude's `message_delta` and a Responses stream's terminal event carry both at once)."""
        return bool(self.finish_reasons) and not self.usage.final and not self.finished and self.error is None

    def observe(self, event: bytes, now: float) -> None:
        try:
            if self.endpoint is Endpoint.RESPONSES:
                self._observe_responses(event, now)
            elif self.protocol is Protocol.ANTHROPIC:
                self._observe_anthropic(event, now)
            else:
                self._observe_openai(event, now)
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
            pass  # an event we cannot read is forwarded as it is; it only goes uncounted

    def _observe_responses(self, event: bytes, now: float) -> None:
        if event.startswith(_RESPONSES_TOKENS):
            self.timings.mark_token(now)
        elif event.startswith(_RESPONSES_END):
            response = orjson.loads(event_data(event)).get("response") or {}
            if isinstance(response.get("status"), str):
                self.finish_reasons.append(response["status"])
            parsed = responses_usage(response)
            self.usage.input_tokens, self.usage.output_tokens = parsed.input_tokens, parsed.output_tokens
            self.usage.cache_read_tokens, self.usage.cache_write_tokens = parsed.cache_read_tokens, parsed.cache_write_tokens
            self.usage.web_searches, self.usage.service_tier = parsed.web_searches, parsed.service_tier
            self.usage.file_searches, self.usage.images, self.usage.containers = parsed.file_searches, parsed.images, parsed.containers
            self.usage.final = self.finished = True
        elif event.startswith((b"event: error", b'data: {"error"')):
            self.error = event

    def _observe_anthropic(self, event: bytes, now: float) -> None:
        if event.startswith(b"event: content_block_delta"):
            self.timings.mark_token(now)
        elif event.startswith(b"event: message_start"):
            message = orjson.loads(event_data(event)).get("message") or {}
            merge_anthropic_usage(self.usage, message.get("usage"))
        elif event.startswith(b"event: message_delta"):
            delta = orjson.loads(event_data(event))
            merge_anthropic_usage(self.usage, delta.get("usage"))
            self.usage.final = True
            reason = (delta.get("delta") or {}).get("stop_reason")
            if isinstance(reason, str):
                self.finish_reasons.append(reason)
        elif event.startswith(b"event: message_stop"):
            self.finished = True
        elif event.startswith(b"event: error"):
            self.error = event
        elif event.startswith(b"event: content_block_start") and b'"server_tool_use"' in event and not self.usage.final:
            # A search is billed once run, and a stream whose client left before message_delta has only
            # this to say it ran; a translated stream's client never sees the block (its tally cannot count
            # it), so the usage counts it here until message_delta gives the provider's own count.
            block = orjson.loads(event_data(event)).get("content_block") or {}
            if block.get("type") == "server_tool_use" and block.get("name") == "web_search":
                self.usage.web_searches += 1

    def _observe_openai(self, event: bytes, now: float) -> None:
        data = event_data(event)
        if data == b"[DONE]":
            self.finished = True
            return
        if b'"usage":{' in data or b'"error":' in data or b'"finish_reason":"' in data:
            chunk = orjson.loads(data)
            if "error" in chunk and "choices" not in chunk:
                self.error = event
                return
            for choice in chunk.get("choices") or ():
                if isinstance(choice, dict) and isinstance(choice.get("finish_reason"), str):
                    self.finish_reasons.append(choice["finish_reason"])
            if isinstance(chunk.get("usage"), dict):
                parsed = chat_usage(chunk)
                self.usage.input_tokens = parsed.input_tokens
                self.usage.output_tokens = parsed.output_tokens
                self.usage.cache_read_tokens = parsed.cache_read_tokens
                self.usage.cache_write_tokens = parsed.cache_write_tokens
                self.usage.service_tier = parsed.service_tier
                self.usage.final = True
        if (b'"content":"' in data and b'"content":""' not in data) or b'"tool_calls":[' in data:
            self.timings.mark_token(now)
