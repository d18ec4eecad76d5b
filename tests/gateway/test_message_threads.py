"""Anthropic's message threads (beta `message-threads-2026-08-12`) and cache diagnostics name an earlier answer by
its id, and Anthropic keeps what they read for the account every team sharing the provider key shares. Through
the proxy with the official anthropic client, the emulator upstream (one key, `up-anthropic`, for both teams)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import orjson
import pytest

from emulator.testing import RunningEmulator
from gateway.testing import RunningServer, running_proxy
from sdk.estimate import input_tokens
from sdk.limits.stage import RESERVE_EXACT_CHARS
from sdk.spend import price_of, worst_cost_usd
from sdk.types import Endpoint, LLMRequest
from tests.helpers import anth, spend_report, write_policy

A, B = "sk-alpha-message-threads", "sk-beta-message-threads"
BETA = "message-threads-2026-08-12"
MODEL = "claude-haiku-4-5"  # no long-context rates: the hold is linear in its tokens
SECRET = [{"role": "user", "content": "Our launch code is 7-4-1-9. Remember it."}]
NEXT = [{"role": "user", "content": "What did I ask you to remember?"}]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory, emulator: RunningEmulator) -> Path:
    """Two teams on one provider key; the folder's `proxy` (tests/gateway/conftest.py) serves them."""
    directory = tmp_path_factory.mktemp("message-threads")
    for team, key in (("alpha", A), ("beta", B)):
        write_policy(directory, team, key, emulator.url)
    return directory


