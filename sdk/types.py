"""The request and response objects that flow through the pipeline.

The request body stays the provider's wire JSON (a dict) so that fields Slipstream does not know
pass through untouched; everything Slipstream itself decides lives in typed dataclasses.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sdk.streams import StreamHooks


class Protocol(StrEnum):
    """Wire dialect of a request or a provider."""

    ANTHROPIC = "anthropic"
    OPENAI = "openai"


class Endpoint(StrEnum):
    MESSAGES = "messages"  # Anthropic POST /v1/messages
    COUNT_TOKENS = "count_tokens"  # Anthropic POST /v1/messages/count_tokens
    CHAT_COMPLETIONS = "chat_completions"  # OpenAI POST /v1/chat/completions
    EMBEDDINGS = "embeddings"  # OpenAI POST /v1/embeddings
    RESPONSES = "responses"  # OpenAI POST /v1/responses
    RESPONSES_INPUT_TOKENS = "responses_input_tokens"  # OpenAI POST /v1/responses/input_tokens
    RESPONSES_COMPACT = "responses_compact"  # OpenAI POST /v1/responses/compact (native Responses targets only)

    @property
    def protocol(self) -> Protocol:
        """The provider whose error shapes and auth the endpoint's clients expect."""
        return Protocol.ANTHROPIC if self in (Endpoint.MESSAGES, Endpoint.COUNT_TOKENS) else Protocol.OPENAI


@dataclass(slots=True)
class Usage:
    """Token usage in one normalized shape.

    `input_tokens` is uncached input (Anthropic's meaning); OpenAI's `prompt_tokens` includes cached
    tokens, so the OpenAI parser subtracts them. The client always receives the provider's own usage
    object unchanged; this copy feeds metrics and cache verification.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0  # of cache_write_tokens, those written for an hour (Anthropic bills them 2x input)
    # Searches the provider ran for the answer and bills per call besides the tokens (Anthropic's
    # server_tool_use.web_search_requests, the Responses API's web_search_call items).
    web_searches: int = 0
    # The Responses API's other hosted tools billed per call: file_search_call items ($2.50 per 1,000),
    # image_generation_call items (an image each, at the image model's rates)
    file_searches: int = 0
    images: int = 0
    # Code interpreter containers the answer ran code in (distinct container_ids of its
    # code_interpreter_call items): OpenAI bills each container session besides the tokens
    containers: int = 0
    service_tier: str = ""  # the OpenAI tier that served the answer (`priority`, `flex`, `default`), as it reports it
    inference_geo: str = ""  # where Anthropic ran it (`us` is billed 1.1x)
    fast: bool = False  # asked for Anthropic's fast mode (`speed: fast`), billed at its own rates
    # A stream's usage fills in as its events pass: True once the provider's final report arrived
    # (OpenAI's usage chunk, Anthropic's message_delta, the terminal response.* event).
    final: bool = field(default=False, compare=False)
    # The gateway counted these itself, the provider's own report never to come: a stream the gateway ended at a stop
    # it applies, its upstream closed there (sdk/routing/translation/stops.py). Charged marked `estimated`.
    estimated: bool = field(default=False, compare=False)

    @property
    def total_input_tokens(self) -> int:
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens


@dataclass(slots=True)
class LLMRequest:
    endpoint: Endpoint
    body: dict[str, Any]
    # Client headers that providers act on (anthropic-version, anthropic-beta, ...); never auth.
    forward_headers: dict[str, str] = field(default_factory=dict)
    query: str = ""
    size: int = 0  # bytes of the client's body (0: not from a door); large bodies are handled off the loop
    # a large body's images and PDF pages (sdk/estimate.py:Media), counted off the loop by the limits stage
    media: Any = field(default=None, compare=False, repr=False)

    @property
    def protocol(self) -> Protocol:
        return self.endpoint.protocol

    @property
    def model(self) -> str:
        model = self.body.get("model")
        return model if isinstance(model, str) else ""

    @property
    def stream(self) -> bool:
        return self.body.get("stream") is True

    def with_model(self, model: str) -> LLMRequest:
        """A copy addressed to another model; the body is copied shallowly, never mutated."""
        if model == self.model:
            return self
        return LLMRequest(self.endpoint, {**self.body, "model": model}, self.forward_headers, self.query, self.size, self.media)


class _UpstreamWait:
    __slots__ = ("timings",)

    def __init__(self, timings: Timings):
        self.timings = timings

    def __enter__(self) -> None:
        timings = self.timings
        if not timings._waits:
            timings._waiting_since = time.perf_counter()
        timings._waits += 1

    def __exit__(self, *exc_info: object) -> None:
        timings = self.timings
        timings._waits -= 1
        if not timings._waits:
            timings.upstream_s += time.perf_counter() - timings._waiting_since


@dataclass(slots=True)
class Timings:
    """Monotonic timestamps of one request, for TTFT/ITL/TPOT/e2e and the overhead header."""

    start: float = field(default_factory=time.perf_counter)
    upstream_s: float = 0.0  # seconds spent waiting on providers (excluded from overhead)
    first_token: float | None = None
    last_token: float | None = None
    token_events: int = 0
    gaps: list[float] = field(default_factory=list)
    _waits: int = 0  # upstream waits in progress (hedged legs overlap)
    _waiting_since: float = 0.0

    def upstream(self) -> _UpstreamWait:
        """Time spent waiting on providers, measured once at the upstream-client boundary: the union of
        the waits, so hedged legs that overlap count their common time once, not once per leg. Use as
        `with timings.upstream():` (a class, not a generator context manager: it runs twice a request)."""
        return _UpstreamWait(self)

    def mark_token(self, now: float) -> None:
        if self.first_token is None:
            self.first_token = now
        else:
            self.gaps.append(now - (self.last_token or now))
        self.last_token = now
        self.token_events += 1


@dataclass(slots=True)
class LLMResponse:
    """A complete (non-streaming) answer: the provider's body bytes, passed through unchanged."""

    status: int
    body: bytes
    headers: dict[str, str]
    usage: Usage
    route: str
    media_type: str = "application/json"


@dataclass(slots=True)
class LLMStream:
    """A streaming answer: complete SSE events (bytes ending in a blank line), in arrival order.

    An item holds one event or several that arrived together (`sdk.sse.events_of` splits one), so
    the door forwards each item with one write. The first item always starts with the first event.

    `usage` and `finish_reasons` fill in while the events pass. `aclose()` cancels the upstream call;
    it is safe to call more than once and is called by every consumer when it stops early.
    """

    status: int
    events: AsyncIterator[bytes]
    headers: dict[str, str]
    usage: Usage
    route: str
    close: Callable[[], Awaitable[None]]
    media_type: str = "text/event-stream"
    finish_reasons: list[str] = field(default_factory=list)  # from the final chunk/event, in the provider's words
    hooks: StreamHooks | None = field(default=None, repr=False)  # the stages' shared wrapper (sdk/streams.py:on_end)

    async def aclose(self) -> None:
        await self.close()  # drop the upstream connection first: that is the cancel the provider sees
        aclose = getattr(self.events, "aclose", None)
        if aclose is not None:
            await aclose()  # every wrapper closes the iterator it wraps (sdk.streams.close_after)


Answer = LLMResponse | LLMStream

