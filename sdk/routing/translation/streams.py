"""Streaming event translators: OpenAI chunks → Anthropic events, and Anthropic events → OpenAI chunks.

Each is a small state machine fed one complete SSE event at a time, returning the events to send
(possibly none). Usage stays exact: `message_start` carries the input the gateway counted (an OpenAI
upstream reports usage only at the end: counting.py), Anthropic's closing `message_delta` the
upstream's full usage (the SDKs overwrite message_start's numbers with it), and an OpenAI client that asked for
`stream_options.include_usage` gets its usage chunk before `[DONE]`.

A stream that meets a stop sequence the gateway applies (stops.py) ends there: the translator sends the answer's end
at once (finish_reason `stop`, stop_reason `stop_sequence` naming it, the usage) and `translated_events` closes the
upstream before that end goes out, so the model stops writing, and being billed, for text the client would never see.
The usage is then the gateway's count of what the model wrote up to the cut (its text, counted as a stream the client
left is: sdk/stream_tally.py), written into the stream's `Usage`, which is charged marked `estimated`. An OpenAI
reasoning model wrote, and is billed for, reasoning it does not stream, which no count of the stream can see: its charge
is the output limit it was sent (`bound`, stops.cut_bound), all it can have written, so a team's budget is never spent
past by cutting its streams; the client's usage is still what it was sent.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from typing import Protocol as TypingProtocol

import orjson

from sdk.errors import error_event
from sdk.routing.translation.bodies import A2O_STOP, chat_usage, service_tier_a2o, service_tier_o2a, stop_o2a, thinking_tokens, usage_o2a
from sdk.routing.translation.call_order import CallOrder
from sdk.routing.translation.output_modes import Unfencer
from sdk.routing.translation.stops import StopCutter
from sdk.routing.translation.web_search import ITEMS, searched, url_citations
from sdk.sse import event_data, events_of
from sdk.stream_tally import StreamTally
from sdk.streams import close_after
from sdk.types import Endpoint, Protocol, Usage
from sdk.usage import merge_anthropic_usage

_ANTHROPIC_ERROR_STATUS = {"invalid_request_error": 400, "authentication_error": 401, "permission_error": 403,
                           "not_found_error": 404, "rate_limit_error": 429, "api_error": 500, "timeout_error": 504,
                           "overloaded_error": 529}
_OPENAI_ERROR_STATUS = {"invalid_request_error": 400, "rate_limit_error": 429, "server_error": 500}


def anthropic_event(payload: dict[str, Any]) -> bytes:
    kind: str = payload["type"]
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


DONE: dict[str, Any] = {}  # `read_chunk`'s answer to `data: [DONE]`


@dataclass(frozen=True, slots=True)
class ChunkError:
    status: int
    message: str


def read_chunk(event: bytes) -> dict[str, Any] | ChunkError | None:
    """One Chat Completions stream event: its chunk, `DONE`, the in-band error it carries, or None (no data)."""
    data = event_data(event)
    if not data:
        return None
    if data == b"[DONE]":
        return DONE
    chunk: dict[str, Any] = orjson.loads(data)
    if "error" in chunk and "choices" not in chunk:
        error = chunk["error"] or {}
        message = error.get("message") or "upstream error"
        return ChunkError(529 if "overload" in message.lower() else _OPENAI_ERROR_STATUS.get(str(error.get("type")), 500), message)
    return chunk


class _EndsAtStops:
    """A translator that applies stop sequences the upstream was not sent: once one appears, `feed` returns the
    answer's end (`_cut`) and nothing after it. What the model wrote is tallied for the usage of that end (`written`), and
    the count goes into the upstream stream's usage (`billed`, the one charged), at least `bound` output tokens."""

    def __init__(self, stops: tuple[str, ...], endpoint: Endpoint, billed: Usage | None, bound: int = 0) -> None:
        self.cutter = StopCutter(stops)
        self.written = StreamTally(endpoint) if stops else None  # the upstream's events, counted only at a stop
        self.billed = billed
        self.bound = bound  # the output limit of a model that reasons unseen: what a cut is charged at least
        self.ended = False  # a stop was met: the answer's end is sent, the upstream is to be closed

    def feed(self, event: bytes) -> list[bytes]:
        if self.ended:
            return []  # the answer ended at a stop: what the upstream sent with it is past that
        if self.written is not None:
            self.written.observe(event)
        out = self._fed(event)
        return out + self._cut() if self.cutter.hit else out

    def _fed(self, event: bytes) -> list[bytes]:
        raise NotImplementedError

    def _cut(self) -> list[bytes]:
        raise NotImplementedError

    def _written(self, protocol: Protocol) -> int:
        """The output tokens the model wrote up to the stop, counted (the upstream's usage is never to come)."""
        assert self.written is not None
        self.ended = True
        return self.written.output_tokens(protocol)

    def _charge(self, written: int) -> None:
        """The cut answer's output charged, marked estimated: what the model wrote, or `bound` where it reasons unseen."""
        if self.billed is not None:
            self.billed.output_tokens = max(self.billed.output_tokens, written, self.bound)
            self.billed.estimated = True


