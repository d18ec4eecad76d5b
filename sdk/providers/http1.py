"""A small HTTP/1.1 client for the upstream hot path: a keep-alive pool, one write per request, httptools.

Why not aiohttp: on the proxy's hot path the upstream client is most of the added latency, and
aiohttp's request machinery (ClientSession._request, its tracing, cookie and redirect hooks)
costs more per call than everything else Slipstream does (docs/benchmarks.md). Provider APIs need
little of it: a request with a body (whole, or streamed from the client for pass-through uploads,
with backpressure), answers delimited by Content-Length, chunks or the connection's end,
keep-alive and TLS. So that is all this does; no redirects, cookies, proxies or compression
(the request asks for `identity`, so bytes arrive as the provider wrote them).

One `Http1Upstream` per event loop (sdk/providers/upstream.py). A response owns its connection
until its body has been read to the end (then the connection goes back to the pool) or until it
is aborted (then the connection is closed, which is how an upstream learns of a cancel).
"""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import httptools

from sdk.errors import UpstreamTimeoutError, UpstreamUnreachableError

if TYPE_CHECKING:
    from sdk.providers.upstream import Timeouts

_PAUSE_AT = 256 * 1024  # buffered body bytes a slow reader may leave before the socket read pauses
_RESUME_AT = 64 * 1024
_IDLE_PER_ORIGIN = 256  # idle keep-alive connections kept per origin
_MAX_PER_ORIGIN = 1000  # open connections per origin; beyond it a call waits for one to free up
_KEEPALIVE_S = 60.0  # an idle connection older than this is closed rather than reused
# Linux only. Many upstreams write an answer's head and body with separate sends and leave Nagle
# on (Python's http.server does): the body then waits for the ACK of the head, which the receiver
# delays by up to 40 ms on a kept-alive connection. Asking for an immediate ACK after each request
# removes that stall (docs/benchmarks.md: 49.9 ms -> 5.4 ms against a 5 ms upstream).
_QUICKACK = getattr(socket, "TCP_QUICKACK", None)
# An upstream that closes the connection after every answer (HTTP/1.0, `Connection: close`) would
# put a connect, and a thread-per-connection server's accept and thread start, in front of each
# request; a replacement is opened in the background instead. Such a spare is used within this many
# seconds or closed (a server may time out an idle connection it never saw a request on).
_SPARE_IDLE_S = 5.0


def shown(url: str) -> str:
    """A URL as errors and logs may show it: without `user:password@` and without the query."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


@functools.lru_cache(maxsize=512)
def _split(method: str, url: str) -> tuple[tuple[str, str, int], bytes]:
    """((scheme, host, port), b"METHOD <target> HTTP/1.1\\r\\nHost: <host>\\r\\n") for a URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UpstreamUnreachableError(f"cannot reach {shown(url)}: only http:// and https:// URLs are supported")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if any(ch in target for ch in " \r\n"):
        raise UpstreamUnreachableError(f"cannot send to {shown(url)!r}: the path has a space or a line break")
    host = parts.netloc.rpartition("@")[2]  # userinfo is never sent in Host (nor anywhere else)
    return (parts.scheme, parts.hostname, port), f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n".encode("latin-1")


