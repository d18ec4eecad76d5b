"""A client that leaves a stream once its answer has finished, before the usage that follows: the gateway
reads on to the usage (bounded) and charges it, rather than closing the upstream and estimating from the
text, which leaves out what a reasoning model thought. Through the proxy with the official clients, the
emulator upstream; what is charged is read from the spend report."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from emulator.testing import RunningEmulator
from gateway.testing import RunningServer, running_proxy
from tests.helpers import anth, oai, spend_report, wait_until, write_policy

KEY = "sk-usage-after-finish"
THINKING = {"model": "gpt-5-mini", "reasoning_effort": "high", "messages": [{"role": "user", "content": "Think, then answer."}]}


def _spent(proxy: RunningServer) -> tuple[float, float]:
    day = spend_report(proxy, KEY)["day"]
    return float(day["total"]), float(day["estimated"])


def _charged(proxy: RunningServer, before: float, ask: Callable[[], Any]) -> tuple[float, float]:
    """What `ask` was charged once its request settled, and how much of that was estimated."""
    ask()
    total, estimated = wait_until(lambda: (spent := _spent(proxy))[0] > before and spent, "the request's charge")
    return total - before, estimated


def _left_after_finish(client: openai.OpenAI) -> None:
    """The openai client's stream, closed at the chunk that finishes the answer (as a client that stops at
    `finish_reason` does), before the usage chunk the gateway asked for."""
    with client.chat.completions.create(**THINKING, stream=True) as stream:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason:
                break


def _read_whole(client: openai.OpenAI) -> None:
    with client.chat.completions.create(**THINKING, stream=True) as stream:
        for _ in stream:
            pass


def test_a_client_leaving_after_the_finish_is_charged_the_usage_that_follows(
        tmp_path: Path, fresh_emulator: RunningEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The usage chunk comes after the finish chunk (here 300 ms after, as a provider may send it): a client
    that left at the finish had the upstream closed, and was charged an estimate of the text it was sent,
    without the 32 reasoning tokens the provider billed. Now it is charged the provider's usage, as a client
    that read the stream whole is."""
    monkeypatch.setattr(fresh_emulator.config, "usage_delay_ms", 300.0)
    with running_proxy([write_policy(tmp_path, "usage", KEY, fresh_emulator.url)]) as proxy:
        client = oai(proxy, KEY)
        whole, whole_estimated = _charged(proxy, 0.0, lambda: _read_whole(client))
        left, left_estimated = _charged(proxy, whole, lambda: _left_after_finish(client))
        stats = httpx.get(f"{fresh_emulator.url}/_emulator/stats").json()
    assert whole_estimated == 0.0
    assert left_estimated == 0.0  # before: the whole charge estimated
    assert left == pytest.approx(whole, abs=2e-6)  # the report rounds to a millionth; before: less (the text only)
    assert stats["completed_streams"] == 2  # read on to the end of the upstream stream, not cut at the finish


def test_anthropic_and_responses_streams_carry_the_usage_with_the_finish(tmp_path: Path, fresh_emulator: RunningEmulator) -> None:
    """Claude's `message_delta` carries the stop reason and the usage together, and a Responses stream's
    `response.completed` is its finish and its usage: a client leaving at either is charged exactly."""
    with running_proxy([write_policy(tmp_path, "usage", KEY, fresh_emulator.url)]) as proxy:
        claude, gpt = anth(proxy, KEY), oai(proxy, KEY)

        def left_claude() -> None:
            with claude.messages.stream(model="claude-haiku-4-5", max_tokens=100,
                                        messages=[{"role": "user", "content": "Hello"}]) as stream:
                for event in stream:
                    if event.type == "message_delta":
                        break

        def left_responses() -> None:
            with gpt.responses.create(model="gpt-5-mini", input="Think, then answer.", reasoning={"effort": "high"},
                                      stream=True) as stream:
                for event in stream:
                    if event.type == "response.completed":
                        break

        total = 0.0
        for ask in (left_claude, left_responses):
            charged, estimated = _charged(proxy, total, ask)
            total += charged
            assert estimated == 0.0


COMPLETION = {"model": "gpt-3.5-turbo-instruct", "prompt": "Once upon a time", "max_tokens": 400, "stream": True,
              "stream_options": {"include_usage": True}}


@pytest.mark.parametrize("asked", [True, False])
def test_a_legacy_completion_client_leaving_after_the_finish_is_charged_its_usage(
        tmp_path: Path, fresh_emulator: RunningEmulator, monkeypatch: pytest.MonkeyPatch, asked: bool) -> None:
    """The pass-through `/v1/completions` stream, asked for with `include_usage`: its usage chunk follows the
    finish chunk (here 300 ms after), and a client that left at the finish had the upstream closed and was
    charged its worst case (the prompt and all of `max_tokens`, marked estimated). It is read on to the usage
    (bounded, as a Chat stream is) and charged exactly, as a client that read the stream whole is. A stream
    whose client did not ask for its usage was charged its worst case however it was read: the gateway asks
    for the usage chunk itself, as for a Chat stream, and takes it out of what the client reads."""
    monkeypatch.setattr(fresh_emulator.config, "usage_delay_ms", 300.0)
    ask = COMPLETION if asked else {k: v for k, v in COMPLETION.items() if k != "stream_options"}
    chunks: list[Any] = []
    priced = 'pricing: {"gpt-3.5-*": {input: 1000, output: 1000}}\n'  # dollars a token: what the report rounds shows
    with running_proxy([write_policy(tmp_path, "usage", KEY, fresh_emulator.url, extra=priced)]) as proxy:
        client = oai(proxy, KEY)

        def read_whole() -> None:
            with client.completions.create(**ask) as stream:  # type: ignore[call-overload]
                chunks.extend(stream)

        def left_at_finish() -> None:
            with client.completions.create(**ask) as stream:  # type: ignore[call-overload]
                for chunk in stream:
                    if chunk.choices and chunk.choices[0].finish_reason:
                        break

        whole, whole_estimated = _charged(proxy, 0.0, read_whole)
        left, left_estimated = _charged(proxy, whole, left_at_finish)
        stats = httpx.get(f"{fresh_emulator.url}/_emulator/stats").json()
    assert whole_estimated == 0.0  # without asking, before: the worst case, estimated
    assert left_estimated == 0.0  # before: the whole charge estimated
    assert left == pytest.approx(whole, abs=2e-6)  # before: the worst case, 400 output tokens
    assert stats["completed_streams"] == 2
    usage = [chunk for chunk in chunks if chunk.usage is not None]
    assert len(usage) == (1 if asked else 0) and all(chunk.choices for chunk in chunks if chunk.usage is None)
