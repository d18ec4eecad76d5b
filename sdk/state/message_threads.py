"""Message ids a Messages request reads by id: Anthropic's Threads and cache diagnostics.

A Messages request may name an earlier answer by its `id`: `thread: {type: "continue",
previous_message_id}` has Anthropic prepend the conversation it holds under that id (the message-threads
beta: only the new turn is sent), and `diagnostics.previous_message_id` has it compare that request's
prompt with this one (its `cache_miss_reason`). Anthropic keeps both for the account, and every team
sharing the provider key shares that account: the ids went upstream as sent, so a team that learned
another team's message id continued (read) the other team's conversation, or probed its prompt.

Each answer to a request that carries `thread` or `diagnostics` (the client opted in; diagnostics are
sent on the first turn with a null id to opt in) has its id recorded as the team's (sdk/state/ownership.py,
kind `message`) before the client can see it, and a request naming an id the gateway did not answer
the team with gets a 404 and nothing is sent: another team's id and an id the gateway never saw alike
(as `previous_response_id` and file ids are handled). The 404 for a Thread carries Anthropic's
`error.details.error_code: thread_not_found`, on which the anthropic SDK's threads replay the whole
conversation under a new Thread.

Beside the owner, the context a Thread holds at that message is recorded (`message-context`): the
answer's input tokens (cached or not) and its output, or while a stream runs its input and the
request's `max_tokens`. A `continue` turn is billed that context again besides its new turn, so the
budget's hold counts it (sdk/limits/stage.py, docs/spend.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from sdk.errors import InvalidRequestError, NotFoundError
from sdk.offload import off_loop_if_large
from sdk.sse import event_data, events_of
from sdk.state.ownership import KEEP_S, MAX_NAMED_FILES, Ownership
from sdk.streams import close_after
from sdk.types import Answer, Endpoint, LLMRequest, LLMResponse, Protocol

MESSAGE = "message"  # the ownership records' kind
CONTEXT = "message-context"  # a Thread's context at a message, in tokens: `message-context:TEAM:ID`
_START = b'"message_start"'
_DELTA = b'"message_delta"'


class MessageNotFound(NotFoundError):
    """Anthropic's 404 for a message id it holds nothing under; a Thread's carries `thread_not_found`."""

    def __init__(self, message_id: str, thread: bool):
        super().__init__(f"No thread found for message {message_id}" if thread else f"No message found with id {message_id}")
        self.thread = thread

    def body(self, protocol: Protocol) -> bytes:
        if not self.thread or protocol is not Protocol.ANTHROPIC:
            return super().body(protocol)
        return orjson.dumps({"type": "error", "error": {"type": "not_found_error", "message": self.message,
                                                        "details": {"error_code": "thread_not_found"}}})


def continued(body: Any) -> str | None:
    """The message id a Messages body's Thread continues from (`thread.previous_message_id`), if any."""
    thread = body.get("thread") if isinstance(body, dict) else None
    if isinstance(thread, dict) and thread.get("type") == "continue" and isinstance(thread.get("previous_message_id"), str):
        return str(thread["previous_message_id"])
    return None


def compared(body: Any) -> str | None:
    """The message id a Messages body's cache diagnostics compare with (`diagnostics.previous_message_id`), if any."""
    diagnostics = body.get("diagnostics") if isinstance(body, dict) else None
    if isinstance(diagnostics, dict) and isinstance(diagnostics.get("previous_message_id"), str):
        return str(diagnostics["previous_message_id"])
    return None


def may_name_messages(request: LLMRequest) -> bool:
    """A Messages request (or its token count) that names an earlier answer, or whose answer a later one may name."""
    return request.endpoint in (Endpoint.MESSAGES, Endpoint.COUNT_TOKENS) and (
        isinstance(request.body.get("thread"), dict) or isinstance(request.body.get("diagnostics"), dict))


async def check_messages(ownership: Ownership, team: str, body: Any) -> int:
    """Refuse (404, nothing sent) a body naming a message id the gateway did not answer `team` with; the
    tokens of the context the Thread it continues holds (0 when it continues none), which the provider
    bills again with the new turn."""
    thread = continued(body)
    named = _named([body])
    if not named:
        return 0
    values = await ownership.records.get([f"{MESSAGE}:{i}" for i in named] + ([f"{CONTEXT}:{team}:{thread}"] if thread else []))
    _refuse_unowned(team, named, values)
    context = values[-1] if thread else None
    return int(context) if context is not None and context.isdigit() else 0


