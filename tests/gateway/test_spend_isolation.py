"""Every answer is charged, with two teams sharing one provider key (issue 25, item 3).

- A stream the client closes before its usage event, or that the upstream cuts, is charged from the
  tokens counted in the request and in what was streamed, marked `estimated` in the spend record and
  the access log; at both doors (the proxy with the official clients, the drop-in SDK).
- A team with a budget cannot spend on a model without a price: a 403 naming the `pricing:` entry,
  before anything leaves; `o3` and `gpt-4-turbo` have built-in prices.
- 60 requests in parallel overshoot a budget by at most one request's reservation (counts, not time).
- An attempt the router drops after sending it (a first-byte timeout, a lost hedge) is charged its input.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import orjson
import pytest

import sdk
from emulator.app import EmulatorConfig
from emulator.testing import RunningEmulator, running_emulator
from gateway.testing import running_proxy
from sdk.estimate import DEFAULT_OUTPUT_TOKENS, input_tokens, output_limit
from sdk.observability import access_log, metrics
from sdk.spend import price_of, worst_cost_usd
from sdk.types import Endpoint, LLMRequest
from tests.helpers import answered_within_budget, wait_until, write_policy
from tests.helpers import spend_report as _spend

SHARED_KEY = "org-key-shared-by-every-team"  # the one provider key both teams' policies hold
ALPHA, BETA = "sk-team-alpha-spend", "sk-team-beta-spend"
PLAIN = "retry: {max_attempts: 1}\nprompt_cache: {enabled: false}\n"
HELLO = [{"role": "user", "content": "Tell me a long story about the sea."}]


@pytest.fixture(scope="module")
def emu() -> Iterator[RunningEmulator]:
    with running_emulator(EmulatorConfig(api_keys=frozenset({SHARED_KEY}))) as running:
        yield running


@pytest.fixture
def slow(emu: RunningEmulator) -> Iterator[RunningEmulator]:
    """Long, paced replies (2,000 tokens at 5 ms): a stream is still open when the client leaves."""
    emu.reset()
    saved = (emu.config.per_output_token_ms, emu.config.default_output_tokens)
    emu.config.per_output_token_ms, emu.config.default_output_tokens = 5.0, 2000
    yield emu
    emu.config.per_output_token_ms, emu.config.default_output_tokens = saved


@pytest.fixture
def access_lines() -> Iterator[list[dict[str, Any]]]:
    """The access log's records, as dicts (the log is on for the test)."""
    lines: list[dict[str, Any]] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(dict(record.msg))  # type: ignore[call-overload]

    access_log.configure("json")
    handler = Keep()
    access_log.log.addHandler(handler)
    yield lines
    access_log.configure("off")


def _teams(directory: Path, emu: RunningEmulator, extra: str = "") -> Path:
    for team, key in (("alpha", ALPHA), ("beta", BETA)):
        write_policy(directory, team, key, emu.url, extra=PLAIN + extra, upstream_key=SHARED_KEY)
    return directory


