"""A budgeted team's request holds its media at the most the provider reading them may bill
(docs/spend.md, "Requests in flight: the bound"). Through the proxy with the official clients, the
emulator upstream; the hold read from `GET /v1/slipstream/spend` while a stream runs, never time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from sdk.spend import price_of
from tests.helpers import spend_report, write_policy

KEY = "sk-team-media-holds"
PLAIN = "retry: {max_attempts: 1}\nprompt_cache: {enabled: false}\nbudget: {usd: 100, period: day}\n"
IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/chart.png", "detail": "high"}}


def _held(proxy: Any, client: openai.OpenAI, body: dict[str, Any]) -> float:
    """What `body`'s stream holds against the budget while it runs."""
    with client.chat.completions.create(**body, stream=True) as stream:
        next(iter(stream))  # in flight: its hold is on the budget
        return float(spend_report(proxy, KEY)["budget"]["held"])


def _ask(model: str, *parts: dict[str, Any]) -> dict[str, Any]:
    return {"model": model, "max_completion_tokens": 500, "messages": [{"role": "user", "content": [{"type": "text", "text": "Describe."}, *parts]}]}


def test_an_image_is_held_at_what_the_model_reading_it_bills(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """gpt-4o-mini bills an image at 33x gpt-4o's tokens (2,833 + 5,667 a tile, up to 8 tiles: 48,169) at
    a 16th of the price; the hold counted every OpenAI image at 3,800 tokens, a 13th of its worst in USD."""
    monkeypatch.setattr(fresh_emulator.config, "per_output_token_ms", 5.0)  # still streaming when the hold is read
    with running_proxy([write_policy(tmp_path, "media", KEY, fresh_emulator.url, extra=PLAIN)]) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
        mini = _held(proxy, client, _ask("gpt-4o-mini", IMAGE)) - _held(proxy, client, _ask("gpt-4o-mini"))
        full = _held(proxy, client, _ask("gpt-4o", IMAGE)) - _held(proxy, client, _ask("gpt-4o"))
    mini_price, full_price = price_of("gpt-4o-mini", {}), price_of("gpt-4o", {})
    assert mini_price is not None and full_price is not None
    assert mini == pytest.approx(48_169 * mini_price.input / 1e6, rel=1e-3)  # before: 3,800 tokens
    assert full == pytest.approx(3_800 * full_price.input / 1e6, rel=1e-3)  # unchanged: OpenAI's worst but gpt-4o-mini's
