"""The response cache stage: answer from the exact or semantic tier, or store what upstream answers.

Only safe answers are stored: a 200 that ended on its own (end_turn / stop_sequence / stop), with no
tool call unless the policy allows, to a request that is not sampled (temperature > 0 or unset)
unless the policy allows. A stream is stored only once it has passed to the client in full.

A hit replays the provider's own response JSON — body, or a synthesized stream in the provider's
event format — including the usage the provider originally reported, so clients see exactly what
they would have. Slipstream's own accounting (`answer.usage`, which feeds metrics) is zero: no
tokens were spent. `x-slipstream-cache` says which tier answered; `x-slipstream-cache-key` names the
entry, for invalidation. A Responses API answer is stored as its response object and replayed under
a fresh id, recorded in the team's response store (sdk/cache/responses.py).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Literal

import orjson

from sdk.cache import answers, responses
from sdk.cache.keys import CacheKeys, cache_keys, fetches_media
from sdk.embedding import MAX_TEXT_CHARS
from sdk.errors import InvalidRequestError
from sdk.observability import metrics
from sdk.offload import is_large, off_loop, off_loop_if_large
from sdk.pipeline import Handler, RequestContext
from sdk.policy import Policy
from sdk.readiness import WarmUp
from sdk.responses.store import MAX_TURN_ITEMS, ResponseStore, StoredResponse, as_items
from sdk.routing.backoff import TranslationRefused
from sdk.routing.translation.responses_requests import responses_to_chat
from sdk.services import Services
from sdk.sse import events_of
from sdk.state.ownership import names_files
from sdk.streams import close_after
from sdk.types import (
    Answer,
    Endpoint,
    LLMRequest,
    LLMResponse,
    LLMStream,
    Protocol,
    Usage,
)

if TYPE_CHECKING:  # numpy and faiss load with the cache itself, only for teams that enable it
    from sdk.cache.response_cache import Lookup, ResponseCache

PRECISION_HEADER = "x-slipstream-min-precision"
METADATA_FIELD = "slipstream"  # body field {"min_precision": x}; the official clients send it via extra_body
KEY_HEADER = "x-slipstream-cache-key"
SKIP_HEADER = "x-slipstream-cache-skip"  # why a request was not the cache's: a skip_reason
# What a stored answer is folded by: the wire protocol of a chat answer, or the Responses API shape.
Shape = Protocol | Literal[Endpoint.RESPONSES]

log = logging.getLogger("slipstream.cache")


def _strip_metadata(request: LLMRequest) -> tuple[LLMRequest, float | None]:
    """The request as upstream must see it (without Slipstream's own fields), and the precision it asks for."""
    asked: list[object] = []
    body, headers = request.body, request.forward_headers
    if METADATA_FIELD in body:
        meta = body[METADATA_FIELD]
        if not isinstance(meta, dict) or set(meta) - {"min_precision"}:
            raise InvalidRequestError(f"'{METADATA_FIELD}' takes an object with the key 'min_precision' only")
        asked.append(meta.get("min_precision"))
        body = {k: v for k, v in body.items() if k != METADATA_FIELD}
    for name in [h for h in headers if h.lower() == PRECISION_HEADER]:
        asked.append(headers[name])
        headers = {k: v for k, v in headers.items() if k != name}
    values = []
    for value in asked:
        try:
            values.append(float(value))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise InvalidRequestError(f"min_precision must be a number between 0 and 1, got {value!r}") from None
    stripped = request if body is request.body and headers is request.forward_headers else replace(request, body=body, forward_headers=headers)
    return stripped, max(values) if values else None


class CacheStage:
    name = "cache"

    def __init__(self, policy: Policy, cache: ResponseCache, response_store: Callable[[], ResponseStore]):
        self.team = policy.team
        self.config = policy.semantic_cache
        self.policy = policy
        self.cache = cache
        self.response_store = response_store  # where a replayed Responses answer is recorded

    def warm_ups(self) -> list[WarmUp]:
        return self.cache.embedder.warm_ups() if self.config.semantic else []

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> Answer:
        request, asked = _strip_metadata(ctx.request)
        ctx.request = request
        if request.endpoint not in (Endpoint.CHAT_COMPLETIONS, Endpoint.MESSAGES, Endpoint.RESPONSES):
            return await call_next(ctx)  # token counts, embeddings: nothing this cache answers
        if (reason := skip_reason(request)) is not None:
            return await self._skipped(ctx, call_next, reason)
        # Hashing a large body (canonical JSON, SHA-256) runs in the heavy-work pool, off the loop.
        keys = await off_loop_if_large(request.size, self._keys, request)
        if keys is None:
            return await call_next(ctx)
        if keys.sampled and not self.config.cache_sampled:
            return await call_next(ctx)
        # A request can only make the cache stricter than its team's policy, never looser.
        min_precision = max(self.config.min_precision, asked or 0.0)
        # A latest turn longer than the embedder reads (256 word pieces) would be matched on a fraction
        # of what it says: such requests use the exact tier only.
        semantic = (self.config.semantic and keys.user_turns <= self.config.max_turns_for_semantic
                    and (keys.query is None or len(keys.query) <= MAX_TEXT_CHARS))
        trace = ctx.trace
        started = time.time_ns() if trace is not None else 0
        try:
            found = await self.cache.lookup(self.team, keys, self.config.exact, semantic, min_precision, self.config.ttl_s)
        except Exception:  # the cache only ever saves work: a broken one must not fail the request
            log.exception("cache lookup failed for team %s; answering from upstream", self.team)
            metrics.RESPONSE_CACHE.labels(self.team, "error").inc()
            if trace is not None:
                trace.stage("cache lookup", started, {"slipstream.cache.outcome": "error"})
            return await call_next(ctx)
        shape: Shape = Endpoint.RESPONSES if request.endpoint is Endpoint.RESPONSES else request.protocol
        if found.entry is not None and not self._safe(shape, found.entry.response):
            # Stored under a policy since changed (cache_tool_calls turned off): served only what it stores now.
            found = replace(found, entry=None, status="miss")
        outcome = found.status if found.entry is not None else "miss"
        metrics.RESPONSE_CACHE.labels(self.team, outcome).inc()
        if trace is not None:
            trace.stage("cache lookup", started, {"slipstream.cache.outcome": outcome, "slipstream.cache.semantic": semantic})
        if found.entry is not None:
            if request.endpoint is Endpoint.RESPONSES:
                return await self._replay_response(ctx, found)
            return self._replay(ctx, found)
        answer = await call_next(ctx)
        if answer.status != 200 or not self._preferred(request.model, answer.route):
            return answer
        if isinstance(answer, LLMResponse):
            read = (functools.partial(responses.from_body, answer.body) if shape is Endpoint.RESPONSES
                    else functools.partial(answers.from_body, request.protocol, answer.body))
            message = await off_loop_if_large(len(answer.body), read)  # a long answer, echoed instructions
            if message is not None and await self._store(shape, keys, answer.route, message, found):
                answer.headers[KEY_HEADER] = keys.exact
            return answer
        answer.events = self._capture(shape, keys, answer, found, answer.events)
        return answer

    async def _skipped(self, ctx: RequestContext, call_next: Handler, reason: str) -> Answer:
        """A request the cache neither answers nor stores: counted by reason, and said in the answer's
        `x-slipstream-cache-skip` (its `x-slipstream-cache` stays `miss`)."""
        metrics.RESPONSE_CACHE_SKIPS.labels(self.team, reason).inc()
        if ctx.trace is not None:
            ctx.trace.stage("cache skip", time.time_ns(), {"slipstream.cache.skip": reason})
        answer = await call_next(ctx)
        answer.headers[SKIP_HEADER] = reason
        return answer

    def _keys(self, request: LLMRequest) -> CacheKeys | None:
        """The request's keys; a Responses request is keyed by its Chat form (so the semantic tier reads
        its latest user turn the same way) with its own fields that form leaves out (responses.key_body)."""
        answered_by = self._answered_by(request.model)
        if request.endpoint is not Endpoint.RESPONSES:
            keyed = request
        else:
            try:
                chat = responses_to_chat(request.body)
            except (TranslationRefused, KeyError, TypeError, AttributeError, ValueError):
                return None  # what has no Chat form (built-in tools, ...) is answered upstream, uncached
            keyed = replace(request, body=responses.key_body(request.body, chat))
        if fetches_media(keyed.body.get("messages")):
            return None  # what a URL serves may change: answered upstream, uncached
        return cache_keys(self.team, keyed, answered_by)

    def _preferred(self, model: str, answered: str) -> bool:
        """Whether the target that answered (`PROVIDER/MODEL`) is one the policy means to answer `model`
        with: any of the route's targets, or under `priority` the first only. A fallback answers while
        the first is failing; stored, it would go on answering after the first is back."""
        route = self.policy.route_for(model)
        if route is None or route.strategy != "priority":
            return True
        first = route.targets[0]
        provider, _, answered_model = answered.partition("/")
        if provider != first.provider:
            return False
        # The same provider again later in the route (gpt-5, then gpt-5-mini): the model tells them apart.
        # Else the provider alone does: the local engine answers as its own model, whatever the name asked.
        return (answered_model == (first.model or model)
                or all(t.provider != provider for t in route.targets[1:]))

    def _answered_by(self, model: str) -> list[tuple[str | None, ...]]:
        """The targets of the route the policy gives `model`, in order, as what changes an answer: the
        provider's kind, upstream and way of serving Responses, and the model it is asked for. The cache
        outlives policy reloads; a name moved to another target must not be answered by the old one."""
        route = self.policy.route_for(model)
        answerers: list[tuple[str | None, ...]] = []
        for target in route.targets if route is not None else ():
            provider = self.policy.providers.get(target.provider)
            if provider is not None:
                answerers.append((provider.kind, provider.base_url, provider.model, provider.responses, target.model or model))
        return answerers

    def _safe(self, shape: Shape, message: answers.Message) -> bool:
        """Whether the team's policy as it is now lets `message` be stored, and so served."""
        if shape is Endpoint.RESPONSES:
            return responses.completed_safely(message, self.config.cache_tool_calls)
        return answers.completed_safely(shape, message, self.config.cache_tool_calls)

    async def _store(self, shape: Shape, keys: CacheKeys, route: str, message: answers.Message, found: Lookup) -> bool:
        if not self._safe(shape, message):
            return False
        try:
            await self.cache.put(self.team, keys, route, message, found.vector, self.config)
        except Exception:  # the client already has its answer; a failed store is only a future miss
            log.exception("cache store failed for team %s", self.team)
            return False
        return True

    async def _capture(self, shape: Shape, keys: CacheKeys, stream: LLMStream, found: Lookup,
                       events: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
        capture = responses.StreamCapture() if shape is Endpoint.RESPONSES else answers.StreamCapture(shape)
        stored = False
        try:
            async for item in events:
                for event in events_of(item):
                    if is_large(len(event)):  # a Responses event echoes the request's instructions
                        await off_loop(capture.feed, event)
                    else:
                        capture.feed(event)
                if not stored and (message := capture.message()) is not None:
                    # The answer is whole at its terminal event, and is stored before that event goes
                    # out: the official clients stop reading there, and a client asking again at once
                    # finds it (the store runs in a thread, so after the event it could come too late).
                    stored = True
                    if shape is Protocol.OPENAI and message.get("usage") is None and stream.usage.final:
                        message["usage"] = answers.openai_usage_object(stream.usage)  # the client did not ask; we did
                    await self._store(shape, keys, stream.route, message, found)
                yield item
        finally:
            await close_after(events)

    def _replay(self, ctx: RequestContext, found: Lookup) -> Answer:
        entry = found.entry
        assert entry is not None and entry.team == self.team  # partitions are per team; this cannot fail
        route = f"cache/{entry.route}"
        ctx.cache_status, ctx.route = found.status, route
        headers = {KEY_HEADER: entry.exact_key}
        protocol = ctx.request.protocol
        message = answers.fresh(protocol, entry.response)
        if not ctx.request.stream:
            return LLMResponse(status=200, body=answers.render_body(protocol, message), headers=headers, usage=Usage(), route=route)
        options = ctx.request.body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        events = _replayed(answers.render_events(protocol, message, include_usage), ctx)

        async def close() -> None:
            await events.aclose()

        return LLMStream(status=200, events=events, headers=headers, usage=_nothing_spent(), route=route, close=close,
                         finish_reasons=answers.finish_reasons(protocol, message))


    async def _replay_response(self, ctx: RequestContext, found: Lookup) -> Answer:
        """A Responses hit: the cached response under a fresh id, recorded in the team's response store
        like any other (unless `store: false`), so it can be continued, fetched and deleted."""
        entry = found.entry
        assert entry is not None and entry.team == self.team
        route = f"cache/{entry.route}"
        ctx.cache_status, ctx.route = found.status, route
        body = ctx.request.body
        response = responses.fresh(entry.response, body)
        if body.get("store") is not False:
            items = as_items(body.get("input"))
            await self.response_store().put(StoredResponse(response["id"], self.team, "cache", False, time.time(), items, response))
        headers = {KEY_HEADER: entry.exact_key}
        if not ctx.request.stream:
            return LLMResponse(status=200, body=orjson.dumps(response), headers=headers, usage=Usage(), route=route)
        events = _replayed(responses.render_events(response), ctx)

        async def close() -> None:
            await events.aclose()

        reasons = [response["status"]] if isinstance(response.get("status"), str) else []
        return LLMStream(status=200, events=events, headers=headers, usage=_nothing_spent(), route=route, close=close,
                         finish_reasons=reasons)


# Messages fields naming what the provider holds, or doing what a hit would not do (docs/semantic-cache.md).
_MESSAGES_STATE = (
    # the answer's id is a Thread's, which a later `continue` names (a hit's fresh id holds none), and a
    # `continue` follows the conversation held under its previous id, once (a second is thread_already_continued)
    "thread",
    # the answer says why the provider's prompt cache missed against the request an id names, now; a later
    # request names this answer's id to be compared with it
    "diagnostics",
    # a code-execution container by id: its files, which earlier requests' code wrote, are read and written
    "container",
    # remote MCP servers: their tools (not in the key) are listed and called by the provider
    "mcp_servers",
)


def skip_reason(request: LLMRequest) -> str | None:
    """Why the response cache neither answers nor stores `request` (Chat Completions, Messages or
    Responses), or None: an answer that depends on state the key does not hold (a conversation or
    container the provider keeps, a file by its id), or that must be the provider's own (an id a later
    request names), or a request whose effects a hit would leave undone."""
    body = request.body
    # A file the provider holds, by its id (a document, image or input file part, a container upload, a
    # code interpreter's files): the key holds the id, not the file, which may be deleted (the provider's
    # 404) or replaced under the same name; the gateway does not see every deletion (another key, expiry).
    if names_files(body):
        return "file_id"
    if request.endpoint is Endpoint.RESPONSES:
        # A continued conversation lives in the response store (or at the provider), not in the body:
        # `previous_response_id`, or a provider-side `conversation` (OpenAI's Conversations API), whose
        # earlier turns the provider prepends and to which it appends this turn's items (a hit would
        # answer from another point of the conversation, and leave the turn out of it). `background` is
        # run and polled at the provider; `prompt` is a template it holds, whose latest version answers.
        for field in ("previous_response_id", "background", "prompt"):
            if body.get(field):
                return field
        if body.get("conversation") is not None:
            return "conversation"
        # A turn with more items than a stored turn may hold goes on to be refused (a hit would store it).
        items = body.get("input")
        return "input_items" if isinstance(items, list) and len(items) > MAX_TURN_ITEMS else None
    if request.endpoint is Endpoint.MESSAGES:
        return next((field for field in _MESSAGES_STATE if body.get(field) not in (None, [], {})), None)
    n = body.get("n", 1)
    if not (n is None or n == 1):
        return "n"
    # `store: true`: OpenAI keeps the completion (evals, distillation, GET by its id); a hit keeps nothing
    return "store" if body.get("store") is True else None


def _nothing_spent() -> Usage:
    """A hit's own usage: no provider tokens, and final — nothing for the limits stage to count in its
    place, as for an upstream stream that ended without its usage event (the replay carries the stored
    answer's usage only where the client asked for it)."""
    return Usage(final=True)


_TOKEN_EVENTS = (b"event: content_block_delta", b"event: response.output_text.delta")


async def _replayed(events: list[bytes], ctx: RequestContext) -> AsyncGenerator[bytes, None]:
    for event in events:
        if event.startswith(_TOKEN_EVENTS) or (event.startswith(b"data: {") and b'"delta":{"content"' in event):
            ctx.timings.mark_token(time.perf_counter())
        yield event


def build_cache(policy: Policy, services: Services) -> CacheStage | None:
    config = policy.semantic_cache
    if not config.enabled or not (config.exact or config.semantic):
        return None
    cache = services.response_cache()
    if config.semantic:
        cache.embedder.start()  # load the model in the background now, not on the first request
    return CacheStage(policy, cache, services.response_store)
