"""The pipeline: an ordered list of stages around a terminal handler (the router).

A stage is middleware: it receives the request context and `call_next`, and may change the request,
answer by itself (a cache hit), or wrap the answer (metrics). The order is data (`DEFAULT_STAGES`,
or a team's own list), composed once per team so a request pays one call per stage and nothing else.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol as TypingProtocol

from sdk.observability.tracing.records import Parent, RequestTrace
from sdk.types import Answer, LLMRequest, Timings, Usage

Handler = Callable[["RequestContext"], Awaitable[Answer]]
REQUEST_ID_HEADER = "x-slipstream-request-id"  # on every answer, the gateway's own errors included


def new_request_id() -> str:
    return secrets.token_hex(8)


@dataclass(slots=True)
class PromptCacheReport:
    """Provider-reported cache tokens against what the pipeline expected to be read."""

    expected_read: int = 0
    miss_cause: str = ""  # KIND@PATH of the first block that differs from a prefix cached earlier
    moved: int = 0  # volatile lines moved out of the cached prefix (reorder)
    advice: int = 0  # volatile lines found and left in place
    repaired: int = 0  # client cache_control markers removed to stay within the provider's limit
    canonicalized: bool = False  # tool schemas / tool inputs were re-serialized with sorted keys


@dataclass(slots=True)
class CompressionReport:
    """What the compression stage did (docs/compression.md): tokens (tiktoken cl100k) of the system
    prompt and messages before and after, the places whose material was pruned, and the material
    left whole, by place and reason."""

    before: int = 0
    after: int = 0
    refused: int = 0  # pieces left whole because pruning would drop a protected item
    history: str = ""  # "compacted" | "pending" when history compaction acted
    compressed: dict[str, int] = field(default_factory=dict)  # place -> pieces pruned
    left: dict[str, int] = field(default_factory=dict)  # "place:reason" -> pieces left whole

    def compress(self, place: str) -> None:
        self.compressed[place] = self.compressed.get(place, 0) + 1

    def leave(self, place: str, reason: str) -> None:
        key = f"{place}:{reason}"
        self.left[key] = self.left.get(key, 0) + 1


@dataclass(slots=True)
class RequestContext:
    request: LLMRequest
    team: str
    timings: Timings = field(default_factory=Timings)
    cache_status: str = "miss"  # miss | exact-hit | semantic-hit
    prompt_cache: PromptCacheReport = field(default_factory=PromptCacheReport)
    route: str = ""  # PROVIDER/MODEL that answered, set by the router
    provider: str = ""  # gen_ai.provider.name of the target that answered (sdk/observability/tracing/genai.py:provider_name), set by the router
    key_id: str = ""  # which team key sent it (a hash prefix, never the key), for per-key limits
    compression: CompressionReport | None = None  # set by the compression stage when it ran
    attempts: int = 0  # upstream attempts the router started (retries, fallbacks and hedge legs)
    # models of attempts dropped after they went upstream (a first-byte timeout, a hedge leg that lost, legs
    # cancelled with their request): the provider read, and bills, their prompts (sdk/limits/stage.py charges them)
    abandoned: list[str] = field(default_factory=list)
    # answers the provider gave (and bills) that the request dropped, by model: a failed fan-out's other choices
    # (sdk/routing/translation/choices.py); charged with their usage
    discarded: list[tuple[str, Usage]] = field(default_factory=list)
    usage_estimated: bool = False  # no usage came back: the gateway counted the tokens it charged (sdk/estimate.py)
    request_id: str = field(default_factory=new_request_id)  # x-slipstream-request-id, access log
    trace: RequestTrace | None = None  # the request's spans while it runs (sdk/observability/tracing/); None when tracing is off
    parent: Parent | None = None  # the application's current span, when the drop-in SDK runs the pipeline in process


class Stage(TypingProtocol):
    name: str

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Answer: ...


class Pipeline:
    def __init__(self, stages: Sequence[Stage], terminal: Handler):
        self.stages = list(stages)
        self.terminal = terminal  # the router
        handler = terminal
        for stage in reversed(self.stages):
            handler = _bind(stage, handler)
        self._handler = handler

    async def run(self, ctx: RequestContext) -> Answer:
        return await self._handler(ctx)


def _bind(stage: Stage, call_next: Handler) -> Handler:
    async def handler(ctx: RequestContext) -> Answer:
        return await stage(ctx, call_next)

    return handler
