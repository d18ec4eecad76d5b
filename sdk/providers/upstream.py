"""The one small interface between providers and the HTTP client library.

aiohttp is the implementation: on the proxy's hot path the upstream client is most of the added
latency (measurements.md: ~1 ms with aiohttp against ~2.9 ms with httpx), and that is the budget.
A session is bound to an event loop, so there is one pool per loop (the proxy's loop, or the SDK's
background loop), with keep-alive connections reused across requests and teams.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol as TypingProtocol

import aiohttp

from sdk.errors import UpstreamTimeoutError, UpstreamUnreachableError


class UpstreamResponse(TypingProtocol):
    status: int
    headers: dict[str, str]

    async def read(self) -> bytes: ...
    def iter_chunks(self) -> AsyncIterator[bytes]: ...
    def abort(self) -> None: ...  # drop the connection: this is how the upstream learns of a cancel


class UpstreamClient(TypingProtocol):
    async def post(self, url: str, headers: dict[str, str], body: bytes, timeout: "Timeouts") -> UpstreamResponse: ...


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float = 10.0
    first_byte_s: float = 600.0  # until response headers arrive
    read_s: float = 600.0  # between chunks once streaming


class _AiohttpResponse:
    __slots__ = ("_response", "status", "headers", "_read_timeout")

    def __init__(self, response: aiohttp.ClientResponse, read_timeout: float):
        self._response = response
        self.status = response.status
        self.headers = {k.lower(): v for k, v in response.headers.items()}
        self._read_timeout = read_timeout

    async def read(self) -> bytes:
        try:
            return await self._response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._response.close()
            raise UpstreamUnreachableError(f"upstream connection failed while reading the answer: {exc!r}") from exc
        finally:
            self._response.release()

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        content = self._response.content
        while True:
            try:
                async with asyncio.timeout(self._read_timeout):
                    chunk = await content.readany()
            except TimeoutError as exc:
                raise UpstreamTimeoutError(f"upstream sent nothing for {self._read_timeout:g}s mid-stream") from exc
            except aiohttp.ClientError as exc:
                raise UpstreamUnreachableError(f"upstream connection dropped mid-stream: {exc!r}") from exc
            if not chunk:
                return
            yield chunk

    def abort(self) -> None:
        # close() (not release()) so the half-read connection is not returned to the pool.
        self._response.close()


class AiohttpUpstream:
    """Pooled keep-alive client; create it inside the loop that will use it."""

    def __init__(self, limit: int = 1000):
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limit, limit_per_host=0, keepalive_timeout=60, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(total=None),
            auto_decompress=True,
            skip_auto_headers=("User-Agent",),
        )

    async def post(self, url: str, headers: dict[str, str], body: bytes, timeout: Timeouts) -> UpstreamResponse:
        try:
            async with asyncio.timeout(timeout.first_byte_s):
                response = await self._session.post(
                    url,
                    data=body,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeout.connect_s),
                )
        except TimeoutError as exc:
            raise UpstreamTimeoutError(f"{url} sent no response within {timeout.first_byte_s:g}s") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamUnreachableError(f"cannot reach {url}: {exc}") from exc
        return _AiohttpResponse(response, timeout.read_s)

    async def aclose(self) -> None:
        await self._session.close()


_clients: dict[asyncio.AbstractEventLoop, AiohttpUpstream] = {}


def upstream_for_running_loop() -> AiohttpUpstream:
    """The shared client of the current event loop (created on first use)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        for stale in [l for l in _clients if l.is_closed()]:
            del _clients[stale]
        client = _clients[loop] = AiohttpUpstream()
    return client


async def close_upstream_for_running_loop() -> None:
    client = _clients.pop(asyncio.get_running_loop(), None)
    if client is not None:
        await client.aclose()


_users: dict[asyncio.AbstractEventLoop, int] = {}


def retain_upstream() -> None:
    """Count a user of this loop's pool (an async drop-in client) so the last one to close closes it."""
    loop = asyncio.get_running_loop()
    _users[loop] = _users.get(loop, 0) + 1


async def release_upstream() -> None:
    loop = asyncio.get_running_loop()
    remaining = _users.get(loop, 1) - 1
    if remaining > 0:
        _users[loop] = remaining
        return
    _users.pop(loop, None)
    await close_upstream_for_running_loop()
