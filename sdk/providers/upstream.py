"""The one small interface between providers and the HTTP client.

On the proxy's hot path the upstream client is most of the added latency (~2.9 ms with
httpx, ~1 ms with aiohttp, measured early in the project), and that is the budget; the implementation is the small HTTP/1.1
client in sdk/providers/http1.py, which costs less than either (docs/benchmark-history.md). A pool is
bound to an event loop, so there is one per loop (the proxy's loop, or the SDK's background loop),
with keep-alive connections reused across requests and teams. A provider reaches it through a
`TeamUpstream`, which names the team (each team holds at most its share of an origin's connections)
and the provider's egress settings (proxy, CA bundle: sdk/providers/egress.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Protocol as TypingProtocol

from sdk.providers.http1 import ANYONE, Caller, Http1Upstream


class UpstreamResponse(TypingProtocol):
    status: int
    headers: dict[str, str]

    async def read(self) -> bytes: ...
    def iter_chunks(self) -> AsyncIterator[bytes]: ...
    def abort(self) -> None: ...  # drop the connection: this is how the upstream learns of a cancel


class UpstreamClient(TypingProtocol):
    async def post(self, url: str, headers: dict[str, str], body: bytes, timeout: Timeouts) -> UpstreamResponse: ...
    async def request(self, method: str, url: str, headers: dict[str, str], body: bytes | AsyncIterable[bytes],
                      timeout: Timeouts, length: int | None = None) -> UpstreamResponse: ...


@dataclass(frozen=True, slots=True)
class Timeouts:
    # Also how long a written request may go without a byte of it acknowledged by the upstream's TCP
    # before it counts as never delivered (sent again once, then a clear error: sdk/providers/http1.py).
    connect_s: float = 10.0
    first_byte_s: float = 600.0  # until response headers arrive: the official clients' default timeout
    read_s: float = 600.0  # between chunks once streaming


@dataclass(frozen=True, slots=True)
class TeamUpstream:
    """The running loop's shared pool, as one team's provider uses it (an UpstreamClient)."""

    caller: Caller = ANYONE

    async def post(self, url: str, headers: dict[str, str], body: bytes, timeout: Timeouts) -> UpstreamResponse:
        return await upstream_for_running_loop().request("POST", url, headers, body, timeout, caller=self.caller)

    async def request(self, method: str, url: str, headers: dict[str, str], body: bytes | AsyncIterable[bytes],
                      timeout: Timeouts, length: int | None = None) -> UpstreamResponse:
        return await upstream_for_running_loop().request(method, url, headers, body, timeout, length, caller=self.caller)


_clients: dict[asyncio.AbstractEventLoop, Http1Upstream] = {}


def upstream_for_running_loop() -> Http1Upstream:
    """The shared client of the current event loop (created on first use)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        for stale in [other for other in _clients if other.is_closed()]:
            del _clients[stale]
        client = _clients[loop] = Http1Upstream()
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
