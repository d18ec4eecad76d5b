"""A small HTTP/1.1 client for the upstream hot path: a keep-alive pool, one write per request, httptools.

Why not aiohttp: on the proxy's hot path the upstream client is most of the added latency, and
aiohttp's request machinery (ClientSession._request, its tracing, cookie and redirect hooks)
costs more per call than everything else Slipstream does (docs/benchmark-history.md). Provider APIs need
little of it: a request with a body (whole, or streamed from the client for pass-through uploads,
with backpressure), answers delimited by Content-Length, chunks or the connection's end,
keep-alive, TLS, and HTTP proxies from the environment or the policy (sdk/providers/egress.py).
So that is all this does; no redirects, cookies or compression (the request asks for `identity`,
so bytes arrive as the provider wrote them).

One `Http1Upstream` per event loop (sdk/providers/upstream.py); this module is its pool, and
sdk/providers/http1_wire.py one exchange on one connection.

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
import ssl
import time
from collections import deque
from collections.abc import AsyncIterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sdk.errors import UpstreamTimeoutError, UpstreamUnreachableError
from sdk.providers.dns import open_connection
from sdk.providers.egress import Egress, choose_proxy, open_tunnel, tls_context
from sdk.providers.http1_wire import (
    NO_BODY,
    Connection,
    Destination,
    NotDelivered,
    Response,
    absolute_form,
    request_head,
    shown,
    split_url,
    upload,
)

if TYPE_CHECKING:
    from sdk.providers.egress import TLSOptions
    from sdk.providers.upstream import Timeouts

_IDLE_PER_ORIGIN = 256  # idle keep-alive connections kept per origin
_MAX_PER_ORIGIN = 1000  # open connections per origin; beyond it a call waits for one to free up
_KEEPALIVE_S = 60.0  # an idle connection older than this is closed rather than reused
# An upstream that closes the connection after every answer (HTTP/1.0, `Connection: close`) would
# put a connect, and a thread-per-connection server's accept and thread start, in front of each
# request; a replacement is opened in the background instead. Such a spare is used within this many
# seconds or closed (a server may time out an idle connection it never saw a request on).
_SPARE_IDLE_S = 5.0
# Connections one call may try: its own, one for the single re-send of a request that provably
# never reached the upstream, and one more if a connection was closed before anything was written.
_CONNECTIONS_PER_CALL = 3


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sends (for the pool's fair share) and how the request leaves (proxy, CAs)."""

    team: str | None = None  # None: no share of its own (tests, benchmarks, tools)
    connections: int | None = None  # most connections this team holds to one origin at once (None: the default share)
    egress: Egress = field(default_factory=Egress)


ANYONE = Caller()