def test_streams_closed_before_their_usage_are_charged_estimated(tmp_path: Path, slow: RunningEmulator,
                                                                  access_lines: list[dict[str, Any]]) -> None:
    with running_proxy([_teams(tmp_path, slow)]) as proxy:
        oa = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=ALPHA, max_retries=0)
        read = 0
        with oa.chat.completions.create(model="gpt-4o-mini", messages=HELLO, stream=True,
                                        stream_options={"include_usage": True}) as stream:
            for chunk in stream:
                read += bool(chunk.choices and chunk.choices[0].delta.content)
                if read == 40:
                    break
        slow.wait_for(lambda s: s["cancelled_streams"] == 1)
        day = wait_until(lambda: (d := _spend(proxy, ALPHA)["day"])["total"] > 0 and d, "alpha's stream charged")
        # Input and the 40+ tokens received, at gpt-4o-mini's prices; all of it estimated.
        price = price_of("gpt-4o-mini", {})
        assert day["total"] >= (40 * price.output + 10 * price.input) / 1e6
        assert day["estimated"] == day["total"] and day["by_model"] == {"gpt-4o-mini": day["total"]}

        an = anthropic.Anthropic(base_url=proxy.url, api_key=ALPHA, max_retries=0)
        with an.messages.stream(model="claude-sonnet-4-6", max_tokens=4000, messages=HELLO) as helper:
            for i, _ in enumerate(helper.text_stream):
                if i == 40:
                    break
        slow.wait_for(lambda s: s["cancelled_streams"] == 2)
        before = day["total"]
        day = wait_until(lambda: (d := _spend(proxy, ALPHA)["day"])["total"] > before and d, "alpha's Anthropic stream charged")
        claude = day["by_model"]["claude-sonnet-4-6"]
        assert claude >= (40 * 15) / 1e6  # the output streamed, not message_start's single token
        assert day["estimated"] == pytest.approx(day["total"])
        assert _spend(proxy, BETA)["day"]["total"] == 0  # same provider key, nothing charged to the other team

    ended = [line for line in access_lines if line["team"] == "alpha"]
    assert [line.get("usage") for line in ended] == ["estimated", "estimated"]
    assert all(line["status"] == "cancelled" and line["output_tokens"] >= 40 for line in ended)


def test_a_stream_the_upstream_cuts_is_charged_estimated(tmp_path: Path, emu: RunningEmulator) -> None:
    emu.reset()
    with running_proxy([_teams(tmp_path, emu)]) as proxy:
        oa = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=BETA, max_retries=0)
        emu.inject_fault("disconnect_after:events=12", model="gpt-*")
        with pytest.raises(openai.APIError):
            for _ in oa.chat.completions.create(model="gpt-4o", messages=HELLO, stream=True,
                                                stream_options={"include_usage": True}):
                pass
        day = wait_until(lambda: (d := _spend(proxy, BETA)["day"])["total"] > 0 and d, "the cut stream charged")
        assert day["estimated"] == day["total"]
        assert _spend(proxy, ALPHA)["day"]["total"] == 0


def test_an_openai_stream_without_include_usage_is_charged_the_providers_count(
        tmp_path: Path, emu: RunningEmulator, access_lines: list[dict[str, Any]]) -> None:
    """The gateway asks the upstream for the usage chunk itself and takes it out again: the client
    gets the stream it asked for (no empty `choices`, no `usage` field), the spend is exact."""
    emu.reset()
    direct = openai.OpenAI(base_url=f"{emu.url}/v1", api_key=SHARED_KEY, max_retries=0)
    counted = list(direct.chat.completions.create(model="gpt-4o", messages=HELLO, stream=True,
                                                  stream_options={"include_usage": True}))[-1].usage
    assert counted is not None and counted.completion_tokens > 0

    def chunks(client: openai.OpenAI) -> list[dict[str, Any]]:
        with client.chat.completions.with_streaming_response.create(model="gpt-4o", messages=HELLO, stream=True) as raw:
            body = b"".join(raw.iter_bytes())
        return [orjson.loads(event[6:]) for event in body.split(b"\n\n") if event.startswith(b"data: {")]

    unasked = chunks(direct)
    with running_proxy([_teams(tmp_path, emu)]) as proxy:
        received = chunks(openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=ALPHA, max_retries=0))
        assert [chunk["choices"] for chunk in received] == [chunk["choices"] for chunk in unasked]
        assert [sorted(chunk) for chunk in received] == [sorted(chunk) for chunk in unasked]  # no `usage` key
        day = wait_until(lambda: (d := _spend(proxy, ALPHA)["day"])["total"] > 0 and d, "the stream charged")
        price = price_of("gpt-4o", {})
        assert day["estimated"] == 0
        assert day["total"] == pytest.approx((counted.prompt_tokens * price.input + counted.completion_tokens * price.output) / 1e6)
    line = next(line for line in access_lines if line["team"] == "alpha")
    assert "usage" not in line and line["output_tokens"] == counted.completion_tokens


