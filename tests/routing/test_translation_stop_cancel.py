"""A stream cut at a stop the gateway applies ends there, and its upstream call is cancelled.

Some stop sequences are the gateway's, not the upstream's (stops.py): a Chat client's whitespace-only stops, which
Claude refuses, and a Messages client's stop sequences an OpenAI reasoning model refuses (or more than OpenAI's 4).
The gateway cut the answer where the first one appeared but went on reading the upstream until the model finished on
its own: the client's stream ended only then, and the model wrote (and was billed) on past the stop for text nobody
saw. Now the stream ends at the stop, its terminal events at once, and the upstream connection is dropped, which the
emulator counts as a cancelled stream; the usage is the gateway's count of what was written up to the cut, charged
marked estimated. The official clients through the proxy; the emulator streams slowly (20 ms a token, 400 tokens:
8 s a stream) so that an upstream read to its end can only be the old behaviour.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from emulator.app import EmulatorConfig
from emulator.testing import running_emulator
from gateway.testing import running_proxy
from tests.helpers import wait_until
from tests.routing.conftest import policy_text
from tests.routing.test_translation_client_fields import ROUTES  # claude-o3-* → o3, claude-* → gpt-4o, gpt-* → Claude

ASK: Any = [{"role": "user", "content": "Write a long story."}]
KEY = "sk-routing"
WHOLE = 400  # tokens in the emulator's whole answer


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[tuple[Any, str]]:
    config = EmulatorConfig(per_output_token_ms=20.0, default_output_tokens=WHOLE)
    with running_emulator(config) as upstream:
        directory = tmp_path_factory.mktemp("stop_cancel")
        (directory / "routing.yaml").write_text(policy_text(upstream.url, ROUTES))
        with running_proxy([directory], watch_interval_s=None) as proxy:
            yield upstream, proxy.url


def _stats(upstream: Any) -> dict[str, Any]:
    return httpx.get(f"{upstream.url}/_emulator/stats").json()


def _ended(upstream: Any) -> dict[str, Any]:
    """The emulator's counters once its one stream has ended, cancelled or written to its end."""
    return wait_until(lambda: (s := _stats(upstream))["cancelled_streams"] + s["completed_streams"] >= 1 and s, "the upstream stream ended")


def _estimated(proxy: str) -> float:
    spend = httpx.get(f"{proxy}/v1/slipstream/spend", headers={"authorization": f"Bearer {KEY}"})
    spend.raise_for_status()
    return float(spend.json()["day"]["estimated"])


