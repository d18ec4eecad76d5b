"""Work that must not be done on every request: each is cheap alone, and a proxy's added latency is
their sum. Counted, not timed: a count does not move with the machine's load."""

from __future__ import annotations

from pathlib import Path

import pytest

import sdk
import sdk.limits.stage
from emulator.testing import RunningEmulator
from sdk.estimate import input_tokens
from sdk.types import LLMRequest

pytestmark = pytest.mark.timeout(20)

LONG = [{"role": "user", "content": " ".join(f"Line {i} of a long prompt." for i in range(400))}]


def test_an_answered_request_is_not_counted_again_when_it_settles(emu: RunningEmulator, policy: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The limits stage counts a prompt's tokens (tiktoken over up to 8 KiB of text) only to charge a
    prompt read the provider made and did not answer (a dropped attempt). Answered requests have none,
    yet from 3b75419 every request was counted once more as it settled (the early return was lost)."""
    counted: list[LLMRequest] = []

    def counting(request: LLMRequest) -> int:
        counted.append(request)
        return input_tokens(request)

    monkeypatch.setattr(sdk.limits.stage, "input_tokens", counting)
    client = sdk.OpenAI(policy=policy, max_retries=0)
    assert client.chat.completions.create(model="gpt-4o-mini", messages=LONG).choices[0].message.content
    with client.chat.completions.create(model="gpt-4o-mini", messages=LONG, stream=True) as stream:
        assert any(chunk.choices and chunk.choices[0].delta.content for chunk in stream)
    assert emu.stats()["completed_streams"] == 1
    assert counted == []
