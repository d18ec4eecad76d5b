"""A large request translated for a target of the other protocol is translated off the event loop.

Through the proxy with the official clients, the emulator as both upstreams. Translating walks and
rebuilds the client's body part by part, Python work in proportion to its messages (about a second
for 200,000 short ones, within the default 32 MiB body limit): it ran on the event loop every team's
requests share, so one team's large Chat request routed to Claude held every other team's requests
meanwhile. A large request's translation runs in the heavy-work pool now, as its team's turn.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import orjson

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from sdk.offload import LARGE_BYTES, TENANT
from sdk.routing.translation import provider
from tests.helpers import anth, oai, write_policy

KEY = "sk-alpha-translated"
TURNS = 6_000  # short messages: about 320 KB of body, past LARGE_BYTES


def _conversation() -> list[dict[str, Any]]:
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} of a long talk"} for i in range(TURNS)]
    return [*turns, {"role": "user", "content": "Sum it up."}]


def _where() -> tuple[str, str]:
    return threading.current_thread().name.rsplit("-", 1)[0], TENANT.get()


def test_a_large_request_is_translated_in_the_heavy_work_pool(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                              monkeypatch) -> None:
    """Chat -> Claude, Messages -> OpenAI and a Messages token count on an OpenAI target: each large
    one was translated on the loop's thread before, in the heavy-work pool as alpha's work now."""
    ran: dict[str, list[tuple[str, str]]] = {"to_claude": [], "to_openai": []}
    to_claude, to_openai = provider.openai_to_anthropic, provider.anthropic_to_openai

    def recorded_to_claude(body: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        ran["to_claude"].append(_where())
        return to_claude(body, *args, **kwargs)

    def recorded_to_openai(body: dict[str, Any], *args: Any) -> dict[str, Any]:
        ran["to_openai"].append(_where())
        return to_openai(body, *args)

    monkeypatch.setattr(provider, "openai_to_anthropic", recorded_to_claude)
    monkeypatch.setattr(provider, "anthropic_to_openai", recorded_to_openai)
    messages = _conversation()
    assert len(orjson.dumps(messages)) >= LARGE_BYTES
    write_policy(tmp_path, "alpha", KEY, fresh_emulator.url, extra="prompt_cache: {enabled: false}\n")
    with running_proxy([tmp_path]) as proxy:
        chat = oai(proxy, KEY).chat.completions.create(model="claude-haiku-4-5", max_tokens=8, messages=messages)  # type: ignore[arg-type]
        assert chat.choices[0].message.content
        claude = anth(proxy, KEY)
        assert claude.messages.create(model="gpt-4.1", max_tokens=8, messages=messages).content  # type: ignore[arg-type]
        assert claude.messages.count_tokens(model="gpt-4", messages=messages).input_tokens > 0  # type: ignore[arg-type]
        # A small request costs less than the hop to a thread: still translated where it is.
        oai(proxy, KEY).chat.completions.create(model="claude-haiku-4-5", max_tokens=8,
                                                messages=[{"role": "user", "content": "Hi"}])
    assert ran["to_claude"][:1] == [("slipstream-heavy", "alpha")]  # before: the event loop's thread
    assert ran["to_openai"] == [("slipstream-heavy", "alpha")] * 2  # the request and its count (gpt-4: cl100k, bundled)
    assert ran["to_claude"][1][0] != "slipstream-heavy"
    assert len(ran["to_claude"]) == 2

