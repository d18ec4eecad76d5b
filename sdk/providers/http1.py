"""A small HTTP/1.1 client for the upstream hot path: a keep-alive pool, one write per request, httptools.

Why not aiohttp: on the proxy's hot path the upstream client is most of the added latency, and
aiohttp's request machinery (ClientSession._request, its tracing, cookie and redirect hooks)
costs more per call than everything else Slipstream does (docs/benchmarks.md). Provider APIs need
little of it: a request with a body (whole, or streamed from the client for pass-through uploads,
with backpressure), answers delimited by Content-Length, chunks or the connection's end,
keep-alive, TLS, and HTTP proxies from the environment or the policy (sdk/providers/egress.py).
So that is all this does; no redirects, cookies or compression (the request asks for `identity`,
so bytes arrive as the provider wrote them).

One `Http1Upstream` per event loop (sdk/providers/upstream.py). A response owns its connection
until its body has been read to the end (then the connection goes back to the pool) or until it
is aborted (then the connection is closed, which is how an upstream learns of a cancel).

Connections are pooled per destination (origin, proxy, TLS settings) and shared by every team,
but a team holds at most its share of them at once (`Caller.connections`, default a quarter of
the origin's cap): one team's slow streams cannot take the connections another team needs.

A request is sent again, once, on a fresh connection only when it provably did not reach the
upstream's application: on a reused keep-alive connection that the server closed before any byte
of the answer (the race with a server's idle timeout), or when the upstream's TCP stack has not
acknowledged the request's bytes within the connect timeout (a server that never accepted the
connection: its listen backlog overflowed). Either way the body must be bytes (replayable).
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import socket
import ssl
import sys
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast
from urllib.parse import urlsplit, urlunsplit

import httptools

from sdk.errors import UpstreamTimeoutError, UpstreamUnreachableError
from sdk.providers.egress import Egress, Proxy, TLSOptions, choose_proxy, open_tunnel, tls_context

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
# Bytes a socket holds that the peer has not acknowledged (Linux SIOCOUTQ, which is TIOCOUTQ): a
# request still unacknowledged after the connect timeout never reached the upstream's kernel.
_SIOCOUTQ = 0x5411


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sends (for the pool's fair share) and how the request leaves (proxy, CAs)."""

    team: str | None = None  # None: no share of its own (tests, benchmarks, tools)
    connections: int | None = None  # most connections this team holds to one origin at once (None: the default share)
    egress: Egress = field(default_factory=Egress)


ANYONE = Caller()


