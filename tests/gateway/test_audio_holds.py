"""Audio a Chat request makes the provider read is held at what it may bill (docs/spend.md, "Requests in
flight: the bound"): an `input_audio` clip by its duration (it was held as one image), and an earlier spoken
answer named by its audio id, which OpenAI reads again as input (it was held as nothing). Through the proxy
with the official client, the emulator upstream; the hold read while a stream runs."""

from __future__ import annotations

import base64
import struct
from pathlib import Path
from typing import Any

import openai
import pytest

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from sdk.estimate import input_tokens
from sdk.limits.stage import RESERVE_EXACT_CHARS
from sdk.spend import price_of, worst_cost_usd
from sdk.types import Endpoint, LLMRequest
from tests.helpers import oai, spend_report, write_policy

KEY = "sk-team-audio-holds"
PLAIN = "retry: {max_attempts: 1}\nprompt_cache: {enabled: false}\n"
MODEL = "gpt-4o"
QUESTION = {"role": "user", "content": "What did I say?"}


def _wav(seconds: int, rate: int = 8_000) -> str:
    """A mono 8-bit WAV clip of `seconds` of silence, as base64."""
    samples = b"\x80" * (rate * seconds)
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate, 1, 8)
    riff = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(samples)) + samples
    return base64.b64encode(b"RIFF" + struct.pack("<I", len(riff)) + riff).decode()


def _held(proxy: Any, client: openai.OpenAI, messages: list[dict[str, Any]]) -> float:
    with client.chat.completions.create(model=MODEL, max_completion_tokens=100, messages=messages, stream=True) as stream:
        next(iter(stream))  # in flight: its hold is on the budget
        return float(spend_report(proxy, KEY)["budget"]["held"])


def _tokens_usd(tokens: int) -> float:
    price = price_of(MODEL, {})
    assert price is not None
    return worst_cost_usd(tokens, 0, price)


def test_audio_is_held_by_its_duration_and_an_earlier_answers_audio_at_the_most_one_carries(
        tmp_path: Path, fresh_emulator: RunningEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 10-second WAV clip holds 200 tokens (20 a second, the higher of OpenAI's audio rates), not an
    image's 3,800; an assistant turn naming an earlier spoken answer by id holds 16,384 tokens (the audio
    models' output limit: the most that answer's audio can be), where it held nothing."""
    monkeypatch.setattr(fresh_emulator.config, "per_output_token_ms", 5.0)  # still streaming when the hold is read
    clip = {"role": "user", "content": [{"type": "text", "text": "Transcribe."},
                                        {"type": "input_audio", "input_audio": {"data": _wav(10), "format": "wav"}}]}
    with running_proxy([write_policy(tmp_path, "audio", KEY, fresh_emulator.url, extra=PLAIN + "budget: {usd: 100, period: day}\n")]) as proxy:
        client = oai(proxy, KEY)
        plain = _held(proxy, client, [QUESTION])
        heard = _held(proxy, client, [clip, QUESTION]) - plain
        spoken = client.chat.completions.create(model=MODEL, modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"},
                                                messages=[QUESTION])
        assert spoken.choices[0].message.audio is not None
        again = [QUESTION, {"role": "assistant", "audio": {"id": spoken.choices[0].message.audio.id}}, QUESTION]
        reread = _held(proxy, client, again) - _held(proxy, client, [QUESTION, {"role": "assistant", "content": ""}, QUESTION])
    text_of_clip = input_tokens(LLMRequest(Endpoint.CHAT_COMPLETIONS, {"messages": [{"role": "user", "content": "Transcribe."}]}),
                                RESERVE_EXACT_CHARS, worst=True)
    assert reread == pytest.approx(_tokens_usd(16_384), rel=0.02)  # before: nothing
    assert heard == pytest.approx(_tokens_usd(200 + text_of_clip), rel=0.02)  # before: 3,800 tokens, an image
