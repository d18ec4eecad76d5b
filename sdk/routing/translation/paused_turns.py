"""Claude's paused turns, resumed for a client of OpenAI's protocols.

Claude may end a turn with stop_reason `pause_turn`: it paused a long-running turn (its server tools' loop, the web
search a Chat `web_search_options` or a Responses `web_search` tool asks of it: web_search.py), and the caller is to
send the response back as it is for Claude to go on (Anthropic's docs, "Handling stop reasons": pause_turn). OpenAI's
models do not pause, so no Chat or Responses client sends anything back: given `finish_reason: "stop"` (a Responses
status `completed`), it took a turn that had searched and said nothing yet as the answer.

The gateway sends it back, as Anthropic's docs ask: the request again with the paused content as the last assistant
message (added to one already there, a prefill), up to MAX_RESUMES times; the answers are one, their content in
order and their usage summed (each request bills its prompt, the prefix the one before cached read back as any
attempt's: the continuation is planned for the prompt cache as any request). A stream goes on in place: the paused
message's end is held back, the continuation's start left out, its blocks numbered after the paused ones, and its
closing usage is the whole turn's. A continuation that fails after the stream began ends the stream with its error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from sdk.errors import SlipstreamError, UpstreamHTTPError, error_event
from sdk.sse import event_data, events_of
from sdk.streams import close_after
from sdk.types import Answer, LLMRequest, LLMResponse, LLMStream, Protocol
from sdk.usage import summed

MAX_RESUMES = 4  # how often one turn is sent back; a turn paused more often ends paused (`stop`)
PAUSED = "pause_turn"

Send = Callable[[LLMRequest], Awaitable[Answer]]


async def resumed(send: Send, request: LLMRequest) -> Answer:
    """`request` (a Messages request) sent, and the answer's paused turn sent back until it ends."""
    answer = await send(request)
    if isinstance(answer, LLMResponse):
        return await _resumed_body(send, request, answer)
    answer.events = _resumed_events(send, request, answer, answer.events)
    return answer


def _sent_back(request: LLMRequest, content: list[dict[str, Any]]) -> LLMRequest:
    """`request` with the paused turn's `content` as its last assistant message."""
    messages = list(request.body["messages"])
    last = messages[-1] if messages else None
    if isinstance(last, dict) and last.get("role") == "assistant":  # a prefill: the turn goes on after it
        earlier = last.get("content")
        earlier = [{"type": "text", "text": earlier}] if isinstance(earlier, str) and earlier else earlier or []
        messages[-1] = {**last, "content": [*earlier, *content]}
    else:
        messages.append({"role": "assistant", "content": content})
    return LLMRequest(request.endpoint, {**request.body, "messages": messages}, size=request.size)


