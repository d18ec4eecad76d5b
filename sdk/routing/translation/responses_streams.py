"""Chat Completions chunks → Responses API stream events.

The event sequence is OpenAI's: `response.created`, `response.in_progress`, then per output item
`response.output_item.added` … (`response.content_part.added`, `response.output_text.delta`* | `response.refusal.delta`*,
`response.output_text.done` | `response.refusal.done`, `response.content_part.done`) or (`response.function_call_arguments.delta`*,
`response.function_call_arguments.done`) … `response.output_item.done`, and exactly one terminal
`response.completed` | `response.incomplete`, each with its `sequence_number`.

The terminal event carries the usage, so it is sent only once the upstream's usage chunk (`choices:
[]`, asked for with `stream_options.include_usage`) and `[DONE]` have arrived, never at the
`finish_reason` chunk before them.

A stream that fails after its first byte ends as OpenAI ends a failed Responses stream: an `error` event
and the terminal `response.failed` (`failed_events`). Translated streams end so here; every Responses
stream the door sends passes `ending_as_responses`, which ends a native upstream's broken stream and the
gateway's own failures mid-stream the same way, instead of with a Chat Completions error line.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from sdk.routing.translation import client_tools
from sdk.routing.translation.call_order import CallOrder
from sdk.routing.translation.compaction import compacting
from sdk.routing.translation.compaction import item as compaction_item
from sdk.routing.translation.namespaces import as_called, namespaced
from sdk.routing.translation.responses_answers import (
    custom_call_item,
    custom_input,
    custom_tools,
    function_call_item,
    message_item,
    new_id,
    response_object,
    usage_c2r,
)
from sdk.routing.translation.streams import DONE, ChunkError, read_chunk
from sdk.routing.translation.web_search import ITEMS, annotations_c2r, search_item
from sdk.sse import event_data, events_of
from sdk.streams import close_after


def failed_events(response: dict[str, Any], error: ChunkError, event: Callable[..., bytes]) -> list[bytes]:
    """A failure after the first byte, as the Responses stream says it: an `error` event (code, message), then
    the terminal `response.failed` carrying `response` (what was finished) and the error; `event(type, **fields)`
    frames each with its sequence number."""
    code = "rate_limit_exceeded" if error.status == 429 else "server_error"
    failed = response | {"status": "failed", "completed_at": None, "incomplete_details": None, "usage": None,
                         "error": {"code": code, "message": error.message}}
    return [event("error", code=code, message=error.message, param=None), event("response.failed", response=failed)]


def _framed(kind: str, sequence: int, fields: dict[str, Any]) -> bytes:
    payload = {"type": kind, "sequence_number": sequence, **fields}
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


_ECHO_ONCE_CHARS = 4096


_WHOLE = ("custom_tool_call", *client_tools.CALLS)  # items whose arguments are sent once they are whole


class ChatToResponses:
    """Feeds on an OpenAI chunk stream, yields Responses events for `request`'s response `response_id`."""

    def __init__(self, request: dict[str, Any], response_id: str) -> None:
        instructions = request.get("instructions")
        if isinstance(instructions, str) and len(instructions) > _ECHO_ONCE_CHARS:
            # Echoed by response.created, .in_progress and .completed: written once here, not three times
            # (a team's megabytes; the target builds this in the heavy-work pool for a large request).
            request = {**request, "instructions": orjson.Fragment(orjson.dumps(instructions))}
        self.request = request
        self.id = response_id
        self.model = request.get("model") or ""
        self.created_at: int | None = None
        self.sequence = 0
        self.started = False
        self.output: list[dict[str, Any]] = []  # items in output order, completed as they close
        self.open: dict[str, Any] | None = None  # the item being streamed
        self.calls: dict[int, int] = {}  # chat tool_call index → output index
        self.order = CallOrder()  # the tool calls one after another, as items are streamed (call_order.py)
        self.custom, self.names, self.builtin = custom_tools(request), namespaced(request), client_tools.run_by_client(request)
        self.compacting = compacting(request)  # the text is a summary: one compaction item (compaction.py)
        self.raw = ""  # the open custom tool call's (or tool search call's) arguments: sent once they are whole
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    def _event(self, kind: str, **fields: Any) -> bytes:
        self.sequence += 1
        return _framed(kind, self.sequence - 1, fields)

    def _response(self, status: str) -> dict[str, Any]:
        return response_object(self.request, self.id, self.model, status, self.output if status != "in_progress" else [],
                               self.usage if status != "in_progress" else None, self.finish_reason, self.created_at)

    def feed(self, event: bytes) -> list[bytes]:
        chunk = read_chunk(event)
        if chunk is None:
            return []
        if chunk is DONE:
            return self._finish()
        out = self._start(chunk)
        if isinstance(chunk, ChunkError):
            return out + self._failed(chunk)
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            for search in delta.get(ITEMS) or ():
                out += self._search(search)
            if delta.get("content"):
                out += self._text(delta["content"])
            if delta.get("refusal"):
                out += self._text(delta["refusal"], refusal=True)
            if delta.get("annotations"):
                out += self._annotated(annotations_c2r(delta))
            for call in () if self.compacting else delta.get("tool_calls") or ():
                out += [event for ordered in self.order.feed(call) for event in self._call(ordered)]
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        if isinstance(chunk.get("usage"), dict):
            self.usage = usage_c2r(chunk["usage"])
        return out

    def _start(self, chunk: dict[str, Any] | ChunkError) -> list[bytes]:
        """The stream's opening events, before its first chunk (or its error: a Responses stream always opens)."""
        if self.started:
            return []
        self.started = True
        if isinstance(chunk, dict):
            self.model = chunk.get("model") or self.model
            self.created_at = chunk.get("created")
        return [self._event("response.created", response=self._response("in_progress")),
                self._event("response.in_progress", response=self._response("in_progress"))]

    def _failed(self, error: ChunkError) -> list[bytes]:
        """An upstream error after the first byte (not a Chat-style error line, which the SDK's Responses
        stream cannot read): `failed_events` with what was finished."""
        return failed_events(self._response("failed"), error, self._event)

    def _text(self, text: str, refusal: bool = False) -> list[bytes]:
        """Text of the answer, or of its refusal (a message with a `refusal` part, streamed with refusal events)."""
        if self.compacting:
            return self._summary(text)
        out: list[bytes] = []
        kind = "refusal" if refusal else "output_text"
        if self.open is None or self.open["type"] != "message" or self.open["content"][0]["type"] != kind:
            out += self._close()
            self.open = message_item(new_id("msg"), "", status="in_progress", refusal=refusal)
            part = self.open["content"][0]
            self.open["content"] = []
            out.append(self._event("response.output_item.added", output_index=len(self.output), item=self.open))
            self.open["content"] = [part]
            out.append(self._event("response.content_part.added", item_id=self.open["id"], output_index=len(self.output),
                                   content_index=0, part=part))
        field = "refusal" if refusal else "text"
        self.open["content"][0][field] += text
        extra: dict[str, Any] = {} if refusal else {"logprobs": []}
        out.append(self._event("response.refusal.delta" if refusal else "response.output_text.delta", item_id=self.open["id"],
                               output_index=len(self.output), content_index=0, delta=text, **extra))
        return out

    def _summary(self, text: str) -> list[bytes]:
        """A compaction's summary: the item opens with the first text and is whole when it closes."""
        out: list[bytes] = []
        if self.open is None or self.open["type"] != "compaction":
            out += self._close()
            self.open = compaction_item(new_id("cmp"), "")
            out.append(self._event("response.output_item.added", output_index=len(self.output), item=dict(self.open)))
            out.append(self._event("response.compaction.compacting", item_id=self.open["id"], output_index=len(self.output)))
        self.raw += text
        return out

    def _search(self, search: dict[str, Any]) -> list[bytes]:
        """One of Claude's web searches, whole when it arrives (web_search.py): its item's events, as OpenAI streams one."""
        out, index = self._close(), len(self.output)
        item = search_item(search, new_id("ws"))
        out.append(self._event("response.output_item.added", output_index=index, item={**item, "status": "in_progress"}))
        out += [self._event(f"response.web_search_call.{stage}", output_index=index, item_id=item["id"])
                for stage in ("in_progress", "searching", "completed")]
        self.output.append(item)
        return out + [self._event("response.output_item.done", output_index=index, item=item)]

    def _annotated(self, annotations: list[dict[str, Any]]) -> list[bytes]:
        """Web search citations of the text streamed so far (web_search.py), on the open message's text part."""
        if self.open is None or self.open["type"] != "message" or self.open["content"][0]["type"] != "output_text":
            return []
        part, out = self.open["content"][0], []
        for annotation in annotations:
            part["annotations"].append(annotation)
            out.append(self._event("response.output_text.annotation.added", item_id=self.open["id"], output_index=len(self.output),
                                   content_index=0, annotation_index=len(part["annotations"]) - 1, annotation=annotation))
        return out

    def _call(self, call: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        index = call.get("index", 0)
        function = call.get("function") or {}
        if index not in self.calls:
            out += self._close()
            self.calls[index] = len(self.output)
            name, call_id = function.get("name") or "", call.get("id") or new_id("call")
            if name in self.builtin:  # a built-in tool the client runs (client_tools.py)
                self.open = client_tools.call_item(self.builtin[name], new_id("ctc"), call_id, {}, status="in_progress")
            else:
                self.open = as_called(custom_call_item(new_id("ctc"), call_id, name, "", status="in_progress") if name in self.custom
                                      else function_call_item(new_id("fc"), call_id, name, "", status="in_progress"), self.names)
            out.append(self._event("response.output_item.added", output_index=len(self.output), item=dict(self.open)))
        if function.get("arguments") and self.open is not None and self.open["type"] in _WHOLE:
            self.raw += function["arguments"]
        elif function.get("arguments") and self.open is not None and self.calls[index] == len(self.output):
            self.open["arguments"] += function["arguments"]
            out.append(self._event("response.function_call_arguments.delta", item_id=self.open["id"],
                                   output_index=len(self.output), delta=function["arguments"]))
        return out

    def _close(self) -> list[bytes]:
        """Finish the open item: its `.done` events, then it joins the output."""
        item, self.open = self.open, None
        if item is None:
            return []
        index = len(self.output)
        item["status"] = "completed"
        if item["type"] == "message":
            part = item["content"][0]
            done = (self._event("response.refusal.done", item_id=item["id"], output_index=index, content_index=0, refusal=part["refusal"])
                    if part["type"] == "refusal" else
                    self._event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                                text=part["text"], logprobs=[]))
            out = [done,
                   self._event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part)]
        elif item["type"] == "compaction":
            item, self.raw, out = compaction_item(item["id"], self.raw), "", []
        elif item["type"] in client_tools.CALLS:  # OpenAI streams them whole: no argument events
            item[client_tools.CALLS[item["type"]].field], self.raw, out = client_tools.arguments_of(self.raw), "", []
        elif item["type"] == "custom_tool_call":
            item["input"], self.raw = custom_input(self.raw), ""
            out = [self._event("response.custom_tool_call_input.delta", item_id=item["id"], output_index=index, delta=item["input"]),
                   self._event("response.custom_tool_call_input.done", item_id=item["id"], output_index=index, input=item["input"])]
        else:
            out = [self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                               name=item["name"], arguments=item["arguments"])]
        self.output.append(item)
        return out + [self._event("response.output_item.done", output_index=index, item=item)]

    def _finish(self) -> list[bytes]:
        out = [event for call in self.order.flush() for event in self._call(call)] + self._close()
        response = self._response("completed")
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return out + [self._event(kind, response=response)]


