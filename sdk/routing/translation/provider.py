"""A provider wrapper that lets a target of one protocol serve requests of the other.

The request is translated (or refused) before anything is sent; the answer comes back in the
client's dialect: bodies, error bodies and stream events alike. Usage is the inner provider's own
`Usage` object, filled from the upstream's exact numbers, so metrics and headers stay true (a Chat
request for several choices on Claude: one request per choice, their usage summed, choices.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from sdk.errors import InvalidRequestError, UpstreamHTTPError
from sdk.estimate import input_tokens
from sdk.offload import off_loop_if_large
from sdk.promptcache.placement import min_cacheable_tokens
from sdk.providers.base import Provider
from sdk.routing.backoff import TranslationRefused
from sdk.routing.translation import chat_custom, compaction, context_edits, legacy_functions, tool_changes
from sdk.routing.translation.bodies import completion_o2a, error_for, extra_o2a
from sdk.routing.translation.choices import ChatAnswers, Spent, fan_out
from sdk.routing.translation.counting import count_chats, counted, start_count
from sdk.routing.translation.fields import Shape, check, mark_dropped
from sdk.routing.translation.output_limits import warmed, warming
from sdk.routing.translation.output_modes import json_mode
from sdk.routing.translation.paused_turns import resumed
from sdk.routing.translation.requests import anthropic_to_openai, openai_to_anthropic, refuse_prefill
from sdk.routing.translation.stops import cut_bound, openai_stops, split_stops
from sdk.routing.translation.streams import OpenAIToAnthropic, translated_events
from sdk.routing.translation.tool_ids import shortened_tool_names
from sdk.routing.translation.web_search import searches_asked
from sdk.streams import close_after
from sdk.types import (
    Answer,
    Endpoint,
    LLMRequest,
    LLMResponse,
    Protocol,
    Timings,
)

_ENDPOINT = {Protocol.ANTHROPIC: Endpoint.MESSAGES, Protocol.OPENAI: Endpoint.CHAT_COMPLETIONS}


def translate(convert: Callable[[dict[str, Any]], dict[str, Any]], body: dict[str, Any], target: str) -> dict[str, Any]:
    """`convert(body)`, for every translator. They read the client's structure field by field; one
    that is missing or of the wrong type is the client's error, answered with a 400 before anything
    is sent, never a 500."""
    try:
        return convert(body)
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as exc:
        raise InvalidRequestError(f"malformed request: cannot translate it for a {target} target "
                                  f"({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A request made ready for the other protocol: the client's body as translated (`client_body`: legacy
    functions as tools, a compacted conversation from its summary on), the upstream's, and what it dropped."""

    client_body: dict[str, Any]
    body: dict[str, Any]
    dropped: list[str]
    legacy: bool
    warm: bool


