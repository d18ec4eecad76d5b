"""The drop-in SDK: the official `openai` / `anthropic` clients, with the pipeline in process.

`OpenAI(...)` and friends return the official client objects, unchanged, except that their HTTP
client's transport answers every request by running the team's pipeline here instead of sending it
to a server. Everything above the transport (typed results, streaming helpers, `with_raw_response`,
retries, error classes) is the official SDK's own code.

The transport is a thin adapter around the door core (sdk/door/), the same core the proxy's ASGI
handlers call: `_answer` hands it the httpx2 request's bytes and turns its `Reply` into an httpx2
response, so the two doors answer alike by construction. The async transport awaits it on the
caller's loop. The sync transport runs it on one background loop thread per process (the upstream
connection pool is per loop, so it lives there) and streams events back through a bounded buffer.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import os
import queue
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

import httpx2

from sdk.door import Door, OneTeam, Reply, too_large
from sdk.observability import tracing
from sdk.observability.tracing import Parent
from sdk.policy import Policy, ProviderConfig, RetryPolicy, Route, Target, load_policy
from sdk.providers.upstream import (
    close_upstream_for_running_loop,
    release_upstream,
    retain_upstream,
)
from sdk.runtime import TeamRuntime
from sdk.services import Services
from sdk.types import Protocol

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
    the migration. Its team is its upstream and key (`default-` and a digest of them, never the key):
    what a team leaves in the data directory every client of the process, and every program of the
    host's user, shares (stored conversations, the ownership of files and batches, spend) is kept by
    team, and a client given another key must not reach what this one stored, as the official client
    with that key could not.
    """
    name = protocol.value
    account = hashlib.sha256("\0".join((name, base_url or "", api_key or "")).encode()).hexdigest()[:16]
    return Policy(
        team=f"default-{account}",
        providers={name: ProviderConfig(kind="anthropic" if protocol is Protocol.ANTHROPIC else "openai", base_url=base_url, api_key=api_key or None)},
        routes=[Route(targets=[Target(provider=name)])],
        retry=RetryPolicy(max_attempts=1),
    )


def OpenAI(*, policy: str | os.PathLike[str] | Policy | None = None, state_url: str | None = None, **kwargs: Any) -> openai.OpenAI:
    """`openai.OpenAI(**kwargs)` running Slipstream in process; `policy` or $SLIPSTREAM_POLICY names the team's policy."""
    team = _runtime(Protocol.OPENAI, policy, kwargs, state_url)
    import openai

    return openai.OpenAI(**kwargs, http_client=httpx2.Client(transport=SyncTransport(team)))


def AsyncOpenAI(*, policy: str | os.PathLike[str] | Policy | None = None, state_url: str | None = None, **kwargs: Any) -> openai.AsyncOpenAI:
    """`openai.AsyncOpenAI(**kwargs)` running Slipstream on the caller's event loop."""
    team = _runtime(Protocol.OPENAI, policy, kwargs, state_url)
    import openai

    return openai.AsyncOpenAI(**kwargs, http_client=httpx2.AsyncClient(transport=AsyncTransport(team)))


def Anthropic(*, policy: str | os.PathLike[str] | Policy | None = None, state_url: str | None = None, **kwargs: Any) -> anthropic.Anthropic:
    """`anthropic.Anthropic(**kwargs)` running Slipstream in process; `policy` or $SLIPSTREAM_POLICY names the team's policy."""
    team = _runtime(Protocol.ANTHROPIC, policy, kwargs, state_url)
    import anthropic

    return anthropic.Anthropic(**kwargs, http_client=httpx2.Client(transport=SyncTransport(team)))


def AsyncAnthropic(*, policy: str | os.PathLike[str] | Policy | None = None, state_url: str | None = None, **kwargs: Any) -> anthropic.AsyncAnthropic:
    """`anthropic.AsyncAnthropic(**kwargs)` running Slipstream on the caller's event loop."""
    team = _runtime(Protocol.ANTHROPIC, policy, kwargs, state_url)
    import anthropic

    return anthropic.AsyncAnthropic(**kwargs, http_client=httpx2.AsyncClient(transport=AsyncTransport(team)))


# --- the adapter: httpx2 request -> door core (sdk/door/) -> httpx2 response ---------------------