def test_a_request_cancelled_before_its_first_byte_is_charged_its_input(tmp_path: Path, emu: RunningEmulator) -> None:
    emu.reset()
    with running_proxy([_teams(tmp_path, emu)]) as proxy:
        emu.inject_fault("stall:ms=120000", model="gpt-*")  # the provider reads the prompt, then nothing comes
        impatient = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=ALPHA, max_retries=0, timeout=1.0)
        with pytest.raises(openai.APITimeoutError):
            impatient.chat.completions.create(model="gpt-4o", messages=HELLO, stream=True)
        emu.wait_for(lambda s: s["cancelled_streams"] == 1)  # the proxy dropped the upstream call
        day = wait_until(lambda: (d := _spend(proxy, ALPHA)["day"])["total"] > 0 and d, "the cancelled request charged")
        assert day["estimated"] == day["total"] <= 50 * price_of("gpt-4o", {}).input / 1e6  # its input only
        assert _spend(proxy, BETA)["day"]["total"] == 0


@pytest.mark.parametrize("dropped_by", ["first_byte_timeout", "hedge"])
def test_attempts_dropped_after_they_went_upstream_are_charged_their_input(tmp_path: Path, emu: RunningEmulator,
                                                                           dropped_by: str) -> None:
    """A retry after a first-byte timeout, and a hedge's second leg, send the prompt again: the
    provider read (and bills) the attempt the gateway dropped, but only the answer was charged, so a
    team whose requests stalled (a large prompt, a slow model) spent the shared account's tokens
    uncounted. Each dropped attempt is charged its input now, counted (estimated)."""
    emu.reset()
    retry = ("retry: {max_attempts: 2, base_delay_ms: 1, max_delay_ms: 10, first_byte_timeout_ms: 1000}\n"
             if dropped_by == "first_byte_timeout" else
             "retry: {max_attempts: 2, first_byte_timeout_ms: 60000}\nhedging: {enabled: true, delay_ms: 50}\n")
    for team, key in (("alpha", ALPHA), ("beta", BETA)):
        write_policy(tmp_path, team, key, emu.url, extra="prompt_cache: {enabled: false}\n" + retry, upstream_key=SHARED_KEY)
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Summarise the tides. " * 200}], "max_tokens": 8}
    with running_proxy([tmp_path]) as proxy:
        emu.inject_fault("stall:ms=60000", model="gpt-*")  # the first attempt is read, then nothing comes
        answer = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=ALPHA, max_retries=0).chat.completions.create(**body)
        emu.wait_for(lambda s: s["cancelled_requests"] == 1 and s["requests_total"] == 2)  # one dropped, one answered
        price = price_of("gpt-4o", {})
        assert answer.usage is not None
        answered = (answer.usage.prompt_tokens * price.input + answer.usage.completion_tokens * price.output) / 1e6
        read = input_tokens(LLMRequest(Endpoint.CHAT_COMPLETIONS, body)) * price.input / 1e6
        day = wait_until(lambda: (d := _spend(proxy, ALPHA)["day"])["total"] > answered * 1.01 and d, "the dropped attempt charged")
        assert day["estimated"] == pytest.approx(read, abs=1e-6)  # $0 before: only the answer was charged (the report rounds)
        assert day["total"] == pytest.approx(answered + read, abs=1e-6)
        assert _spend(proxy, BETA)["day"]["total"] == 0


async def test_the_drop_in_sdk_charges_a_stream_it_closed(tmp_path: Path, slow: RunningEmulator,
                                                         access_lines: list[dict[str, Any]]) -> None:
    policy = write_policy(tmp_path, "dropin-spend", ALPHA, slow.url, extra=PLAIN, upstream_key=SHARED_KEY)
    client = sdk.AsyncOpenAI(policy=policy, max_retries=0)
    stream = await client.chat.completions.create(model="gpt-4o-mini", messages=HELLO, stream=True)
    read = 0
    async for chunk in stream:
        read += bool(chunk.choices and chunk.choices[0].delta.content)
        if read == 30:
            break
    await stream.close()
    await asyncio.to_thread(slow.wait_for, lambda s: s["cancelled_streams"] == 1)
    spent = metrics.SPEND.labels("dropin-spend", "", "gpt-4o-mini")._value.get()
    assert spent >= 30 * price_of("gpt-4o-mini", {}).output / 1e6
    line = next(line for line in access_lines if line["team"] == "dropin-spend")
    assert line["usage"] == "estimated" and line["output_tokens"] >= 30
    await client.close()