_CHAT_ERROR = b'data: {"error"'  # a Chat Completions error line, as a provider or the gateway ends a broken stream
_CREATED, _ITEM_DONE = b"event: response.created", b"event: response.output_item.done"


async def ending_as_responses(events: AsyncIterator[bytes], request: dict[str, Any],
                              failure: Callable[[Exception], ChunkError]) -> AsyncIterator[bytes]:
    """A Responses stream (`request`'s) as it goes to the client, whose failures after the first byte end it with
    `failed_events`: a Chat Completions error line in it (the gateway's end of a native upstream's stream that
    broke off) and an exception raised while it is read (`failure` says what to tell the client). The response
    the failure carries is the one `response.created` opened, with the output items finished by then; the
    sequence numbers go on from the events already sent (one per event, from 0, as OpenAI numbers them)."""
    sequence = 0
    response: dict[str, Any] | None = None
    output: list[dict[str, Any]] = []
    error: ChunkError | None = None
    try:
        async for item in events:
            if _CREATED in item or _ITEM_DONE in item or _CHAT_ERROR in item:
                kept = []
                for event in events_of(item):
                    if event.startswith(_CHAT_ERROR):
                        chunk = read_chunk(event)
                        error = chunk if isinstance(chunk, ChunkError) else ChunkError(500, "upstream error")
                        break
                    if event.startswith(_CREATED):
                        response = orjson.loads(event_data(event)).get("response")
                    elif event.startswith(_ITEM_DONE):
                        output.append(orjson.loads(event_data(event)).get("item"))
                    kept.append(event)
                item = b"".join(kept)
            sequence += item.count(b"\nevent: ") + item.startswith(b"event: ")
            if item:
                yield item
            if error is not None:
                break
    except Exception as exc:
        error = failure(exc)
    finally:
        await close_after(events)
    if error is None:
        return

    def frame(kind: str, **fields: Any) -> bytes:
        nonlocal sequence
        sequence += 1
        return _framed(kind, sequence - 1, fields)

    opened = response if isinstance(response, dict) else response_object(request, new_id("resp"), str(request.get("model") or ""),
                                                                          "failed", [], None)
    for out in failed_events(opened | {"output": output}, error, frame):
        yield out