class TranslatingProvider:
    """Serves `client`-protocol requests through `inner`, which speaks the other protocol; `source` is
    the policy's provider behind `inner` (an attempt's wrapper), which token counts are asked of."""

    def __init__(self, inner: Provider, client: Protocol, source: Provider | None = None, spent: Spent | None = None):
        self.inner = inner
        self.source = source or inner
        self.spent = spent  # the request's record of dropped upstream work (a failed fan-out's legs: choices.py)
        self.edits = context_edits.Memo()  # this attempt's context edits, worked out once (context_edits.py)
        self.name = inner.name
        self.protocol = client

    async def list_models(self) -> list[dict[str, Any]]:
        return await self.inner.list_models()

    async def send(self, request: LLMRequest, timings: Timings) -> Answer:
        if request.endpoint is Endpoint.COUNT_TOKENS:  # OpenAI has no count endpoint: the gateway counts
            return await self._counted(request)
        if request.endpoint is Endpoint.EMBEDDINGS:
            raise TranslationRefused(f"provider {self.name!r} speaks {self.inner.protocol}, which has no embeddings endpoint")
        to_openai = self.protocol is Protocol.ANTHROPIC
        # Reading and rebuilding the client's body is Python work in proportion to its parts (about a
        # second for 200,000 short messages): a large request's runs in the heavy-work pool, as its team's
        # turn, not on the loop every team's requests share.
        prepared = await off_loop_if_large(request.size, self._prepared, request)
        client_body, body, dropped = prepared.client_body, prepared.body, prepared.dropped
        # Client headers are for the client's provider (anthropic-version, -beta): they do not travel across.
        upstream = LLMRequest(_ENDPOINT[self.inner.protocol], body, size=request.size)
        if not to_openai:
            answers = _chat_answers(request.body, prepared.legacy)
            choices = request.body.get("n")  # 1..128 (sdk/requests.py): above 1, one request per choice (choices.py)
            # a turn Claude paused is sent back until it ends: OpenAI's answers do not pause (paused_turns.py)
            send = partial(resumed, lambda sent: self._sent(sent, timings))
            if isinstance(choices, int) and choices > 1:
                answer = await fan_out(choices, lambda: send(upstream), answers, timings, self.spent, upstream.model,
                                       staggered=input_tokens(upstream) >= min_cacheable_tokens(upstream.model))
            else:
                answer = await send(upstream)
                answers.translated(answer)
            mark_dropped(answer.headers, dropped)
            return answer
        # An Anthropic stream opens with the input count, which an OpenAI upstream reports only at its
        # end: counted beside the upstream call (off the loop for a long prompt).
        count = asyncio.ensure_future(start_count(self.source, body)) if request.stream else None
        try:
            answer = await self._sent(upstream, timings)
        except BaseException:
            _cancel(count)
            raise
        mark_dropped(answer.headers, dropped)
        stops = openai_stops(client_body.get("stop_sequences"), client_body.get("model"))[1]  # those the gateway applies
        if isinstance(answer, LLMResponse):
            _cancel(count)
            answer.body = await off_loop_if_large(len(answer.body), completion_o2a, answer.body,
                                                  extra_o2a(client_body, self.edits.edited), shortened_tool_names(client_body), stops)
            if prepared.warm:
                answer.body = warmed(answer.body)
            if client_body.get(compaction.SUMMARIZE) is not None:  # a compaction request: the summary its one block
                answer.body = compaction.summary_message(answer.body)
            return answer
        assert count is not None
        to_anthropic = OpenAIToAnthropic(extra_o2a(client_body, self.edits.edited), shortened_tool_names(client_body), stops,
                                         answer.usage, cut_bound(body))
        answer.events = translated_events(_counted_first(count, to_anthropic, answer.events), to_anthropic, to_anthropic.cutter)
        if client_body.get(compaction.SUMMARIZE) is not None:
            answer.events = compaction.summary_events(answer.events)
        return answer

    def _prepared(self, request: LLMRequest) -> _Prepared:
        """The client's request checked (a refused field is a 400 here, before anything is sent) and translated."""
        to_openai = self.protocol is Protocol.ANTHROPIC
        target = "OpenAI" if to_openai else "Anthropic"
        legacy = not to_openai and legacy_functions.used(request.body)  # functions, not tools: as tools (legacy_functions.py)
        client_body = translate(legacy_functions.as_tools, request.body, target) if legacy else request.body
        if to_openai:  # a conversation Claude compacted, from its summary on, as Claude reads it (compaction.py), with the
            client_body = tool_changes.applied(compaction.claude_compacted(client_body))  # tools in effect at its end
        dropped = check(Shape.MESSAGES if to_openai else Shape.CHAT, client_body, target, self.edits.edited)
        if to_openai:  # as compacted: a turn that opens with the compaction block (the SDK's, an assistant turn) asks nothing
            refuse_prefill(client_body)
        warm = to_openai and warming(request.body)  # max_tokens 0: the prompt cached, nothing written (output_limits.py)
        # the body just checked, as it is: Chat → Messages does not check it again
        body = translate(self._to_openai if to_openai else _to_anthropic, client_body, str(self.inner.protocol))
        return _Prepared(client_body, body, dropped, legacy, warm)

    def _to_openai(self, body: dict[str, Any]) -> dict[str, Any]:
        return anthropic_to_openai(body, self.edits.edited)

    async def _counted(self, request: LLMRequest) -> LLMResponse:
        """A Messages request's input tokens, counted by the gateway. With context editing, as Anthropic's count says:
        the count after its edits, and the whole conversation's (`original_input_tokens`: the same where no edit
        acted). The two are counted together, the texts they share once (counting.count_chats)."""
        body, chats = await off_loop_if_large(request.size, self._chats, request.body)  # as _prepared: a large one off the loop
        tokens = await count_chats(self.source, chats)
        edited = {} if body.get("context_management") is None else {"context_management": {"original_input_tokens": tokens[-1]}}
        return counted({"input_tokens": tokens[0], **edited}, f"{self.name}/{request.model}")

    def _chats(self, messages: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """A Messages body as Claude reads it, and the Chat bodies whose tokens make its count."""
        body = compaction.claude_compacted(messages)
        # Anthropic's count takes the compaction parameter and ignores it: the conversation as sent is counted
        body = {key: value for key, value in body.items() if key != compaction.SUMMARIZE}
        chats = [translate(self._to_openai, body, str(self.inner.protocol))]
        if self.edits.edited(body).applied:
            whole = {key: value for key, value in body.items() if key != "context_management"}
            chats.append(translate(anthropic_to_openai, whole, str(self.inner.protocol)))
        return body, chats

    async def _sent(self, upstream: LLMRequest, timings: Timings) -> Answer:
        """`upstream` sent to the inner provider; its error answer reshaped for the client's protocol."""
        try:
            return await self.inner.send(upstream, timings)
        except UpstreamHTTPError as exc:
            raise UpstreamHTTPError(exc.status, error_for(self.protocol, exc.status, exc.body), exc.headers, exc.route) from exc


def _to_anthropic(body: dict[str, Any]) -> dict[str, Any]:
    return openai_to_anthropic(body, checked=True)


def _chat_answers(body: dict[str, Any], legacy: bool) -> ChatAnswers:
    """How a Chat request's Claude answers become Chat ones (choices.py)."""
    mode = json_mode(body)
    prefill = mode.prefill if mode is not None and not mode.native else None  # an answer by instruction: validated
    stops = split_stops(body.get("stop"))[1]  # those Claude refuses: cut here
    options = body.get("stream_options")
    return ChatAnswers(prefill, stops, legacy, isinstance(options, dict) and bool(options.get("include_usage")), chat_custom.names(body),
                       searches_asked(body))


def _cancel(task: asyncio.Future[int] | None) -> None:
    if task is not None:
        task.cancel()


async def _counted_first(count: Awaitable[int], translator: OpenAIToAnthropic, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`events`, once `count` has given `translator` the input count its message_start carries."""
    try:
        translator.input_tokens = await count
        async for item in events:
            yield item
    finally:
        await close_after(events)