def default_share() -> int:
    """A team's connections to one origin when its policy sets none: a quarter of the origin's cap."""
    return max(1, _MAX_PER_ORIGIN // 4)


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
    idle: list[Connection] = field(default_factory=list)
    open: int = 0  # connections open (idle or in use)
    closes: bool = False  # the upstream ended its last answer by closing: keep a spare connection ready
    turns: _Turns = field(default_factory=_Turns)  # calls waiting for a free connection
    teams: dict[str, _Share] = field(default_factory=dict)  # one per team that has called (teams come from policies)


def _reusable(pool: _Origin) -> Connection | None:
    """The most recently used idle connection (the least likely to have been closed by the server)
    that is still open and has not idled too long; the others it passes are closed."""
    now = time.monotonic()
    while pool.idle:
        conn = pool.idle.pop()
        if not conn.closed and now - conn.idle_since < (_SPARE_IDLE_S if pool.closes else _KEEPALIVE_S):
            conn.reused = True
            return conn  # a server that closed it while idle has been seen closing (connection_lost)
        conn.close()
    return None


class Http1Upstream:
    """Keep-alive pool per destination; create it inside the loop that will use it."""

    def __init__(self) -> None:
        self._origins: dict[Destination, _Origin] = {}
        self._destinations: dict[tuple[str, str, int, Egress], Destination] = {}
        self._tls: dict[TLSOptions, ssl.SSLContext] = {}
        self._closed = False
        self._spares: set[asyncio.Task[None]] = set()  # background connects (see _SPARE_IDLE_S)
        self.resent = 0  # requests sent again because they provably never reached the upstream

    async def post(self, url: str, headers: dict[str, str], body: bytes, timeout: Timeouts,
                   caller: Caller = ANYONE) -> Response:
        return await self.request("POST", url, headers, body, timeout, caller=caller)

    async def request(self, method: str, url: str, headers: dict[str, str], body: bytes | AsyncIterable[bytes],
                      timeout: Timeouts, length: int | None = None, caller: Caller = ANYONE) -> Response:
        """Send one request; `body` is bytes (sent with the head in one write) or an async iterable
        streamed as it is produced: with Content-Length when `length` is given, else chunked."""
        (scheme, host, port), start = split_url(method, url)
        destination = self._destination(scheme, host, port, caller.egress)
        if destination.proxy is not None and scheme == "http":
            start = absolute_form(method, url, destination.proxy)
        if isinstance(body, bytes):
            request = start + request_head(headers, len(body) if body or method not in NO_BODY else None) + body
        else:
            request = start + request_head(headers, length, chunked=length is None)
        sent_again = False  # a written request is sent again at most once
        for attempt in range(_CONNECTIONS_PER_CALL):
            conn = await self._connect(destination, url, timeout, caller, fresh=attempt > 0)
            head = conn.begin(request)
            check = None
            if isinstance(body, bytes):  # only a replayable request is watched (see _check_delivered)
                after = min(timeout.connect_s, timeout.first_byte_s)
                check = asyncio.get_running_loop().call_later(after, _check_delivered, conn, len(request), after)
            try:
                if not isinstance(body, bytes):
                    await upload(conn, body, chunked=length is None)
                async with asyncio.timeout(timeout.first_byte_s):
                    await head
            except TimeoutError as exc:
                conn.close()
                raise UpstreamTimeoutError(f"{shown(url)} sent no response within {timeout.first_byte_s:g}s") from exc
            except UpstreamUnreachableError as exc:
                conn.close()
                spent = attempt == _CONNECTIONS_PER_CALL - 1 or (conn.written and sent_again)
                if spent or not isinstance(body, bytes) or not _undelivered(conn, exc, len(request)):
                    raise
                sent_again = sent_again or conn.written  # a connection closed before the write sent nothing
                self.resent += 1
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
        else:
            raise AssertionError("unreachable: the last attempt breaks or raises")
        if method == "HEAD":  # no body follows whatever Content-Length says; the parser would wait for one
            conn.complete, conn.spent = True, True
        if not isinstance(body, bytes):  # an answer that came before the upload ended leaves the upstream mid-body
            conn.spent = True
        return Response(conn, self.release, timeout.read_s)

    def _destination(self, scheme: str, host: str, port: int, egress: Egress) -> Destination:
        key = (scheme, host, port, egress)
        destination = self._destinations.get(key)
        if destination is None:
            proxy = choose_proxy(scheme, host, port, egress)
            destination = self._destinations[key] = Destination(scheme, host, port, proxy, egress.tls() if scheme == "https" else None)
        return destination

    async def _connect(self, destination: Destination, url: str, timeout: Timeouts, caller: Caller,
                       fresh: bool) -> Connection:
        """A free connection, or a new one, within the connect timeout, counted against the caller's share."""
        pool = self._origins.get(destination) or self._origins.setdefault(destination, _Origin())
        share = None
        if caller.team is not None:
            share = pool.teams.get(caller.team) or pool.teams.setdefault(caller.team, _Share())
        cap = caller.connections or default_share()
        if not fresh and pool.idle and (share is None or share.in_use < cap):  # most calls: no wait, no timer
            conn = _reusable(pool)
            if conn is not None:
                if share is not None:
                    share.in_use += 1
                conn.team = caller.team
                return conn
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

    def release(self, conn: Connection) -> None:
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

    def _forget(self, conn: Connection) -> None:
        pool = self._origins.get(conn.origin)
        if pool is not None:
            self._leave(pool, conn)
            pool.open -= 1
            pool.turns.wake_one()

    @staticmethod
    def _leave(pool: _Origin, conn: Connection) -> None:
        """The connection no longer counts against its team's share (released, or closed)."""
        if conn.team is not None:
            share = pool.teams[conn.team]
            conn.team = None
            share.in_use -= 1
            share.turns.wake_one()

    async def _acquire(self, destination: Destination, pool: _Origin, url: str, fresh: bool) -> Connection:
        while True:
            if not fresh and (conn := _reusable(pool)) is not None:
                return conn
            if pool.open < _MAX_PER_ORIGIN:
                break
            if fresh and pool.idle:
                pool.idle.pop(0).close()  # room for a new connection: the longest idle one goes
                continue
            await pool.turns.wait()
        return await self._open(destination, pool, url)

    async def _open(self, destination: Destination, pool: _Origin, url: str) -> Connection:
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

    async def _dial(self, destination: Destination) -> Connection:
        """A connection to the destination: direct, to the proxy (http), or through a CONNECT tunnel (https)."""
        loop = asyncio.get_running_loop()
        tls = self._tls_context(destination.tls) if destination.tls is not None else None
        proxy = destination.proxy
        if proxy is None or tls is None:
            host, port = (destination.host, destination.port) if proxy is None else (proxy.host, proxy.port)
            # The name looked up by sdk/providers/dns.py, not in asyncio's default pool (see there).
            conn: Connection = await open_connection(loop, lambda: Connection(destination, self._forget), host, port, tls)
            return conn
        raw = await open_tunnel(proxy, destination.host, destination.port)
        conn = Connection(destination, self._forget)
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

    async def _spare(self, origin: Destination, pool: _Origin) -> None:
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


def _undelivered(conn: Connection, error: UpstreamUnreachableError, size: int) -> bool:
    """Whether a failed request provably never reached the upstream's application."""
    if isinstance(error, NotDelivered):
        return True
    if conn.received:
        return False  # part of an answer came: the upstream read the request
    unread = conn.unacknowledged_at_eof  # None: reset, or not known here
    if conn.reused:
        # A kept-alive connection the server closed (its idle timeout) as the request went out; but
        # not one closed cleanly after the server's TCP had acknowledged the request (a server that
        # closes an idle connection with unread bytes resets it): that server may have read it.
        return unread is None or unread >= size
    return unread is not None and unread >= size  # a new connection closed unread (a timeout in its accept queue)


def _check_delivered(conn: Connection, size: int, after_s: float) -> None:
    """The connect timeout after a request was written and no answer yet: if the upstream's TCP has
    acknowledged none of it, no application there has read it (a connection still in a full listen
    backlog, a dead peer), so it fails as not delivered and is sent again on a new connection."""
    if conn.head is None or conn.head.done() or conn.closed:
        return
    pending = conn.unacknowledged()
    if pending is not None and pending >= size:
        conn.fail(NotDelivered(f"{conn.origin.shown} did not take the request: none of it was acknowledged within {after_s:g}s"))
        conn.close()
