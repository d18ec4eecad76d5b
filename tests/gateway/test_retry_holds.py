"""Attempts the router sends and drops before their first byte (a first-byte timeout, a hedge leg that
lost) are each a prompt the provider read and bills, and each is charged (docs/spend.md, "Answers without
usage"); the budget's hold counted one request, so a team with a first-byte timeout or hedging spent up
to its attempts' prompts beyond what it held. Through the proxy with the official client, the emulator
upstream; the hold read while a stream runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from sdk.estimate import input_tokens
from sdk.limits.stage import RESERVE_EXACT_CHARS
from sdk.spend import price_of, worst_cost_usd
from sdk.types import Endpoint, LLMRequest
from tests.helpers import held_while_streaming, write_policy

KEY = "sk-team-retry-holds"
MODEL = "claude-haiku-4-5"  # no long-context rates: the hold is linear in its tokens
BODY = {"model": MODEL, "max_tokens": 100, "messages": [{"role": "user", "content": "Contract clause under review. " * 2000}]}


@pytest.mark.parametrize("routing", ["retry: {max_attempts: 3, first_byte_timeout_ms: 60000}",
                                     "retry: {max_attempts: 3}\nhedging: {enabled: true, delay_ms: 60000}"])
def test_the_prompts_of_attempts_the_router_may_drop_are_held(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                              monkeypatch: pytest.MonkeyPatch, routing: str) -> None:
    """Three attempts on one target, each droppable before its first byte: two prompt reads beyond the
    answer's worst cost are held, and a request beside it is refused where the budget had room for the
    old hold twice over."""
    monkeypatch.setattr(fresh_emulator.config, "per_output_token_ms", 20.0)  # still streaming when the hold is read
    price = price_of(MODEL, {})
    assert price is not None
    prompt = input_tokens(LLMRequest(Endpoint.MESSAGES, BODY), RESERVE_EXACT_CHARS, worst=True)
    once = worst_cost_usd(prompt, 100, price)
    held_now = once + 2 * worst_cost_usd(prompt, 0, price)
    budget = (2 * once + held_now) / 2
    assert 2 * once < budget < held_now
    extra = f"prompt_cache: {{enabled: false}}\n{routing}\nbudget: {{usd: {budget:.6f}, period: day}}\n"
    with running_proxy([write_policy(tmp_path, "retries", KEY, fresh_emulator.url, extra=extra)]) as proxy:
        held = held_while_streaming(proxy, KEY, BODY, beside={**BODY, "max_tokens": 10})  # before: admitted beside it
    assert held == pytest.approx(held_now, rel=1e-3)  # before: `once`
