"""The upstream HTTP/1.1 client (sdk/providers/http1.py) against small loopback servers with scripted answers.

The rest of the suite drives it through the emulator (every provider call goes through it); these
tests pin down what the emulator never does: answers framed three ways, a keep-alive connection the
server closed while idle, an answer cut short, TLS, and what reaches the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import ssl
import struct
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from statistics import median

import pytest

from sdk.errors import UpstreamTimeoutError, UpstreamUnreachableError
from sdk.providers import http1, http1_wire
from sdk.providers.egress import Egress
from sdk.providers.http1 import Caller, Http1Upstream
from sdk.providers.upstream import Timeouts
from tests.helpers import PATIENCE_S

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]
# Bounds no loopback answer comes near, loaded or not; they only turn a hang into a failure.
QUICK = Timeouts(connect_s=PATIENCE_S, first_byte_s=PATIENCE_S, read_s=PATIENCE_S)


class Server:
    """A loopback server that hands each request (head and body read) to `handler`."""

    def __init__(self, handler: Handler):
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed = asyncio.Event()  # set when a client closes its side
        self.reset = False  # for handlers: close by a reset

    async def start(self, tls: ssl.SSLContext | None = None) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=tls)
        port = self._server.sockets[0].getsockname()[1]
        return f"{'https://localhost' if tls else 'http://127.0.0.1'}:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
                self.requests.append(head + await reader.readexactly(length))
                await self.handler(reader, writer, len(self.requests))
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed.set()
        finally:
            writer.close()

    async def stop(self) -> None:
        self._server.close()
        await self._server.wait_closed()


@contextlib.asynccontextmanager
async def serving(handler: Handler, tls: ssl.SSLContext | None = None) -> AsyncIterator[tuple[Server, str, Http1Upstream]]:
    server = Server(handler)
    url = await server.start(tls)
    client = Http1Upstream()
    try:
        yield server, url, client
    finally:
        await client.aclose()
        await server.stop()


async def _answer(writer: asyncio.StreamWriter, raw: bytes) -> None:
    writer.write(raw)
    await writer.drain()


async def test_framings_and_keep_alive():
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Id: a\r\nX-Id: b\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nchu\r\n4\r\nnked\r\n0\r\n\r\n",
    ]

    async def handler(reader, writer, n):
        await _answer(writer, answers[n - 1])

    async with serving(handler) as (server, url, client):
        first = await client.post(f"{url}/v1/messages?beta=true", {"x-api-key": "k"}, b'{"a":1}', QUICK)
        assert first.status == 200 and first.headers["x-id"] == "a, b"
        assert await first.read() == b"hello"
        second = await client.post(f"{url}/v1/messages", {}, b"{}", QUICK)
        assert b"".join([chunk async for chunk in second.iter_chunks()]) == b"chunked"
        assert await second.read() == b""  # read to the end already: nothing more
        assert server.connections == 1  # the connection went back to the pool and was reused
        head = server.requests[0].decode()
        assert head.startswith("POST /v1/messages?beta=true HTTP/1.1\r\nHost: 127.0.0.1:")
        assert "x-api-key: k\r\n" in head and "Content-Length: 7\r\n" in head and head.endswith('\r\n\r\n{"a":1}')


async def test_an_answer_ended_by_the_connection_close():
    async def handler(reader, writer, n):
        await _answer(writer, b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
        writer.close()

    async with serving(handler) as (_server, url, client):
        response = await client.post(url, {}, b"", QUICK)
        assert await response.read() == b"until the end"


async def test_a_keep_alive_connection_closed_while_idle_is_not_reused():
    async def handler(reader, writer, n):
        await _answer(writer, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        writer.close()  # without a `Connection: close`: the client learns it from the socket

    async with serving(handler) as (server, url, client):
        assert await (await client.post(url, {}, b"1", QUICK)).read() == b"ok"
        await asyncio.sleep(0.05)
        assert await (await client.post(url, {}, b"2", QUICK)).read() == b"ok"
        assert server.connections == 2 and len(server.requests) == 2


async def test_an_answer_cut_short_is_an_error_not_a_short_body():
    async def handler(reader, writer, n):
        await _answer(writer, b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        writer.transport.abort()

    async with serving(handler) as (_server, url, client):
        response = await client.post(url, {}, b"", QUICK)
        with pytest.raises(UpstreamUnreachableError, match="before the answer was complete"):
            await response.read()


async def test_first_byte_timeout_and_abort_drop_the_connection():
    async def handler(reader, writer, n):
        if n == 2:
            await _answer(writer, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        # n == 1: never answers

    async with serving(handler) as (server, url, client):
        with pytest.raises(UpstreamTimeoutError):
            await client.post(url, {}, b"", Timeouts(first_byte_s=0.1))
        await asyncio.wait_for(server.closed.wait(), PATIENCE_S)  # the server saw the connection go
        server.closed.clear()
        response = await client.post(url, {}, b"", QUICK)
        chunks = response.iter_chunks()
        assert await anext(chunks) == b"first"
        response.abort()  # a client gone mid-stream
        await asyncio.wait_for(server.closed.wait(), PATIENCE_S)


async def test_header_injection_is_refused_before_anything_is_sent():
    client = Http1Upstream()
    with pytest.raises(UpstreamUnreachableError, match="line break"):
        await client.post("http://127.0.0.1:9/", {"x-evil": "a\r\nx-injected: 1"}, b"", QUICK)
    with pytest.raises(UpstreamUnreachableError, match="only http"):
        await client.post("ftp://example.invalid/", {}, b"", QUICK)


async def test_unreachable_origin_is_a_clear_error():
    client = Http1Upstream()
    with pytest.raises(UpstreamUnreachableError, match="cannot reach"):
        await client.post("http://127.0.0.1:9/v1/messages", {}, b"", QUICK)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
async def test_tls_with_hostname_verification(tmp_path: Path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                   check=True, capture_output=True)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)

    async def handler(reader, writer, n):
        await _answer(writer, b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecret")

    async with serving(handler, tls=server_tls) as (_server, url, client):
        with pytest.raises(UpstreamUnreachableError, match="CERTIFICATE_VERIFY_FAILED"):
            await client.post(url, {}, b"", QUICK)  # an untrusted certificate is refused
        trusting = Caller(egress=Egress(ca_bundle=str(cert)))  # the provider's `ca_bundle` policy key
        response = await client.post(url, {}, b"", QUICK, caller=trusting)
        assert await response.read() == b"secret"


async def test_connections_per_origin_are_capped_and_calls_wait_their_turn(monkeypatch):
    monkeypatch.setattr("sdk.providers.http1._MAX_PER_ORIGIN", 2)

    async def handler(reader, writer, n):
        await asyncio.sleep(0.1)
        await _answer(writer, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    async def call(client: Http1Upstream, url: str) -> bytes:
        return await (await client.post(url, {}, b"", QUICK)).read()

    async with serving(handler) as (server, url, client):
        assert await asyncio.gather(*(call(client, url) for _ in range(5))) == [b"ok"] * 5
        assert server.connections == 2  # the other three waited and reused a released connection
        outcomes = await asyncio.gather(*(client.post(url, {}, b"", Timeouts(connect_s=0.05)) for _ in range(3)),
                                        return_exceptions=True)
        waited_too_long = [o for o in outcomes if isinstance(o, UpstreamUnreachableError)]
        assert len(waited_too_long) == 1 and "no connection within" in str(waited_too_long[0])
        for outcome in outcomes:
            if not isinstance(outcome, Exception):
                outcome.abort()


@contextlib.contextmanager
def stdlib_server(http11: bool, one_send: bool = False):
    """Python's own http.server with its defaults: head and body in two sends, Nagle left on
    (`one_send`: head and body in one, which no delayed ACK can hold: the baseline to compare with)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1" if http11 else "HTTP/1.0"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            if one_send:
                self.wfile.write(f"{self.protocol_version} 200 OK\r\ncontent-length: 2\r\n\r\n{{}}".encode())
                return
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def test_an_answer_in_two_sends_is_not_held_by_a_delayed_ack():
    # Without an immediate ACK the body waits ~40 ms for the head's ACK on every kept-alive call.
    # Compared with the same answer in one send, alternating calls, so machine load weighs on both
    # alike: a delayed ACK is a fixed ~40 ms more per call, whatever the load.
    client = Http1Upstream()
    loop = asyncio.get_running_loop()
    with stdlib_server(http11=True) as two_sends, stdlib_server(http11=True, one_send=True) as one_send:
        took: dict[str, list[float]] = {two_sends: [], one_send: []}
        for _ in range(12):
            for url in took:
                started = loop.time()
                assert await (await client.post(url + "/v1/x", {}, b"{}", QUICK)).read() == b"{}"
                took[url].append(loop.time() - started)
        await client.aclose()
    held = median(took[two_sends]) - median(took[one_send])
    assert held < 0.020, f"the second send waited {held * 1000:.0f} ms more than one send"


