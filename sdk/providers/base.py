"""Provider adapters: send one LLMRequest to one upstream and return its answer.

Both hosted providers speak HTTP + JSON + SSE; they differ only in paths, auth headers and usage
shapes, which a small `Dialect` describes. The adapter never rewrites the body beyond what the
pipeline already decided: unknown fields (cache_control with ttl, betas, ...) pass through untouched.
One exception: a Chat Completions stream that did not ask for its usage is sent with
`stream_options.include_usage`, and the usage chunk (and the `"usage":null` the others then carry)
is taken out before the client sees the stream. Usage is then the provider's count, not an estimate
(sdk/estimate.py), and prompt-cache reads can be verified on such streams too.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from typing import Protocol as TypingProtocol
from urllib.parse import quote

import orjson

from sdk.errors import (
    SlipstreamError,
    UpstreamHTTPError,
    UpstreamTimeoutError,
    UpstreamUnreachableError,
    account_rate_limited,
    credentials_refused,
    naming_provider,
)
from sdk.offload import is_large, off_loop, off_loop_if_large
from sdk.providers.keys import ROTATE_STATUSES, KeyRing
from sdk.providers.upstream import (
    Timeouts,
    UpstreamClient,
    UpstreamResponse,
    upstream_for_running_loop,
)
from sdk.sse import StreamObserver, account_limit_event, may_name_an_account_limit, split_event_batches
from sdk.types import (
    Answer,
    Endpoint,
    LLMRequest,
    LLMResponse,
    LLMStream,
    Protocol,
    Timings,
    Usage,
)
from sdk.usage import usage_from_body

log = logging.getLogger("slipstream.providers")

# Upstream response headers worth handing to the client (ids for support tickets, rate-limit state).
# Anthropic's Priority Tier and fast mode report their capacity's state like the rate limits: the account's.
_RATE_LIMITS = ("anthropic-ratelimit-", "x-ratelimit-", "anthropic-priority-", "anthropic-fast-")
# What names the provider account, which a team is never told (as its requests never name it).
_ACCOUNT = frozenset({"openai-organization", "openai-project", "anthropic-organization-id"})
_MAX_MODEL_PAGES = 20
_NEVER_STREAMED = (Endpoint.COUNT_TOKENS, Endpoint.RESPONSES_INPUT_TOKENS)  # counts answer with JSON, whatever `stream` says
# A stream whose client left after the answer's finish reads on to its usage for at most this long and this
# many bytes (a Chat stream's usage chunk follows its finish chunk at once, a few hundred bytes), then closes.
READ_ON_S = 2.0
READ_ON_BYTES = 64 * 1024
# What `include_usage` adds to a Chat Completions stream, compact (OpenAI's) or spaced.
_NO_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
_USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')
_USAGE_NULL = re.compile(rb',\s*"usage"\s*:\s*null')
_COMPACT_USAGE_NULL = b',"usage":null'
_PASSTHROUGH = {"request-id", "x-request-id", "retry-after", "retry-after-ms", "x-should-retry", "openai-processing-ms"}


def passthrough_headers(headers: dict[str, str], shared_account: bool) -> dict[str, str]:
    return {k: v for k, v in headers.items()
            if (k in _PASSTHROUGH or k.startswith(_RATE_LIMITS)) and not account_header(k, shared_account)}


def account_header(name: str, shared_account: bool) -> bool:
    """Whether an upstream response header is about the provider account, not the request: its name,
    and, on an account other teams share (`shared_account`), its rate-limit state, which every
    team's traffic moves (a team watching it saw the others' request and token volume)."""
    return name in _ACCOUNT or (shared_account and name.startswith(_RATE_LIMITS))


class Provider(TypingProtocol):
    name: str

    @property
    def protocol(self) -> Protocol: ...

    async def send(self, request: LLMRequest, timings: Timings) -> Answer: ...
    async def list_models(self) -> list[dict[str, Any]]: ...  # the upstream's own entries ({"id": ...})


class Dialect(TypingProtocol):
    protocol: Protocol
    models_path: str  # GET: the upstream's own model list

    def path(self, endpoint: Endpoint) -> str: ...
    def auth(self, api_key: str) -> dict[str, str]: ...
    def headers(self, api_key: str, request: LLMRequest) -> dict[str, str]: ...


@dataclass
class HTTPProvider:
    """A hosted provider (or anything speaking its wire format, such as the emulator)."""

    name: str
    dialect: Dialect
    base_url: str
    keys: KeyRing
    timeouts: Timeouts = field(default_factory=Timeouts)
    client: UpstreamClient | None = None  # None: the shared pool of the running loop, for no team in particular
    shared_account: bool = False  # another team's policy has one of these keys (Services.shared_provider_keys)

    @property
    def protocol(self) -> Protocol:
        return self.dialect.protocol

    async def send(self, request: LLMRequest, timings: Timings) -> Answer:
        if request.protocol is not self.protocol:
            raise SlipstreamError(
                f"provider {self.name!r} speaks {self.protocol} and cannot serve a {request.protocol} request "
                "(cross-provider translation is not available yet)",
                status=400,
            )
        route = f"{self.name}/{request.model}"
        client = self.client or upstream_for_running_loop()
        url = self.base_url + self.dialect.path(request.endpoint) + (f"?{request.query}" if request.query else "")
        streamed = request.stream and request.endpoint not in _NEVER_STREAMED
        sent = asking_usage(request) if streamed else None
        fields = request.body if sent is None else sent
        body = await off_loop_if_large(request.size, orjson.dumps, fields)
        try:
            with timings.upstream():
                order = self.keys.order()
                for tried, index in enumerate(order, 1):
                    response = await client.post(url, self.dialect.headers(self.keys.keys[index], request), body, self.timeouts)
                    if response.status >= 400 or not streamed:
                        data = await response.read()
                    if response.status not in ROTATE_STATUSES or len(order) == 1:
                        break
                    self.keys.refused(index, response.status, response.headers, data)
                    if tried < len(order):
                        log.info("%s: key %d answered %d; trying key %d", self.name, index + 1, response.status, order[tried] + 1)
        except (UpstreamUnreachableError, UpstreamTimeoutError) as exc:
            raise naming_provider(exc, self.name) from exc  # the client learns the provider's name, not its URL
        if response.status >= 400:
            raise self._failed(response, data, route)
        if not streamed:
            return LLMResponse(
                status=response.status,
                body=data,
                headers=passthrough_headers(response.headers, self.shared_account),
                # A Responses answer echoes the request's instructions (a team's megabytes): read off the loop when large.
                usage=await off_loop_if_large(len(data), usage_from_body, request.endpoint, data),
                route=route,
            )
        usage = Usage()
        observer = StreamObserver(request.endpoint, usage, timings)
        events = _observed_events(response, observer, route, usage_asked=sent is not None,
                                  shared_account=self.name if self.shared_account else None)

        async def close() -> None:
            if not observer.awaiting_usage:  # else the events read on to it first (_observed_events)
                response.abort()
            await events.aclose()
            response.abort()

        return LLMStream(
            status=response.status,
            events=events,
            headers=passthrough_headers(response.headers, self.shared_account),
            usage=usage,
            route=route,
            close=close,
            finish_reasons=observer.finish_reasons,
        )

    def _failed(self, response: UpstreamResponse, data: bytes, route: str) -> UpstreamHTTPError:
        """The provider's error answer, passed on; but a 401/403 refused the gateway's own key and its
        body may echo that key, so it is replaced, on every endpoint, before any door sees it; and a
        429's message on an account other teams share names the account and their use of it."""
        if response.status in (401, 403):
            data = credentials_refused(self.protocol, response.status, self.name)
        elif response.status == 429 and self.shared_account:
            data = account_rate_limited(self.protocol, data, self.name)
        return UpstreamHTTPError(response.status, data, passthrough_headers(response.headers, self.shared_account), route)

    async def list_models(self) -> list[dict[str, Any]]:
        """The upstream's own model entries, as it sends them, fetched with this provider's key
        (every page of Anthropic's paginated list)."""
        client = self.client or upstream_for_running_loop()
        headers = {"accept": "application/json", **self.dialect.auth(self.keys.keys[self.keys.order()[0]])}
        url = self.base_url + self.dialect.models_path
        entries: list[dict[str, Any]] = []
        query = "?limit=1000" if self.protocol is Protocol.ANTHROPIC else ""
        for _ in range(_MAX_MODEL_PAGES):
            response = await client.request("GET", url + query, headers, b"", self.timeouts)
            data = await response.read()
            if response.status != 200:
                raise self._failed(response, data, f"{self.name}/models")
            page = orjson.loads(data)
            entries.extend(entry for entry in page.get("data", []) if isinstance(entry, dict) and isinstance(entry.get("id"), str))
            if not page.get("has_more") or not page.get("last_id"):
                break
            query = f"?limit=1000&after_id={quote(str(page['last_id']))}"
        return entries

    async def call(self, method: str, path: str, timings: Timings) -> LLMResponse:
        """A plain request under the provider's base URL (GET/DELETE of a stored object), answered whole.

        An error status raises UpstreamHTTPError with the provider's own body, as `send` does.
        """
        route = f"{self.name}/{path}"
        client = self.client or upstream_for_running_loop()
        headers = {"accept": "application/json", **self.dialect.auth(self.keys.keys[self.keys.order()[0]])}
        try:
            with timings.upstream():
                response = await client.request(method, self.base_url + path, headers, b"", self.timeouts)
                data = await response.read()
        except (UpstreamUnreachableError, UpstreamTimeoutError) as exc:
            raise naming_provider(exc, self.name) from exc
        if response.status >= 400:
            raise self._failed(response, data, route)
        return LLMResponse(status=response.status, body=data, headers=passthrough_headers(response.headers, self.shared_account), usage=Usage(), route=route)


