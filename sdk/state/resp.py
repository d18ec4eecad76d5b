"""RESP on one connection per server and event loop, commands pipelined on it (sdk/state/redis_client.py
routes commands to servers: one, the master Sentinel names, or a Cluster's nodes).

redis-py's asyncio client costs about 0.1–0.2 ms of Python per command here (a pool checkout, a
lock, its parser; hiredis changes little), and concurrent commands each take a connection of their
own and a round trip: at 16 concurrent callers its p50 was 6–13 ms against 0.17–0.38 ms here
(docs/benchmark-history.md, "One Redis client"). Admission runs on every request, so the client speaks RESP
itself: an `asyncio.Protocol` that writes each command (or a batch) in one write and hands replies to
the waiting futures in order (Redis answers a connection's commands in order), so any number of
concurrent requests share one connection without waiting on each other. Commands issued in the same
event-loop iteration go out in one write.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from sdk.state.redis_url import Auth

Reply = Any  # bytes | int | list | None | RespError


class RespError(Exception):
    """An error reply (`-ERR …`): Redis answered, and said no."""


class StateUnavailable(ConnectionError):
    """No connection to Redis (refused, dropped, or lost while a reply was due)."""


# Encoded arguments, memoised: keys, script digests, field names and most numbers repeat on every
# request (a command cost ~15 µs to encode afresh on this machine, most of the Redis path's CPU).
# Numbers have a table of their own: 1 == 1.0 would share an entry, and EXPIRE refuses "1.0".
_TEXTS: dict[str | bytes, bytes] = {}
_NUMBERS: dict[tuple[type, int | float], bytes] = {}
_MAX_PIECES = 4096  # per table; leases and amounts are unique: start over rather than grow
# Only short texts are remembered: what repeats is short (keys, field names, script digests). Every
# argument was, so each stored response's record and each cached answer (a team's megabytes) stayed
# in the memory every team's requests share, twice, until 4,096 other texts had passed.
_MEMO_LENGTH = 256


def _piece(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


def encode(*args: Any) -> bytes:
    """One command in RESP: an array of bulk strings (numbers as their text)."""
    out = [b"*%d\r\n" % len(args)]
    texts, numbers = _TEXTS, _NUMBERS
    for arg in args:
        kind = type(arg)
        if kind is str or kind is bytes:
            if len(arg) > _MEMO_LENGTH:
                out.append(_piece(arg.encode() if kind is str else arg))
                continue
            piece = texts.get(arg)
            if piece is None:
                if len(texts) >= _MAX_PIECES:
                    texts.clear()
                piece = texts[arg] = _piece(arg.encode() if kind is str else arg)
        else:
            piece = numbers.get((kind, arg))
            if piece is None:
                if len(numbers) >= _MAX_PIECES:
                    numbers.clear()
                piece = numbers[(kind, arg)] = _piece(repr(arg).encode() if kind is float else str(arg).encode())
        out.append(piece)
    return b"".join(out)


def _parse(buf: bytearray, pos: int) -> tuple[Reply, int] | None:
    """One reply from `buf` at `pos`: (reply, next position), or None when it is not all there yet."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        return None
    kind, line = buf[pos], bytes(buf[pos + 1 : end])
    pos = end + 2
    if kind == 43:  # +
        return line, pos
    if kind == 45:  # -
        return RespError(line.decode(errors="replace")), pos
    if kind == 58:  # :
        return int(line), pos
    if kind == 36:  # $
        size = int(line)
        if size < 0:
            return None, pos
        if len(buf) < pos + size + 2:
            return None
        return bytes(buf[pos : pos + size]), pos + size + 2
    if kind == 42:  # *
        count = int(line)
        if count < 0:
            return None, pos
        items = []
        for _ in range(count):
            parsed = _parse(buf, pos)
            if parsed is None:
                return None
            item, pos = parsed
            items.append(item)
        return items, pos
    raise StateUnavailable(f"unexpected reply from Redis: {bytes(buf[pos - len(line) - 3 : pos])!r}")


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiting: deque[asyncio.Future[Reply]] = deque()
        self.lost: BaseException | None = None
        self.outgoing: list[bytes] = []  # commands of this loop iteration, written together

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        pos = 0
        while self.waiting:
            parsed = _parse(self.buf, pos)
            if parsed is None:
                break
            reply, pos = parsed
            future = self.waiting.popleft()
            if not future.done():  # its caller may have timed out; the reply is consumed all the same
                future.set_result(reply)
        del self.buf[:pos]

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = exc or StateUnavailable("Redis closed the connection")
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(StateUnavailable(f"connection to Redis lost: {self.lost}"))

    def send(self, payload: bytes, replies: int) -> list[asyncio.Future[Reply]]:
        if self.lost is not None or self.transport is None or self.transport.is_closing():
            raise StateUnavailable("not connected to Redis")
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(replies)]
        self.waiting.extend(futures)
        if not self.outgoing:
            loop.call_soon(self._flush)
        self.outgoing.append(payload)
        return futures

    def _flush(self) -> None:
        """One write (one syscall here, one read in Redis) for every command queued since the last."""
        payload, self.outgoing = b"".join(self.outgoing), []
        if self.lost is None and self.transport is not None and not self.transport.is_closing():
            self.transport.write(payload)


