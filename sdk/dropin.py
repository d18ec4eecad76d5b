"""The drop-in SDK: the official `openai` / `anthropic` clients, with the pipeline in process.

`OpenAI(...)` and friends return the official client objects, unchanged, except that their HTTP
client's transport answers every request by running the team's pipeline here instead of sending it
to a server. Everything above the transport (typed results, streaming helpers, `with_raw_response`,
retries, error classes) is the official SDK's own code.

One async function, `_answer`, maps an httpx2 request to an `LLMRequest` and the pipeline's answer
back to status, headers and body; it mirrors the proxy's door (gateway/proxy.py). The async
transport awaits it on the caller's loop. The sync transport runs it on one background loop thread
per process (the upstream connection pool is per loop, so it lives there) and streams events back
through a bounded buffer.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import queue
import re
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx2

from sdk import tracing
from sdk.errors import (
    NotFoundError,
    RequestTooLargeError,
    SlipstreamError,
    UpstreamHTTPError,
)
from sdk.models import model_body, models_body
from sdk.passthrough import Door, family, forward
from sdk.pipeline import REQUEST_ID_HEADER, RequestContext, new_request_id
from sdk.policy import Policy, ProviderConfig, RetryPolicy, Route, Target, load_policy
from sdk.providers.upstream import (
    close_upstream_for_running_loop,
    release_upstream,
    retain_upstream,
)
from sdk.requests import FORWARDED_HEADERS, parse_off_loop
from sdk.runtime import TeamRuntime, slipstream_headers, upstream_error_headers
from sdk.services import Services
from sdk.tracing import Parent
from sdk.types import Endpoint, LLMStream, Protocol, Timings, Usage
from sdk.unexpected import unexpected_error

if TYPE_CHECKING:  # each constructor imports its official package: an OpenAI-only program never loads anthropic
    import anthropic
    import openai

__all__ = ["Anthropic", "AsyncAnthropic", "AsyncOpenAI", "OpenAI"]

# The official client only ever talks to this origin; `.invalid` can never resolve (RFC 2606),
# so nothing can leak to the network if a request ever bypassed the transport.
_ORIGIN = "http://slipstream.invalid"
_BASE_URL = {Protocol.OPENAI: _ORIGIN + "/v1", Protocol.ANTHROPIC: _ORIGIN}
# The official client insists on a key; with a policy the real upstream keys come from the policy.
_PLACEHOLDER_KEY = "slipstream-in-process"
_ENV = {  # (api key, base url) variables the official client would read in pass-through mode
    Protocol.OPENAI: ("OPENAI_API_KEY", "OPENAI_BASE_URL"),
    Protocol.ANTHROPIC: ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"),
}
_ENDPOINTS = {
    "/v1/chat/completions": Endpoint.CHAT_COMPLETIONS,
    "/v1/messages": Endpoint.MESSAGES,
    "/v1/messages/count_tokens": Endpoint.COUNT_TOKENS,
    "/v1/embeddings": Endpoint.EMBEDDINGS,
    "/v1/responses": Endpoint.RESPONSES,
    "/v1/responses/input_tokens": Endpoint.RESPONSES_INPUT_TOKENS,
    "/v1/responses/compact": Endpoint.RESPONSES_COMPACT,
}
_STORED = re.compile(r"/v1/responses/([^/]+)(/input_items)?")  # a stored response: GET, DELETE, input_items
_JSON = {"content-type": "application/json"}
_SSE = {"content-type": "text/event-stream", "cache-control": "no-cache"}


# --- configuration -------------------------------------------------------------------------------


def _runtime(protocol: Protocol, policy: str | os.PathLike[str] | Policy | None, kwargs: dict[str, Any],
             state_url: str | None = None) -> TeamRuntime:
    """Build the client's team runtime and rewrite `kwargs` for the official constructor."""
    if kwargs.get("http_client") is not None:
        raise TypeError("http_client cannot be given: Slipstream supplies the client's HTTP client (its transport runs the pipeline)")
    policy = policy if policy is not None else os.environ.get("SLIPSTREAM_POLICY") or None
    base_url = kwargs.pop("base_url", None)
    if policy is None:
        key_env, url_env = _ENV[protocol]
        api_key = kwargs.get("api_key") or os.environ.get(key_env)
        url = base_url or os.environ.get(url_env)
        resolved = _passthrough(protocol, str(url) if url else None, api_key)
    else:
        # base_url is not used: the policy names the upstreams.
        resolved = policy if isinstance(policy, Policy) else load_policy(policy)
        if kwargs.get("api_key") is None:
            kwargs["api_key"] = _PLACEHOLDER_KEY
    kwargs["base_url"] = _BASE_URL[protocol]
    # state_url (else $SLIPSTREAM_STATE_URL): limits, budgets and breakers shared with proxies and other apps
    return TeamRuntime.build(resolved, Services(state_url=state_url))


