"""The proxy's request path as raw ASGI: HTTP in, pipeline, HTTP out.

Mounted into the Litestar app as ASGI handlers so that the hot path pays for no framework layers it
does not use, and so that it controls disconnects itself: a watcher task waits for
`http.disconnect` and cancels the request's task, which closes the upstream call at once whether
the answer is still pending or streaming.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.refusals import auth_failure, client_address
from sdk.errors import AuthenticationError, RequestTooLargeError, SlipstreamError, UpstreamHTTPError, credentials_refused
from sdk.pipeline import REQUEST_ID_HEADER, RequestContext, new_request_id
from sdk.requests import FORWARDED_HEADERS, parse_off_loop
from sdk.runtime import TeamRegistry, TeamRuntime, slipstream_headers, upstream_error_headers
from sdk.types import Endpoint, LLMStream, Protocol, Timings
from sdk.unexpected import unexpected_error

log = logging.getLogger("slipstream.proxy")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_FORWARDED = tuple(name.encode() for name in FORWARDED_HEADERS)
_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


class ClientGone(Exception):
    """The client closed the connection; nothing is left to answer."""


def team_key(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The team key from `x-api-key` or `Authorization: Bearer`. An empty value is no key (it must
    not hide a valid one in the other header); two different keys are refused, never one picked."""
    found: str | None = None
    for name, value in headers:
        if name == b"x-api-key":
            key = value.decode("latin-1").strip()
        elif name == b"authorization" and value[:7].lower() == b"bearer ":
            key = value[7:].decode("latin-1").strip()
        else:
            continue
        if key and found is not None and key != found:
            raise AuthenticationError("two different team keys in one request: send one key, in one header")
        found = key or found
    return found


def authenticate(registry: TeamRegistry, scope: Scope) -> tuple[TeamRuntime, str]:
    """The caller's team and key id. A missing, unknown or doubled key is counted and logged
    (rate-limited per client address: gateway/refusals.py) before it is refused."""
    try:
        key = team_key(scope["headers"])
    except AuthenticationError:
        auth_failure("team", "two_keys", client_address(scope), scope["path"])
        raise
    try:
        return registry.authenticate(key)
    except AuthenticationError:
        auth_failure("team", "invalid" if key else "missing", client_address(scope), scope["path"])
        raise


async def _read_body(receive: Receive, headers: list[tuple[bytes, bytes]], limit: int) -> bytes:
    for name, value in headers:
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            raise RequestTooLargeError(f"request body of {int(value)} bytes is over this team's limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise RequestTooLargeError(f"request body is over this team's limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def send_error(send: Send, protocol: Protocol, status: int, body: bytes, extra: dict[str, str] | None = None) -> None:
    headers = list(_JSON)
    for name, value in (extra or {}).items():
        headers.append((name.encode(), value.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _for_team(ctx: RequestContext, exc: UpstreamHTTPError, protocol: Protocol) -> tuple[bytes, dict[str, str]]:
    """An upstream error as a team's client may see it. A 401/403 means the provider refused the
    gateway's own key; its body can echo that key (masked or not), so the gateway answers instead."""
    headers = upstream_error_headers(ctx, exc)
    if exc.status not in (401, 403):
        return exc.body, headers
    body = credentials_refused(protocol, exc.status, exc.route.split("/", 1)[0])
    return body, {k: v for k, v in headers.items() if k.startswith("x-slipstream-")}


async def watch_disconnect(receive: Receive, task: asyncio.Task[Any]) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            task.cancel("client disconnected")
            return


def make_handler(registry: TeamRegistry, endpoint: Endpoint) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    protocol = endpoint.protocol

    async def handle(scope: Scope, receive: Receive, send: Send) -> None:
        timings = Timings()
        headers = scope["headers"]
        team_name: str | None = None
        request_id = new_request_id()  # named by every answer, refusals before the pipeline included
        named = {REQUEST_ID_HEADER: request_id}
        try:
            team, key_id = authenticate(registry, scope)
            team_name = team.team
            if scope["method"] != "POST":
                raise SlipstreamError(f"{scope['method']} is not allowed on {scope['path']}: use POST", status=405)
            raw = await _read_body(receive, headers, team.policy.limits.max_body_bytes)
            forward = {name.decode(): value.decode("latin-1") for name, value in headers if name in _FORWARDED}
            request = await parse_off_loop(endpoint, raw, scope.get("query_string", b"").decode("latin-1"), forward)
        except SlipstreamError as exc:
            await send_error(send, protocol, exc.status, exc.body(protocol), {**exc.headers, **named})
            return
        except ClientGone:
            return
        except Exception as exc:  # a bug of ours: answered and logged, never a dropped connection
            error = unexpected_error(exc, team_name, request_id)
            await send_error(send, protocol, error.status, error.body(protocol), {**error.headers, **named})
            return
        ctx = RequestContext(request=request, team=team.team, timings=timings, key_id=key_id, request_id=request_id)
        task = asyncio.current_task()
        assert task is not None
        watcher = asyncio.get_running_loop().create_task(watch_disconnect(receive, task))
        stream: LLMStream | None = None
        started = False  # response headers sent: from here an error can only end the body
        try:
            answer, _ = await team.handle(request, ctx)
            extra = slipstream_headers(ctx, answer)
            if isinstance(answer, LLMStream):
                response_headers = [*_SSE]
            else:
                response_headers = [*_JSON, (b"content-length", str(len(answer.body)).encode())]
            response_headers += [(k.encode(), v.encode("latin-1")) for k, v in answer.headers.items()]
            response_headers += [(k.encode(), v.encode("latin-1")) for k, v in extra.items()]
            if isinstance(answer, LLMStream):
                stream = answer
            await send({"type": "http.response.start", "status": answer.status, "headers": response_headers})
            started = True
            if not isinstance(answer, LLMStream):
                await send({"type": "http.response.body", "body": answer.body})
                return
            async for event in answer.events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        except asyncio.CancelledError:
            if watcher.done() and not watcher.cancelled():
                task.uncancel()  # the client left: a normal end, not an error of ours
                log.debug("client disconnected; upstream call cancelled")
                return
            raise
        except UpstreamHTTPError as exc:
            await send_error(send, protocol, exc.status, *_for_team(ctx, exc, protocol))
        except Exception as exc:
            error = exc if isinstance(exc, SlipstreamError) else unexpected_error(exc, team_name, ctx.request_id)
            if not started:
                await send_error(send, protocol, error.status, error.body(protocol), {**error.headers, **named})
            elif stream is not None:
                await send({"type": "http.response.body", "body": error.sse_event(protocol), "more_body": False})
        finally:
            watcher.cancel()
            if stream is not None:
                await stream.aclose()

    return handle