class Link:
    """One server: one connection per event loop, every command pipelined on it. Its address is fixed,
    or asked anew at each connection (`address` a coroutine function: the master Sentinel names)."""

    def __init__(self, address: tuple[str, int] | Callable[[], Awaitable[tuple[str, int]]], auth: Auth, connect_timeout_s: float,
                 master: bool = False):
        self.address = address
        self.auth = auth
        self.connect_timeout_s = connect_timeout_s
        self.master = master  # check the server's ROLE on connecting: a stale answer may name a replica
        self._conn: _Connection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Future[_Connection] | None = None

    async def _connection(self) -> _Connection:
        loop = asyncio.get_running_loop()
        conn = self._conn
        if conn is not None and self._loop is loop and conn.lost is None:
            return conn
        if self._connecting is None or self._loop is not loop:
            self._loop = loop
            self._connecting = loop.create_future()
            connecting = self._connecting
            try:
                conn = await self._connect(loop)
            except BaseException as exc:
                self._connecting = None
                connecting.set_exception(exc if isinstance(exc, Exception) else StateUnavailable(str(exc)))
                connecting.exception()  # retrieved: nobody else may be waiting
                raise
            self._conn, self._connecting = conn, None
            connecting.set_result(conn)
            return conn
        return await asyncio.shield(self._connecting)

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        async with asyncio.timeout(self.connect_timeout_s):  # finding the master and the TLS handshake included
            host, port = self.address if isinstance(self.address, tuple) else await self.address()
            try:
                _, conn = await loop.create_connection(_Connection, host, port, ssl=self.auth.tls)
            except OSError as exc:
                raise StateUnavailable(f"cannot connect to Redis at {host}:{port}: {exc}") from exc
            transport = conn.transport
            assert transport is not None  # set by connection_made before create_connection returns
            sock = transport.get_extra_info("socket")
            if sock is not None:  # small pipelined writes must not wait for an ACK (Nagle)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello: list[tuple[Any, ...]] = []
            auth = self.auth
            if auth.password is not None:
                hello.append(("AUTH", auth.username, auth.password) if auth.username else ("AUTH", auth.password))
            if auth.db:
                hello.append(("SELECT", auth.db))
            if self.master:
                hello.append(("ROLE",))
            if hello:
                replies = await asyncio.gather(*conn.send(b"".join(encode(*c) for c in hello), len(hello)))
                error: Exception | None = next((reply for reply in replies if isinstance(reply, RespError)), None)
                if error is None and self.master and replies[-1][0] != b"master":
                    error = StateUnavailable(f"{host}:{port} is not a master (yet): {replies[-1][0]!r}")
                if error is not None:
                    transport.close()
                    raise error
            return conn

    async def execute(self, *args: Any) -> Reply:
        reply = (await self.pipeline([args], raise_errors=False))[0]
        if isinstance(reply, RespError):
            raise reply
        return reply

    async def pipeline(self, commands: list[tuple[Any, ...]], raise_errors: bool = True) -> list[Reply]:
        """Send the commands in one write; their replies in order. An error reply raises RespError
        (with `raise_errors=False`, it is returned in its place)."""
        conn = await self._connection()
        replies = await asyncio.gather(*conn.send(b"".join(encode(*c) for c in commands), len(commands)))
        for reply in replies:
            if isinstance(reply, RespError):
                if str(reply).startswith("READONLY") and conn.transport is not None:
                    conn.transport.close()  # a master demoted by a failover: the next call finds the new one
                if raise_errors:
                    raise reply
        return replies

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and conn.transport is not None:
            conn.transport.close()
