"""Hedged requests: if the primary has not answered by a delay, race a second target against it.

"Answered" means the router's attempt finished: a complete body, or a stream primed with its first
event (nothing has reached the client yet). The first leg to succeed wins; the other is cancelled,
which drops its upstream connection (and an answer it produced in the same instant is closed), so
a hedge never leaves an upstream call running. If a leg fails, the other is still awaited: a hedge
is an extra chance, never a reason to fail.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from sdk.types import Answer, LLMStream


class AllLegsFailed(Exception):
    def __init__(self, errors: list[BaseException]):
        super().__init__("every hedged leg failed")
        self.errors = errors  # errors[0] is the primary's


async def race(
    primary: Callable[[], Awaitable[Answer]], delay_s: float, hedge: Callable[[], Awaitable[Answer] | None]
) -> tuple[Answer, int]:
    """The first answer and which leg gave it (0 primary, 1 hedge). `hedge()` may return None: no leg to add."""
    tasks: list[asyncio.Task[Answer]] = [asyncio.ensure_future(primary())]
    winner: asyncio.Task[Answer] | None = None
    try:
        done, _ = await asyncio.wait(tasks, timeout=delay_s)
        if not done:
            leg = hedge()
            if leg is not None:
                tasks.append(asyncio.ensure_future(leg))
        pending = set(tasks)
        while pending:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is None:
                    winner = task
                    return task.result(), tasks.index(task)
        raise AllLegsFailed([task.exception() or asyncio.CancelledError() for task in tasks])
    finally:
        for task in tasks:
            if task is not winner:
                await _discard(task)


async def _discard(task: asyncio.Task[Answer]) -> None:
    """Cancel a losing leg and wait for it; an answer it already produced is closed."""
    task.cancel()
    await asyncio.wait([task])  # unlike `await task`, never raises the leg's error (or swallows ours)
    if task.cancelled() or task.exception() is not None:
        return  # exception() also marks it retrieved: no "never retrieved" warning
    answer = task.result()
    if isinstance(answer, LLMStream):
        await answer.aclose()