def test_a_budgeted_team_cannot_spend_on_a_model_without_a_price(tmp_path: Path, emu: RunningEmulator) -> None:
    emu.reset()
    extra = "budget: {usd: 5, period: day}\n"
    (tmp_path / "alpha.yaml").write_text(f"""team: alpha
api_keys: [{{value: "{ALPHA}"}}]
providers:
  gpt: {{kind: openai, base_url: "{emu.url}/v1", api_key: "{SHARED_KEY}"}}
routes:
  - match: {{model: "*"}}
    targets: [{{provider: gpt}}]
{PLAIN}{extra}""")
    with running_proxy([tmp_path]) as proxy:
        oa = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=ALPHA, max_retries=0)
        with pytest.raises(openai.PermissionDeniedError) as refused:
            oa.chat.completions.create(model="my-finetune-v2", messages=HELLO, max_tokens=16)
        message = refused.value.body["message"]
        assert "pricing:" in message and "'my-finetune-v2'" in message and '"my-finetune-v2"' in message
        assert emu.stats()["requests_total"] == 0  # refused before anything left
        for model in ("o3", "gpt-4-turbo"):  # priced now: charged, not $0
            oa.chat.completions.create(model=model, messages=HELLO, max_tokens=16)
        by_model = _spend(proxy, ALPHA)["day"]["by_model"]
        assert by_model["o3"] > 0 and by_model["gpt-4-turbo"] > 0


def test_a_client_naming_new_models_cannot_flood_the_log(tmp_path: Path, emu: RunningEmulator,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """Model names come from clients: each unpriced one is logged once, for the first
    UNPRICED_WARNINGS of a team, then one line says the rest are not (a line per request filled a
    benchmark's unread log pipe and stopped the proxy)."""
    from sdk.limits.stage import UNPRICED_WARNINGS

    emu.reset()
    _teams(tmp_path, emu)
    with caplog.at_level(logging.WARNING, logger="slipstream.spend"), running_proxy([tmp_path]) as proxy:
        oa = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=ALPHA, max_retries=0)
        for i in range(UNPRICED_WARNINGS + 8):
            oa.chat.completions.create(model=f"gpt-invented-{i}", messages=HELLO, max_tokens=4)
        oa.chat.completions.create(model="gpt-invented-0", messages=HELLO, max_tokens=4)  # seen: no new line
    lines = [r.getMessage() for r in caplog.records if "has no price" in r.getMessage()]
    assert len(lines) == UNPRICED_WARNINGS and "further unpriced models" in lines[-1]
    assert emu.stats()["requests_total"] == UNPRICED_WARNINGS + 9  # every request answered


def test_every_choice_is_held_against_the_budget(tmp_path: Path, slow: RunningEmulator) -> None:
    """A request asking for `n` choices (or `best_of` completions) without an output limit is billed
    for every one of them, but held only one choice's default: 128 choices held a 128th of their
    worst cost, so parallel requests passed the budget by far more than one reservation."""
    body = {"model": "gpt-4o", "messages": HELLO, "n": 4}
    with running_proxy([_teams(tmp_path, slow, "budget: {usd: 1000, period: day}\n")]) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=ALPHA, max_retries=0)
        with client.chat.completions.create(**body, stream=True) as stream:
            next(iter(stream))  # in flight: its hold is on the budget
            held = _spend(proxy, ALPHA)["budget"]["held"]
    request = LLMRequest(Endpoint.CHAT_COMPLETIONS, body)
    assert output_limit(request) == 4 * DEFAULT_OUTPUT_TOKENS
    assert held == pytest.approx(worst_cost_usd(input_tokens(request), 4 * DEFAULT_OUTPUT_TOKENS, price_of("gpt-4o", {})), rel=1e-3)
    completion = {"model": "gpt-3.5-turbo-instruct", "prompt": "Once", "max_tokens": 16, "best_of": 5, "n": 2}
    assert output_limit(LLMRequest(Endpoint.CHAT_COMPLETIONS, completion)) == 5 * 16  # best_of are all billed


