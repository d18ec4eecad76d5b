"""One HTTP/1.1 exchange on one pooled connection (the pool: sdk/providers/http1.py).

The request's bytes (request line, head, a body written with the head or streamed after it), the
connection's protocol (httptools parsing, backpressure both ways, what a caller may ask of the
socket) and the response a caller reads. A response owns its connection until its body has been
read to the end (then `release` takes it back) or until it is aborted (then the connection is
closed, which is how an upstream learns of a cancel).
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import socket
import sys
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit, urlunsplit

import httptools

from sdk.errors import UpstreamTimeoutError, UpstreamUnreachableError
from sdk.providers.egress import Proxy, TLSOptions

_PAUSE_AT = 256 * 1024  # buffered body bytes a slow reader may leave before the socket read pauses
_RESUME_AT = 64 * 1024
# Linux only. Many upstreams write an answer's head and body with separate sends and leave Nagle
# on (Python's http.server does): the body then waits for the ACK of the head, which the receiver
# delays by up to 40 ms on a kept-alive connection. Asking for an immediate ACK after each request
# removes that stall (docs/benchmark-history.md: 49.9 ms -> 5.4 ms against a 5 ms upstream).
_QUICKACK = getattr(socket, "TCP_QUICKACK", None)
# Bytes a socket holds that the peer has not acknowledged (Linux SIOCOUTQ, which is TIOCOUTQ): a
# request still unacknowledged after the connect timeout never reached the upstream's kernel.
_SIOCOUTQ = 0x5411


@dataclass(frozen=True, slots=True)
class Destination:
    """What a pooled connection reaches and how: connections are reused only for the same one."""

    scheme: str
    host: str
    port: int
    proxy: Proxy | None
    tls: TLSOptions | None  # https only

    @property
    def shown(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


def shown(url: str) -> str:
    """A URL as errors and logs may show it: without `user:password@` and without the query."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


@functools.lru_cache(maxsize=512)
def split_url(method: str, url: str) -> tuple[tuple[str, str, int], bytes]:
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


@functools.lru_cache(maxsize=512)
def absolute_form(method: str, url: str, proxy: Proxy) -> bytes:
    """The request line and Host for an http:// upstream through a proxy: the target in absolute form."""
    (scheme, _, _), _ = split_url(method, url)
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    target = f"{scheme}://{host}{parts.path or '/'}" + (f"?{parts.query}" if parts.query else "")
    auth = f"Proxy-Authorization: {proxy.authorization}\r\n" if proxy.authorization else ""
    return f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n{auth}".encode("latin-1")


class NotDelivered(UpstreamUnreachableError):
    """The request provably never reached the upstream's application: it may be sent again."""


