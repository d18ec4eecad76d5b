"""Helpers for stages that wrap a stream: close what you wrap, and act once when it ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from sdk.types import LLMStream


async def close_after(events: AsyncIterator[bytes]) -> None:
    """Close a wrapped event iterator; wrappers call this in `finally` so a close reaches the source."""
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()


def on_end(stream: LLMStream, callback: Callable[[bool], None], observe: Callable[[bytes], None] | None = None) -> None:
    """Call `callback(completed)` exactly once when the stream ends, however it ends, and
    `observe(item)` on each item as it is handed on (before the consumer sees it).

    `completed` is True when the events were read to the end. Wrapping only the event iterator is
    not enough: an async generator that was never started does not run its `finally` when closed,
    so a stream dropped before its first read (a client gone while headers were being sent) would
    never report. The callbacks therefore also hang off `close()`, which every consumer calls.

    Stages that hook a stream one after another share one wrapper (`StreamHooks`): every layer of
    async generator costs each item a resumption, and four stages each wrapping the stream were
    most of what a streamed request cost at concurrency 1 beyond the upstream's own time.
    """
    hooks = stream.hooks
    if hooks is None or stream.events is not hooks.events:  # wrapped by something else since: a new layer
        hooks = stream.hooks = StreamHooks(stream)
    if observe is not None:
        hooks.observers.append(observe)
    hooks.callbacks.append(callback)


def end_after_the_reply(stream: LLMStream) -> None:
    """Run the stream's end callbacks on the loop's next turn rather than before its consumer's next
    step: the HTTP door then writes the chunk that ends the response first, and the stages'
    accounting (settle, spend, metrics, the access log: about 0.1 ms a stream) runs after the client
    has its answer instead of before. What arrives next on the loop (that client's next request)
    is handled after these callbacks. In process (the drop-in SDK, `TeamRuntime.handle`) they stay
    immediate: the caller's next request may follow without the loop turning."""
    hooks = stream.hooks
    while hooks is not None:
        hooks.deferred = True
        hooks = hooks.inner


class StreamHooks:
    """One wrapper around a stream's events and close: the items pass every observer, and the end
    fires every callback, in the order they were added (the stages nearest the provider first)."""

    __slots__ = ("callbacks", "deferred", "events", "inner", "observers")

    def __init__(self, stream: LLMStream):
        self.observers: list[Callable[[bytes], None]] = []
        self.callbacks: list[Callable[[bool], None]] = []
        self.inner = stream.hooks  # a layer wrapped before this one (something else wrapped in between)
        self.deferred = False  # fire on the loop's next turn (end_after_the_reply)
        inner_close, inner_events = stream.close, stream.events

        async def close() -> None:
            try:
                await inner_close()
            finally:
                self._end(False)

        stream.close = close
        self.events = stream.events = self._events(inner_events)

    async def _events(self, inner: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        completed = False
        observers = self.observers
        try:
            async for event in inner:
                for observe in observers:
                    observe(event)
                yield event
            completed = True
        finally:
            await close_after(inner)
            self._end(completed)

    def _end(self, completed: bool) -> None:
        if not self.deferred or not self.callbacks:
            self._fire(completed)
            return
        try:
            asyncio.get_running_loop().call_soon(self._fire, completed)
        except RuntimeError:  # closed outside a running loop (a generator finalized late): now
            self._fire(completed)

    def _fire(self, completed: bool) -> None:
        # The callbacks usually hold the stream (a stage's lambda over its answer) while the stream
        # holds `close` and so this object: a reference cycle that only the garbage collector would
        # free, with every object of the request in it. Letting go of them once they have fired breaks
        # the cycle, so a finished request is freed by reference counting (bench/proxy_cpu.py:
        # collector time).
        callbacks, self.callbacks = self.callbacks, []
        self.observers.clear()
        failure: BaseException | None = None
        for callback in callbacks:  # each runs, as each had its own wrapper's `finally` before
            try:
                callback(completed)
            except BaseException as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
