"""A large request's history snapshot is counted with its plan, off the event loop."""

from __future__ import annotations

import asyncio
import threading

from sdk.offload import LARGE_BYTES
from sdk.pipeline import PromptCacheReport
from sdk.policy import PromptCachePolicy
from sdk.promptcache import ledger
from sdk.promptcache.stage import PromptCachePlanner
from sdk.types import Endpoint, LLMRequest, LLMResponse, Timings, Usage

MODEL = "claude-sonnet-5"


def test_a_large_requests_history_text_is_counted_off_the_loop(monkeypatch):
    """The ledger keeps a request's block texts for miss diagnoses, counted against HISTORY_CHARS.
    `remember` summed every block's text length on the event loop every team shares (about 10 ms for a
    10 MB request), after the plan the heavy-work pool had made. The count is made with the plan now:
    in the pool for a large request, on the loop for a small one (cheaper than the hop)."""
    counted: list[str] = []
    real = getattr(ledger, "held_chars", None)

    def held_chars(layout: object) -> int:
        counted.append(threading.current_thread().name)
        assert real is not None
        return real(layout)

    monkeypatch.setattr(ledger, "held_chars", held_chars, raising=False)  # absent on the old code
    planner = PromptCachePlanner("history-count", PromptCachePolicy())
    system = "You are the support assistant.\n" + "Answer from the manual and cite the section. " * 300

    async def send(request: LLMRequest) -> LLMResponse:
        return LLMResponse(200, b"{}", {}, Usage(input_tokens=10, cache_write_tokens=3000), f"anthropic/{MODEL}")

    async def main() -> None:
        for size in (LARGE_BYTES, 100):
            body = {"model": MODEL, "max_tokens": 16, "system": system, "messages": [{"role": "user", "content": f"hi {size}"}]}
            await planner.planned(LLMRequest(Endpoint.MESSAGES, body, size=size), send, Timings(), PromptCacheReport())

    asyncio.run(main())
    assert [name.startswith("slipstream-heavy") for name in counted] == [True, False], counted
    history = planner.optimizer.ledger.scope("anthropic", MODEL, "").history
    assert planner.optimizer.ledger.history_chars == sum(snapshot.chars for snapshot in history) > len(system) * 2
