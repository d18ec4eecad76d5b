"""A Claude answer as a Chat one, and Chat's `n` > 1 on Claude: one Messages request per choice, merged.

Claude has no `n`. A Chat request asking for n choices (1..128, sdk/requests.py) is sent n times, the
same translated body (each planned for the prompt cache as any attempt's), and the n answers become
one: a body whose choices are indexed 0..n-1, or one stream whose chunks carry their choice's index,
each choice its finish chunk, then one usage chunk (when the client asked) and `[DONE]`. Its usage is
what the provider billed: the n answers' usage summed (Claude bills the prompt n times, OpenAI once).

The first request goes alone and the others start once it has begun answering (a stream's first
event, a body's arrival): Anthropic makes a cache entry readable only once the response writing it
has begun, so they read the prefix the first one wrote instead of each writing it again. A prompt
shorter than the model's least cacheable prefix caches nothing, so its requests start together. The
fan-out starts or fails as one: the router is answered once every leg has begun (a stream: its first
event), so a failure before that is retried or falls back like any attempt's. A leg's failure fails
the request with that leg's error, mapped as any, and the other legs are cancelled (their
connections dropped); what the provider billed for them is charged to the team (`Spent`). A client
that leaves closes the merged stream, which closes every leg.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from sdk.routing.backoff import primed
from sdk.routing.translation import chat_custom, legacy_functions
from sdk.routing.translation.bodies import chat_usage, message_a2o
from sdk.routing.translation.streams import AnthropicToOpenAI, Translator, translated_events
from sdk.types import Answer, LLMResponse, LLMStream, Timings, Usage
from sdk.usage import summed


@dataclass(frozen=True, slots=True)
class ChatAnswers:
    """How one Chat request's Claude answers become Chat ones: JSON mode's prefill (None: none), the
    stops the gateway applies, the legacy functions shape, whether the stream ends with usage, the custom
    tools whose calls are custom tool calls (chat_custom.py)."""

    prefill: str | None
    stops: tuple[str, ...]
    legacy: bool
    include_usage: bool
    custom: frozenset[str] = frozenset()
    searches: bool = False  # the answer carries Claude's web searches (web_search.ITEMS)

    def translated(self, answer: Answer, index: int = 0, ending: bool = True) -> AnthropicToOpenAI | None:
        """`answer` made a Chat one in place (choice `index`); a stream's translator, whose end (`ending`
        False) the merge of several choices writes."""
        if isinstance(answer, LLMResponse):
            body = message_a2o(answer.body, self.prefill, self.stops, self.searches)
            body = chat_custom.answered(body, self.custom) if self.custom else body
            answer.body = legacy_functions.answered(body) if self.legacy else body
            return None
        chunks = AnthropicToOpenAI(self.include_usage, self.prefill, self.stops, index, ending, answer.usage, self.searches)
        custom: Translator = chat_custom.CustomChunks(chunks, self.custom) if self.custom else chunks
        answer.events = translated_events(answer.events, legacy_functions.LegacyChunks(custom) if self.legacy else custom,
                                          chunks.cutter)
        return chunks


class Spent(Protocol):
    """Where a request records upstream work it dropped (sdk/pipeline.py:RequestContext; the limits stage charges it)."""

    abandoned: list[str]  # models of calls dropped before their answer: a prompt read, estimated
    discarded: list[tuple[str, Usage]]  # answers dropped whole: what the provider reported, charged exactly


@dataclass(slots=True)
class _Leg:
    answer: Answer
    chunks: AnthropicToOpenAI | None  # a stream's translator


async def fan_out(n: int, send: Callable[[], Awaitable[Answer]], answers: ChatAnswers, timings: Timings,
                  spent: Spent | None, model: str, staggered: bool = True) -> Answer:
    """The answer to a Chat request for `n` choices, each choice one `send()` of the translated request:
    the first alone and the others once it has begun (`staggered`, so they read what it cached), else
    all at once."""
    started: list[_Leg] = []
    rest: list[asyncio.Future[_Leg]] = []
    try:
        if staggered:
            started.append(await _leg(send, answers, 0, timings, None))
            first = started[0].chunks
            same: _Identity | None = _Identity(first.id, first.model, first.created) if first is not None else None
        else:
            same = _Identity(f"chatcmpl-{secrets.token_hex(12)}", "", int(time.time()))
        rest = [asyncio.ensure_future(_leg(send, answers, index, timings, same)) for index in range(len(started), n)]
        started += await _all(rest)
    except BaseException as exc:
        await _dropped(started[:1], rest, spent, model, cancelled=isinstance(exc, asyncio.CancelledError))
        raise
    if isinstance(started[0].answer, LLMResponse):
        return _merged_body(started)
    return _Merge(started).stream()


@dataclass(frozen=True, slots=True)
class _Identity:
    """What every chunk of one merged stream shares: its id, model (empty: each leg's own) and creation time."""

    id: str
    model: str
    created: int


async def _leg(send: Callable[[], Awaitable[Answer]], answers: ChatAnswers, index: int, timings: Timings,
               same: _Identity | None) -> _Leg:
    answer = await send()
    chunks = answers.translated(answer, index, ending=False)
    if isinstance(answer, LLMStream):
        if chunks is not None and same is not None:  # one completion: one id
            chunks.id, chunks.created = same.id, same.created
            chunks.model = same.model or chunks.model
        answer = await primed(answer, timings)  # begun: its cache entries are readable (and it did not fail at once)
    return _Leg(answer, chunks)


async def _all(tasks: list[asyncio.Future[_Leg]]) -> list[_Leg]:
    """Every task's result, in order; the first failure raised as soon as it happens."""
    pending = set(tasks)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if (error := task.exception()) is not None:
                raise error
    return [task.result() for task in tasks]


async def _dropped(first: list[_Leg], rest: list[asyncio.Future[_Leg]], spent: Spent | None, model: str,
                   cancelled: bool) -> None:
    """The fan-out failed or was cancelled: every leg still running is cancelled, every answer closed, and
    the provider's work for them recorded: an answer's usage, a prompt read for a call dropped on its way
    (when the whole attempt was cancelled, the router records one such read itself)."""
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)
    answered = first + [task.result() for task in rest if not task.cancelled() and task.exception() is None]
    dropped = sum(task.cancelled() for task in rest)
    for leg in answered:
        if isinstance(leg.answer, LLMStream):
            await leg.answer.aclose()
    if spent is not None:
        spent.discarded += [(leg.answer.route.partition("/")[2] or model, leg.answer.usage) for leg in answered]
        spent.abandoned += [model] * max(0, dropped - cancelled)