async def check_batch_requests(ownership: Ownership, team: str, batch: Any) -> dict[str, int]:
    """The same check for a message batch's requests (`requests[].params`), which Anthropic runs under the
    shared key into results the team reads; at most MAX_NAMED_FILES distinct ids (each a lookup). The
    context each continued Thread holds, in tokens, by the id it continues from (for the batch's worst cost)."""
    requests = batch.get("requests") if isinstance(batch, dict) else None
    named = _named([request.get("params") for request in requests if isinstance(request, dict)]) if isinstance(requests, list) else {}
    if len(named) > MAX_NAMED_FILES:
        raise InvalidRequestError(f"the batch names {len(named)} distinct message ids; at most {MAX_NAMED_FILES} are checked")
    if not named:
        return {}
    threads = [message_id for message_id, thread in named.items() if thread]
    values = await ownership.records.get([f"{MESSAGE}:{i}" for i in named] + [f"{CONTEXT}:{team}:{i}" for i in threads])
    _refuse_unowned(team, named, values)
    return {message_id: int(context) for message_id, context in zip(threads, values[len(named):], strict=True)
            if context is not None and context.isdigit()}


def _named(bodies: list[Any]) -> dict[str, bool]:
    """The message ids `bodies` name, once each, and whether each is a Thread's (else only compared with)."""
    named: dict[str, bool] = {}
    for body in bodies:
        if (thread := continued(body)) is not None:
            named[thread] = True
        if (diagnosed := compared(body)) is not None:
            named.setdefault(diagnosed, False)
    return named


def _refuse_unowned(team: str, named: dict[str, bool], owners: list[str | None]) -> None:
    for (message_id, thread), owner in zip(named.items(), owners, strict=False):
        if owner != team:
            raise MessageNotFound(message_id, thread)


def _input(usage: Any) -> int:
    if not isinstance(usage, dict):
        return 0
    return sum(value for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
               if isinstance(value := usage.get(key), int) and not isinstance(value, bool))


def _output(usage: Any) -> int:
    value = usage.get("output_tokens") if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


async def _own(ownership: Ownership, team: str, message_id: Any, context: int) -> None:
    if isinstance(message_id, str) and message_id:
        await ownership.records.put({f"{MESSAGE}:{message_id}": team, f"{CONTEXT}:{team}:{message_id}": str(context)}, KEEP_S)


async def recorded(ownership: Ownership, team: str, request: LLMRequest, answer: Answer) -> Answer:
    """`answer` with its message id recorded as `team`'s (and the context a Thread holds at it) before the
    client sees it: a whole answer now, a stream's at its `message_start`, its context again at its end."""
    if isinstance(answer, LLMResponse):
        if answer.status == 200:
            data = await off_loop_if_large(len(answer.body), orjson.loads, answer.body)
            if isinstance(data, dict):
                await _own(ownership, team, data.get("id"), _input(data.get("usage")) + _output(data.get("usage")))
        return answer
    most = request.body.get("max_tokens")
    answer.events = _recorded_events(ownership, team, answer.events, most if isinstance(most, int) else 0)
    return answer


async def _recorded_events(ownership: Ownership, team: str, events: AsyncIterator[bytes], max_tokens: int) -> AsyncIterator[bytes]:
    message_id: Any = None
    started = 0
    try:
        async for item in events:
            if _START in item or (message_id is not None and _DELTA in item):
                for event in events_of(item):
                    try:
                        data = orjson.loads(event_data(event))
                    except orjson.JSONDecodeError:
                        continue
                    if not isinstance(data, dict):
                        continue
                    if data.get("type") == "message_start" and isinstance(message := data.get("message"), dict):
                        # the owner before the client has the id; the context at worst until the end says it
                        message_id, started = message.get("id"), _input(message.get("usage"))
                        await _own(ownership, team, message_id, started + max_tokens)
                    elif data.get("type") == "message_delta" and message_id is not None:
                        usage = data.get("usage")
                        await _own(ownership, team, message_id, (_input(usage) or started) + _output(usage))
            yield item
    finally:
        await close_after(events)

