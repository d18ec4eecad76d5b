"""Hedged requests: the losing leg of a race is cancelled, and an answer it already produced closed.

The race itself is the router's attempt loop (sdk/routing/router.py): when the only running attempt has
sent no first byte within the hedge delay (the policy's `delay_ms`, else the target's observed p95
time to first byte), a second leg starts; the first to answer wins. "Answered" means the attempt
finished: a complete body, or a stream primed with its first event (nothing has reached the client
yet), so cancelling the loser never splices two answers.
"""

from __future__ import annotations

import asyncio

from sdk.types import Answer, LLMStream


async def discard(task: asyncio.Future[Answer]) -> bool:
    """Cancel a leg that lost (or outlived its request) and wait for it; a finished answer is closed.
    True when the leg had answered: the provider ran it, and the router has it charged."""
    task.cancel()
    await asyncio.wait([task])  # unlike `await task`, never raises the leg's error (or swallows ours)
    if task.cancelled() or task.exception() is not None:
        return False  # exception() also marks it retrieved: no "never retrieved" warning
    answer = task.result()
    if isinstance(answer, LLMStream):
        await answer.aclose()
    return True
