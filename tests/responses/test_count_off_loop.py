"""A large Responses token count for a Claude target is translated and written off the event loop.

Through the proxy with the official client, the emulator as the Anthropic upstream. `POST
/v1/responses/input_tokens` on a translated Claude target turns the input into Chat in the heavy-work
pool, but then translated that into a Messages body, Python work in proportion to its parts, and
wrote it for the upstream's count_tokens, on the event loop every team's requests share: the count
request was made without the client's size, so it looked small. Both run in the heavy-work pool now,
as the team's work, for a body of 256 KiB or more; a small count stays on the loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from sdk.providers import base
from sdk.responses import target
from tests.helpers import long_talk, oai, running_where, write_policy

KEY = "sk-alpha-count-translated"


class _RecordedJson:
    """The orjson module, with each Messages body it writes recorded where it was written."""

    def __init__(self, written: list[tuple[str, str]]) -> None:
        self.written = written

    def __getattr__(self, name: str) -> Any:
        return getattr(orjson, name)

    def dumps(self, obj: Any, *args: Any, **kwargs: Any) -> bytes:
        if isinstance(obj, dict) and "messages" in obj:
            self.written.append(running_where())
        return orjson.dumps(obj, *args, **kwargs)


def test_a_large_count_for_claude_is_translated_and_written_in_the_heavy_work_pool(
        tmp_path: Path, fresh_emulator: RunningEmulator, monkeypatch) -> None:
    translated: list[tuple[str, str]] = []
    written: list[tuple[str, str]] = []
    to_claude = target.openai_to_anthropic

    def recorded(body: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        translated.append(running_where())
        return to_claude(body, *args, **kwargs)

    monkeypatch.setattr(target, "openai_to_anthropic", recorded)
    monkeypatch.setattr(base, "orjson", _RecordedJson(written))
    write_policy(tmp_path, "alpha", KEY, fresh_emulator.url, extra="prompt_cache: {enabled: false}\n")
    with running_proxy([tmp_path]) as proxy:
        count = oai(proxy, KEY).responses.input_tokens.count
        large = count(model="claude-haiku-4-5", input=long_talk(6_000))  # type: ignore[arg-type]
        small = count(model="claude-haiku-4-5", input="Hi")
    assert large.input_tokens > small.input_tokens > 0
    heavy = ("slipstream-heavy", "alpha")
    assert translated[0] == heavy and written[0] == heavy, (translated, written)  # before: the loop's thread
    assert len(translated) == len(written) == 2 and heavy not in (translated[1], written[1])