def _create(client: anthropic.Anthropic, stream: bool, messages: list[dict[str, Any]], **extra: Any) -> str:
    """A Thread created (or a diagnosed turn), whole or streamed: its answer's id."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 50, "messages": messages, "betas": [BETA], **extra}
    if stream:
        with client.beta.messages.stream(**body) as events:
            return events.get_final_message().id
    return client.beta.messages.create(**body).id


def _sent(emulator: RunningEmulator, message_id: str) -> list[str]:
    return [r["path"] for r in emulator.app.state.recent if message_id.encode() in (r["body"] or b"")]


@pytest.mark.parametrize("stream", [False, True])
def test_another_teams_thread_cannot_be_continued(proxy: RunningServer, fresh_emulator: RunningEmulator, stream: bool) -> None:
    """`thread: continue` went upstream as sent: team beta, naming alpha's message id, was answered from alpha's
    conversation (the provider holds it for the shared key). Now an id the gateway did not answer the team with
    (another team's, or one it never saw) is Anthropic's 404 for an unknown Thread (`thread_not_found`, on which
    the SDK's threads replay the conversation whole), and nothing is sent; the owner continues its own."""
    alpha, beta = anth(proxy, A), anth(proxy, B)
    created = _create(alpha, stream, SECRET, thread={"type": "create"})
    fresh_emulator.app.state.recent.clear()

    refusals = []
    for named in (created, "msg_0123456789abcdef"):
        with pytest.raises(anthropic.NotFoundError) as refused:
            _create(beta, stream, NEXT, thread={"type": "continue", "previous_message_id": named})
        assert refused.value.error_code == "thread_not_found"
        refusals.append(refused.value.response.text.replace(named, "ID"))
    assert refusals[0] == refusals[1]  # no oracle for ids
    assert _sent(fresh_emulator, created) == []  # the provider never saw the id from beta

    followed = alpha.beta.messages.create(model=MODEL, max_tokens=50, messages=NEXT, betas=[BETA],  # type: ignore[arg-type]
                                          thread={"type": "continue", "previous_message_id": created})
    assert followed.usage.input_tokens > 20  # the provider read the thread's conversation with the new turn
    assert _sent(fresh_emulator, created) == ["/v1/messages"]
    # and the continued answer is alpha's too: a later turn continues from it, beta cannot
    with pytest.raises(anthropic.NotFoundError):
        _create(beta, False, NEXT, thread={"type": "continue", "previous_message_id": followed.id})
    assert _create(alpha, False, NEXT, thread={"type": "continue", "previous_message_id": followed.id})


def test_another_teams_message_cannot_be_compared_with(proxy: RunningServer, fresh_emulator: RunningEmulator) -> None:
    """`diagnostics.previous_message_id` has Anthropic compare that request's prompt with this one, a probe of
    another team's prompt under the shared key: another team's id and an unknown one are the same 404, unsent."""
    alpha, beta = anth(proxy, A), anth(proxy, B)
    first = _create(alpha, False, SECRET, diagnostics={"previous_message_id": None})
    fresh_emulator.app.state.recent.clear()
    refusals = []
    for named in (first, "msg_fedcba9876543210"):
        with pytest.raises(anthropic.NotFoundError) as refused:
            _create(beta, False, SECRET, diagnostics={"previous_message_id": named})
        refusals.append(refused.value.response.text.replace(named, "ID"))
    assert refusals[0] == refusals[1]
    assert _sent(fresh_emulator, first) == []
    assert _create(alpha, False, SECRET + [{"role": "assistant", "content": "Noted."}] + NEXT,
                   diagnostics={"previous_message_id": first})
    assert _sent(fresh_emulator, first) == ["/v1/messages"]


def test_a_continue_turns_hold_counts_the_threads_context(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A `continue` turn sends only its new turn, and the provider bills the Thread's whole context with it: the
    hold counted the new turn alone, so a team continuing a long thread ran requests its budget had no room for.
    The hold counts the context the gateway recorded at the message it continues (the answer's input and output)."""
    monkeypatch.setattr(fresh_emulator.config, "per_output_token_ms", 20.0)  # still streaming when the hold is read
    price = price_of(MODEL, {})
    assert price is not None
    budget = 0.02  # a request is admitted while the period's spend and holds are below it
    extra = f"prompt_cache: {{enabled: false}}\nbudget: {{usd: {budget}, period: day}}\n"
    long = [{"role": "user", "content": "Contract clause under review. " * 2000}]
    with running_proxy([write_policy(tmp_path, "alpha", A, fresh_emulator.url, extra=extra)]) as proxy:
        created = anth(proxy, A).beta.messages.create(model=MODEL, max_tokens=50, messages=long, betas=[BETA],  # type: ignore[arg-type]
                                                      thread={"type": "create"})
        context = created.usage.input_tokens + created.usage.output_tokens
        turn = {"model": MODEL, "max_tokens": 100, "messages": NEXT, "betas": [BETA],
                "thread": {"type": "continue", "previous_message_id": created.id}}
        prompt = input_tokens(LLMRequest(Endpoint.MESSAGES, {k: v for k, v in turn.items() if k != "betas"}),
                              RESERVE_EXACT_CHARS, worst=True)
        held_before, held_now = worst_cost_usd(prompt, 100, price), worst_cost_usd(prompt + context, 100, price)
        spent = float(spend_report(proxy, A)["budget"]["spent"])
        assert spent + held_before < budget <= spent + held_now  # beside the old hold a request fits; beside the thread's, none
        turn["extra_headers"] = {"x-emulator-output-tokens": "100"}  # still streaming when the hold is read
        held = _held_while_continuing(proxy, turn, {"model": MODEL, "max_tokens": 10, "messages": NEXT})
    assert held == pytest.approx(held_now, rel=1e-3)  # before: held_before


def _held_while_continuing(proxy: RunningServer, turn: dict[str, Any], beside: dict[str, Any]) -> float:
    """held_while_streaming, for a beta Messages turn (`thread` is the beta client's)."""
    client = anth(proxy, A)
    with client.beta.messages.stream(**turn) as stream:
        next(iter(stream))
        held = float(spend_report(proxy, A)["budget"]["held"])
        with pytest.raises(anthropic.RateLimitError, match="budget"):
            client.messages.create(**beside)
    return held




def test_a_message_batch_cannot_continue_another_teams_thread(proxy: RunningServer, fresh_emulator: RunningEmulator) -> None:
    """A message batch's requests are run by Anthropic under the shared key into results the team reads: one
    naming another team's message id (a Thread to continue, a prompt to compare with) is the same 404, and
    no batch is created."""
    created = _create(anth(proxy, A), False, SECRET, thread={"type": "create"})
    beta = anth(proxy, B)
    fresh_emulator.app.state.recent.clear()
    for named in ({"thread": {"type": "continue", "previous_message_id": created}}, {"diagnostics": {"previous_message_id": created}}):
        with pytest.raises(anthropic.NotFoundError):
            beta.messages.batches.create(requests=[{"custom_id": "x", "params": {"model": MODEL, "max_tokens": 50,  # type: ignore[typeddict-unknown-key]
                                                                                 "messages": NEXT, **named}}])
    assert _sent(fresh_emulator, created) == []


def test_a_message_batch_continuing_a_thread_counts_its_context(tmp_path: Path, fresh_emulator: RunningEmulator) -> None:
    """A message batch is created only if its worst cost fits what is left of the budget, and a request
    continuing a Thread is billed the thread's context: it counted the request's new turn alone."""
    budget = 0.013
    extra = f"prompt_cache: {{enabled: false}}\nbudget: {{usd: {budget}, period: day}}\n"
    long = [{"role": "user", "content": "Contract clause under review. " * 2000}]
    price = price_of(MODEL, {})
    assert price is not None
    with running_proxy([write_policy(tmp_path, "alpha", A, fresh_emulator.url, extra=extra)]) as proxy:
        client = anth(proxy, A)
        created = client.beta.messages.create(model=MODEL, max_tokens=50, messages=long, betas=[BETA],  # type: ignore[arg-type]
                                              thread={"type": "create"})
        context = created.usage.input_tokens + created.usage.output_tokens
        params = {"model": MODEL, "max_tokens": 50, "messages": NEXT, "thread": {"type": "continue", "previous_message_id": created.id}}
        prompt = input_tokens(LLMRequest(Endpoint.MESSAGES, params), RESERVE_EXACT_CHARS, worst=True)
        spent = float(spend_report(proxy, A)["budget"]["spent"])
        assert spent + worst_cost_usd(prompt, 50, price) / 2 < budget < spent + worst_cost_usd(prompt + context, 50, price) / 2
        with pytest.raises(anthropic.RateLimitError, match="budget"):  # before: created
            client.messages.batches.create(requests=[{"custom_id": "x", "params": params}])  # type: ignore[list-item]


def test_the_sdks_tool_runner_threads_through_the_gateway(proxy: RunningServer, fresh_emulator: RunningEmulator) -> None:
    """The anthropic SDK's tool runner threads by default: it creates a Thread, then continues it with only the
    new turn, naming the answer it was given; that answer is the team's, so the turn goes on to Claude."""
    ran: list[str] = []

    @anthropic.beta_tool
    def weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return "18C and sunny"

    runner = anth(proxy, A).beta.messages.tool_runner(model=MODEL, max_tokens=256, tools=[weather],
                                                      messages=[{"role": "user", "content": "What is the weather in Paris? Use weather."}])
    final = runner.until_done()
    assert ran and final.stop_reason == "end_turn"
    threads = [orjson.loads(r["body"]).get("thread") for r in fresh_emulator.app.state.recent if r["path"] == "/v1/messages"]
    assert [t["type"] for t in threads] == ["create", "continue"]
