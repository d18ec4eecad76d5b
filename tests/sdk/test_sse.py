"""Splitting a byte stream into whole SSE events, batched by the chunk that completed them."""

from __future__ import annotations

from collections.abc import AsyncIterator

from sdk.sse import events_of, split_event_batches


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def test_events_that_arrive_together_leave_together():
    chunks = _chunks(b"event: a\ndata: 1\n\nevent: b\nda", b"ta: 2\n\nevent: c\r\ndata: 3\r\n\r\nevent: d\n", b"data: 4\n\n", b"data: tail")
    batches = [batch async for batch in split_event_batches(chunks)]
    assert batches == [
        [b"event: a\ndata: 1\n\n"],
        [b"event: b\ndata: 2\n\n", b"event: c\ndata: 3\n\n"],  # CRLF normalised
        [b"event: d\ndata: 4\n\n"],
        [b"data: tail\n\n"],  # an unterminated last event is closed
    ]


async def test_any_split_of_a_stream_gives_the_same_events():
    stream = b"event: a\ndata: 1\n\nevent: b\ndata: 22\n\n\ndata: 333\n\nevent: c\ndata: x\n\n"
    whole = [event for batch in [b async for b in split_event_batches(_chunks(stream))] for event in batch]
    for size in range(1, len(stream) + 1):
        parts = [stream[i:i + size] for i in range(0, len(stream), size)]
        assert [event for batch in [b async for b in split_event_batches(_chunks(*parts))] for event in batch] == whole, size


async def test_a_large_event_in_many_chunks_is_joined_once():
    """A Responses event echoes the request's `instructions` (a team's megabytes) and arrives in many
    chunks; each chunk was added to the buffer so far, copying it all again (and the buffer searched
    from its start): its size squared over the chunk size, on the loop every team shares."""
    copied = [0]

    class Piece(bytes):
        def __radd__(self, other: bytes) -> bytes:  # `buffer + chunk`: the copy of the buffer so far
            copied[0] += len(other)
            return bytes(other) + bytes(self)

    event = b"event: response.created\ndata: " + b"x" * (64 * 65536) + b"\n\n"
    pieces = [Piece(event[i:i + 65536]) for i in range(0, len(event), 65536)]
    assert [batch async for batch in split_event_batches(_chunks(*pieces))] == [[event]]
    assert copied[0] == 0  # about 130 MiB re-copied for this 4 MiB event before


def test_events_of_splits_an_item_back_into_events():
    assert events_of(b"data: 1\n\n") == [b"data: 1\n\n"]
    assert events_of(b"event: a\ndata: 1\n\nevent: b\ndata: 2\n\n") == [b"event: a\ndata: 1\n\n", b"event: b\ndata: 2\n\n"]


def test_the_usage_chunk_the_gateway_asked_for_is_taken_out_in_any_spacing():
    """Chat Completions events as the client would have had them without `include_usage`: OpenAI's
    compact form, a spaced one, and text that only quotes the field are all handled alike."""
    from sdk.providers.base import without_asked_usage

    compact = b'data: {"id":"c","choices":[{"delta":{"content":"hi"}}],"usage":null}\n\n'
    spaced = b'data: {"id": "c", "choices": [{"delta": {"content": "hi"}}], "usage": null}\n\n'
    quoted = b'data: {"id":"c","choices":[{"delta":{"content":"x,\\"usage\\":null"}}],"usage":null}\n\n'
    usage_compact = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5}}\n\n'
    usage_spaced = b'data: {"id": "c", "choices": [ ], "usage": {"prompt_tokens": 3}}\n\n'
    assert without_asked_usage([compact, spaced, quoted, usage_compact, usage_spaced, b"data: [DONE]\n\n"]) == [
        b'data: {"id":"c","choices":[{"delta":{"content":"hi"}}]}\n\n',
        b'data: {"id": "c", "choices": [{"delta": {"content": "hi"}}]}\n\n',
        b'data: {"id":"c","choices":[{"delta":{"content":"x,\\"usage\\":null"}}]}\n\n',
        b"data: [DONE]\n\n",
    ]
