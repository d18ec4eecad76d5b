"""The response cache's Responses API shape: what is stored, and how a hit is replayed.

An entry is the response object as the client received it (from the body, or from the stream's
terminal `response.completed` event). A hit is replayed under a fresh id (every response has its
own, for `previous_response_id`, GET and DELETE: the stage records the replay in the team's response
store), as a body or as OpenAI's event sequence with `sequence_number` from 0. Only responses that
completed with message, function-call (when the policy allows) and reasoning items are stored.
"""

from __future__ import annotations

import copy
import time
from typing import Any, TypeGuard

import orjson

from sdk.cache.answers import fresh_id
from sdk.cache.keys import NOT_IN_KEY
from sdk.routing.translation.responses_answers import new_id
from sdk.sse import event_data

Message = dict[str, Any]
_REPLAYABLE = frozenset({"message", "function_call", "reasoning"})


# What a response echoes of its request without it changing the answer (so not in the key): a hit echoes
# the asking request's, as its own answer would.
_ECHOED: tuple[tuple[str, Any], ...] = (("metadata", {}), ("user", None), ("store", True))
# Echoed, and in the key (every hit's request has the same): not stored, so an entry holds the answer
# only. A team's `instructions` may be megabytes, and every hit on an entry holding them read and
# parsed them again on the loop, under the cache's one lock.
_NOT_STORED: tuple[tuple[str, Any], ...] = (("instructions", None),)


def key_body(request: Message, chat: Message) -> Message:
    """What a Responses request is keyed by: its Chat form, so the semantic tier reads the latest user
    turn as for Chat, marked so it never shares an entry with a Chat request, with every field of the
    request itself (`include`, `reasoning.summary`, `truncation`, ...) and the reasoning items of its
    input, which the Chat form leaves out and a native target answers by."""
    items = request.get("input")
    reasoning = [i for i in items if isinstance(i, dict) and i.get("type") == "reasoning"] if isinstance(items, list) else []
    own = {k: v for k, v in request.items() if k not in ("model", "input") and k not in NOT_IN_KEY}
    return {**chat, "api": "responses", "responses": own, "reasoning_items": reasoning}


def from_body(body: bytes) -> Message | None:
    try:
        response = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return _stored(response)


def _stored(response: Any) -> Message | None:
    """What an entry keeps of a response just parsed: all but what a hit echoes from its own request."""
    if not _replayable(response):
        return None
    for name, _ in _NOT_STORED:
        response.pop(name, None)
    return response


def _replayable(response: Any) -> TypeGuard[Message]:
    output = response.get("output") if isinstance(response, dict) else None
    return isinstance(output, list) and all(isinstance(item, dict) and item.get("type") in _REPLAYABLE for item in output)


def completed_safely(response: Message, allow_tool_calls: bool) -> bool:
    """Completed, with no refusal part (the model's call on one request), no function call unless allowed,
    and no reasoning item the provider would read by its id: one without `encrypted_content` is sent back
    by id alone (the next turn's `input`, or the history `previous_response_id` expands), which OpenAI reads
    from the responses stored on the account, and a hit's fresh id is none of them (its 404, "Item with id
    'rs_…' not found"). Asked for with `include: ["reasoning.encrypted_content"]`, the item carries itself."""
    calls = any(item["type"] == "function_call" for item in response["output"])
    refused = any(isinstance(part, dict) and part.get("type") == "refusal"
                  for item in response["output"] if item["type"] == "message" for part in item.get("content") or ())
    by_id = any(item["type"] == "reasoning" and not item.get("encrypted_content") for item in response["output"])
    return response.get("status") == "completed" and not refused and not by_id and (allow_tool_calls or not calls)


class StreamCapture:
    """The response of a stream's terminal `response.completed` event (None until then)."""

    def __init__(self) -> None:
        self._response: Message | None = None

    def feed(self, event: bytes) -> None:
        if event.startswith(b"event: response.completed"):
            self._response = _stored(orjson.loads(event_data(event)).get("response"))

    def message(self) -> Message | None:
        return self._response


def fresh(response: Message, request: Message) -> Message:
    """The cached response as `request`'s: its own id and creation and completion times, output items
    re-identified, each function call its own call_id (a client matches its output to the call by it),
    and the request's own metadata, user, store and instructions echoed. Only what changes is copied:
    the entry was read for this hit alone, and nothing it shares with the answer is changed."""
    out = {**response, "id": new_id("resp"), "created_at": int(time.time())}
    if out.get("completed_at") is not None:
        out["completed_at"] = out["created_at"]
    for name, default in (*_ECHOED, *_NOT_STORED):
        value = request.get(name)
        out[name] = copy.copy(default) if value is None else value
    prefixes = {"message": "msg", "function_call": "fc", "reasoning": "rs"}
    out["output"] = [{**item, "id": new_id(prefixes[item["type"]]),
                      **({"call_id": fresh_id("call_")} if item["type"] == "function_call" else {})}
                     for item in response["output"]]
    return out


def render_events(response: Message) -> list[bytes]:
    """OpenAI's stream for a finished response: lifecycle, each item's added/delta/done, completed."""
    events: list[bytes] = []

    def emit(kind: str, **fields: Any) -> None:
        payload = {"type": kind, "sequence_number": len(events), **fields}
        events.append(b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n")

    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    emit("response.created", response=opening)
    emit("response.in_progress", response=opening)
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            emit("response.output_item.added", output_index=index, item={**item, "status": "in_progress", "content": []})
            for part_index, part in enumerate(item["content"]):
                text_key = "text" if part.get("type") == "output_text" else "refusal"
                kind = "output_text" if text_key == "text" else "refusal"
                ids = {"item_id": item["id"], "output_index": index, "content_index": part_index}
                emit("response.content_part.added", **ids, part={**part, text_key: ""})
                if kind == "output_text":
                    emit("response.output_text.delta", **ids, delta=part["text"], logprobs=[])
                    emit("response.output_text.done", **ids, text=part["text"], logprobs=[])
                else:
                    emit("response.refusal.delta", **ids, delta=part["refusal"])
                    emit("response.refusal.done", **ids, refusal=part["refusal"])
                emit("response.content_part.done", **ids, part=part)
        elif item["type"] == "function_call":
            emit("response.output_item.added", output_index=index, item={**item, "status": "in_progress", "arguments": ""})
            ids = {"item_id": item["id"], "output_index": index}
            emit("response.function_call_arguments.delta", **ids, delta=item["arguments"])
            emit("response.function_call_arguments.done", **ids, name=item["name"], arguments=item["arguments"])
        else:  # reasoning: its summary parts stream as the model thinks
            emit("response.output_item.added", output_index=index, item={**item, "summary": []})
            for summary_index, part in enumerate(item.get("summary") or ()):
                ids = {"item_id": item["id"], "output_index": index, "summary_index": summary_index}
                emit("response.reasoning_summary_part.added", **ids, part={**part, "text": ""})
                emit("response.reasoning_summary_text.delta", **ids, delta=part["text"])
                emit("response.reasoning_summary_text.done", **ids, text=part["text"])
                emit("response.reasoning_summary_part.done", **ids, part=part)
        emit("response.output_item.done", output_index=index, item=item)
    emit("response.completed", response=response)
    return events