async def _next(batches: AsyncIterator[list[bytes]]) -> list[bytes] | None:
    """The next batch of events, or None at the end."""
    async for batch in batches:
        return batch
    return None


class Watched(TypingProtocol):
    """What reads a stream's events for its usage: StreamObserver, a pass-through completion's tally."""

    @property
    def awaiting_usage(self) -> bool: ...

    def observe(self, event: bytes, now: float) -> None: ...


class UsageReads:
    """A stream's event batches, read for `observer`: once the finish has passed and the usage is still to
    come, each read runs in a task the client's leaving does not cancel (asyncio.shield), and `left`, called
    when the client has left, reads on to the usage (`_read_on`) before the caller closes the upstream."""

    def __init__(self, batches: AsyncIterator[list[bytes]], observer: Watched):
        self.batches, self.observer = batches, observer
        self.reading: asyncio.Future[list[bytes] | None] | None = None  # a read after the finish

    async def next(self) -> list[bytes] | None:
        if not self.observer.awaiting_usage:
            return await _next(self.batches)
        self.reading = asyncio.ensure_future(_next(self.batches))
        try:
            batch = await asyncio.shield(self.reading)  # cancelled: the client left, and `left` reads on from it
        except Exception:
            self.reading = None  # the read itself failed: nothing to read on
            raise
        self.reading = None
        return batch

    async def left(self) -> None:
        if self.reading is not None or self.observer.awaiting_usage:  # the client left between the finish and the usage
            await _read_on(self.batches, self.reading, self.observer)


