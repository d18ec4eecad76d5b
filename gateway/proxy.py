"""The proxy's door: raw ASGI around the door core (sdk/door/), HTTP bytes in, HTTP bytes out.

Every decision (team, endpoint, method, limits, parse, pipeline, errors, headers) is the core's, the
same the drop-in SDK's transport calls; this module only turns ASGI into a `Call` and a `Reply`
into ASGI messages. The pipeline endpoints are mounted as ASGI handlers so that the hot path pays
for no framework layers it does not use, and so that it controls disconnects itself: a watcher
task waits for `http.disconnect` and cancels the request's task, which closes the upstream call at
once whether the answer is still pending or streaming.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import unquote

from gateway.refusals import client_address
from sdk.door import ClientGone, Door, Reply, too_large
from sdk.observability.tracing import Parent
from sdk.types import Endpoint

log = logging.getLogger("slipstream.proxy")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIHandler = Callable[[Scope, Receive, Send], Awaitable[None]]


class AsgiCall:
    """An ASGI request as the door core reads it (sdk/door/call.py); the body is read from `receive`
    only when the core asks, within the team's limit."""

    __slots__ = ("_receive", "_scope", "caller", "headers", "method", "path", "query")

    def __init__(self, scope: Scope, receive: Receive, path: str | None = None):
        self._scope, self._receive = scope, receive
        self.method: str = scope["method"]
        self.path: str = path or scope["path"]
        self.query: str = scope["query_string"].decode("latin-1")
        self.headers: list[tuple[bytes, bytes]] = scope["headers"]
        self.caller: Parent | None = None  # the client's span travels in its traceparent header

    async def read(self, limit: int, need: Callable[[int], None]) -> bytes:
        # Its own loop rather than joining `_received`: every pipeline request comes through here,
        # and a generator in between would add calls to each one.
        for name, value in self.headers:
            if name == b"content-length" and value.isdigit():
                if int(value) > limit:
                    raise too_large(int(value), limit)  # refused before a byte of it is read
                need(int(value))  # so is a body the process has no room for
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise too_large(size, limit, declared=False)
            need(size)
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    def upload(self) -> tuple[bytes | AsyncIterator[bytes], int | None]:
        declared = next((value for name, value in self.headers if name == b"content-length"), b"")
        length = int(declared) if declared.isdigit() else None
        chunked = any(name == b"transfer-encoding" and b"chunked" in value for name, value in self.headers)
        return (self._received() if length or (length is None and chunked) else b""), length

    async def _received(self) -> AsyncIterator[bytes]:
        # Handed to the upstream write piece by piece, so the body is never held whole here.
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            yield message.get("body", b"")
            if not message.get("more_body"):
                return

    def raw_path(self) -> str:
        return self.raw(self._scope)

    @staticmethod
    def raw(scope: Scope) -> str:
        raw: bytes = scope.get("raw_path") or scope["path"].encode()
        return raw.decode("latin-1")

    def origin(self) -> str:
        """The gateway's URL as this client reached it: where a batch's `results_url` must point."""
        host = next((value.decode("latin-1") for name, value in self.headers if name == b"host"), "")
        host = host or "{}:{}".format(*(self._scope.get("server") or ("127.0.0.1", 80)))
        return f"{self._scope.get('scheme', 'http')}://{host}"

    def peer(self) -> str:
        return client_address(self._scope)


async def watch_disconnect(receive: Receive, task: asyncio.Task[Any]) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            task.cancel("client disconnected")
            return


async def _stream(send: Send, reply: Reply) -> None:
    """A body that arrives in pieces, after its response start. One that fails midway ends as
    `Reply.broken` says: with the provider's error event, or left incomplete (the server then drops
    the connection). The reply is closed however it ends, also when the client left before the
    response start was sent: that is the upstream's cancel, and lets the request's body go."""
    assert reply.chunks is not None
    try:
        await send({"type": "http.response.start", "status": reply.status, "headers": reply.headers})
        async for chunk in reply.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    except Exception as exc:
        end = reply.broken(exc)
        if end is not None:
            await send({"type": "http.response.body", "body": end})
    finally:
        if reply.close is not None:
            await reply.close()


async def _answer(door: Door, endpoint: Endpoint | None, task: asyncio.Task[Any], scope: Scope, receive: Receive,
                  send: Send) -> None:
    """One request through the door; `task` is the one running it (a client that leaves cancels it)."""
    try:
        if endpoint is not None:
            started = await door.prepare(endpoint, AsgiCall(scope, receive))
        else:  # a mount sees its sub-path in scope["path"]: the core reads the whole one
            started = await door.answer(AsgiCall(scope, receive, unquote(AsgiCall.raw(scope))))
    except ClientGone:
        return
    if isinstance(started, Reply) and started.chunks is None:
        reply = started  # a refusal, sent as it is: nothing upstream to cancel
    else:
        # The request is read (a pass-through upload too), so `receive` now only says "gone": a
        # watcher then cancels this task, which closes the upstream call, or its stream, at once.
        watcher = asyncio.get_running_loop().create_task(watch_disconnect(receive, task))
        try:
            reply = started if isinstance(started, Reply) else await door.run(*started, accounting_after_reply=True)
            if reply.chunks is not None:
                await _stream(send, reply)
                return
        except asyncio.CancelledError:
            if watcher.done() and not watcher.cancelled():
                task.uncancel()  # the client left: a normal end, not an error of ours
                log.debug("client disconnected; upstream call cancelled")
                return
            raise
        finally:
            watcher.cancel()
    # A whole body, in hand: sending it has nothing left to cancel.
    await send({"type": "http.response.start", "status": reply.status, "headers": reply.headers})
    await send({"type": "http.response.body", "body": reply.body})


def door_handler(endpoint: Endpoint | None) -> ASGIHandler:
    """The ASGI handler of one pipeline endpoint, or (None) of the pass-through mounts; the app's
    state holds the `Door`."""

    async def handle(scope: Scope, receive: Receive, send: Send) -> None:
        state = scope["litestar_app"].state
        # Held in the app's state while it runs: at shutdown the app waits for these before it closes
        # the state backend, so what they charge is settled (gateway/app.py:_lifespan).
        requests: set[asyncio.Task[Any]] = state.requests
        task = asyncio.current_task()
        assert task is not None
        requests.add(task)
        try:
            await _answer(state.door, endpoint, task, scope, receive, send)
        finally:
            requests.discard(task)

    return handle