class _InProcess:
    """An httpx2 request as the door core reads it (sdk/door/call.py): its body is in hand already."""

    __slots__ = ("_raw", "_request", "caller", "headers", "method", "path", "query")

    def __init__(self, request: httpx2.Request, raw: bytes, caller: Parent | None):
        self._request, self._raw, self.caller = request, raw, caller
        self.method, self.path = request.method, request.url.path
        self.query = request.url.query.decode("latin-1")
        self.headers = [(name.lower(), value) for name, value in request.headers.raw]

    async def read(self, limit: int, need: Callable[[int], None]) -> bytes:
        if len(self._raw) > limit:
            raise too_large(len(self._raw), limit)
        need(len(self._raw))
        return self._raw

    def upload(self) -> tuple[bytes, int]:
        return self._raw, len(self._raw)

    def raw_path(self) -> str:
        return self._request.url.raw_path.decode("ascii").partition("?")[0]

    def origin(self) -> str:
        return _ORIGIN

    def peer(self) -> str:
        return "in-process"


async def _answer(door: Door, request: httpx2.Request, raw: bytes, caller: Parent | None = None) -> Reply:
    """One request through the door core; every failure is a provider-shaped reply.
    `caller`: the application's current span (traced requests go under it), read on its own thread."""
    # The client's read timeout bounds the wait for an answer, as it would on the wire; raised as
    # httpx2's own exception, the official client turns it into APITimeoutError (and retries).
    deadline = asyncio.timeout((request.extensions.get("timeout") or {}).get("read"))
    try:
        async with deadline:
            return await door.answer(_InProcess(request, raw, caller))
    except TimeoutError:
        if deadline.expired():
            raise httpx2.ReadTimeout("Slipstream got no answer within the client's timeout", request=request) from None
        raise


def _response(reply: Reply, stream: httpx2.SyncByteStream | httpx2.AsyncByteStream | None = None) -> httpx2.Response:
    if stream is None:
        return httpx2.Response(reply.status, headers=reply.headers, content=reply.body)
    return httpx2.Response(reply.status, headers=reply.headers, stream=stream)


async def _chunks(reply: Reply) -> AsyncGenerator[bytes, None]:
    """The reply's body as it arrives. A failure mid-body ends a stream with the provider's error
    event, and leaves any other body incomplete, as the proxy does (`Reply.broken`): the reader
    gets httpx2's error for a body cut short, as it would from the proxy over HTTP.

    Closing this iterator early (or cancelling the task reading it) closes the reply, which drops
    the upstream connection: that is the cancel the provider sees.
    """
    assert reply.chunks is not None
    try:
        async for chunk in reply.chunks:
            yield chunk
    except Exception as exc:
        end = reply.broken(exc)
        if end is None:
            raise httpx2.RemoteProtocolError("the answer's body broke off before its end") from exc
        yield end
    finally:
        await _close(reply)


async def _close(reply: Reply) -> None:
    if reply.close is not None:
        await reply.close()


# --- async transport: the caller's own loop --------------------------------------------------------


class _AsyncChunks(httpx2.AsyncByteStream):
    def __init__(self, reply: Reply):
        self._reply = reply
        self._chunks = _chunks(reply)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks

    async def aclose(self) -> None:
        await self._chunks.aclose()
        await _close(self._reply)  # also when iteration never started (aclose on a fresh generator skips its finally)


class AsyncTransport(httpx2.AsyncBaseTransport):
    """Answers an `httpx2.AsyncClient`'s requests through the door core on the caller's loop."""

    def __init__(self, team: TeamRuntime):
        self.door = Door(OneTeam(team))
        self._retained = False  # holds the caller loop's upstream pool open until aclose()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if not self._retained:
            retain_upstream()
            self._retained = True
        reply = await _answer(self.door, request, await request.aread(), tracing.caller_parent())
        return _response(reply, _AsyncChunks(reply) if reply.chunks is not None else None)

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

    def __init__(self, reply: Reply, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._credits = asyncio.Semaphore(_BUFFER_EVENTS)
        self._done = threading.Event()
        self._reading = True  # loop-thread only: a cancel must not interrupt the cleanup in _pump's finally
        self._task = loop.create_task(self._pump(_chunks(reply), reply))  # runs on the loop thread

    async def _pump(self, events: AsyncGenerator[bytes, None], reply: Reply) -> None:
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
                await _close(reply)  # also when the consumer closed before the first event was read
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
    """Answers an `httpx2.Client`'s requests through the door core on the background loop thread."""

    def __init__(self, team: TeamRuntime):
        self.door = Door(OneTeam(team))

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
        reply = await _answer(self.door, request, raw, caller)
        return _response(reply, _SyncEvents(reply, loop) if reply.chunks is not None else None)
