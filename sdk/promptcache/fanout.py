"""Warm-then-fan-out: hold a request until a sibling's cache write becomes readable.

A new cache entry is readable only once the response that writes it has started (A.9), so N
parallel requests that share a new prefix all miss and all pay to write it. When the ledger shows
that an in-flight request is writing an entry this request would read, the request waits for that
writer's first byte (bounded), then reads the entry instead of writing it again.
"""

from __future__ import annotations

import asyncio

from sdk.promptcache.ledger import Entry


async def wait_for_writer(entry: Entry, max_wait_s: float) -> str:
    """Wait until `entry` is readable; returns the outcome: warmed | timeout | skipped."""
    event = entry.ready
    if event is None:
        return "skipped"
    if event.is_set():
        return "warmed"
    try:
        await asyncio.wait_for(event.wait(), max_wait_s)
    except TimeoutError:
        return "timeout"
    except RuntimeError:  # the writer runs on another event loop (SDK clients in other threads)
        return "skipped"
    return "warmed"
