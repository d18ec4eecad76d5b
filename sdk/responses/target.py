"""One routing target serving the Responses API: natively, or translated to its Chat/Messages API.

Native (`kind: openai` providers whose upstream has /responses): the client's body goes out as it
came, the provider's bytes come back unchanged. Translated (Anthropic, the local engine, OpenAI
compatible servers without /responses): Responses → Chat (`translation/responses_requests.py`),
and from Chat on to Messages for an Anthropic target through the chat ↔ messages translation; the
answer comes back the same way.

A provider says how it serves /responses with the policy key `responses: auto | native | chat`
(policies/README.md); `auto` (the default for `kind: openai`) sends natively until the upstream
answers a POST /responses with 404/405 that is not about the model or an object the request names, then translates for the rest of
the policy's life.

`previous_response_id` and `item_reference` are resolved from the team's store first
(sdk/responses/conversation.py: an id the team does not hold is a 404, never sent): the provider
that holds a response continues it itself; any other target gets the stored conversation expanded
into `input` (sdk/responses/store.py). Every answer with `store` not false is recorded when it
completes, before the client sees it (its last event, for a stream), so a follow-up sent at once
finds it and the team's ownership of the id is known to every replica before the id can be used.
`/v1/responses/input_tokens` goes to a native target as sent, after the same resolution; a translated
one counts the Chat form (`translation/counting.py`: Anthropic's count_tokens, the local engine's
tokenizer, a bundled tiktoken encoding) or refuses, saying why. `/v1/responses/compact` is native
only (a translated target answers 404).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import orjson

from sdk.errors import InvalidRequestError, UpstreamHTTPError
from sdk.offload import off_loop_if_large
from sdk.providers.base import HTTPProvider, Provider
from sdk.providers.openai import OpenAIDialect
from sdk.providers.openai import ResponsesMode as Mode
from sdk.responses.conversation import Conversations, Resolved
from sdk.responses.store import ResponseStore
from sdk.routing.backoff import TranslationRefused
from sdk.routing.translation import truncation
from sdk.routing.translation.bodies import responses_error
from sdk.routing.translation.compaction import readable_by_openai
from sdk.routing.translation.counting import anthropic_count, count_chat, counted
from sdk.routing.translation.fields import Shape, check, mark_dropped
from sdk.routing.translation.provider import TranslatingProvider, translate
from sdk.routing.translation.requests import openai_to_anthropic
from sdk.routing.translation.responses_answers import completion_c2r, new_id
from sdk.routing.translation.responses_requests import configured, responses_to_chat
from sdk.routing.translation.responses_streams import ChatToResponses
from sdk.routing.translation.streams import translated_events
from sdk.sse import event_data, events_of
from sdk.streams import close_after
from sdk.types import Answer, Endpoint, LLMRequest, LLMResponse, Protocol, Timings

log = logging.getLogger("slipstream.responses")
_TERMINAL = (b"event: response.completed", b"event: response.incomplete")


def responses_mode(provider: Provider) -> Mode:
    """How `provider` serves the Responses API (only an OpenAI-dialect HTTP provider can natively)."""
    if isinstance(provider, HTTPProvider) and isinstance(provider.dialect, OpenAIDialect):
        return provider.dialect.responses
    return "chat"


def _lacks_endpoint(exc: UpstreamHTTPError) -> bool:
    """A 404/405 from POST /responses that is about the path, not the model (vLLM says "model ... does not exist"),
    nor an object the request names, which OpenAI answers with a 404 of its own ("Conversation with id 'conv_…' not
    found.", "Item with id 'rs_…' not found."): a team naming a conversation gone at the provider turned its `auto`
    provider to translation for the policy's life, every later turn refused or sent without the provider's state."""
    body = exc.body.lower()
    return exc.status in (404, 405) and b"model" not in body and b"with id '" not in body


class ResponsesTarget:
    """A Provider for Responses requests in front of `inner`, recording stored answers for `team`."""

    def __init__(self, inner: Provider, team: str, store: Callable[[], ResponseStore]):
        self.inner = inner
        self.name = inner.name
        self.protocol = Protocol.OPENAI
        self.team = team
        self.store = store
        self.mode: Mode = responses_mode(inner)
        self.conversations = Conversations(team, store)

    def via(self, upstream: Provider) -> Provider:
        """This target for one attempt, sending through `upstream` (`inner` as the router prepared it
        for the attempt: planned for its prompt cache, sdk/promptcache/stage.py)."""
        return _Via(self, upstream)

    async def send(self, request: LLMRequest, timings: Timings, upstream: Provider | None = None) -> Answer:
        upstream = upstream or self.inner
        if request.endpoint is Endpoint.RESPONSES_INPUT_TOKENS:
            if self.mode == "chat":
                return await self._counted(request, timings, upstream)
            return await upstream.send(await self._resolved(request), timings)
        if request.endpoint is Endpoint.RESPONSES_COMPACT:
            if self.mode == "chat":  # the route's next target may be native; if none is, OpenAI's answer to a path it lacks
                raise TranslationRefused(f"provider {self.name!r} serves Responses by translation; /v1/responses/compact exists only on a native OpenAI Responses target", status=404)
            return await upstream.send(await self._resolved(request), timings)
        if request.body.get("background") not in (None, False):
            # Run at the provider after this call answers `queued`, without usage: nothing the team's
            # limits or budget could charge, on an account every team shares.
            raise InvalidRequestError("background: Slipstream does not run background responses (their work happens "
                                      "after the call returns, where the team's limits and spend cannot count it); "
                                      "send background: false, or stream the response")
        if self.mode != "chat":
            try:
                return await self._native(request, timings, upstream)
            except UpstreamHTTPError as exc:
                if self.mode == "native" or not _lacks_endpoint(exc):
                    raise
                self.mode = "chat"  # discovered: this upstream serves Chat Completions only
        return await self._translated(request, timings, upstream)

    async def _resolved(self, request: LLMRequest) -> LLMRequest:
        """A request bound for the native upstream with what it names resolved (not recorded: it
        creates no response)."""
        resolved = await self.conversations.resolve(request.body, request.size, self.name, creates=False)
        body = readable_by_openai(self.conversations.body(request.body, resolved))
        return request if body is request.body else replace(request, body=body, size=resolved.size)

    async def _counted(self, request: LLMRequest, timings: Timings, upstream: Provider) -> LLMResponse:
        """/v1/responses/input_tokens on a translated target: its Chat form counted (counting.py)."""
        resolved = await self.conversations.resolve(request.body, request.size, None, creates=False)
        to_anthropic = self.inner.protocol is Protocol.ANTHROPIC
        protocol = "Anthropic Messages" if to_anthropic else "Chat Completions"
        chat = await _as_chat(request.body, resolved, protocol)
        if to_anthropic:  # a large body translated in the heavy-work pool, as the team's work
            messages = await off_loop_if_large(resolved.size, translate, openai_to_anthropic, chat, protocol)
            n = await anthropic_count(upstream, messages, timings, resolved.size)
        else:
            n = await count_chat(self.inner, chat)
        return counted({"object": "response.input_tokens", "input_tokens": n}, f"{self.name}/{request.model}")

    # --- native -------------------------------------------------------------------------------

    async def _native(self, request: LLMRequest, timings: Timings, upstream: Provider) -> Answer:
        resolved = await self.conversations.resolve(request.body, request.size, self.name)
        body = readable_by_openai(self.conversations.body(request.body, resolved))  # a translated turn's compaction too
        answer = await upstream.send(request if body is request.body else replace(request, body=body, size=resolved.size), timings)
        if isinstance(answer, LLMResponse):
            if answer.status == 200:
                await self.conversations.record(await _parsed(answer.body), request.body, resolved, self.name, True)
            return answer
        answer.events = self._recorded(answer.events, request.body, resolved, True)
        return answer

    # --- translated ---------------------------------------------------------------------------

    async def _translated(self, request: LLMRequest, timings: Timings, upstream: Provider) -> Answer:
        body = request.body
        resolved = await self.conversations.resolve(body, request.size, None)
        # Refusals name the protocol the upstream speaks (Chat is only the way to it for Anthropic).
        protocol = "Anthropic Messages" if self.inner.protocol is Protocol.ANTHROPIC else "Chat Completions"
        response_id = new_id("resp")
        # Chat reaches an Anthropic provider through the chat ↔ messages translation.
        via = upstream if upstream.protocol is Protocol.OPENAI else TranslatingProvider(upstream, Protocol.OPENAI)
        # x-slipstream-dropped-fields names what the client's own body loses. Where the target is sent the client's input
        # as it came (no stored history, no item replaced), translating it checked that very body: its fields are named
        # from there; otherwise the client's body is checked apart from the expanded one the translation checked.
        own = resolved.context == resolved.own
        dropped: list[str] = []
        answer = await _fitting(via, body, resolved, protocol, timings, dropped if own else None)
        mark_dropped(answer.headers, dropped if own else check(Shape.RESPONSES, configured(body), protocol))
        if isinstance(answer, LLMResponse):
            # The answer echoes the request's instructions: written off the loop when the request is large.
            answer.body = await off_loop_if_large(resolved.size, completion_c2r, body, response_id, answer.body)
            await self.conversations.record(await _parsed(answer.body), body, resolved, self.name, False)
            return answer
        translator = await off_loop_if_large(resolved.size, ChatToResponses, body, response_id)
        answer.events = self._recorded(translated_events(answer.events, translator), body, resolved, False)
        return answer

    async def _recorded(self, events: AsyncIterator[bytes], body: dict[str, Any], resolved: Resolved,
                        native: bool) -> AsyncIterator[bytes]:
        """The stream, with the response recorded from its terminal event before that event is sent."""
        try:
            async for item in events:
                if _TERMINAL[0] in item or _TERMINAL[1] in item:
                    for event in events_of(item):
                        if event.startswith(_TERMINAL):
                            response = (await _parsed(event_data(event))).get("response") or {}
                            await self.conversations.record(response, body, resolved, self.name, native)
                yield item
        finally:
            await close_after(events)


async def _parsed(data: bytes) -> Any:
    """A response's JSON, which echoes the request's instructions (a team's megabytes): in the
    heavy-work pool when large, not on the loop every team's requests share."""
    return await off_loop_if_large(len(data), orjson.loads, data)


async def _as_chat(body: dict[str, Any], resolved: Resolved, protocol: str, context: list[dict[str, Any]] | None = None,
                   dropped: list[str] | None = None) -> dict[str, Any]:
    """The request as Chat Completions, its input the resolved context (or `context`, what of it is kept): in the
    heavy-work pool when that context is large (a continuation of a long stored conversation, however small its body).
    With `dropped` (the context is the client's own input), the client's body itself is translated, and the fields
    its check drops are added to `dropped`."""
    items = resolved.context if context is None else context
    sent = body if dropped is not None else {**body, "input": items}
    to_chat = functools.partial(translate, lambda b: responses_to_chat(b, protocol, dropped), sent, protocol)
    return await off_loop_if_large(resolved.size, to_chat)


async def _fitting(via: Provider, body: dict[str, Any], resolved: Resolved, protocol: str, timings: Timings,
                   dropped: list[str] | None = None) -> Answer:
    """The request sent through `via` as Chat; with `truncation: "auto"`, while the target answers that the prompt is
    over its context window, sent again with its oldest turns dropped (truncation.py). A 400 in the Responses API's words.
    `dropped`: as `_as_chat`'s, filled by the first translation (the client's own input, whole)."""
    context, tries = resolved.context, 0
    while True:
        chat = await _as_chat(body, resolved, protocol, context, dropped if tries == 0 else None)
        try:
            return await via.send(LLMRequest(Endpoint.CHAT_COMPLETIONS, chat, size=resolved.size), timings)
        except UpstreamHTTPError as exc:
            if exc.status != 400:
                raise
            told = truncation.overflow(exc.body) if body.get("truncation") == truncation.AUTO and tries < truncation.TRIES else None
            kept = None if told is None else await off_loop_if_large(resolved.size, truncation.fitted, body, context, *told)
            if kept is None:
                raise UpstreamHTTPError(exc.status, responses_error(exc.body), exc.headers, exc.route) from exc
            context, tries = kept, tries + 1


class _Via:
    """A ResponsesTarget bound to one attempt's upstream (ResponsesTarget.via)."""

    def __init__(self, target: ResponsesTarget, upstream: Provider):
        self.target = target
        self.upstream = upstream
        self.name = target.name
        self.protocol = target.protocol

    async def send(self, request: LLMRequest, timings: Timings) -> Answer:
        return await self.target.send(request, timings, self.upstream)

    async def list_models(self) -> list[dict[str, Any]]:
        return await self.target.inner.list_models()