@dataclass(frozen=True, slots=True)
class _Destination:
    """What a pooled connection reaches and how: connections are reused only for the same one."""

    scheme: str
    host: str
    port: int
    proxy: Proxy | None
    tls: TLSOptions | None  # https only

    @property
    def shown(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


def default_share() -> int:
    """A team's connections to one origin when its policy sets none: a quarter of the origin's cap."""
    return max(1, _MAX_PER_ORIGIN // 4)


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


@functools.lru_cache(maxsize=512)
def _absolute(method: str, url: str, proxy: Proxy) -> bytes:
    """The request line and Host for an http:// upstream through a proxy: the target in absolute form."""
    (scheme, _, _), _ = _split(method, url)
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    target = f"{scheme}://{host}{parts.path or '/'}" + (f"?{parts.query}" if parts.query else "")
    auth = f"Proxy-Authorization: {proxy.authorization}\r\n" if proxy.authorization else ""
    return f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n{auth}".encode("latin-1")


class _Connection(asyncio.Protocol):
    """One keep-alive connection and the state of the exchange running on it."""

    def __init__(self, origin: _Destination, on_closed: Callable[[_Connection], None]) -> None:
        self.origin = origin
        self._on_closed = on_closed
        self.transport: asyncio.Transport | None = None
        self._socket: socket.socket | None = None  # for TCP_QUICKACK and SIOCOUTQ; None once either fails
        self.closed = False
        self.idle_since = 0.0
        self.team: str | None = None  # the team whose share this connection counts against while in use
        self.reused = False  # taken from the pool's idle connections (not dialled for the call using it)
        self.received = 0  # bytes of the current answer received
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
        self.received = 0
        assert self.transport is not None  # set by connection_made before a connection is handed out
        self.transport.write(request)
        self.quick_ack()

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

    def fail(self, error: BaseException) -> None:
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
class _Turns:
    """Calls waiting for a place (a connection of an origin, or of a team's share), in arrival order."""

    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)

    def wake_one(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def wait(self) -> None:
        """Until woken by a release or a close; then the caller looks again."""
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.wake_one()  # woken, but leaving (timeout, cancel): pass the turn on
            raise


@dataclass(slots=True)
class _Share:
    in_use: int = 0  # connections of one origin this team is using now
    turns: _Turns = field(default_factory=_Turns)


@dataclass(slots=True)
class _Origin:
    idle: list[_Connection] = field(default_factory=list)
    open: int = 0  # connections open (idle or in use)
    closes: bool = False  # the upstream ended its last answer by closing: keep a spare connection ready
    turns: _Turns = field(default_factory=_Turns)  # calls waiting for a free connection
    teams: dict[str, _Share] = field(default_factory=dict)  # one per team that has called (teams come from policies)


class _NotDelivered(UpstreamUnreachableError):
    """The request provably never reached the upstream's application: it may be sent again."""


class Http1Upstream:
    """Keep-alive pool per destination; create it inside the loop that will use it."""

    def __init__(self) -> None:
        self._origins: dict[_Destination, _Origin] = {}
        self._destinations: dict[tuple[str, str, int, Egress], _Destination] = {}
        self._tls: dict[TLSOptions, ssl.SSLContext] = {}
        self._closed = False
        self._spares: set[asyncio.Task[None]] = set()  # background connects (see _SPARE_IDLE_S)

    async def post(self, url: str, headers: dict[str, str], body: bytes, timeout: Timeouts,
                   caller: Caller = ANYONE) -> _Response:
        return await self.request("POST", url, headers, body, timeout, caller=caller)

    async def request(self, method: str, url: str, headers: dict[str, str], body: bytes | AsyncIterable[bytes],
                      timeout: Timeouts, length: int | None = None, caller: Caller = ANYONE) -> _Response:
        """Send one request; `body` is bytes (sent with the head in one write) or an async iterable
        streamed as it is produced: with Content-Length when `length` is given, else chunked."""
        (scheme, host, port), start = _split(method, url)
        destination = self._destination(scheme, host, port, caller.egress)
        if destination.proxy is not None and scheme == "http":
            start = _absolute(method, url, destination.proxy)
        if isinstance(body, bytes):
            request = start + _head(headers, len(body) if body or method not in _NO_BODY else None) + body
        else:
            request = start + _head(headers, length, chunked=length is None)
        fresh = False  # the second try: on a new connection, and not tried again
        while True:
            conn = await self._connect(destination, url, timeout, caller, fresh)
            conn.begin(request)
            check = None
            if isinstance(body, bytes):  # only a replayable request is watched (see _check_delivered)
                after = min(timeout.connect_s, timeout.first_byte_s)
                check = asyncio.get_running_loop().call_later(after, _check_delivered, conn, len(request), after)
            try:
                if not isinstance(body, bytes):
                    await _upload(conn, body, chunked=length is None)
                async with asyncio.timeout(timeout.first_byte_s):
                    await conn.head  # type: ignore[misc]
            except TimeoutError as exc:
                conn.close()
                raise UpstreamTimeoutError(f"{shown(url)} sent no response within {timeout.first_byte_s:g}s") from exc
            except UpstreamUnreachableError as exc:
                conn.close()
                stale = conn.reused and conn.received == 0  # a kept-alive connection the server had closed
                if fresh or not isinstance(body, bytes) or not (stale or isinstance(exc, _NotDelivered)):
                    raise
                fresh = True
                continue
            except BaseException:
                # Failed, or cancelled: dropping the connection is what tells the upstream. Sent
                # again above only when it provably never reached the upstream; anything else is
                # the router's to retry (and count).
                conn.close()
                raise
            finally:
                if check is not None:
                    check.cancel()
            break
        if method == "HEAD":  # no body follows whatever Content-Length says; the parser would wait for one
            conn.complete, conn.spent = True, True
        if not isinstance(body, bytes):  # an answer that came before the upload ended leaves the upstream mid-body
            conn.spent = True
        return _Response(conn, self, timeout.read_s)

    def _destination(self, scheme: str, host: str, port: int, egress: Egress) -> _Destination:
        key = (scheme, host, port, egress)
        destination = self._destinations.get(key)
        if destination is None:
            proxy = choose_proxy(scheme, host, port, egress)
            destination = self._destinations[key] = _Destination(scheme, host, port, proxy, egress.tls() if scheme == "https" else None)
        return destination

    async def _connect(self, destination: _Destination, url: str, timeout: Timeouts, caller: Caller,
                       fresh: bool) -> _Connection:
        """A free connection, or a new one, within the connect timeout, counted against the caller's share."""
        pool = self._origins.get(destination) or self._origins.setdefault(destination, _Origin())
        share = None
        if caller.team is not None:
            share = pool.teams.get(caller.team) or pool.teams.setdefault(caller.team, _Share())
        cap = caller.connections or default_share()
        try:
            async with asyncio.timeout(timeout.connect_s):
                if share is not None:
                    while share.in_use >= cap:
                        await share.turns.wait()
                    share.in_use += 1
                try:
                    conn = await self._acquire(destination, pool, url, fresh)
                except BaseException:
                    if share is not None:
                        share.in_use -= 1
                        share.turns.wake_one()
                    raise
        except TimeoutError as exc:
            held = f" (team {caller.team!r} holds all {cap} of its connections to it)" if share and share.in_use >= cap else ""
            raise UpstreamUnreachableError(f"cannot reach {shown(url)}: no connection within {timeout.connect_s:g}s{held}") from exc
        conn.team = caller.team
        return conn

    def release(self, conn: _Connection) -> None:
        pool = self._origins.get(conn.origin)
        if pool is not None:
            self._leave(pool, conn)
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
        pool.turns.wake_one()

    def _forget(self, conn: _Connection) -> None:
        pool = self._origins.get(conn.origin)
        if pool is not None:
            self._leave(pool, conn)
            pool.open -= 1
            pool.turns.wake_one()

    @staticmethod
    def _leave(pool: _Origin, conn: _Connection) -> None:
        """The connection no longer counts against its team's share (released, or closed)."""
        if conn.team is not None:
            share = pool.teams[conn.team]
            conn.team = None
            share.in_use -= 1
            share.turns.wake_one()

    async def _acquire(self, destination: _Destination, pool: _Origin, url: str, fresh: bool) -> _Connection:
        while True:
            now = time.monotonic()
            while pool.idle and not fresh:
                conn = pool.idle.pop()  # the most recently used: the least likely to have been closed by the server
                if not conn.closed and now - conn.idle_since < (_SPARE_IDLE_S if pool.closes else _KEEPALIVE_S):
                    conn.reused = True
                    return conn  # a server that closed it while idle has been seen closing (connection_lost)
                conn.close()
            if pool.open < _MAX_PER_ORIGIN:
                break
            if fresh and pool.idle:
                pool.idle.pop(0).close()  # room for a new connection: the longest idle one goes
                continue
            await pool.turns.wait()
        return await self._open(destination, pool, url)

    async def _open(self, destination: _Destination, pool: _Origin, url: str) -> _Connection:
        pool.open += 1  # counted from now, so concurrent calls cannot overshoot while this one connects
        try:
            conn = await self._dial(destination)
            conn.reused = False
        except BaseException as exc:
            pool.open -= 1
            pool.turns.wake_one()
            if isinstance(exc, OSError):  # refused, unreachable, DNS, TLS (ssl.SSLError is an OSError)
                via = f" through proxy {destination.proxy.shown}" if destination.proxy else ""
                raise UpstreamUnreachableError(f"cannot reach {shown(url)}{via}: {exc}") from exc
            raise
        return conn  # counted until it closes: then _forget gives the place back

    async def _dial(self, destination: _Destination) -> _Connection:
        """A connection to the destination: direct, to the proxy (http), or through a CONNECT tunnel (https)."""
        loop = asyncio.get_running_loop()
        tls = self._tls_context(destination.tls) if destination.tls is not None else None
        proxy = destination.proxy
        if proxy is None or tls is None:
            host, port = (destination.host, destination.port) if proxy is None else (proxy.host, proxy.port)
            _, conn = await loop.create_connection(lambda: _Connection(destination, self._forget), host, port, ssl=tls)
            return conn
        raw = await open_tunnel(proxy, destination.host, destination.port)
        conn = _Connection(destination, self._forget)
        try:
            transport = await loop.start_tls(raw, conn, tls, server_hostname=destination.host)
        except BaseException:
            conn.closed = True  # never counted as open by itself: _open gives the place back
            raw.abort()
            raise
        if transport is None:
            raise UpstreamUnreachableError(f"cannot start TLS through proxy {proxy.shown}")
        conn.connection_made(transport)
        return conn

    async def _spare(self, origin: _Destination, pool: _Origin) -> None:
        """Open a connection for the next call to an upstream that closes after each answer."""
        try:
            conn = await self._open(origin, pool, origin.shown)
        except Exception:  # only a head start: the next call connects (and reports) itself
            return
        if self._closed or not pool.closes:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        pool.idle.append(conn)
        pool.turns.wake_one()

    def _tls_context(self, options: TLSOptions) -> ssl.SSLContext:
        context = self._tls.get(options)
        if context is None:
            context = self._tls[options] = tls_context(options)
        return context

    async def aclose(self) -> None:
        self._closed = True
        for task in list(self._spares):
            task.cancel()
        for pool in self._origins.values():
            for conn in pool.idle:
                conn.close()
            pool.idle.clear()


def _check_delivered(conn: _Connection, size: int, after_s: float) -> None:
    """The connect timeout after a request was written and no answer yet: if the upstream's TCP has
    acknowledged none of it, no application there has read it (a connection still in a full listen
    backlog, a dead peer), so it fails as not delivered and is sent again on a new connection."""
    if conn.head is None or conn.head.done() or conn.closed:
        return
    pending = conn.unacknowledged()
    if pending is not None and pending >= size:
        conn.fail(_NotDelivered(f"{conn.origin.shown} did not take the request: none of it was acknowledged within {after_s:g}s"))
        conn.close()


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
