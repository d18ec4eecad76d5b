"""Chat's `n` > 1 on a Claude target is n upstream requests (sdk/routing/translation/choices.py), and
the team pays for all of them: n requests against its requests-per-minute limit, n slots of its
concurrency cap while they run, n times the worst cost held against its budget while it runs, every
answer's usage charged, also when one choice failed and took the request down. Through the proxy with the official `openai` client, the emulator
as Claude; counts and spend records, never time. Each test was a 400 before (`n` was refused).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from emulator.app import EmulatorConfig
from emulator.testing import RunningEmulator, running_emulator
from gateway.testing import running_proxy
from sdk.estimate import choice_limit, worst_input
from sdk.spend import price_of, worst_cost_usd
from sdk.types import Endpoint, LLMRequest, Protocol
from tests.helpers import STALL_MS, wait_until
from tests.helpers import spend_report as _spend
from tests.routing.conftest import policy_text

KEY = "sk-routing"  # policy_text's team
CLAUDE = "claude-sonnet-4-5"  # a built-in price
ASK = [{"role": "user", "content": "Tell me about fjords."}]
# Over Claude's least cacheable prefix, so the choices are staggered (the first alone): a prompt
# below it starts them together (choices.py), and the order of the faults below would be a race.
CACHEABLE = [{"role": "system", "content": "\n".join(f"Rule {i}: answer in one short sentence." for i in range(300))}, *ASK]


@pytest.fixture(scope="module")
def emu() -> Iterator[RunningEmulator]:
    """Paced answers (20 ms a token): a stream is still running while the test reads the team's spend."""
    with running_emulator(EmulatorConfig(per_output_token_ms=20.0, default_output_tokens=400)) as running:
        yield running


@pytest.fixture
def proxy(tmp_path: Path, emu: RunningEmulator, request: pytest.FixtureRequest) -> Iterator[Any]:
    httpx.post(f"{emu.url}/_emulator/reset").raise_for_status()
    routes = f"""  - match: {{model: "gpt-*"}}
    targets: [{{provider: claude, model: {CLAUDE}}}]
  - match: {{model: "native-*"}}
    targets: [{{provider: gpt, model: gpt-4o-mini}}]"""
    extra = f"retry: {{max_attempts: 1}}\nprompt_cache: {{enabled: false}}\n{getattr(request, 'param', '')}"
    (tmp_path / "routing.yaml").write_text(policy_text(emu.url, routes, extra))
    with running_proxy([tmp_path], watch_interval_s=None) as running:
        yield running


def _client(proxy: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)


def _total_after(proxy: Any, before: float) -> float:
    """The team's spend today once it has moved past `before` (charges land after the answer)."""
    return wait_until(lambda: (total := _spend(proxy, KEY)["day"]["total"]) > before and total, "the spend moved")


@pytest.mark.parametrize("proxy", ["limits: {requests_per_minute: 4}"], indirect=True)
def test_each_choice_is_a_request_against_the_teams_limit(proxy: Any, emu: RunningEmulator) -> None:
    client = _client(proxy)
    assert len(client.chat.completions.create(model="gpt-x", messages=ASK, max_completion_tokens=5, n=3).choices) == 3
    with pytest.raises(openai.RateLimitError, match="over its limit of 4 requests per minute"):
        client.chat.completions.create(model="gpt-x", messages=ASK, max_completion_tokens=5, n=3)  # 3 more of 4: 1 left
    with pytest.raises(openai.RateLimitError, match="makes 5 upstream requests"):  # never fits: said so, not "retry in"
        client.chat.completions.create(model="gpt-x", messages=ASK, max_completion_tokens=5, n=5)
    assert emu.stats()["endpoints"]["POST /v1/messages"] == 3


@pytest.mark.parametrize("proxy", ["limits: {max_concurrent: 4}"], indirect=True)
def test_each_choice_takes_a_slot_of_the_teams_concurrency(proxy: Any, emu: RunningEmulator) -> None:
    client = _client(proxy)
    with client.chat.completions.create(model="gpt-x", messages=ASK, max_completion_tokens=500, n=3, stream=True) as stream:
        next(iter(stream))  # its three requests are in flight upstream: three of the team's four slots
        with pytest.raises(openai.RateLimitError, match="has 3 requests in flight and this request makes 2"):
            client.chat.completions.create(model="gpt-x", messages=ASK, max_completion_tokens=5, n=2)
        # OpenAI answers n choices natively, in one request: one slot, the fourth
        assert len(client.chat.completions.create(model="native-x", messages=ASK, max_completion_tokens=5, n=3).choices) == 3
    with pytest.raises(openai.RateLimitError, match=r"makes 5 upstream requests.*limit of 4 requests in flight"):  # never fits: said so
        client.chat.completions.create(model="gpt-x", messages=ASK, max_completion_tokens=5, n=5)
    assert emu.stats()["endpoints"]["POST /v1/messages"] == 3
    assert emu.stats()["endpoints"]["POST /v1/chat/completions"] == 1


@pytest.mark.parametrize("proxy", ["budget: {usd: 1000, period: day}"], indirect=True)
def test_every_choice_holds_its_worst_cost_and_is_charged(proxy: Any, emu: RunningEmulator) -> None:
    body = {"model": "gpt-x", "messages": ASK, "max_completion_tokens": 500}
    client = _client(proxy)
    with client.chat.completions.create(**body, n=4, stream=True) as stream:
        next(iter(stream))  # every choice has begun: the request holds its worst cost
        held = _spend(proxy, KEY)["budget"]["held"]
    request = LLMRequest(Endpoint.CHAT_COMPLETIONS, body)
    prompt = worst_input(request).on(CLAUDE, Protocol.ANTHROPIC)  # counted as Claude's tokenizer would count it
    one = worst_cost_usd(prompt, choice_limit(request), price_of(CLAUDE, {}))  # type: ignore[arg-type]
    assert held == pytest.approx(4 * one, rel=1e-3)  # each choice: a prompt and up to 500 tokens, at Claude's prices
    emu.wait_for(lambda s: s["cancelled_streams"] == 4)
    spent = _total_after(proxy, 0.0)
    client.chat.completions.create(**{**body, "max_completion_tokens": 5})
    single = _total_after(proxy, spent) - spent
    client.chat.completions.create(**{**body, "max_completion_tokens": 5}, n=3)
    three = _total_after(proxy, spent + single) - spent - single
    assert three == pytest.approx(3 * single, rel=1e-6)  # every choice's usage, as Claude billed it


@pytest.mark.parametrize("proxy", ["budget: {usd: 1000, period: day}"], indirect=True)
def test_the_choices_answered_before_one_failed_are_charged(proxy: Any, emu: RunningEmulator) -> None:
    client = _client(proxy)
    client.chat.completions.create(model="gpt-x", messages=CACHEABLE, max_completion_tokens=5)
    single = _total_after(proxy, 0.0)
    emu.inject_fault("stall:ms=1")  # the first choice is answered,
    emu.inject_fault("500")  # the second fails,
    emu.inject_fault(f"stall:ms={STALL_MS}")  # and the third is dropped on its way
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="gpt-x", messages=CACHEABLE, max_completion_tokens=5, n=3)
    emu.wait_for(lambda s: s["cancelled_requests"] == 1)
    # the first choice's answer (as billed: one more `single`) and the third's prompt read (counted)
    _total_after(proxy, 2 * single)
    assert _spend(proxy, KEY)["budget"]["held"] == 0  # nothing left holding the budget
