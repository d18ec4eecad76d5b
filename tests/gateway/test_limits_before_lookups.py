"""A request past its team's rate or concurrency limit is refused before it costs a lookup.

Through the proxy with the official client, the emulator upstream. The limits stage looked up every
file a request names (up to 10,000, in the ownership store every team's requests use: SQLite, or the
shared Redis), its audio ids and its stored conversation before it checked the team's limits, so a
team past its `requests_per_minute` or `max_concurrent` still had each refused request's lookups run:
its limits bounded what it sent upstream, not what it cost the stores it shares. The rates and the
concurrency cap are checked first now; the budget, which holds the worst cost the lookups make known
(what a continuation sends, its media), after them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from sdk.limits.stage import LimitsStage
from sdk.state.ownership import Ownership
from tests.helpers import anth, oai, write_policy

KEY = "sk-alpha-limited-lookups"


def test_a_request_past_the_rate_limit_is_refused_before_its_lookups(
        tmp_path: Path, fresh_emulator: RunningEmulator, monkeypatch) -> None:
    checked: list[int] = []
    read: list[int] = []
    check_files, history_tokens = Ownership.check_files, LimitsStage.history_tokens

    async def recorded_files(self: Ownership, team: str, bodies: Any, size: int) -> None:
        checked.append(size)
        await check_files(self, team, bodies, size)

    async def recorded_history(self: LimitsStage, requests: Any, *args: Any) -> list[int]:
        read.append(len(requests))
        return await history_tokens(self, requests, *args)

    monkeypatch.setattr(Ownership, "check_files", recorded_files)
    monkeypatch.setattr(LimitsStage, "history_tokens", recorded_history)
    write_policy(tmp_path, "alpha", KEY, fresh_emulator.url,
                 extra="limits: {requests_per_minute: 2}\nbudget: {usd: 100, period: day}\n"
                       'pricing: {"gpt-4o": {input: 1, output: 2}}\n')
    files = [{"type": "file", "file": {"file_id": f"file-{i:06d}"}} for i in range(1_000)]
    with running_proxy([tmp_path]) as proxy:
        client = oai(proxy, KEY)
        for _ in range(2):  # within the limit: checked, then sent
            assert client.chat.completions.create(model="gpt-4o", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]).choices
        for _ in range(3):  # past it: 1,000 files named each, looked up on the old code (a 404 for the first unknown)
            with pytest.raises(openai.RateLimitError, match="rate limit"):
                client.chat.completions.create(model="gpt-4o", max_tokens=8,
                                               messages=[{"role": "user", "content": [*files, {"type": "text", "text": "Read them."}]}])  # type: ignore[list-item]
    assert len(checked) == 2 and len(read) == 2  # before: 5 each, the last three refused only after their lookups


def test_a_message_batch_past_the_rate_limit_is_refused_before_its_checks(
        tmp_path: Path, fresh_emulator: RunningEmulator, monkeypatch) -> None:
    """The pass-through read a message batch create whole, looked up the files its requests name and
    costed each request before it admitted the create to the team's limits."""
    checked: list[int] = []
    check_files = Ownership.check_files

    async def recorded_files(self: Ownership, team: str, bodies: Any, size: int) -> None:
        checked.append(size)
        await check_files(self, team, bodies, size)

    monkeypatch.setattr(Ownership, "check_files", recorded_files)
    write_policy(tmp_path, "alpha", KEY, fresh_emulator.url, extra="limits: {requests_per_minute: 1}\n")
    document = {"type": "document", "source": {"type": "file", "file_id": "file_unknown_to_alpha"}}
    requests = [{"custom_id": f"r{i}", "params": {"model": "claude-haiku-4-5", "max_tokens": 8,
                                                  "messages": [{"role": "user", "content": [document, {"type": "text", "text": "Sum it up."}]}]}}
                for i in range(100)]
    with running_proxy([tmp_path]) as proxy:
        client = anth(proxy, KEY)
        assert client.messages.create(model="claude-haiku-4-5", max_tokens=8, messages=[{"role": "user", "content": "Hi"}]).content
        for _ in range(3):  # past the limit: read, looked up and refused as naming an unknown file on the old code
            with pytest.raises(anthropic.RateLimitError, match="rate limit"):
                client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    assert len(checked) == 1  # the first request's own; before: 4, each create's files looked up (a 404, not the 429)