def _passthrough(protocol: Protocol, base_url: str | None, api_key: str | None) -> Policy:
    """No policy: one provider of the client's kind with its base_url and key, routing every model.

    One attempt per call, so retries stay the official client's own (its `max_retries`), as before
    the migration.
    """
    name = protocol.value
    return Policy(
        team="default",
        providers={name: ProviderConfig(kind="anthropic" if protocol is Protocol.ANTHROPIC else "openai", base_url=base_url, api_key=api_key or None)},
        routes=[Route(targets=[Target(provider=name)])],
        retry=RetryPolicy(max_attempts=1),
    )


def OpenAI(*, policy: str | os.PathLike[str] | Policy | None = None, state_url: str | None = None, **kwargs: Any) -> openai.OpenAI:
    """`openai.OpenAI(**kwargs)` running Slipstream in process; `policy` or $SLIPSTREAM_POLICY names the team's policy."""
    team = _runtime(Protocol.OPENAI, policy, kwargs, state_url)
    import openai

    return openai.OpenAI(**kwargs, http_client=httpx2.Client(transport=SyncTransport(team, Protocol.OPENAI)))


def AsyncOpenAI(*, policy: str | os.PathLike[str] | Policy | None = None, state_url: str | None = None, **kwargs: Any) -> openai.AsyncOpenAI:
    """`openai.AsyncOpenAI(**kwargs)` running Slipstream on the caller's event loop."""
    team = _runtime(Protocol.OPENAI, policy, kwargs, state_url)
    import openai

    return openai.AsyncOpenAI(**kwargs, http_client=httpx2.AsyncClient(transport=AsyncTransport(team, Protocol.OPENAI)))


def Anthropic(*, policy: str | os.PathLike[str] | Policy | None = None, state_url: str | None = None, **kwargs: Any) -> anthropic.Anthropic:
    """`anthropic.Anthropic(**kwargs)` running Slipstream in process; `policy` or $SLIPSTREAM_POLICY names the team's policy."""
    team = _runtime(Protocol.ANTHROPIC, policy, kwargs, state_url)
    import anthropic

    return anthropic.Anthropic(**kwargs, http_client=httpx2.Client(transport=SyncTransport(team, Protocol.ANTHROPIC)))


def AsyncAnthropic(*, policy: str | os.PathLike[str] | Policy | None = None, state_url: str | None = None, **kwargs: Any) -> anthropic.AsyncAnthropic:
    """`anthropic.AsyncAnthropic(**kwargs)` running Slipstream on the caller's event loop."""
    team = _runtime(Protocol.ANTHROPIC, policy, kwargs, state_url)
    import anthropic

    return anthropic.AsyncAnthropic(**kwargs, http_client=httpx2.AsyncClient(transport=AsyncTransport(team, Protocol.ANTHROPIC)))


# --- the shared mapping: httpx2 request -> pipeline -> status, headers, body ----------------------


@dataclass(slots=True)
class _Reply:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    stream: LLMStream | None = None

    def response(self, stream: httpx2.SyncByteStream | httpx2.AsyncByteStream | None = None) -> httpx2.Response:
        # Every answer names a request id, as the proxy's do; pipeline answers carry their own.
        headers = self.headers if REQUEST_ID_HEADER in self.headers else {**self.headers, REQUEST_ID_HEADER: new_request_id()}
        if stream is None:
            return httpx2.Response(self.status, headers=headers, content=self.body)
        return httpx2.Response(self.status, headers=headers, stream=stream)


