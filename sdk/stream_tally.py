"""What a stream's client was sent, tallied for the estimate a stream without final usage is charged
(sdk/estimate.py says how the counts lean): the generated text, the hosted tool calls it showed done,
and whether the event that carries the final usage passed."""

from __future__ import annotations

import contextlib
import math

import orjson

from sdk.estimate import ANTHROPIC_FACTOR, CHARS_PER_TOKEN, EXACT_CHARS, count_texts, input_tokens, looped_input
from sdk.sse import event_data, events_of
from sdk.types import Endpoint, LLMRequest, Protocol, Usage
from sdk.usage import container_of

PENDING_BYTES = 1024 * 1024  # of a stream held unparsed until an estimate needs them

# Events that carry generated text, by the start of their bytes.
_ANTHROPIC_DELTA = b"event: content_block_delta"
_RESPONSES_DELTA = (b"event: response.output_text.delta", b"event: response.function_call_arguments.delta",
                    b"event: response.refusal.delta", b"event: response.reasoning")
_RESPONSES_END = (b"event: response.completed", b"event: response.incomplete", b"event: response.failed")
# Hosted tool calls billed per call, as a stream shows each one done before its final usage counts them:
# a Responses output item by its type (the Usage field it adds to), Anthropic's server tool by its name.
_RESPONSES_CALLS = {"web_search_call": "web_searches", "file_search_call": "file_searches", "image_generation_call": "images"}
_RESPONSES_ITEM_DONE = b"event: response.output_item.done"
# Output items of the built-in tools the provider runs in its loop: each is followed by another sampling step
_RESPONSES_STEPS = frozenset({"web_search_call", "file_search_call", "image_generation_call", "code_interpreter_call", "mcp_call",
                              "shell_call", "tool_search_call"})
_ANTHROPIC_BLOCK_START = b"event: content_block_start"


class StreamTally:
    """What a stream's client was sent: the generated text (up to EXACT_CHARS kept, the rest
    counted by length) and whether the event that carries the final usage passed."""

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint
        self.final = False  # the provider's final usage passed: nothing to estimate
        self._kept: list[str] = []
        self._room = EXACT_CHARS
        self._extra_chars = 0
        # Items are only parsed when an estimate is needed (rare: most streams end with usage), so
        # the hot path pays a substring test and an append per item; past PENDING_BYTES they are
        # parsed as they come, which bounds the memory a long stream holds.
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self.calls = Usage()  # the hosted tool calls billed per call that the stream showed done
        self.steps = 0  # the server tool calls it showed: each has the provider read the prompt again (looped_input)
        self._containers: set[str] = set()  # the code interpreter's containers among them
        if endpoint is Endpoint.RESPONSES:
            self._final_markers: tuple[bytes, ...] = _RESPONSES_END
        elif endpoint.protocol is Protocol.ANTHROPIC:
            self._final_markers = (b"event: message_delta",)
        else:
            self._final_markers = (b'"usage":{',)

    def observe(self, item: bytes) -> None:
        if any(marker in item for marker in self._final_markers):
            self.final = True
        self._pending.append(item)
        self._pending_bytes += len(item)
        if self._pending_bytes > PENDING_BYTES:
            self._parse_pending()

    def _parse_pending(self) -> None:
        for item in self._pending:
            for event in events_of(item):
                with contextlib.suppress(orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
                    self._observe(event)  # an event we cannot read is not counted
        self._pending.clear()
        self._pending_bytes = 0

    def _observe(self, event: bytes) -> None:
        if self.endpoint is Endpoint.RESPONSES:
            if event.startswith(_RESPONSES_DELTA):
                self._add(orjson.loads(event_data(event)).get("delta"))
            elif event.startswith(_RESPONSES_ITEM_DONE):
                item = orjson.loads(event_data(event)).get("item") or {}
                kind = item.get("type")
                self.steps += int(isinstance(kind, str) and kind in _RESPONSES_STEPS)
                field = _RESPONSES_CALLS.get(kind) if isinstance(kind, str) else None
                if field is not None:
                    setattr(self.calls, field, getattr(self.calls, field) + 1)
                elif (container := container_of(item)) is not None:  # billed per container, however many calls ran in it
                    self._containers.add(container)
                    self.calls.containers = len(self._containers)
        elif self.endpoint.protocol is Protocol.ANTHROPIC:
            if event.startswith(_ANTHROPIC_DELTA):
                delta = orjson.loads(event_data(event)).get("delta") or {}
                for key in ("text", "partial_json", "thinking"):
                    self._add(delta.get(key))
            elif event.startswith(_ANTHROPIC_BLOCK_START):
                block = orjson.loads(event_data(event)).get("content_block") or {}
                if block.get("type") in ("server_tool_use", "mcp_tool_use"):
                    self.steps += 1
                    self.calls.web_searches += int(block.get("name") == "web_search")
        else:
            data = event_data(event)
            if b'"content":"' in data or b'"arguments":"' in data or b'"reasoning_content":"' in data:
                for choice in orjson.loads(data).get("choices") or ():
                    delta = choice.get("delta") or {}
                    self._add(delta.get("content"))
                    self._add(delta.get("reasoning_content"))
                    for call in delta.get("tool_calls") or ():
                        self._add((call.get("function") or {}).get("arguments"))

    def _add(self, text: object) -> None:
        if not isinstance(text, str) or not text:
            return
        if len(text) <= self._room:
            self._kept.append(text)
            self._room -= len(text)
        else:
            self._extra_chars += len(text)

    def output_tokens(self, protocol: Protocol) -> int:
        self._parse_pending()
        n = count_texts(self._kept, protocol)
        if self._extra_chars:
            n += math.ceil(self._extra_chars / CHARS_PER_TOKEN * (ANTHROPIC_FACTOR if protocol is Protocol.ANTHROPIC else 1))
        return n

    def estimate(self, request: LLMRequest, usage: Usage, history: int = 0) -> Usage:
        """`usage` (what the provider reported before the stream ended) completed by the estimate:
        input counted from the request (and the `history` tokens of a stored conversation it
        continues) when none was reported, output from what was streamed (never below what was
        reported), and the hosted tool calls the stream showed done (a search, an image: billed
        whether or not the client stayed for the final usage)."""
        protocol = Protocol.ANTHROPIC if self.endpoint.protocol is Protocol.ANTHROPIC else Protocol.OPENAI
        out = Usage(usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.cache_write_tokens)
        if not out.total_input_tokens:
            out.input_tokens = input_tokens(request) + history
        out.output_tokens = max(out.output_tokens, self.output_tokens(protocol))
        if self.steps:  # a hosted tool loop the client left: the input reported or counted is its first step's
            read = out.total_input_tokens
            out.input_tokens += looped_input(read, self.steps, out.output_tokens) - read
        out.web_searches = max(usage.web_searches, self.calls.web_searches)
        out.file_searches = max(usage.file_searches, self.calls.file_searches)
        out.images = max(usage.images, self.calls.images)
        out.containers = max(usage.containers, self.calls.containers)
        return out