def test_parallel_requests_overshoot_a_budget_by_at_most_one_reservation(tmp_path: Path, emu: RunningEmulator) -> None:
    emu.reset()
    # Each answer costs about $0.0003 (≈ 20 input + 16 output tokens of gpt-4o); the budget is two of them.
    budget = 0.0006
    with running_proxy([_teams(tmp_path, emu, f"budget: {{usd: {budget}, period: day}}\n")]) as proxy:
        answered = answered_within_budget(
            [proxy], ALPHA, lambda client: client.chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=16))
        spent = _spend(proxy, ALPHA)["day"]["total"]
    request = LLMRequest(Endpoint.CHAT_COMPLETIONS, {"model": "gpt-4o", "messages": HELLO, "max_tokens": 16})
    reservation = worst_cost_usd(input_tokens(request), output_limit(request), price_of("gpt-4o", {}))
    assert answered >= 1
    assert answered <= budget / reservation + 1  # in-flight requests hold their worst cost
    assert spent <= budget + reservation  # the documented bound (docs/spend.md), not 32×
    assert emu.stats()["requests_total"] == answered


async def test_holds_are_shared_across_replicas_over_redis() -> None:
    """Two replicas on one Redis: what one admitted holds against the other's admissions, and settling frees it."""
    pytest.importorskip("redis")
    from gateway.testing import running_redis
    from sdk.policy import BudgetPolicy
    from sdk.spend import budget_check
    from sdk.state import open_state
    from sdk.state.backend import Admission, Settlement

    with running_redis() as server:
        url = f"{server.url}?prefix=holds&timeout_ms=500"
        first, second = open_state(url), open_state(url)
        budget = BudgetPolicy(usd=1.0, period="day")
        held = Admission("lease-a", budget=budget_check("shared", budget, reserve=0.7))
        assert await first.admit(held) is None
        assert await second.admit(Admission("lease-b", budget=budget_check("shared", budget, reserve=0.7))) is None
        refused = await second.admit(Admission("lease-c", budget=budget_check("shared", budget, reserve=0.7)))
        assert refused is not None and refused.kind == "budget" and refused.value >= 1.0  # 1.4 held by two replicas
        first.settle(Settlement("lease-a", budget=held.budget))
        second.settle(Settlement("lease-b", budget=held.budget))
        await first.close()
        await second.close()
        third = open_state(url)
        assert await third.admit(Admission("lease-d", budget=budget_check("shared", budget, reserve=0.7))) is None
        await third.close()


def test_two_replicas_over_redis_bound_the_overshoot_together(tmp_path: Path, emu: RunningEmulator) -> None:
    """The same 60 parallel requests, spread over two proxies sharing one Redis: still one reservation."""
    pytest.importorskip("redis")
    from gateway.testing import running_redis

    emu.reset()
    budget = 0.0006
    policies = _teams(tmp_path, emu, f"budget: {{usd: {budget}, period: day}}\n")
    with running_redis() as server:
        url = f"{server.url}?prefix=overshoot&timeout_ms=500"
        with running_proxy([policies], state_url=url) as one, running_proxy([policies], state_url=url) as two:
            answered = answered_within_budget(
                [two, one], ALPHA, lambda client: client.chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=16))
        spent = asyncio.run(_total_in_redis(url, "alpha"))  # both replicas closed: every charge has reached Redis
    request = LLMRequest(Endpoint.CHAT_COMPLETIONS, {"model": "gpt-4o", "messages": HELLO, "max_tokens": 16})
    reservation = worst_cost_usd(input_tokens(request), output_limit(request), price_of("gpt-4o", {}))
    assert 1 <= answered <= budget / reservation + 1
    assert 0 < spent <= budget + reservation
    assert emu.stats()["requests_total"] == answered


async def _total_in_redis(url: str, team: str) -> float:
    from sdk.spend import periods, record_key
    from sdk.state import open_state

    state = open_state(url)
    try:
        return (await state.spend(record_key(team, periods()[0]))).get("total", 0.0)
    finally:
        await state.close()