def _merged_body(legs: list[_Leg]) -> LLMResponse:
    """The choices' bodies as one chat.completion: the first's id, each choice its index, the usage summed (each
    choice's reasoning tokens too, which Usage does not hold)."""
    first = legs[0].answer
    assert isinstance(first, LLMResponse)
    merged = orjson.loads(first.body)
    choices, thought = [], 0
    for index, leg in enumerate(legs):
        assert isinstance(leg.answer, LLMResponse)
        body = merged if index == 0 else orjson.loads(leg.answer.body)
        choices.append({**body["choices"][0], "index": index})
        thought += _reasoning(body)
    usage = summed([leg.answer.usage for leg in legs], Usage())
    merged["choices"], merged["usage"] = choices, chat_usage(usage, thought)
    return LLMResponse(first.status, orjson.dumps(merged), first.headers, usage, first.route, first.media_type)


def _reasoning(body: Any) -> int:
    """A Chat body's usage.completion_tokens_details.reasoning_tokens, or 0."""
    usage = body.get("usage") if isinstance(body, dict) else None
    details = usage.get("completion_tokens_details") if isinstance(usage, dict) else None
    tokens = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return tokens if isinstance(tokens, int) else 0


def _has_error(item: bytes) -> bool:
    """Whether a translated item holds an error event (one choice failed: the answer ends with it)."""
    return item.startswith(b'data: {"error"') or b'\n\ndata: {"error"' in item


class _Merge:
    """The choices' streams as one: each leg read by a task of its own into one bounded queue (a slow
    client slows every leg), items passed on as they come."""

    def __init__(self, legs: list[_Leg]):
        self.legs = legs
        self.usage = Usage()
        self.finish_reasons: list[str] = []
        self.queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue(maxsize=len(legs))
        self.pumps: list[asyncio.Task[None]] = []

    def stream(self) -> LLMStream:
        first = self.legs[0].answer
        return LLMStream(first.status, self.events(), first.headers, self.usage, first.route, self.stop,
                         first.media_type, self.finish_reasons)

    async def events(self) -> AsyncIterator[bytes]:
        try:
            self.pumps = [asyncio.ensure_future(self._pump(leg.answer)) for leg in self.legs if isinstance(leg.answer, LLMStream)]
            running = len(self.pumps)
            while running:
                item = await self.queue.get()
                if item is None:
                    running -= 1
                    continue
                if isinstance(item, BaseException):
                    raise item
                yield item
                if _has_error(item):
                    return  # one choice failed: so did the answer (the others are cancelled below)
            ends = [leg.chunks for leg in self.legs]
            if all(chunks is not None and chunks.finished for chunks in ends):  # else cut short, as a single stream is
                assert ends[0] is not None
                thought = sum(chunks.thought for chunks in ends if chunks is not None)  # each choice's thinking
                yield b"".join(ends[0].end(self._summed(), thought))
        finally:
            await self.stop()

    async def _pump(self, stream: LLMStream) -> None:
        try:
            async for item in stream.events:
                await self.queue.put(item)
        except Exception as exc:  # handed to the reader, which raises it
            await self.queue.put(exc)
            return
        await self.queue.put(None)

    async def stop(self) -> None:
        """Every leg closed (its connection dropped, which the provider sees as a cancel); safe to repeat."""
        for pump in self.pumps:
            pump.cancel()
        await asyncio.gather(*self.pumps, return_exceptions=True)
        for leg in self.legs:
            if isinstance(leg.answer, LLMStream):
                await leg.answer.aclose()
        self._summed()

    def _summed(self) -> Usage:
        streams = [leg.answer for leg in self.legs]
        self.finish_reasons[:] = [reason for stream in streams if isinstance(stream, LLMStream) for reason in stream.finish_reasons]
        return summed([stream.usage for stream in streams], self.usage)