def _error(status: int, body: bytes, headers: dict[str, str] | None = None) -> _Reply:
    return _Reply(status, {**_JSON, **(headers or {})}, body)


async def _answer(team: TeamRuntime, protocol: Protocol, request: httpx2.Request, raw: bytes,
                  caller: Parent | None = None) -> _Reply:
    """Run one request through the team's pipeline; every failure becomes a provider-shaped answer.
    `caller`: the application's current span (traced requests go under it), read on its own thread."""
    timings = Timings()
    path, method = request.url.path, request.method
    if path == "/v1/models" or path.startswith("/v1/models/"):
        return await _models(team, protocol, method, path, request.url.params)
    if family(path) is not None:
        return await _passed(team, protocol, request, raw, caller)
    endpoint = _ENDPOINTS.get(path)
    stored = _STORED.fullmatch(path) if endpoint is None and protocol is Protocol.OPENAI else None
    if stored is not None and method in ("GET", "DELETE"):
        return await _stored(team, method, stored.group(1), stored.group(2) is not None, request.url.query.decode("latin-1"))
    if endpoint is None or endpoint.protocol is not protocol:
        return _error(404, NotFoundError(f"{method} {path} is not an endpoint Slipstream serves").body(protocol))
    if method != "POST":
        return _error(405, SlipstreamError(f"{method} is not allowed on {path}: use POST", status=405).body(protocol))
    # The client's read timeout bounds the wait for an answer, as it would on the wire; raised as
    # httpx2's own exception, the official client turns it into APITimeoutError (and retries).
    deadline = asyncio.timeout((request.extensions.get("timeout") or {}).get("read"))
    request_id = new_request_id()  # the access log's, and every answer's, refusals before the pipeline included
    named = {REQUEST_ID_HEADER: request_id}
    try:
        limit = team.policy.limits.max_body_bytes
        if len(raw) > limit:
            raise RequestTooLargeError(f"request body of {len(raw)} bytes is over this team's limit of {limit} bytes")
        forward = {name: value for name in FORWARDED_HEADERS if (value := request.headers.get(name)) is not None}
        llm_request = await parse_off_loop(endpoint, raw, request.url.query.decode("latin-1"), forward)
        ctx = RequestContext(request=llm_request, team=team.team, timings=timings, parent=caller, request_id=request_id)
        async with deadline:
            answer, _ = await team.handle(llm_request, ctx)
    except TimeoutError:
        if deadline.expired():
            raise httpx2.ReadTimeout("Slipstream got no answer within the client's timeout", request=request) from None
        raise
    except UpstreamHTTPError as exc:
        return _error(exc.status, exc.body, upstream_error_headers(ctx, exc))
    except SlipstreamError as exc:
        return _error(exc.status, exc.body(protocol), {**exc.headers, **named})
    except Exception as exc:  # a bug of ours still answers in the provider's shape (sdk/unexpected.py)
        error = unexpected_error(exc, team.team, request_id)
        return _error(error.status, error.body(protocol), {**error.headers, **named})
    headers = {**(_SSE if isinstance(answer, LLMStream) else _JSON), **answer.headers, **slipstream_headers(ctx, answer)}
    if isinstance(answer, LLMStream):
        return _Reply(answer.status, headers, stream=answer)
    return _Reply(answer.status, headers, answer.body)


async def _models(team: TeamRuntime, protocol: Protocol, method: str, path: str, params: Mapping[str, str]) -> _Reply:
    """`GET /v1/models` and `GET /v1/models/{id}`, as the proxy answers them."""
    if method != "GET":
        return _error(405, SlipstreamError(f"{method} is not allowed on {path}: use GET", status=405).body(protocol))
    try:
        if path == "/v1/models":
            return _Reply(200, dict(_JSON), models_body(await team.models.models(), protocol, dict(params)))
        return _Reply(200, dict(_JSON), model_body(await team.models.model(path.removeprefix("/v1/models/")), protocol))
    except SlipstreamError as exc:
        return _error(exc.status, exc.body(protocol), exc.headers)


