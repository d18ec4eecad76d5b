"""Helpers for stages that wrap a stream: close what you wrap, and act once when it ends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from sdk.types import LLMStream


async def close_after(events: AsyncIterator[bytes]) -> None:
    """Close a wrapped event iterator; wrappers call this in `finally` so a close reaches the source."""
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()


def on_end(stream: LLMStream, callback: Callable[[bool], None]) -> None:
    """Call `callback(completed)` exactly once when the stream ends, however it ends.

    `completed` is True when the events were read to the end. Wrapping only the event iterator is
    not enough: an async generator that was never started does not run its `finally` when closed,
    so a stream dropped before its first read (a client gone while headers were being sent) would
    never report. The callback therefore also hangs off `close()`, which every consumer calls.
    """
    # The callback usually holds the stream (a stage's lambda over its answer) while the stream holds
    # `close` and so the callback: a reference cycle that only the garbage collector would free, with
    # every object of the request in it. Handing the callback over once it has fired breaks the cycle,
    # so a finished request is freed by reference counting (bench/proxy_cpu.py: collector time).
    pending = [callback]

    def fire(completed: bool) -> None:
        if pending:
            pending.pop()(completed)

    inner_close, inner_events = stream.close, stream.events

    async def close() -> None:
        try:
            await inner_close()
        finally:
            fire(False)

    async def events() -> AsyncIterator[bytes]:
        completed = False
        try:
            async for event in inner_events:
                yield event
            completed = True
        finally:
            await close_after(inner_events)
            fire(completed)

    stream.close, stream.events = close, events()
