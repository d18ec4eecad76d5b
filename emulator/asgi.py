"""Minimal ASGI plumbing: the per-request `Call`, responses, disconnect watching, hard closes.

Kept framework-free so a request costs a handful of dict lookups and one or two `send`s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

import orjson

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

JSON_CT = (b"content-type", b"application/json")
SSE_HEADERS: Headers = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


class Call:
    """One HTTP request in flight, plus its client-disconnect watcher."""

    __slots__ = (
        "body",
        "headers",
        "params",
        "path",
        "receive",
        "request_id",
        "scope",
        "send",
        "start",
        "started",
        "watcher",
    )

    def __init__(self, scope: Scope, receive: Receive, send: Send, start: float) -> None:
        self.scope = scope
        self.receive = receive
        self.send = send
        self.path: str = scope["path"]
        # ASGI servers lower-case header names; latin-1 keeps arbitrary bytes round-trippable.
        self.headers: dict[str, str] = {k.decode("latin-1"): v.decode("latin-1")
                                         for k, v in scope["headers"]}
        self.body = b""
        self.start = start
        self.request_id = ""
        self.watcher: asyncio.Future[Any] | None = None
        self.started = False  # response start sent
        self.params: tuple[str, ...] = ()  # path parameters, e.g. the id in /v1/responses/{id}

    def query(self) -> dict[str, str]:
        """Query parameters (the last value of a repeated one)."""
        qs = self.scope.get("query_string", b"").decode("latin-1")
        return {k: v[-1] for k, v in parse_qs(qs).items()}

    async def read_body(self) -> bytes:
        chunks: list[bytes] = []
        while True:
            msg = await self.receive()
            if msg["type"] == "http.disconnect":
                self.watcher = _done_future()
                break
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                break
        self.body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return self.body

    # --- disconnect detection --------------------------------------------------------------

    def watch(self) -> None:
        """Start listening for `http.disconnect` (only needed while we wait or stream slowly)."""
        if self.watcher is None:
            self.watcher = asyncio.ensure_future(self._wait_disconnect())

    async def _wait_disconnect(self) -> None:
        while True:
            msg = await self.receive()
            if msg["type"] == "http.disconnect":
                return

    def gone(self) -> bool:
        return self.watcher is not None and self.watcher.done()

    async def pause(self, seconds: float) -> bool:
        """Sleep, waking early on disconnect. Returns False if the client went away."""
        if seconds <= 0:
            return not self.gone()
        self.watch()
        assert self.watcher is not None
        if not self.watcher.done():
            await asyncio.wait((self.watcher,), timeout=seconds)
        return not self.watcher.done()

    def finish(self) -> None:
        if self.watcher is not None and not self.watcher.done():
            self.watcher.cancel()

    # --- responses ---------------------------------------------------------------------------

    async def respond(self, status: int, body: bytes, headers: Headers) -> None:
        headers.append((b"content-length", str(len(body)).encode()))
        self.started = True
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})

    async def json(self, status: int, obj: Any, headers: Headers | None = None) -> None:
        h = headers if headers is not None else []
        h.append(JSON_CT)
        await self.respond(status, orjson.dumps(obj), h)

    async def start_stream(self, headers: Headers) -> None:
        self.started = True
        await self.send({"type": "http.response.start", "status": 200, "headers": headers})

    async def chunk(self, data: bytes, more: bool = True) -> None:
        await self.send({"type": "http.response.body", "body": data, "more_body": more})

    # --- hard connection faults -----------------------------------------------------------

    def _transport(self) -> Any:
        # uvicorn's `send` is a bound method of its RequestResponseCycle, which has `.transport`.
        cycle = getattr(self.send, "__self__", None)
        return getattr(cycle, "transport", None)

    async def reset(self) -> None:
        """Drop the TCP connection without (more of) a response."""
        transport = self._transport()
        if transport is None:
            raise ConnectionAbortedError("emulator reset fault (server exposes no transport)")
        transport.abort()
        await asyncio.sleep(0)  # let the server run connection_lost before we return

    async def close_after_flush(self) -> None:
        """Close the connection after already-written bytes are flushed (mid-stream drop)."""
        transport = self._transport()
        if transport is None:
            raise ConnectionAbortedError("emulator disconnect fault (server exposes no transport)")
        transport.close()
        await asyncio.sleep(0)


def _done_future() -> asyncio.Future[None]:
    f: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    f.set_result(None)
    return f