def _added(billed: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """Two Anthropic usage objects as one: counts summed (nested ones too), the rest the later one's."""
    out = {**billed, **more}
    for key, value in more.items():
        before = billed.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and isinstance(before, int):
            out[key] = before + value
        elif isinstance(value, dict) and isinstance(before, dict):
            out[key] = _added(before, value)
    return out


async def _resumed_body(send: Send, request: LLMRequest, answer: LLMResponse) -> LLMResponse:
    data = orjson.loads(answer.body)
    usages = [answer.usage]
    for _ in range(MAX_RESUMES):
        if data.get("stop_reason") != PAUSED:
            break
        more = await send(_sent_back(request, data.get("content") or []))
        assert isinstance(more, LLMResponse)  # a body is asked for
        later = orjson.loads(more.body)
        usages.append(more.usage)
        data = {**later, "id": data.get("id"), "content": [*(data.get("content") or []), *(later.get("content") or [])],
                "usage": _added(data.get("usage") or {}, later.get("usage") or {})}
    if len(usages) > 1:
        answer.body = orjson.dumps(data)
        summed(usages, answer.usage)
    return answer


class _Blocks:
    """The content blocks a Messages stream sends, built from its events (as the SDKs' accumulators do)."""

    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []
        self.json: dict[int, str] = {}  # a tool call's input, as streamed so far

    def feed(self, payload: dict[str, Any]) -> None:
        kind, index = payload.get("type"), payload.get("index")
        if kind == "content_block_start":
            self.blocks.append(dict(payload.get("content_block") or {}))
            return
        if not isinstance(index, int) or not 0 <= index < len(self.blocks):
            return
        block = self.blocks[index]
        if kind == "content_block_stop" and index in self.json:
            block["input"] = orjson.loads(self.json.pop(index) or "{}")
        if kind != "content_block_delta":
            return
        delta = payload.get("delta") or {}
        match delta.get("type"):
            case "text_delta":
                block["text"] = block.get("text", "") + delta.get("text", "")
            case "input_json_delta":
                self.json[index] = self.json.get(index, "") + delta.get("partial_json", "")
            case "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
            case "signature_delta":
                block["signature"] = delta.get("signature", "")
            case "citations_delta":
                block["citations"] = [*(block.get("citations") or []), delta.get("citation")]


def _framed(payload: dict[str, Any]) -> bytes:
    return b"event: " + str(payload["type"]).encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


async def _resumed_events(send: Send, request: LLMRequest, first: LLMStream,
                          events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`first`'s `events`, and those of the paused turn's continuations after them, as one message."""
    stream: LLMStream | None = None  # the continuation being read
    content: list[dict[str, Any]] = []  # the turn's blocks before the message being read
    billed: dict[str, Any] = {}  # the usage of the requests before it
    usages = [first.usage]
    try:
        for turn in range(MAX_RESUMES + 1):
            blocks, paused = _Blocks(), False
            own: dict[str, Any] = {}  # this request's usage, as its events say it
            async for item in stream.events if stream is not None else events:
                out: list[bytes] = []
                for event in events_of(item):
                    data = event_data(event)
                    payload = orjson.loads(data) if data and data.startswith(b"{") else {}
                    kind = payload.get("type")
                    if kind == "message_start":
                        own = _added({}, (payload.get("message") or {}).get("usage") or {})
                        if turn:
                            continue  # the client's message started with the paused one
                    elif kind in ("content_block_start", "content_block_delta", "content_block_stop"):
                        blocks.feed(payload)
                        if turn:
                            event = _framed({**payload, "index": payload["index"] + len(content)})
                    elif kind == "message_delta":
                        own = {**own, **(payload.get("usage") or {})}  # Anthropic's message_delta counts are final
                        if (payload.get("delta") or {}).get("stop_reason") == PAUSED and turn < MAX_RESUMES:
                            paused = True
                            continue
                        if turn:
                            event = _framed({**payload, "usage": _added(billed, own)})
                    elif kind == "message_stop" and paused:
                        continue
                    out.append(event)
                if out:
                    yield b"".join(out)
            if not paused:
                return
            billed, content = _added(billed, own), [*content, *blocks.blocks]
            try:
                more = await send(_sent_back(request, content))
            except (SlipstreamError, UpstreamHTTPError) as exc:
                yield error_event(Protocol.ANTHROPIC, exc.status, f"the paused turn could not be resumed: {_said(exc)}")
                return
            assert isinstance(more, LLMStream)  # a stream is asked for
            if stream is not None:
                await stream.aclose()
            stream = more
            usages.append(more.usage)
    finally:
        if stream is not None:
            first.finish_reasons[:] = stream.finish_reasons  # how the turn ended: the last continuation's
            await stream.aclose()
        await close_after(events)
        if len(usages) > 1:
            summed(usages, first.usage)


def _said(exc: SlipstreamError | UpstreamHTTPError) -> str:
    """What a failed continuation's error says (an upstream's error body, already in the client's shape)."""
    if isinstance(exc, SlipstreamError):
        return exc.message
    try:
        error = orjson.loads(exc.body).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return str(exc)
    return str(error.get("message") or exc) if isinstance(error, dict) else str(exc)