async def _read_on(batches: AsyncIterator[list[bytes]], reading: asyncio.Future[list[bytes] | None] | None,
                   observer: Watched) -> None:
    """Read a stream whose client left after its finish on to its usage, for READ_ON_S and READ_ON_BYTES at
    most, observing what arrives (nobody is sent it): the provider bills the answer whole, reasoning the
    client never saw included, and the usage is how the charge knows it. Whatever stops it, the caller then
    closes the upstream."""
    read = 0
    try:
        async with asyncio.timeout(READ_ON_S):
            while observer.awaiting_usage and read < READ_ON_BYTES:
                batch = await (reading if reading is not None else _next(batches))
                reading = None
                if batch is None:
                    return
                now = time.perf_counter()
                for event in batch:
                    read += len(event)
                    if is_large(len(event)):
                        await off_loop(observer.observe, event, now)
                    else:
                        observer.observe(event, now)
    except (TimeoutError, SlipstreamError, OSError):
        pass  # no usage after all: the charge is estimated, as for any stream without it
    finally:
        if reading is not None:
            reading.cancel()


def asking_usage(request: LLMRequest) -> dict[str, Any] | None:
    """The body of a Chat Completions stream that did not ask for its usage chunk, asking for it;
    None for any other request (and for `stream_options` that is not an object: the upstream's 400)."""
    if request.endpoint is not Endpoint.CHAT_COMPLETIONS:
        return None
    options = request.body.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict) or options.get("include_usage") is True:
        return None
    return {**request.body, "stream_options": {**options, "include_usage": True}}


