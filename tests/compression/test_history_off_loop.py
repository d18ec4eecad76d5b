"""A large conversation's history compaction is worked out off the event loop.

Through the proxy with the official anthropic client, the emulator as the upstream and the summarizer.
History compaction digests every message of a request (to find its conversation's summary) and, when it
schedules a summary, writes the transcript of the turns it replaces: work in proportion to the request
(about half a second for 200,000 short messages, within the default 32 MiB body limit), which ran on the
event loop every team's requests share while the rest of compression ran in the heavy-work pool. For a
request of 256 KiB or more it runs in the heavy-work pool now, as its team's work.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import orjson

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from sdk.compression import history
from sdk.offload import LARGE_BYTES, TENANT
from tests.helpers import anth, write_policy

KEY = "sk-alpha-history"
COMPRESSION = ("compression: {enabled: true, documents: {enabled: false}, history: {enabled: true, trigger_tokens: 600, "
               "keep_turns: 1}, summarizer: {provider: claude, model: claude-haiku-4-5}}\nprompt_cache: {enabled: false}\n")


def _conversation(turns: int) -> list[dict[str, Any]]:
    said = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} of the planning call"} for i in range(turns)]
    return [*said, {"role": "user", "content": "What did we decide?"}]


def test_a_large_conversations_history_is_worked_out_in_the_heavy_work_pool(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                                           monkeypatch) -> None:
    """The digests and the transcript of a 330 KB conversation: on the loop's thread before (uvicorn's), in
    the heavy-work pool as alpha's work now; a small conversation's are still worked out where it is."""
    ran: list[tuple[str, bool, str, str]] = []
    digests, transcript = history._prefix_digests, history.render_transcript

    def where(step: str, messages: list[Any]) -> None:
        large = len(orjson.dumps(messages)) >= LARGE_BYTES
        ran.append((step, large, threading.current_thread().name.rsplit("-", 1)[0], TENANT.get()))

    def recorded_digests(messages: list[Any]) -> list[bytes]:
        where("digests", messages)
        return digests(messages)

    def recorded_transcript(messages: list[Any], previous: str) -> str:
        where("transcript", messages)
        return transcript(messages, previous)

    monkeypatch.setattr(history, "_prefix_digests", recorded_digests)
    monkeypatch.setattr(history, "render_transcript", recorded_transcript)
    write_policy(tmp_path, "alpha", KEY, fresh_emulator.url, extra=COMPRESSION)
    with running_proxy([tmp_path]) as proxy:
        client = anth(proxy, KEY)
        assert client.messages.create(model="claude-haiku-4-5", max_tokens=8, messages=_conversation(6_000)).content  # type: ignore[arg-type]
        assert client.messages.create(model="claude-haiku-4-5", max_tokens=8, messages=_conversation(200)).content  # type: ignore[arg-type]
    heavy = ("slipstream-heavy", "alpha")
    assert [(step, *at) for step, large, *at in ran if large] == [("digests", *heavy), ("transcript", *heavy)]  # before: the loop's
    assert all(at[0] != "slipstream-heavy" for _, large, *at in ran if not large)
    assert [step for step, large, *_ in ran if not large] == ["digests", "transcript"]
