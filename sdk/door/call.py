"""What an adapter hands the door core: one request, bytes in.

The core never sees an ASGI message or an httpx request. Each adapter wraps its request in a
`Call`; what costs anything to compute (the peer's address, the origin, the raw path) is asked for
only where it is needed, so the hot path pays for none of it.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable
from typing import Protocol as TypingProtocol

from sdk.errors import RequestTooLargeError
from sdk.observability.tracing import Parent

# Header names lower-case, values as sent: how ASGI carries them, so the proxy converts nothing.
Headers = list[tuple[bytes, bytes]]


class ClientGone(Exception):
    """The client closed the connection while its request was read: nothing is left to answer."""


class Call(TypingProtocol):
    method: str
    path: str  # percent-decoded, without the query
    query: str
    headers: Headers
    caller: Parent | None  # the application's current span, when the pipeline runs in its process

    async def read(self, limit: int, need: Callable[[int], None]) -> bytes:
        """The whole body; `too_large` past `limit` bytes, `ClientGone` if the client left. `need(size)`
        is told the body's size before its bytes are held (its declared length first, where there is
        one; else the bytes so far, as they arrive) and raises the refusal when the process's body
        budget has no room for it (sdk/door/bodies.py)."""
        ...

    def upload(self) -> tuple[bytes | AsyncIterable[bytes], int | None]:
        """The body as it arrives, for a pass-through upstream write, and its declared length (None: unknown)."""
        ...

    def raw_path(self) -> str:
        """The path as the client wrote it (still percent-encoded): the pass-through checks it."""
        ...

    def origin(self) -> str:
        """scheme://host[:port] the client used: provider URLs in pass-through answers point back here."""
        ...

    def peer(self) -> str:
        """Who sent it, for the log line of a refused key."""
        ...


def too_large(size: int, limit: int, declared: bool = True) -> RequestTooLargeError:
    """The refusal of a body over the team's limit, one message for both doors. `declared`: `size`
    is the whole body's (a content-length, or bytes in hand), not a count that stopped at the limit.
    The caller compares, so a body within the limit costs no call."""
    of = f" of {size} bytes" if declared else ""
    return RequestTooLargeError(f"request body{of} is over this team's limit of {limit} bytes")
