"""A large Chat request's audio ids are looked for off the event loop.

Through the proxy with the official client, the emulator upstream. Every Chat request is walked for
the audio ids of earlier spoken answers it names (each must be the team's own: docs/security.md),
Python work in proportion to its parts (about 40 ms for 200,000 short messages, within the default
32 MiB body limit). The pass-through's check gave the walk its body's size; the pipeline's limits
stage did not, so the walk ran on the event loop every team's requests share. A large request's walk
runs in the heavy-work pool now, as its team's turn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from sdk.state import answer_ids
from tests.helpers import large_then_small_chat, oai, running_where, write_policy

KEY = "sk-alpha-audio-walk"


def test_a_large_requests_audio_ids_are_looked_for_in_the_heavy_work_pool(
        tmp_path: Path, fresh_emulator: RunningEmulator, monkeypatch) -> None:
    ran: list[tuple[str, str]] = []
    named = answer_ids._named

    def recorded(bodies: list[Any]) -> list[str]:
        ran.append(running_where())
        return named(bodies)

    monkeypatch.setattr(answer_ids, "_named", recorded)
    write_policy(tmp_path, "alpha", KEY, fresh_emulator.url, extra="prompt_cache: {enabled: false}\n")
    with running_proxy([tmp_path]) as proxy:
        # A large request (6,000 short messages), then a small one, which costs less than the hop to a
        # thread: walked where it is.
        large_then_small_chat(oai(proxy, KEY))
    assert ran[0] == ("slipstream-heavy", "alpha")  # before: the event loop's thread
    assert len(ran) == 2 and ran[1][0] != "slipstream-heavy"
