"""sdk/streams.py: the one wrapper stages hook a stream with (observers of each item, callbacks at
its end), and when those callbacks run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from sdk.streams import end_after_the_reply, on_end
from sdk.types import LLMStream, Usage


def _stream(items: list[bytes]) -> LLMStream:
    async def events() -> AsyncIterator[bytes]:
        for item in items:
            yield item

    async def close() -> None:
        return None

    return LLMStream(200, events(), {}, Usage(), "p/m", close)


async def test_stages_share_one_wrapper_and_see_every_item_in_order():
    stream = _stream([b"a", b"b"])
    seen: list[object] = []
    on_end(stream, lambda completed: seen.append(("first", completed)), lambda item: seen.append(("tally", item)))
    wrapper = stream.events
    on_end(stream, lambda completed: seen.append(("second", completed)), lambda item: seen.append(("watch", item)))
    assert stream.events is wrapper  # nothing wrapped in between: no second layer
    assert [item async for item in stream.events] == [b"a", b"b"]
    assert seen == [("tally", b"a"), ("watch", b"a"), ("tally", b"b"), ("watch", b"b"), ("first", True), ("second", True)]
    await stream.aclose()
    assert seen[-2:] == [("first", True), ("second", True)]  # each fired once


async def test_a_stream_dropped_before_its_first_read_still_ends_once():
    stream = _stream([b"a"])
    seen: list[bool] = []
    on_end(stream, seen.append)
    await stream.aclose()
    await stream.aclose()
    assert seen == [False]


async def test_every_callback_runs_when_one_before_it_fails():
    stream = _stream([b"a"])
    seen: list[bool] = []

    def failing(completed: bool) -> None:
        raise RuntimeError("a stage's bug")

    on_end(stream, failing)
    on_end(stream, seen.append)
    with pytest.raises(RuntimeError):
        async for _ in stream.events:
            pass
    assert seen == [True]


async def test_after_the_reply_the_callbacks_wait_for_the_loops_next_turn():
    """The HTTP door ends the response (the chunk its client waits for) before the stages' accounting."""
    order: list[str] = []
    for deferred in (False, True):
        stream = _stream([b"a"])
        on_end(stream, lambda completed: order.append("accounted"))
        if deferred:
            end_after_the_reply(stream)
        async for _ in stream.events:
            pass
        order.append("reply ended")
        await asyncio.sleep(0)
    assert order == ["accounted", "reply ended", "reply ended", "accounted"]
