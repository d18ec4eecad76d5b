"""What the emulator holds under an answer's id, as Anthropic does: a Thread continued once, and the prompt a
cache-diagnostics request is compared with (emulator/message_state.py). Official anthropic client."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from emulator.testing import RunningEmulator

BETA = "message-threads-2026-08-12"
FIRST = [{"role": "user", "content": "Remember the number 41."}]
NEXT = [{"role": "user", "content": "Which number?"}]


def _ask(client: anthropic.Anthropic, messages: list[dict[str, Any]], **extra: Any) -> Any:
    return client.beta.messages.create(model="claude-haiku-4-5", max_tokens=100, messages=messages, betas=[BETA], **extra)


def test_an_answer_in_a_thread_is_continued_once(emu: RunningEmulator, _anth: anthropic.Anthropic) -> None:
    created = _ask(_anth, FIRST, thread={"type": "create"})
    turn = {"type": "continue", "previous_message_id": created.id}
    followed = _ask(_anth, NEXT, thread=turn)
    with pytest.raises(anthropic.BadRequestError) as refused:
        _ask(_anth, NEXT, thread=turn)
    assert refused.value.error_code == "thread_already_continued"
    assert _ask(_anth, NEXT, thread={"type": "continue", "previous_message_id": followed.id})  # from the latest


def test_diagnostics_compare_with_the_named_request(emu: RunningEmulator, _anth: anthropic.Anthropic) -> None:
    first = _ask(_anth, FIRST, diagnostics={"previous_message_id": None})
    assert first.diagnostics is not None and first.diagnostics.cache_miss_reason is None
    turn = [*FIRST, {"role": "assistant", "content": "Noted."}, *NEXT]
    assert _ask(_anth, turn, diagnostics={"previous_message_id": first.id}).diagnostics.cache_miss_reason is None
    changed = _ask(_anth, turn, system="Be terse.", diagnostics={"previous_message_id": first.id}).diagnostics.cache_miss_reason
    assert changed is not None and changed.type == "system_changed" and changed.cache_missed_input_tokens > 0
    edited = _ask(_anth, NEXT, diagnostics={"previous_message_id": first.id}).diagnostics.cache_miss_reason
    assert edited is not None and edited.type == "messages_changed"
    unknown = _ask(_anth, turn, diagnostics={"previous_message_id": "msg_0000"}).diagnostics.cache_miss_reason
    assert unknown is not None and unknown.type == "previous_message_not_found"
    assert _anth.beta.messages.create(model="claude-haiku-4-5", max_tokens=10, messages=FIRST).diagnostics is None  # not asked