class OpenAIToAnthropic(_EndsAtStops):
    """Feeds on an OpenAI chunk stream (from an OpenAI target), yields Anthropic events."""

    def __init__(self, extra: dict[str, Any] | None = None, names: dict[str, str] | None = None, stops: tuple[str, ...] = (),
                 billed: Usage | None = None, bound: int = 0) -> None:
        self.extra = extra or {}  # fields message_start's message carries besides the usual (bodies.extra_o2a)
        self.names = names or {}  # the client's tool names the upstream knows by shorter ones (tool_ids.py)
        # the stop sequences the model would refuse (stops.openai_stops); `bound`: a reasoning model's output limit
        super().__init__(stops, Endpoint.CHAT_COMPLETIONS, billed, bound)
        self.tier: Any = None  # the upstream's `service_tier`, which every chunk names
        self.started = False
        self.block = -1  # index of the last Anthropic content block opened
        self.open = False  # that block is still open
        self.text_block: int | None = None  # index of the open text block, if the open one is text
        self.tools: dict[int, int] = {}  # OpenAI tool_call index → Anthropic block index
        self.order = CallOrder()  # the tool calls one after another, as Claude streams blocks (call_order.py)
        self.stop_reason = "end_turn"
        self.stop_sequence: str | None = None  # the stop string that ended it (vLLM's `stop_reason`)
        self.refused = False  # the answer is a refusal (`delta.refusal`): its text, and stop_reason `refusal`
        self.usage: dict[str, Any] = {"output_tokens": 0}
        self.input_tokens = 0  # what message_start says the input is: the gateway's count (counting.py)

    def _fed(self, event: bytes) -> list[bytes]:
        chunk = read_chunk(event)
        if chunk is None:
            return []
        if chunk is DONE:
            return self._finish()
        if isinstance(chunk, ChunkError):
            return [error_event(Protocol.ANTHROPIC, chunk.status, chunk.message)]
        out: list[bytes] = []
        self.tier = chunk.get("service_tier", self.tier)
        if not self.started:
            self.started = True
            # The cache's numbers come with the upstream's usage, at the end (message_delta's, which the SDKs take over
            # these); its TTL split (`cache_creation`), which anthropic 2.x takes from message_start only, is left out
            # here rather than said to be none. The tier an answer is served on is in every chunk, the first too.
            usage: dict[str, Any] = {"input_tokens": self.input_tokens, "cache_creation_input_tokens": 0,
                                     "cache_read_input_tokens": 0, "output_tokens": 0}
            if (tier := service_tier_o2a(chunk.get("service_tier"))) is not None:
                usage["service_tier"] = tier
            out.append(anthropic_event({"type": "message_start", "message": {
                "id": f"msg_{chunk.get('id', '')}", "type": "message", "role": "assistant", "model": chunk.get("model"),
                "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage, **self.extra}}))
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            self.refused = self.refused or bool(delta.get("refusal"))
            out += self._text(self.cutter.feed(delta.get("content") or delta.get("refusal") or ""))
            calls = [] if self.cutter.hit else delta.get("tool_calls") or []  # after a stop the answer has ended
            if calls:
                out += self._text(self.cutter.flush())  # the text is over: what was held for a stop goes before the calls
            for call in calls:
                out += [event for ordered in self.order.feed(call) for event in self._call(ordered)]
            if choice.get("finish_reason"):
                stop = stop_o2a(choice, self.refused, bool(self.tools or self.order.held))
                self.stop_reason, self.stop_sequence = stop["stop_reason"], stop["stop_sequence"]
        if isinstance(chunk.get("usage"), dict):
            self.usage = usage_o2a(chunk["usage"], chunk.get("service_tier"))
        return out

    def _text(self, text: str) -> list[bytes]:
        """A text delta, in the open text block (opened for it if need be)."""
        if not text:
            return []
        out = []
        if self.text_block is None:
            out += self._open_block({"type": "text", "text": ""})
            self.text_block = self.block
        return out + [anthropic_event({"type": "content_block_delta", "index": self.block, "delta": {"type": "text_delta", "text": text}})]

    def _call(self, call: dict[str, Any]) -> list[bytes]:
        """One `tool_calls[]` delta, in the order CallOrder gives them (one call after another, as Claude streams)."""
        index = call.get("index", 0)
        function = call.get("function") or {}
        out: list[bytes] = []
        if index not in self.tools:
            name = function.get("name")
            out += self._open_block({"type": "tool_use", "id": call.get("id"), "name": self.names.get(str(name), name), "input": {}})
            self.tools[index] = self.block
        if function.get("arguments"):
            out.append(anthropic_event({"type": "content_block_delta", "index": self.tools[index],
                                         "delta": {"type": "input_json_delta", "partial_json": function["arguments"]}}))
        return out

    def _open_block(self, block: dict[str, Any]) -> list[bytes]:
        out = self._close_block()
        self.block += 1
        self.open = True
        return out + [anthropic_event({"type": "content_block_start", "index": self.block, "content_block": block})]

    def _close_block(self) -> list[bytes]:
        if not self.open:
            return []
        self.open, self.text_block = False, None
        return [anthropic_event({"type": "content_block_stop", "index": self.block})]

    def _cut(self) -> list[bytes]:
        """The answer's end where a stop the gateway applies appeared: now, with the usage the gateway counts (the input
        message_start said, the text the model wrote up to here), not once the model stops on its own."""
        self.stop_reason, self.stop_sequence = "stop_sequence", self.cutter.matched
        written = self._written(Protocol.OPENAI)
        self.usage = usage_o2a({"prompt_tokens": self.input_tokens, "completion_tokens": written}, self.tier)
        if self.billed is not None and not self.billed.total_input_tokens:
            self.billed.input_tokens = self.input_tokens
        self._charge(written)
        return self._finish()

    def _finish(self) -> list[bytes]:
        delta = {"type": "message_delta", "delta": {"stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence}, "usage": self.usage}
        if "context_management" in self.extra:  # where Anthropic's stream says what context editing applied
            delta["context_management"] = self.extra["context_management"]
        held = self._text(self.cutter.flush()) + [event for call in self.order.flush() for event in self._call(call)]
        return held + self._close_block() + [anthropic_event(delta), anthropic_event({"type": "message_stop"})]


class AnthropicToOpenAI(_EndsAtStops):
    """Feeds on an Anthropic event stream (from an Anthropic target), yields OpenAI chunks."""

    def __init__(self, include_usage: bool, prefill: str | None = None, stops: tuple[str, ...] = (), index: int = 0,
                 ending: bool = True, billed: Usage | None = None, searches: bool = False) -> None:
        self.include_usage = include_usage
        # Claude's web searches carried (web_search.ITEMS): the server_tool_use blocks by id, their input as it streams
        self.searches: dict[str, dict[str, Any]] | None = {} if searches else None
        self.searching: dict[int, tuple[str, str]] = {}  # block index → (server_tool_use id, its input so far)
        # The choice this answer is (Chat's `n` > 1, one Claude request per choice: choices.py); with `ending` False
        # the stream's end (the usage chunk, `[DONE]`) is left to the merge of the choices.
        self.index, self.ending, self.finished = index, ending, False
        # A JSON-mode request Claude answers by instruction (output_modes.py): its assistant prefill ("" for none)
        # is the answer's start, and a code fence around the answer is taken off.
        self.prefill = prefill or ""
        self.fence = Unfencer() if prefill is not None else None
        super().__init__(stops, Endpoint.MESSAGES, billed)  # the Chat stops Claude refuses, applied here (stops.py)
        self.id = ""
        self.model = ""
        self.created = int(time.time())
        self.tools: dict[int, int] = {}  # Anthropic block index → OpenAI tool_call index
        self.argued: set[int] = set()  # Anthropic block indexes of tool calls whose arguments have begun
        self.finish_reason = "stop"
        self.usage = Usage()
        self.thought = 0  # the thinking tokens Claude reports within its output tokens (message_delta's usage)
        self.sent = len(self.prefill)  # characters of the answer sent so far
        self.cited: tuple[int, list[Any]] = (0, [])  # the open text block's start and its web search citations
        self.tier: dict[str, str] = {}  # `service_tier`, from message_start's usage (bodies.service_tier_a2o)

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        payload: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                                   **self.tier,
                                   "choices": [{"index": self.index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
        if self.include_usage:
            payload["usage"] = None
        return b"data: " + orjson.dumps(payload) + b"\n\n"

    def _citations(self) -> list[bytes]:
        """The ended text block's web search citations, as a chunk of url_citation annotations (web_search.py)."""
        (start, citations), self.cited = self.cited, (self.sent, [])
        annotations = url_citations(citations, start, self.sent)
        return [self._chunk({"annotations": annotations})] if annotations else []

    def _fed(self, event: bytes) -> list[bytes]:
        data = event_data(event)
        if not data:
            return []
        payload = orjson.loads(data)
        kind = payload.get("type")
        if kind == "message_start":
            message = payload.get("message") or {}
            # (a later choice keeps the first choice's id and model: choices.py sets them)
            self.id, self.model = self.id or f"chatcmpl-{message.get('id', '')}", self.model or message.get("model") or ""
            self.tier = service_tier_a2o(message.get("usage"))  # the tier it is served on, which every chunk names
            merge_anthropic_usage(self.usage, message.get("usage"))
            return [self._chunk({"role": "assistant", "content": self.prefill, "refusal": None})]
        if kind == "content_block_start":
            block = payload.get("content_block") or {}
            if block.get("type") == "text":
                self.cited = (self.sent, [])
            if self.searches is not None and block.get("type") in ("server_tool_use", "web_search_tool_result"):
                return self._searched(payload.get("index"), block)
            if block.get("type") != "tool_use":
                return []
            index = self.tools[payload["index"]] = len(self.tools)
            call = {"index": index, "id": block.get("id"), "type": "function", "function": {"name": block.get("name"), "arguments": ""}}
            return [self._chunk({"tool_calls": [call]})]
        if kind == "content_block_delta":
            delta = payload.get("delta") or {}
            if delta.get("type") == "text_delta":
                text = delta.get("text", "")
                text = self.cutter.feed(self.fence.feed(text) if self.fence else text)
                self.sent += len(text)
                return [self._chunk({"content": text})] if text or not self.cutter.stops else []
            if delta.get("type") == "citations_delta":
                self.cited[1].append(delta.get("citation"))
            if delta.get("type") == "input_json_delta" and payload.get("index") in self.searching:
                call_id, given = self.searching[payload["index"]]
                self.searching[payload["index"]] = (call_id, given + (delta.get("partial_json") or ""))
            if delta.get("type") == "input_json_delta" and delta.get("partial_json") and payload.get("index") in self.tools:
                # (a server tool's input, Claude's web search query, is not a call of the client's: web_search.py)
                self.argued.add(payload["index"])
                call = {"index": self.tools.get(payload["index"], 0), "function": {"arguments": delta["partial_json"]}}
                return [self._chunk({"tool_calls": [call]})]
            return []
        if kind == "content_block_stop" and (self.fence or self.cutter.held):
            # A text block ended on what was held: a fence's (left out) or not after all, a stop's start or not.
            text = self.cutter.feed(self.fence.flush()) if self.fence else ""
            text += self.cutter.flush()
            if text:
                self.sent += len(text)
                return [self._chunk({"content": text}), *self._citations()]
        if kind == "content_block_stop" and self.cited[1]:
            return self._citations()
        if kind == "content_block_stop" and payload.get("index") in self.tools and payload["index"] not in self.argued:
            # A tool_use with no input streamed: OpenAI's arguments are then `{}`, never empty (clients parse them).
            call = {"index": self.tools[payload["index"]], "function": {"arguments": "{}"}}
            return [self._chunk({"tool_calls": [call]})]
        if kind == "message_delta":
            merge_anthropic_usage(self.usage, payload.get("usage"))
            self.thought = thinking_tokens(payload.get("usage")) or self.thought
            reason = (payload.get("delta") or {}).get("stop_reason")
            if reason:
                self.finish_reason = A2O_STOP.get(reason, "stop")
            return []
        if kind == "message_stop":
            self.finished = True
            return [self._chunk({}, self.finish_reason), *(self.end(self.usage) if self.ending else ())]
        if kind == "error":
            error = payload.get("error") or {}
            status = _ANTHROPIC_ERROR_STATUS.get(str(error.get("type")), 500)
            return [error_event(Protocol.OPENAI, status, error.get("message") or "upstream error")]
        return []  # ping, and event types this translation does not carry (tolerated, as the protocol asks)

    def _searched(self, index: Any, block: dict[str, Any]) -> list[bytes]:
        """A web search's block (web_search.ITEMS): its call held (its input streams after it), its result the search
        whole, one chunk carrying it."""
        assert self.searches is not None
        if block.get("type") == "server_tool_use":
            if block.get("name") == "web_search":
                self.searches[str(block.get("id"))] = block
                self.searching[index] = (str(block.get("id")), "")
            return []
        for call_id, given in self.searching.values():  # the inputs streamed so far, on their calls
            if given:
                self.searches[call_id] = {**self.searches[call_id], "input": _json_or_none(given)}
        call = self.searches.get(str(block.get("tool_use_id")))
        return [self._chunk({ITEMS: [searched(call, block)]})] if call is not None else []

    def _cut(self) -> list[bytes]:
        """The answer's end where a stop the gateway applies appeared: now, with the usage the gateway counts (the input
        message_start said, the text Claude wrote up to here), not once Claude stops on its own."""
        self.finished, self.finish_reason = True, "stop"
        written = self._written(Protocol.ANTHROPIC)
        self.usage.output_tokens = max(self.usage.output_tokens, written)
        self._charge(written)
        return [*self._citations(), self._chunk({}, self.finish_reason), *(self.end(self.usage) if self.ending else ())]

    def end(self, usage: Usage, thought: int | None = None) -> list[bytes]:
        """The stream's end: the usage chunk (`usage`, when the client asked for it; `thought`, its thinking tokens
        where not this stream's own: several choices'), then `[DONE]`."""
        if not self.include_usage:
            return [b"data: [DONE]\n\n"]
        chunk = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model, **self.tier,
                 "choices": [], "usage": chat_usage(usage, self.thought if thought is None else thought)}
        return [b"data: " + orjson.dumps(chunk) + b"\n\n", b"data: [DONE]\n\n"]


class Translator(TypingProtocol):
    def feed(self, event: bytes) -> list[bytes]: ...


async def translated_events(events: AsyncIterator[bytes], translator: Translator,
                            cutter: StopCutter | None = None) -> AsyncIterator[bytes]:
    """Each item's events fed through `translator`; what one item yields leaves as one item. `cutter`: the stops the
    translator applies; once one is met the translator has ended the answer, and `events` (the upstream) is closed
    before that end is sent, not read on while the model writes past the stop."""
    out: list[bytes] = []
    try:
        async for item in events:
            out = [translated for event in events_of(item) for translated in translator.feed(event)]
            if cutter is not None and cutter.hit:
                break
            if out:
                yield b"".join(out)
        else:
            return
    finally:
        await close_after(events)
    if out:
        yield b"".join(out)  # the answer's end at the stop, its upstream closed


def _json_or_none(text: str) -> Any:
    """`text` parsed as JSON (a server tool's streamed input, whole), None if it is not."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