class Connection(asyncio.Protocol):
    """One keep-alive connection and the state of the exchange running on it."""

    def __init__(self, origin: Destination, on_closed: Callable[[Connection], None]) -> None:
        self.origin = origin
        self._on_closed = on_closed
        self.transport: asyncio.Transport | None = None
        self._socket: socket.socket | None = None  # for TCP_QUICKACK and SIOCOUTQ; None once either fails
        self.closed = False
        self.idle_since = 0.0
        self.team: str | None = None  # the team whose share this connection counts against while in use
        self.reused = False  # taken from the pool's idle connections (not dialled for the call using it)
        self.received = 0  # bytes of the current answer received
        self.unacknowledged_at_eof: int | None = None  # request bytes the peer had not acknowledged when it closed
        self.written = False  # the current request went to the transport (not refused on a closed connection)
        self._parser = httptools.HttpResponseParser(self)
        self._writable: asyncio.Future[None] | None = None  # set while the transport's write buffer is full
        self._begin_state(None)

    def _begin_state(self, head: asyncio.Future[None] | None) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.head = head  # None while idle
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.complete = False
        self.keep_alive = False
        self.spent = False  # never reused, whatever the upstream says (a streamed upload, a HEAD)
        self.error: BaseException | None = None
        self._wakeup: asyncio.Future[None] | None = None
        self._paused = False
        self._interim = False  # parsing an interim (1xx) answer: the final one follows it

    def begin(self, request: bytes) -> asyncio.Future[None]:
        """Write the request; the future resolves when the answer's head has arrived."""
        head = asyncio.get_running_loop().create_future()
        self._begin_state(head)
        self.received = 0
        self.unacknowledged_at_eof = None
        self.written = False
        if self.closed or self.transport is None or self.transport.is_closing():
            # Closed by the server between its accept and this write: nothing was sent.
            self.fail(NotDelivered(f"{self.origin.shown} closed the connection before the request was written"))
            return head
        self.transport.write(request)
        self.written = True
        self.quick_ack()
        return head

    def send(self, data: bytes) -> None:
        """More of the request (a streamed body); nothing once the connection is closed."""
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def quick_ack(self) -> None:
        """ACK the answer's first segment at once (see _QUICKACK); the kernel clears this by itself."""
        if self._socket is not None and _QUICKACK is not None:
            try:
                self._socket.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
            except OSError:
                self._socket = None  # not TCP after all, or closed: stop asking

    def unacknowledged(self) -> int | None:
        """Bytes of the request the peer's TCP has not acknowledged: still in the transport's buffer,
        or sent and unacknowledged. None where that cannot be told (not Linux, not TCP)."""
        if self._socket is None or self.transport is None or sys.platform != "linux":
            return None
        try:
            sent = int.from_bytes(fcntl.ioctl(self._socket.fileno(), _SIOCOUTQ, b"\0\0\0\0"), sys.byteorder)
        except OSError:
            return None
        return sent + self.transport.get_write_buffer_size()

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
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not its subclasses
        self._socket = transport.get_extra_info("socket")

    def data_received(self, data: bytes) -> None:
        if self.head is None:  # bytes on an idle connection: nothing can be trusted on it any more
            self.close()
            return
        self.received += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail(UpstreamUnreachableError(f"upstream sent a malformed HTTP answer: {exc}"))
            self.close()

    def eof_received(self) -> None:
        # The peer closed its side. Its FIN acknowledges every byte it received, so what the socket
        # still holds unacknowledged now never reached it: asked here, while the socket is open.
        if self.head is not None:
            self.unacknowledged_at_eof = self.unacknowledged()

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
        self.fail(UpstreamUnreachableError(
            f"upstream closed the connection mid-stream, before the answer was complete{reason}"))

    # --- httptools callbacks ------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            # An interim answer (100 Continue, 103 Early Hints), which HTTP/1.1 lets any server send: the
            # final one follows. Taken as the answer, the connection went back to the pool with the final
            # answer still to come, and the next request on it, any team's, was given it.
            self._interim = True
            self.headers.clear()
            return
        self.status = status
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
        if self._interim:
            self._interim = False
            return
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

    def fail(self, error: BaseException) -> None:
        self.error = error
        if self.head is not None and not self.head.done():
            self.head.set_exception(error)
            self.head.exception()  # retrieved here: a caller may already have given up on it
        self._wake()

    def _ends_at_eof(self) -> bool:
        return ("content-length" not in self.headers and "chunked" not in self.headers.get("transfer-encoding", "")
                and self.status not in (204, 304))


class Response:
    __slots__ = ("_conn", "_read_timeout", "_release", "headers", "status")

    def __init__(self, conn: Connection, release: Callable[[Connection], None], read_timeout: float):
        self._conn: Connection | None = conn
        self._release = release  # the pool's: the connection is reusable once the answer is read
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
        self._release(conn)

    def abort(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


async def upload(conn: Connection, body: AsyncIterable[bytes], chunked: bool) -> None:
    """Write a streamed body piece by piece, waiting for socket room between pieces. An upstream that
    answers before the upload ends (a 4xx, typically) ends it: its answer is what the caller gets."""
    async for piece in body:
        if conn.closed or conn.head is None or conn.head.done():
            return
        if piece:
            conn.send(b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece)
            await conn.drain()
    if chunked and not conn.closed:
        conn.send(b"0\r\n\r\n")
    conn.quick_ack()


_OWN_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "accept-encoding", "connection"})
NO_BODY = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})  # no Content-Length: 0 on a request without a body


def request_head(headers: dict[str, str], length: int | None, chunked: bool = False) -> bytes:
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