async def test_an_upstream_that_closes_after_each_answer_gets_a_spare_connection():
    client = Http1Upstream()
    with stdlib_server(http11=False) as url:
        for _ in range(3):
            assert await (await client.post(url + "/v1/x", {}, b"{}", QUICK)).read() == b"{}"
            for _ in range(200):  # the spare is opened in the background
                pool = next(iter(client._origins.values()))
                if pool.idle:
                    break
                await asyncio.sleep(0.005)
            assert len(pool.idle) == 1 and pool.closes
        await client.aclose()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close as a server does that closes a connection with a request unread in its buffer: a reset."""
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def test_a_request_that_meets_a_closing_keep_alive_connection_is_sent_again():
    # The race with a server's idle timeout, made to happen every time: a connection that has
    # answered once is closed, unanswered, when the next request arrives on it.
    answered, dropped = [], []

    async def handler(reader, writer, n):
        if getattr(writer, "answered", False):
            dropped.append(n)
            _reset(writer)
            return
        writer.answered = True
        answered.append(n)
        await _answer(writer, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    async with serving(handler) as (_server, url, client):
        for i in range(30):
            response = await client.post(url, {}, b'{"n": %d}' % i, QUICK)
            assert await response.read() == b"ok"  # none lost
        assert len(answered) == 30 and len(dropped) == 29  # every reuse met a closing connection


async def test_only_a_replayable_request_on_a_reused_connection_is_sent_again():
    async def drop_all(reader, writer, n):
        writer.transport.abort()

    async with serving(drop_all) as (server, url, client):
        with pytest.raises(UpstreamUnreachableError, match="before the answer was complete"):
            await client.post(url, {}, b"{}", QUICK)  # a fresh connection: the server may have seen it
        assert len(server.requests) == 1

    async def answer_once(reader, writer, n):
        if n == 1:
            await _answer(writer, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        elif server.reset:
            _reset(writer)
        else:
            writer.close()  # read, then closed cleanly: the server may have acted on it

    async def upload() -> AsyncIterator[bytes]:
        yield b"{}"

    for reset, body in ((True, upload()), (False, b"{}")):
        async with serving(answer_once) as (server, url, client):
            server.reset = reset
            assert await (await client.post(url, {}, b"{}", QUICK)).read() == b"ok"
            with pytest.raises(UpstreamUnreachableError):
                await client.request("POST", url, {}, body, QUICK, length=2)  # not replayable, or read by the server
            assert len(server.requests) == 2


async def test_a_request_the_upstream_never_acknowledged_is_sent_again_then_fails_clearly(monkeypatch):
    # A connection stuck in a full listen backlog looks established to the client, but the server's
    # TCP acknowledges none of what is written on it. Here the first connection is made to look so.
    async def handler(reader, writer, n):
        if server.connections > 1:
            await _answer(writer, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        # the first connection never answers

    real = http1_wire.Connection.unacknowledged
    stuck: set[int] = set()

    def unacknowledged(conn: http1_wire.Connection) -> int | None:
        return 1 << 20 if id(conn) in stuck else real(conn)

    monkeypatch.setattr(http1_wire.Connection, "unacknowledged", unacknowledged)
    opened = http1.Http1Upstream._dial

    async def dial(self: Http1Upstream, destination: object) -> http1_wire.Connection:
        conn = await opened(self, destination)
        if not stuck:
            stuck.add(id(conn))
        return conn

    monkeypatch.setattr(http1.Http1Upstream, "_dial", dial)
    quick_check = Timeouts(connect_s=0.2, first_byte_s=30, read_s=2)
    async with serving(handler) as (server, url, client):
        assert await (await client.post(url, {}, b"{}", quick_check)).read() == b"ok"
        assert server.connections == 2
        [conn] = next(iter(client._origins.values())).idle
        if sys.platform == "linux":
            assert real(conn) == 0  # a request the server read has been acknowledged

    async def never(reader, writer, n):
        pass

    monkeypatch.setattr(http1_wire.Connection, "unacknowledged", lambda conn: 1 << 20)  # no connection gets through
    async with serving(never) as (server, url, client):
        with pytest.raises(UpstreamUnreachableError, match="did not take the request"):
            await client.post(url, {}, b"{}", quick_check)
        assert server.connections == 2  # sent once more, not again and again


async def test_a_team_holds_at_most_its_share_of_an_origin(monkeypatch):
    monkeypatch.setattr(http1, "_MAX_PER_ORIGIN", 3)
    release = asyncio.Event()

    async def handler(reader, writer, n):
        if b"x-team: a" in server.requests[n - 1]:
            await release.wait()  # team A's calls are slow streams
        await _answer(writer, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    team_a, team_b = Caller(team="a", connections=2), Caller(team="b")

    async def call(caller: Caller, timeout: Timeouts = QUICK) -> bytes:
        return await (await client.post(url, {"x-team": caller.team or ""}, b"{}", timeout, caller=caller)).read()

    async with serving(handler) as (server, url, client):
        slow = [asyncio.create_task(call(team_a, Timeouts(connect_s=30, first_byte_s=30))) for _ in range(4)]
        while len(server.requests) < 2:
            await asyncio.sleep(0.01)
        assert await call(team_b) == b"ok"  # A's four calls left B a connection of the three
        assert len(server.requests) == 3 and server.connections == 3  # A holds two; its others wait their turn
        release.set()
        assert await asyncio.gather(*slow) == [b"ok"] * 4
        assert server.connections == 3  # A's waiting calls reused its two connections