def test_a_chat_stream_cut_at_a_whitespace_stop_ends_there_and_cancels_claude(stack):
    """stop=[" "] (whitespace, which Claude refuses) to a Claude model: the client's stream ends after the first word
    with finish_reason stop and its usage chunk, and the Claude call is cancelled, not read on to its 400th token."""
    upstream, proxy = stack
    httpx.post(f"{upstream.url}/_emulator/reset").raise_for_status()
    before = _estimated(proxy)
    client = openai.OpenAI(base_url=f"{proxy}/v1", api_key=KEY, max_retries=0)
    chunks = list(client.chat.completions.create(model="gpt-x", messages=ASK, stop=[" ", "\n"], stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and " " not in text  # the first word
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    assert usage.prompt_tokens > 0 and 0 < usage.completion_tokens < WHOLE  # what was written up to the cut
    stats = _ended(upstream)
    assert stats["cancelled_streams"] == 1 and stats["completed_streams"] == 0  # cancelled, not read to its end
    wait_until(lambda: _estimated(proxy) > before, "the cut stream's spend, marked estimated")


@pytest.mark.parametrize("model", ["claude-o3-x", "claude-x"])
def test_a_messages_stream_cut_at_a_stop_the_gateway_applies_ends_there_and_cancels_the_openai_model(stack, model):
    """stop_sequences to o3 (which takes none) or five of them to gpt-4o (OpenAI takes 4): the client's stream ends at
    the stop with stop_reason stop_sequence naming it and its usage, and the OpenAI call is cancelled."""
    upstream, proxy = stack
    httpx.post(f"{upstream.url}/_emulator/reset").raise_for_status()
    before = _estimated(proxy)
    client = anthropic.Anthropic(base_url=proxy, api_key=KEY, max_retries=0)
    stops = [" ", *(f"<never {i}>" for i in range(4))] if model == "claude-x" else [" "]
    with client.messages.stream(model=model, max_tokens=WHOLE, messages=ASK, stop_sequences=stops) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == " "
    assert final.content[0].type == "text" and final.content[0].text and " " not in final.content[0].text
    assert final.usage.input_tokens > 0 and 0 < final.usage.output_tokens < WHOLE
    stats = _ended(upstream)
    assert stats["cancelled_streams"] == 1 and stats["completed_streams"] == 0
    wait_until(lambda: _estimated(proxy) > before, "the cut stream's spend, marked estimated")


def test_each_choice_of_a_chat_stream_for_several_ends_at_the_stop_and_cancels_its_claude_call(stack):
    """n=2 on Claude is two Claude requests (choices.py): each choice ends at the stop with its finish chunk, each
    request is cancelled there, and the merged stream ends with the usage chunk, both choices' counts summed."""
    upstream, proxy = stack
    httpx.post(f"{upstream.url}/_emulator/reset").raise_for_status()
    client = openai.OpenAI(base_url=f"{proxy}/v1", api_key=KEY, max_retries=0)
    chunks = list(client.chat.completions.create(model="gpt-x", messages=ASK, stop=" ", n=2, stream=True,
                                                 stream_options={"include_usage": True}))
    finishes = sorted((c.choices[0].index, c.choices[0].finish_reason) for c in chunks if c.choices and c.choices[0].finish_reason)
    assert finishes == [(0, "stop"), (1, "stop")]
    for index in (0, 1):
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == index)
        assert text and " " not in text
    usage = chunks[-1].usage
    assert usage is not None and 0 < usage.completion_tokens < 2 * WHOLE
    stats = wait_until(lambda: (s := _stats(upstream))["cancelled_streams"] + s["completed_streams"] >= 2 and s, "both streams ended")
    assert stats["cancelled_streams"] == 2 and stats["completed_streams"] == 0


def test_a_reasoning_models_cut_stream_is_charged_its_output_limit(stack):
    """An OpenAI reasoning model's reasoning is billed as output but not streamed, so the text counted up to the cut is
    not all it wrote: the cut stream is charged the output limit it was sent (all it can have written, marked estimated),
    where it was charged the text alone and a team could spend past its budget by cutting streams. gpt-4o, which does
    not reason, is still charged what it wrote. The client's usage is what it was sent, either way."""
    upstream, proxy = stack
    client = anthropic.Anthropic(base_url=proxy, api_key=KEY, max_retries=0)
    charged = {}
    for model in ("claude-o3-x", "claude-x"):
        httpx.post(f"{upstream.url}/_emulator/reset").raise_for_status()
        before = _estimated(proxy)
        stops = [" "] if model == "claude-o3-x" else [" ", *(f"<never {i}>" for i in range(4))]
        with client.messages.stream(model=model, max_tokens=WHOLE, messages=ASK, stop_sequences=stops) as stream:
            final = stream.get_final_message()
        assert final.stop_reason == "stop_sequence" and 0 < final.usage.output_tokens < WHOLE
        _ended(upstream)
        charged[model] = wait_until(lambda start=before: (now := _estimated(proxy)) > start and now - start, "the cut stream's spend")
    assert charged["claude-o3-x"] >= WHOLE * 8 / 1e6  # o3's output at $8 a million tokens, all 400 of its limit
    assert charged["claude-x"] < WHOLE * 10 / 1e6 / 4  # gpt-4o's ($10): the few tokens it wrote
