"""One routing target serving the Responses API: natively, or translated to its Chat/Messages API.

Native (`kind: openai` providers whose upstream has /responses): the client's body goes out as it
came, the provider's bytes come back unchanged. Translated (Anthropic, the local engine, OpenAI
compatible servers without /responses): Responses → Chat (`translation/responses_requests.py`),
and from Chat on to Messages for an Anthropic target through the chat ↔ messages translation; the
answer comes back the same way.

A provider says how it serves /responses with the policy key `responses: auto | native | chat`
(policies/README.md); `auto` (the default for `kind: openai`) sends natively until the upstream
answers a POST /responses with 404/405 that is not about the model, then translates for the rest of
the policy's life.

`previous_response_id`: the provider that holds a response continues it itself; any other target
gets the stored conversation expanded into `input` (sdk/responses/store.py). Every answer with
`store` not false is recorded when it completes: a translated one before the client sees its last
event, so a follow-up sent at once finds it; a native one (which its provider holds and continues
itself) in the background, off the answer's path.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from sdk.errors import InvalidRequestError, UpstreamHTTPError
from sdk.providers.base import HTTPProvider, Provider
from sdk.providers.openai import OpenAIDialect, ResponsesMode as Mode
from sdk.responses.store import ResponseStore, StoredResponse, as_items
from sdk.routing.backoff import TranslationRefused
from sdk.routing.translation.provider import TranslatingProvider, translate, translated_events
from sdk.routing.translation.responses_answers import completion_c2r, new_id
from sdk.routing.translation.responses_requests import responses_to_chat
from sdk.routing.translation.responses_streams import ChatToResponses
from sdk.sse import event_data, events_of
from sdk.streams import close_after
from sdk.types import Answer, Endpoint, LLMRequest, LLMResponse, Protocol, Timings

if TYPE_CHECKING:
    from sdk.stages.prompt_cache import Planner

log = logging.getLogger("slipstream.responses")
_TERMINAL = (b"event: response.completed", b"event: response.incomplete")


def responses_mode(provider: Provider) -> Mode:
    """How `provider` serves the Responses API (only an OpenAI-dialect HTTP provider can natively)."""
    if isinstance(provider, HTTPProvider) and isinstance(provider.dialect, OpenAIDialect):
        return provider.dialect.responses
    return "chat"


def _lacks_endpoint(exc: UpstreamHTTPError) -> bool:
    """A 404/405 from POST /responses that is about the path, not the model (vLLM says "model ... does not exist")."""
    return exc.status in (404, 405) and b"model" not in exc.body.lower()


class ResponsesTarget:
    """A Provider for Responses requests in front of `inner`, recording stored answers for `team`."""

    def __init__(self, inner: Provider, team: str, store: Callable[[], ResponseStore], planner: Planner | None = None):
        self.inner = inner
        self.name = inner.name
        self.protocol = Protocol.OPENAI
        self.team = team
        self.store = store
        self.mode: Mode = responses_mode(inner)
        self._writes: set[asyncio.Task[None]] = set()  # background copies of native responses
        # Chat reaches an Anthropic provider through the chat ↔ messages translation. The prompt-cache
        # optimizer plans the body the upstream receives (Anthropic breakpoints, or Chat's cache key).
        self.planner = planner
        self.chat: Provider = inner if inner.protocol is Protocol.OPENAI else TranslatingProvider(inner, Protocol.OPENAI, planner)

    async def send(self, request: LLMRequest, timings: Timings) -> Answer:
        if request.endpoint is Endpoint.RESPONSES_INPUT_TOKENS:
            if self.mode == "chat":
                raise TranslationRefused(f"provider {self.name!r} has no Responses API to count input tokens with; route /v1/responses/input_tokens to a native OpenAI target")
            return await self.inner.send(request, timings)
        if self.mode != "chat":
            try:
                return await self._native(request, timings)
            except UpstreamHTTPError as exc:
                if self.mode == "native" or not _lacks_endpoint(exc):
                    raise
                self.mode = "chat"  # discovered: this upstream serves Chat Completions only
        return await self._translated(request, timings)

    # --- conversation state ------------------------------------------------------------------

    async def _previous(self, body: dict[str, Any]) -> StoredResponse | None:
        previous = body.get("previous_response_id")
        if not previous:
            return None
        if not isinstance(previous, str):
            raise InvalidRequestError("previous_response_id: a string is required")
        return await self.store().get(self.team, previous)

    async def _record(self, response: dict[str, Any], context: list[dict[str, Any]], native: bool, body: dict[str, Any]) -> None:
        if body.get("store") is False or not isinstance(response.get("id"), str):
            return
        own = len(as_items(body.get("input")))
        record = StoredResponse(response["id"], self.team, self.name, native, time.time(), context, response, own)
        if not native:
            await self.store().put(record)  # Slipstream alone holds it: stored before the client can ask for it
            return
        # The provider holds a native response and continues it itself: our copy (for a fallback to
        # another target, and GET/DELETE routing) is written off the answer's path.
        task = asyncio.get_running_loop().create_task(self._put_quietly(record))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _put_quietly(self, record: StoredResponse) -> None:
        try:
            await self.store().put(record)
        except Exception:  # the client has its answer; a lost copy only costs a later fallback its history
            log.exception("could not store response %s for team %s", record.id, self.team)

    # --- native -------------------------------------------------------------------------------

    async def _native(self, request: LLMRequest, timings: Timings) -> Answer:
        body = request.body
        previous = await self._previous(body)
        context = as_items(body.get("input"))
        if previous is not None:
            if not (previous.native and previous.provider == self.name):
                # Held by Slipstream or another provider: this one cannot continue it, so it gets the history.
                body = {k: v for k, v in body.items() if k != "previous_response_id"}
                body["input"] = previous.history() + context
                request = replace(request, body=body)
            context = previous.history() + context
        answer = await self.inner.send(request, timings)
        if isinstance(answer, LLMResponse):
            if answer.status == 200:
                await self._record(orjson.loads(answer.body), context, True, body)
            return answer
        answer.events = self._recorded(answer.events, context, True, body)
        return answer

    # --- translated ---------------------------------------------------------------------------

    async def _translated(self, request: LLMRequest, timings: Timings) -> Answer:
        body = request.body
        previous = await self._previous(body)
        if body.get("previous_response_id") and previous is None:
            raise InvalidRequestError(f"Previous response with id '{body['previous_response_id']}' not found.")
        context = (previous.history() if previous else []) + as_items(body.get("input"))
        chat = translate(responses_to_chat, {**body, "input": context}, "Chat Completions")
        response_id = new_id("resp")
        upstream = LLMRequest(Endpoint.CHAT_COMPLETIONS, chat, size=request.size)
        if self.planner is not None and self.chat is self.inner:
            answer = await self.planner(upstream, lambda planned: self.inner.send(planned, timings), timings)
        else:
            answer = await self.chat.send(upstream, timings)
        if isinstance(answer, LLMResponse):
            answer.body = completion_c2r(body, response_id, answer.body)
            await self._record(orjson.loads(answer.body), context, False, body)
            return answer
        answer.events = self._recorded(translated_events(answer.events, ChatToResponses(body, response_id)), context, False, body)
        return answer

    async def _recorded(self, events: AsyncIterator[bytes], context: list[dict[str, Any]], native: bool,
                        body: dict[str, Any]) -> AsyncIterator[bytes]:
        """The stream, with the response recorded from its terminal event before that event is sent."""
        try:
            async for item in events:
                if _TERMINAL[0] in item or _TERMINAL[1] in item:
                    for event in events_of(item):
                        if event.startswith(_TERMINAL):
                            await self._record(orjson.loads(event_data(event)).get("response") or {}, context, native, body)
                yield item
        finally:
            await close_after(events)

