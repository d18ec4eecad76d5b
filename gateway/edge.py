"""Bounded work before the app sees a request: uvicorn's httptools protocol with limits on the head.

uvicorn's httptools protocol has no limit on a request head: httptools hands a header value over in
pieces and joins them with `bytes +=`, so one 64 MiB header costs quadratic copying on the event
loop (seconds for every other connection), and nothing closes a connection that dribbles its
headers. uvicorn's h11 protocol offers `h11_max_incomplete_event_size` (a 400 at the size, not 431)
but still no head timeout, and it is several times slower per request than httptools. So the proxy
keeps httptools and adds, in this subclass, what the head needs:

- `max_header_bytes` for the request line and headers together: counted as bytes arrive while the
  head is incomplete, so at most one read past the limit is parsed, and as parsed for a head that
  came in one read; then 431 and close.
- `max_headers` header fields; then 431 and close.
- `header_timeout_s` from the connection's start (or a kept-alive request's first byte) to the end of
  its head; then 408 and close (a connection that sent nothing is closed without an answer). Idle
  kept-alive connections stay under uvicorn's keep-alive timeout.
- `max_connections` open connections. A new connection past the cap closes the oldest one still
  reading its head, or idle between requests (a slow client holds no place an authenticated request
  could use; a team's places past its share of requests in flight are refused, sdk/door/bodies.py); when none is,
  the new connection is answered 503 and closed. uvicorn's `limit_concurrency` answers 503 only after
  a head is read, so it would not stop slow heads from holding the connections.
- after the app has answered without reading the whole body (401 for a bad key, 413 over a limit),
  at most `drain_bytes` more are read and thrown away (a client that sent a small body still gets
  its answer); a bigger body closes the connection instead of being read.

Refusals are counted in `slipstream_edge_refusals_total{reason}` and logged, rate-limited per client
address (gateway/refusals.py). The limits reach every worker through the pickled uvicorn config
(`EdgeConfig`).
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass
from typing import Any, cast

import orjson
import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from gateway import collector
from gateway.refusals import EDGE_REFUSALS, RateLimitedLog, log
from sdk.offload import share_the_gil
from sdk.pipeline import REQUEST_ID_HEADER, new_request_id

_EDGE_LOG = RateLimitedLog(log)


@dataclass(frozen=True)
class EdgeLimits:
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    header_timeout_s: float = 10.0
    max_connections: int = 4096
    drain_bytes: int = 1024 * 1024


class EdgeConfig(uvicorn.Config):
    """A uvicorn Config that carries the edge limits to `EdgeProtocol` (and, pickled, to each worker).
    With `serving` (`slipstream serve`, not a test's server in a thread), each process settles its
    garbage collector once its app is loaded (gateway/collector.py) and shortens the GIL's switch
    interval (sdk/offload.py)."""

    def __init__(self, app: Any, edge: EdgeLimits, serving: bool = False, **options: Any):
        super().__init__(app, http=EdgeProtocol, **options)
        self.edge = edge
        self.serving = serving

    def load(self) -> None:
        super().load()
        if self.serving:
            collector.settle()
            share_the_gil()


# Per server: the connections still reading a request head, oldest first (the ones a new connection
# past the cap may close).
_HEADS: weakref.WeakKeyDictionary[ServerState, dict[EdgeProtocol, None]] = weakref.WeakKeyDictionary()


def _answer(status: int, message: str) -> bytes:
    # Shaped so both official clients read it: OpenAI's reads error.message, Anthropic's error.type too.
    # Like every answer of the gateway, it names a request id (this one's is its own: no request began).
    body = orjson.dumps({"type": "error", "error": {"type": "request_refused", "message": message}})
    return b"".join([STATUS_LINE[status], b"content-type: application/json\r\ncontent-length: ",
                     str(len(body)).encode(), b"\r\n", REQUEST_ID_HEADER.encode(), b": ", new_request_id().encode(),
                     b"\r\nconnection: close\r\n\r\n", body])


class EdgeProtocol(HttpToolsProtocol):
    def __init__(self, config: uvicorn.Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits = config.edge if isinstance(config, EdgeConfig) else EdgeLimits()
        self.heads = _HEADS.setdefault(server_state, {})
        self.head_timer: asyncio.TimerHandle | None = None  # set while a request head is being read
        self.head_bytes = 0  # read while this head is incomplete (a head that never ends is cut at the limit)
        self.parsed_bytes = 0  # of this head's line and fields as parsed (a head that arrived in one read)
        self.head_started = False  # a byte of this head has arrived (else a refusal closes without an answer)
        self.header_count = 0
        self.drained = 0
        self.refused = False

    # --- the head ---------------------------------------------------------------------------------

    def _arm(self) -> None:
        self.head_bytes = self.parsed_bytes = self.header_count = self.drained = 0
        self.head_started = False
        self.head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timeout)
        self.heads[self] = None

    def _disarm(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None
        self.heads.pop(self, None)

    def _head_timeout(self) -> None:
        self.head_timer = None
        self._refuse(408, "header_timeout", f"request head not received within {self.limits.header_timeout_s:g} s")

    def _refuse(self, status: int, reason: str, message: str, answer_idle: bool = False) -> None:
        """Answer `status` and close; the app never sees this request. A connection that has sent
        nothing of a request is closed without an answer (unless `answer_idle`), as uvicorn closes an
        idle kept-alive one: a client that sends its request on it later must not read our answer as
        the reply to it."""
        if self.refused:
            return
        self.refused = True
        self._disarm()
        EDGE_REFUSALS.labels(reason).inc()
        source = self.client[0] if self.client else "unknown"
        _EDGE_LOG.warning(f"edge:{source}", "connection from %s closed before a request: %s", source, message)
        if not self.transport.is_closing():
            if self.head_started or answer_idle:
                self.transport.write(_answer(status, message))
            self.transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(cast(asyncio.Transport, transport))  # a TCP transport: uvicorn's own annotation
        self._arm()
        if len(self.connections) <= self.limits.max_connections:
            return
        oldest = next((protocol for protocol in self.heads if protocol is not self), None)
        if oldest is not None:
            oldest._refuse(408, "evicted", "closed for a new connection: the proxy is at its connection cap "
                                           "and this one had not sent its request head")
        else:
            self._refuse(503, "connection_cap", f"the proxy is at its cap of {self.limits.max_connections} connections",
                         answer_idle=True)  # a new connection: its client is about to send, and reads this

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.timeout_keep_alive_task is not None and not self.transport.is_closing():
            # Idle until its next head, as one that has sent nothing yet: at the cap it is closed for a new
            # connection (without an answer, as its keep-alive timeout would close it). Not evictable, a
            # team's answered connections its client kept held their places until that timeout, and with
            # its requests in flight took every place from another team's new connection.
            self.heads[self] = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """A request uvicorn cannot parse: the edge's JSON refusal (with its request id), not plain text."""
        self._disarm()
        self.transport.write(_answer(400, msg))
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        super().data_received(data)
        if self.head_timer is not None and not self.refused:  # still inside a head after this read
            self.head_bytes += len(data)
            if self.head_bytes > self.limits.max_header_bytes:
                self._refuse(431, "header_too_large", f"request head over {self.limits.max_header_bytes} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.head_timer is None:  # a kept-alive connection's next request (the first is armed on connect)
            self._arm()
        self.head_started = True

    def on_url(self, url: bytes) -> None:
        self.parsed_bytes += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.refused:
            return
        self.parsed_bytes += len(name) + len(value) + 4  # ": " and CRLF
        self.header_count += 1
        if self.header_count > self.limits.max_headers:
            self._refuse(431, "too_many_headers", f"more than {self.limits.max_headers} header fields")
            return
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self.refused:
            return
        if self.parsed_bytes > self.limits.max_header_bytes:
            self._refuse(431, "header_too_large", f"request head over {self.limits.max_header_bytes} bytes")
            return
        self._disarm()
        super().on_headers_complete()

    # --- the body ---------------------------------------------------------------------------------

    def on_body(self, body: bytes) -> None:
        if self.refused:
            return
        if self.cycle.response_complete:  # answered already: the rest of the body is thrown away
            self.drained += len(body)
            if self.drained > self.limits.drain_bytes and not self.transport.is_closing():
                EDGE_REFUSALS.labels("body_not_read").inc()
                self.transport.close()
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self.refused:
            return
        super().on_message_complete()