def without_asked_usage(batch: list[bytes]) -> list[bytes]:
    """`batch` as the client would have had it without `include_usage`: no usage chunk (its
    `choices` is empty: a client reading `choices[0]` of every chunk would fail on it) and no
    `"usage":null` in the others. A JSON string cannot hold an unescaped quote, so these patterns
    cannot match inside generated text."""
    kept = []
    for event in batch:
        if _COMPACT_USAGE_NULL in event:  # a content chunk as OpenAI writes it: most events, no pattern run
            kept.append(event.replace(_COMPACT_USAGE_NULL, b""))
        elif not (_NO_CHOICES.search(event) and _USAGE_OBJECT.search(event)):
            kept.append(_USAGE_NULL.sub(b"", event))
    return kept


async def _observed_events(response: UpstreamResponse, observer: StreamObserver, route: str,
                           usage_asked: bool = False, shared_account: str | None = None) -> AsyncGenerator[bytes, None]:
    """Forward events as they arrive; a failure mid-stream ends it with a provider-shaped error event.
    `usage_asked`: the gateway, not the client, asked for the usage chunk, which is observed and dropped.
    `shared_account`: the provider's name when other teams share its account, whose rate and quota
    limits an in-band error must not tell a team about (as `_failed` does for a 429)."""
    protocol = observer.protocol
    drained = False  # read to the end: the connection can go back to the pool
    reads = UsageReads(split_event_batches(response.iter_chunks()), observer)
    try:
        while True:
            batch = await reads.next()
            if batch is None:
                break
            now = time.perf_counter()
            for event in batch:
                if is_large(len(event)):  # a Responses event echoes the request's instructions: a team's megabytes
                    await off_loop(observer.observe, event, now)
                else:
                    observer.observe(event, now)
            if usage_asked:
                batch = without_asked_usage(batch)
                if not batch:
                    continue
            if shared_account is not None and any(may_name_an_account_limit(event) for event in batch):
                batch = [await off_loop_if_large(len(event), account_limit_event, event, shared_account)
                         if may_name_an_account_limit(event) else event for event in batch]
            yield batch[0] if len(batch) == 1 else b"".join(batch)  # arrived together: one write onward
        drained = True
        if not observer.finished and observer.error is None:
            yield SlipstreamError(f"{route} closed the stream before it finished", status=502).sse_event(protocol)
    except SlipstreamError as exc:
        yield exc.sse_event(protocol)
    finally:
        if not drained:
            await reads.left()
            response.abort()
