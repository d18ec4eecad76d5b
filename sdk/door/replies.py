"""What the door core hands back: status, headers and body, bytes out; and the error ladder that
turns every failure into one of them.

Both adapters write a `Reply` as it is (the proxy as ASGI messages, the drop-in SDK as an httpx2
response), so an answer has the same status, headers and body whichever door it left by.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

from sdk.door.call import Headers
from sdk.errors import SlipstreamError, UpstreamHTTPError, credentials_refused
from sdk.pipeline import REQUEST_ID_HEADER, RequestContext
from sdk.runtime import upstream_error_headers
from sdk.types import Protocol
from sdk.unexpected import unexpected_error

log = logging.getLogger("slipstream.door")

JSON: Headers = [(b"content-type", b"application/json")]
# x-accel-buffering: a reverse proxy in front (nginx) must pass events on as they come, not buffer them.
SSE: Headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
_REQUEST_ID = REQUEST_ID_HEADER.encode()


@dataclass(slots=True)
class Reply:
    """One answer. A whole body is `body`; a body that arrives in pieces (a pipeline stream's SSE
    events, a pass-through download) is `chunks`, and `close` drops its source, which is how the
    upstream learns of a cancel: every adapter calls it once the body has ended, however it ended."""

    status: int
    headers: Headers
    body: bytes = b""
    chunks: AsyncIterator[bytes] | None = None
    close: Callable[[], Awaitable[None]] | None = None
    stream_of: RequestContext | None = None  # the pipeline request a stream answers

    def broken(self, exc: Exception) -> bytes | None:
        """What ends a body that failed after its headers went out. A pipeline stream ends with the
        provider's error event; any other body (a pass-through download) is left incomplete (None),
        so the client sees a broken transfer, never an error event inside its file."""
        ctx = self.stream_of
        if ctx is None:
            log.warning("an answer failed mid-body (status %s): %s", self.status, exc)
            return None
        return stream_failure(exc, ctx).sse_event(ctx.request.protocol)


def stream_failure(exc: Exception, ctx: RequestContext) -> SlipstreamError:
    """What a client is told of `exc`, raised while its stream was being sent: Slipstream's own error as it
    is, anything else a logged, counted 500 naming the request id (sdk/unexpected.py)."""
    return exc if isinstance(exc, SlipstreamError) else unexpected_error(exc, ctx.team, ctx.request_id)


def encoded(headers: Mapping[str, str]) -> Headers:
    return [(name.encode(), value.encode("latin-1")) for name, value in headers.items()]


def whole(status: int, headers: Headers, body: bytes) -> Reply:
    """A JSON answer read whole: `headers` after the content type and length."""
    return Reply(status, [*JSON, (b"content-length", str(len(body)).encode()), *headers], body)


def named(headers: Headers, request_id: str) -> Headers:
    """`headers` with the request id every answer names (an upstream's own answer carries its own)."""
    if any(name == _REQUEST_ID for name, _ in headers):
        return headers
    return [*headers, (_REQUEST_ID, request_id.encode())]


def refusal(protocol: Protocol, exc: Exception, team: str | None, request_id: str, ctx: RequestContext | None = None) -> Reply:
    """The error ladder: any failure before an answer's first byte, as the client's provider shapes it.

    - A provider's error status passes through with its body and headers, and with the
      x-slipstream-* headers when it answered a pipeline request (`ctx`). But a 401/403 means the
      provider refused the gateway's own key: its body can echo that key and its headers describe
      the gateway's account, so the gateway answers instead, keeping only its own headers.
    - Slipstream's own refusals (`SlipstreamError`) in the client's provider's shape.
    - Anything else is a bug of ours: a logged, counted 500 naming the request id (sdk/unexpected.py).
    """
    if isinstance(exc, UpstreamHTTPError):
        headers = upstream_error_headers(ctx, exc) if ctx is not None else exc.headers
        body = exc.body
        if exc.status in (401, 403):
            body = credentials_refused(protocol, exc.status, exc.route.split("/", 1)[0])
            headers = {name: value for name, value in headers.items() if name.startswith("x-slipstream-")}
        return whole(exc.status, named(encoded(headers), request_id), body)
    error = exc if isinstance(exc, SlipstreamError) else unexpected_error(exc, team, request_id)
    return whole(error.status, named(encoded(error.headers), request_id), error.body(protocol))