async def _stored(team: TeamRuntime, method: str, response_id: str, items: bool, query: str) -> _Reply:
    """GET / DELETE of a stored response, or its input items (sdk/responses/api.py)."""
    try:
        if items:
            if method != "GET":
                return _error(405, SlipstreamError("use GET", status=405).body(Protocol.OPENAI))
            answer = await team.responses.input_items(response_id, query)
        elif method == "GET":
            answer = await team.responses.retrieve(response_id, query)
        else:
            answer = await team.responses.delete(response_id)
    except UpstreamHTTPError as exc:
        return _error(exc.status, exc.body, exc.headers)
    except SlipstreamError as exc:
        return _error(exc.status, exc.body(Protocol.OPENAI), exc.headers)
    return _Reply(answer.status, {**_JSON, **answer.headers}, answer.body)


async def _passed(team: TeamRuntime, protocol: Protocol, request: httpx2.Request, raw: bytes, caller: Parent | None) -> _Reply:
    """A pass-through endpoint (sdk/passthrough/); the answer's body streams back as it arrives."""
    raw_path = request.url.raw_path.decode("ascii").partition("?")[0]
    try:
        passed = await forward(team, request.method, raw_path, request.url.query.decode("latin-1"), dict(request.headers),
                               raw, len(raw), Door(_ORIGIN, caller=caller))
    except SlipstreamError as exc:
        return _error(exc.status, exc.body(protocol), exc.headers)

    async def close() -> None:
        passed.abort()

    route = dict(passed.headers).get("x-slipstream-route", "")
    stream = LLMStream(passed.status, passed.body(), {}, Usage(), route, close)
    return _Reply(passed.status, dict(passed.headers), stream=stream)


async def _events(stream: LLMStream, protocol: Protocol) -> AsyncGenerator[bytes, None]:
    """The stream's SSE events; a failure mid-stream ends it with an error event (as the proxy does).

    Closing this iterator early (or cancelling the task reading it) closes the LLMStream, which
    drops the upstream connection: that is the cancel the provider sees.
    """
    try:
        async for event in stream.events:
            yield event
    except SlipstreamError as exc:
        yield exc.sse_event(protocol)
    except Exception as exc:
        yield unexpected_error(exc, None).sse_event(protocol)
    finally:
        await stream.aclose()


# --- async transport: the caller's own loop --------------------------------------------------------


class _AsyncEvents(httpx2.AsyncByteStream):
    def __init__(self, stream: LLMStream, protocol: Protocol):
        self._stream = stream
        self._events = _events(stream, protocol)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._events

    async def aclose(self) -> None:
        await self._events.aclose()
        await self._stream.aclose()  # also when iteration never started (aclose on a fresh generator skips its finally)


class AsyncTransport(httpx2.AsyncBaseTransport):
    """Answers an `httpx2.AsyncClient`'s requests by awaiting the pipeline on the caller's loop."""

    def __init__(self, team: TeamRuntime, protocol: Protocol):
        self.team = team
        self.protocol = protocol
        self._retained = False  # holds the caller loop's upstream pool open until aclose()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if not self._retained:
            retain_upstream()
            self._retained = True
        reply = await _answer(self.team, self.protocol, request, await request.aread(), tracing.caller_parent())
        return reply.response(_AsyncEvents(reply.stream, self.protocol) if reply.stream else None)

    async def aclose(self) -> None:
        """`await client.close()` / leaving `async with client`: the last client on a loop closes its pool."""
        if self._retained:
            self._retained = False
            await release_upstream()


# --- sync transport: one background loop thread per process ----------------------------------------