class _Connection(asyncio.Protocol):
    """One keep-alive connection and the state of the exchange running on it."""

    def __init__(self, origin: tuple[str, str, int], on_closed: Callable[[_Connection], None]) -> None:
        self.origin = origin
        self._on_closed = on_closed
        self.transport: asyncio.Transport | None = None
        self._socket: socket.socket | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._writable: asyncio.Future[None] | None = None  # set while the transport's write buffer is full
        self._begin_state(None)

    def _begin_state(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.head: asyncio.Future[None] | None = loop.create_future() if loop else None
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.complete = False
        self.keep_alive = False
        self.spent = False  # never reused, whatever the upstream says (a streamed upload, a HEAD)
        self.error: BaseException | None = None
        self._wakeup: asyncio.Future[None] | None = None
        self._paused = False

    def begin(self, request: bytes) -> None:
        self._begin_state(asyncio.get_running_loop())
        self.transport.write(request)
        self.quick_ack()

    def quick_ack(self) -> None:
        """ACK the answer's first segment at once (see _QUICKACK); the kernel clears this by itself."""
        if self._socket is not None:
            try:
                self._socket.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)  # type: ignore[arg-type]
            except OSError:
                self._socket = None  # not TCP after all, or closed: stop asking

    async def drain(self) -> None:
        """Until the transport's write buffer has room again (an upload must not outrun the socket)."""
        if self._writable is not None:
            await asyncio.shield(self._writable)

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None:
            if not self._writable.done():
                self._writable.set_result(None)
            self._writable = None

    def close(self) -> None:
        if not self.closed:
            self._mark_closed()
            if self.transport is not None:
                self.transport.abort()  # no lingering: an upstream sees the cancel at once

    def _mark_closed(self) -> None:
        self.closed = True
        self._on_closed(self)  # once: the pool counts open connections

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if _QUICKACK is not None:
            self._socket = transport.get_extra_info("socket")

    def data_received(self, data: bytes) -> None:
        if self.head is None:  # bytes on an idle connection: nothing can be trusted on it any more
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamUnreachableError(f"upstream sent a malformed HTTP answer: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self._mark_closed()
        self.resume_writing()  # an upload waiting for room finds the connection gone
        if self.head is None or self.complete:
            return
        if self.head.done() and self._ends_at_eof():
            self.on_message_complete()  # an answer delimited by the connection's end
            return
        reason = f": {exc!r}" if exc else ""
        self._fail(UpstreamUnreachableError(
            f"upstream closed the connection mid-stream, before the answer was complete{reason}"))

    # --- httptools callbacks ------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        if self.head is not None and not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(bytes(body))
        self.buffered += len(body)
        if self.buffered > _PAUSE_AT and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()  # release() also refuses a closed connection
        self._wake()

    # --- for the response ---------------------------------------------------------------------

    def take(self) -> bytes | None:
        """The next buffered body piece, or None when none is buffered."""
        if not self.chunks:
            return None
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        if self._paused and self.buffered < _RESUME_AT and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return chunk

    async def wait(self) -> None:
        """Until more body, the end of the answer, or a failure."""
        if self.chunks or self.complete or self.error is not None:
            return
        self._wakeup = asyncio.get_running_loop().create_future()
        try:
            await self._wakeup
        finally:
            self._wakeup = None

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    def _fail(self, error: BaseException) -> None:
        self.error = error
        if self.head is not None and not self.head.done():
            self.head.set_exception(error)
            self.head.exception()  # retrieved here: a caller may already have given up on it
        self._wake()

    def _ends_at_eof(self) -> bool:
        return ("content-length" not in self.headers and "chunked" not in self.headers.get("transfer-encoding", "")
                and self.status not in (204, 304))


class _Response:
    __slots__ = ("_conn", "_pool", "_read_timeout", "headers", "status")

    def __init__(self, conn: _Connection, pool: Http1Upstream, read_timeout: float):
        self._conn: _Connection | None = conn
        self._pool = pool
        self._read_timeout = read_timeout
        self.status = conn.status
        self.headers = conn.headers

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iter_chunks()])

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            return
        try:
            while True:
                chunk = conn.take()
                if chunk is not None:
                    yield chunk
                    continue
                if conn.complete:
                    break
                if conn.error is not None:
                    raise conn.error
                try:
                    async with asyncio.timeout(self._read_timeout):
                        await conn.wait()
                except TimeoutError as exc:
                    raise UpstreamTimeoutError(f"upstream sent nothing for {self._read_timeout:g}s mid-answer") from exc
        except BaseException:
            self.abort()  # unread bytes (or a failure) stay on the connection: it cannot be reused
            raise
        self._conn = None
        self._pool.release(conn)

    def abort(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


@dataclass(slots=True)
class _Origin:
    idle: list[_Connection] = field(default_factory=list)
    open: int = 0  # connections open (idle or in use)
    closes: bool = False  # the upstream ended its last answer by closing: keep a spare connection ready
    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)  # calls waiting for a free one

    def wake_one(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


class Http1Upstream:
    """Keep-alive pool per origin; create it inside the loop that will use it."""

    def __init__(self) -> None:
        self._origins: dict[tuple[str, str, int], _Origin] = {}
        self._tls: ssl.SSLContext | None = None
        self._closed = False
        self._spares: set[asyncio.Task[None]] = set()  # background connects (see _SPARE_IDLE_S)

    async def post(self, url: str, headers: dict[str, str], body: bytes, timeout: Timeouts) -> _Response:
        return await self.request("POST", url, headers, body, timeout)

    async def request(self, method: str, url: str, headers: dict[str, str], body: bytes | AsyncIterable[bytes],
                      timeout: Timeouts, length: int | None = None) -> _Response:
        """Send one request; `body` is bytes (sent with the head in one write) or an async iterable
        streamed as it is produced: with Content-Length when `length` is given, else chunked."""
        origin, start = _split(method, url)
        streamed = not isinstance(body, bytes)
        if streamed:
            request = start + _head(headers, length, chunked=length is None)
        else:
            request = start + _head(headers, len(body) if body or method not in _NO_BODY else None) + body
        try:
            async with asyncio.timeout(timeout.connect_s):  # a free connection, or a new one, in time
                conn = await self._acquire(origin, url)
        except TimeoutError as exc:
            raise UpstreamUnreachableError(f"cannot reach {shown(url)}: no connection within {timeout.connect_s:g}s") from exc
        conn.begin(request)
        try:
            if streamed:
                await _upload(conn, body, chunked=length is None)  # type: ignore[arg-type]
            async with asyncio.timeout(timeout.first_byte_s):
                await conn.head  # type: ignore[misc]
        except TimeoutError as exc:
            conn.close()
            raise UpstreamTimeoutError(f"{shown(url)} sent no response within {timeout.first_byte_s:g}s") from exc
        except BaseException:
            # Failed, or cancelled: dropping the connection is what tells the upstream. Never sent
            # again here, even when no byte came back: the provider may have started on it, and the
            # router decides (and counts) retries.
            conn.close()
            raise
        if method == "HEAD":  # no body follows whatever Content-Length says; the parser would wait for one
            conn.complete, conn.spent = True, True
        if streamed:  # an answer that came before the upload ended leaves the upstream mid-body
            conn.spent = True
        return _Response(conn, self, timeout.read_s)

    def release(self, conn: _Connection) -> None:
        pool = self._origins.get(conn.origin)
        if pool is not None:
            pool.closes = not conn.keep_alive
            if pool.closes and not self._closed and pool.open <= _MAX_PER_ORIGIN:
                task = asyncio.get_running_loop().create_task(self._spare(conn.origin, pool))
                self._spares.add(task)
                task.add_done_callback(self._spares.discard)
        if self._closed or not conn.keep_alive or conn.spent or conn.closed or pool is None or len(pool.idle) >= _IDLE_PER_ORIGIN:
            conn.close()
            return
        conn.head = None
        conn.idle_since = time.monotonic()
        pool.idle.append(conn)
        pool.wake_one()

    def _forget(self, conn: _Connection) -> None:
        pool = self._origins.get(conn.origin)
        if pool is not None:
            pool.open -= 1
            pool.wake_one()

    async def _acquire(self, origin: tuple[str, str, int], url: str) -> _Connection:
        pool = self._origins.setdefault(origin, _Origin())
        while True:
            now = time.monotonic()
            while pool.idle:
                conn = pool.idle.pop()  # the most recently used: the least likely to have been closed by the server
                if not conn.closed and now - conn.idle_since < (_SPARE_IDLE_S if pool.closes else _KEEPALIVE_S):
                    return conn  # a server that closed it while idle has been seen closing (connection_lost)
                conn.close()
            if pool.open < _MAX_PER_ORIGIN:
                break
            waiter = asyncio.get_running_loop().create_future()
            pool.waiters.append(waiter)
            try:
                await waiter  # woken by a release or a close; then look again
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    pool.wake_one()  # woken, but leaving (timeout, cancel): pass the turn on
                raise
        return await self._open(origin, pool, url)

    async def _open(self, origin: tuple[str, str, int], pool: _Origin, url: str) -> _Connection:
        pool.open += 1  # counted from now, so concurrent calls cannot overshoot while this one connects
        scheme, host, port = origin
        try:
            _, conn = await asyncio.get_running_loop().create_connection(
                lambda: _Connection(origin, self._forget), host, port, ssl=self._tls_context() if scheme == "https" else None
            )
        except BaseException as exc:
            pool.open -= 1
            pool.wake_one()
            if isinstance(exc, OSError):  # refused, unreachable, DNS, TLS (ssl.SSLError is an OSError)
                raise UpstreamUnreachableError(f"cannot reach {shown(url)}: {exc}") from exc
            raise
        return conn  # counted until it closes: then _forget gives the place back

    async def _spare(self, origin: tuple[str, str, int], pool: _Origin) -> None:
        """Open a connection for the next call to an upstream that closes after each answer."""
        try:
            conn = await self._open(origin, pool, f"{origin[0]}://{origin[1]}:{origin[2]}")
        except Exception:  # noqa: BLE001 - only a head start: the next call connects (and reports) itself
            return
        if self._closed or not pool.closes:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        pool.idle.append(conn)
        pool.wake_one()

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    async def aclose(self) -> None:
        self._closed = True
        for task in list(self._spares):
            task.cancel()
        for pool in self._origins.values():
            for conn in pool.idle:
                conn.close()
            pool.idle.clear()


async def _upload(conn: _Connection, body: AsyncIterable[bytes], chunked: bool) -> None:
    """Write a streamed body piece by piece, waiting for socket room between pieces. An upstream that
    answers before the upload ends (a 4xx, typically) ends it: its answer is what the caller gets."""
    async for piece in body:
        if conn.closed or conn.head is None or conn.head.done():
            return
        if piece:
            conn.transport.write(b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece)  # type: ignore[union-attr]
            await conn.drain()
    if chunked and not conn.closed:
        conn.transport.write(b"0\r\n\r\n")  # type: ignore[union-attr]
    conn.quick_ack()


_OWN_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "accept-encoding", "connection"})
_NO_BODY = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})  # no Content-Length: 0 on a request without a body


def _head(headers: dict[str, str], length: int | None, chunked: bool = False) -> bytes:
    lines = []
    for name, value in headers.items():
        if name.lower() in _OWN_HEADERS:
            continue  # framing and encoding are this client's to state
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise UpstreamUnreachableError(f"header {name!r} has a line break; it cannot be sent")
        lines.append(f"{name}: {value}\r\n")
    lines.append("Accept-Encoding: identity\r\n")
    if chunked:
        lines.append("Transfer-Encoding: chunked\r\n")
    elif length is not None:
        lines.append(f"Content-Length: {length}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")
