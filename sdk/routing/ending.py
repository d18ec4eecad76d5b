"""Run bookkeeping exactly once when a stream ends, however it ends.

Wrapping only the event iterator is not enough: an async generator that was never started does
not run its `finally` when closed, so a stream dropped before its first read (a client gone while
headers were being sent) would leak a concurrency slot. The callback therefore also hangs off
`close()`, which every consumer calls.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from sdk.types import LLMStream, close_after


def on_end(stream: LLMStream, callback: Callable[[], None]) -> None:
    fired = False

    def fire() -> None:
        nonlocal fired
        if not fired:
            fired = True
            callback()

    inner_close, inner_events = stream.close, stream.events

    async def close() -> None:
        try:
            await inner_close()
        finally:
            fire()

    async def events() -> AsyncIterator[bytes]:
        try:
            async for event in inner_events:
                yield event
        finally:
            await close_after(inner_events)
            fire()

    stream.close, stream.events = close, events()