class _LoopThread:
    """A daemon thread running an event loop, started on first use (and again after a fork)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=loop.run_forever, name="slipstream-sdk-loop", daemon=True)
                self._thread.start()
                self._loop, self._pid = loop, os.getpid()
                atexit.register(self._close_pool, loop)
            if threading.current_thread() is self._thread:
                # Blocking this thread on itself would deadlock (a sync client called from inside the pipeline).
                raise RuntimeError("a synchronous Slipstream client cannot be called from Slipstream's own loop thread")
            return self._loop

    @staticmethod
    def _close_pool(loop: asyncio.AbstractEventLoop) -> None:
        # Close the keep-alive pool at exit, so no connection outlives the interpreter unclosed.
        if loop.is_running():
            with contextlib.suppress(Exception):  # at exit, a pool that cannot close has nothing left to lose
                asyncio.run_coroutine_threadsafe(close_upstream_for_running_loop(), loop).result(timeout=1)


_LOOP = _LoopThread()
_END = object()
_BUFFER_EVENTS = 64  # events read ahead of a slow consumer before the upstream read pauses
_CLOSE_WAIT_S = 1.0  # bound on how long close() waits for the upstream to be dropped


class _SyncEvents(httpx2.SyncByteStream):
    """Events pumped from the loop thread into a bounded buffer for a consumer on another thread.

    The buffer is a SimpleQueue bounded by credits: the pump takes a credit before reading each
    event, and the consumer returns one per event taken, so a slow consumer stops the upstream read
    (and the loop is never blocked by a full queue).
    """

    def __init__(self, stream: LLMStream, protocol: Protocol, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._credits = asyncio.Semaphore(_BUFFER_EVENTS)
        self._done = threading.Event()
        self._reading = True  # loop-thread only: a cancel must not interrupt the cleanup in _pump's finally
        self._task = loop.create_task(self._pump(_events(stream, protocol), stream))  # runs on the loop thread

    async def _pump(self, events: AsyncGenerator[bytes, None], stream: LLMStream) -> None:
        try:
            while True:
                await self._credits.acquire()
                try:
                    event = await anext(events)
                except StopAsyncIteration:
                    break
                self._queue.put(event)
            self._queue.put(_END)
        except asyncio.CancelledError:
            self._queue.put(_END)  # closed by the consumer
        except Exception as exc:  # an unexpected failure reaches the consumer, not the loop's log
            self._queue.put(exc)
        finally:
            self._reading = False
            try:
                await events.aclose()
                await stream.aclose()  # also when the consumer closed before the first event was read
            finally:
                self._done.set()

    def __iter__(self) -> Iterator[bytes]:
        while True:
            item = self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            self._loop.call_soon_threadsafe(self._credits.release)
            yield item  # type: ignore[misc]

    def _cancel(self) -> bool:
        """Ask the loop thread to stop the pump; False when the loop is gone (interpreter exit)."""
        try:
            self._loop.call_soon_threadsafe(lambda: self._reading and self._task.cancel())
        except RuntimeError:
            return False
        return True

    def close(self) -> None:
        if not self._done.is_set() and self._cancel():
            self._done.wait(_CLOSE_WAIT_S)  # return once the upstream connection is dropped

    def __del__(self) -> None:
        # Safety net for a response dropped unclosed: cancel, without waiting in a finalizer.
        if not self._done.is_set():
            self._cancel()


class SyncTransport(httpx2.BaseTransport):
    """Answers an `httpx2.Client`'s requests by running the pipeline on the background loop thread."""

    def __init__(self, team: TeamRuntime, protocol: Protocol):
        self.team = team
        self.protocol = protocol

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        loop = _LOOP.get()
        caller = tracing.caller_parent()  # the pipeline runs on the loop thread: read the caller's span here
        future = asyncio.run_coroutine_threadsafe(self._start(request, request.read(), loop, caller), loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. KeyboardInterrupt while waiting: cancel the pipeline, not just the wait
            raise

    async def _start(self, request: httpx2.Request, raw: bytes, loop: asyncio.AbstractEventLoop,
                     caller: Parent | None) -> httpx2.Response:
        reply = await _answer(self.team, self.protocol, request, raw, caller)
        return reply.response(_SyncEvents(reply.stream, self.protocol, loop) if reply.stream else None)
