"""Name lookups for upstream connections: one at a time per name, in threads of their own.

`loop.create_connection(host, ...)` looks a name up with `getaddrinfo` in asyncio's default thread
pool, first come, first served, and shared with every `to_thread` caller (a batch's budget hold without Redis,
policy reloads, /metrics, model loads). A lookup cannot be cancelled and a slow resolver holds a
thread for seconds (5 s a try by default): one team's burst of new connections to a provider whose
name resolved slowly took every thread, and every other team's new connections, to any provider,
waited behind them. Here concurrent lookups of one name share one, so a slow name holds one thread
however many connections wait for it, in a pool no other work uses, the names taking turns. Nothing is cached:
each new lookup asks the resolver again, so its records' lifetimes hold as before.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from typing import Any

from sdk.offload import FairPool

AddressInfo = tuple[int, int, int, str, Any]  # getaddrinfo's (family, type, proto, canonname, sockaddr)

# Tenants are the names looked up: one name's lookups take turns with every other name's.
_LOOKUPS = FairPool(workers=4, name="slipstream-dns")
_IN_FLIGHT: dict[tuple[str, int], asyncio.Future[list[AddressInfo]]] = {}


def _lookup(host: str, port: int) -> list[AddressInfo]:
    return [(int(family), int(kind), proto, name, address) for family, kind, proto, name, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


def _numeric(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    except OSError:
        return False
    return True


def _done(key: tuple[str, int], done: asyncio.Future[list[AddressInfo]]) -> None:
    if _IN_FLIGHT.get(key) is done:
        del _IN_FLIGHT[key]
    if not done.cancelled():
        done.exception()  # retrieved: every caller may have left (a timeout) before it failed


async def addresses(host: str, port: int) -> list[AddressInfo]:
    """`host`'s addresses for a TCP connection to `port`: the lookup in flight for the same name and
    port if there is one, else a new one. Raises OSError (socket.gaierror) as getaddrinfo does."""
    key = (host, port)
    pending = _IN_FLIGHT.get(key)
    if pending is None or pending.get_loop() is not asyncio.get_running_loop():
        pending = asyncio.wrap_future(_LOOKUPS.submit(lambda: _lookup(host, port), tenant=host))
        _IN_FLIGHT[key] = pending
        pending.add_done_callback(functools.partial(_done, key))
    return await asyncio.shield(pending)


async def open_connection(loop: asyncio.AbstractEventLoop, factory: Any, host: str, port: int,
                          tls: Any = None, server_hostname: str | None = None) -> Any:
    """`loop.create_connection(factory, host, port, ssl=tls)` with the name looked up here: each
    address in turn, as asyncio tries them, the last error raised when none connects."""
    if _numeric(host):
        _, conn = await loop.create_connection(factory, host, port, ssl=tls)
        return conn
    infos = await addresses(host, port)
    error: OSError | None = None
    for family, _, proto, _, sockaddr in infos:
        try:
            _, conn = await loop.create_connection(factory, sockaddr[0], sockaddr[1], ssl=tls, family=family, proto=proto,
                                                   server_hostname=(server_hostname or host) if tls is not None else None)
            return conn
        except OSError as exc:
            error = exc
    raise error or OSError(f"no address for {host!r}")
