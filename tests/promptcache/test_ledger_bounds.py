"""A team's prompt-cache ledger is bounded: per request and in all.

The ledger keeps an entry per prefix a team's requests wrote, for the provider's TTL (5 minutes; an hour
for Anthropic's long TTL). OpenAI caches every prefix past 1,024 tokens, and the ledger kept one entry a
message: a request of 200,000 short messages (within the default 32 MiB body limit) made 200,000 entries
on the event loop every team shares (seconds of it), every one sent to the shared ledger with Redis, and a
team sending distinct prompts grew its entries as fast as it sent them, in the process every team shares.
A request writes at most WRITES_PER_REQUEST entries now (the first and last third and the rest spread
between), and a team's scopes hold at most Ledger.MAX_ENTRIES together. Through the proxy with the
official client, the emulator upstream.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from emulator.testing import RunningEmulator
from gateway.testing import running_proxy
from sdk.promptcache.ledger import WRITES_PER_REQUEST, Ledger
from tests.helpers import oai, write_policy

KEY = "sk-alpha-ledger-bounds"
BOARDS = ("budget board", "safety board", "hiring panel", "design review", "audit committee", "works council")


def _talk(board: str, turns: int) -> list[dict[str, str]]:
    """A conversation of its own (its first user message), about 10 tokens a message."""
    return [{"role": "system", "content": f"You keep the minutes of the {board}."}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"the {board}'s minutes, item {i}"} for i in range(turns)]


@pytest.fixture
def ledgers(monkeypatch) -> list[Ledger]:
    made: list[Ledger] = []
    init = Ledger.__init__

    def recorded(self: Ledger) -> None:
        init(self)
        made.append(self)

    monkeypatch.setattr(Ledger, "__init__", recorded)
    return made


def _held(ledgers: list[Ledger]) -> int:
    return sum(len(scope.entries) for ledger in ledgers for scope in ledger.scopes.values())


def test_a_request_of_many_messages_writes_a_bounded_number_of_entries(
        tmp_path: Path, fresh_emulator: RunningEmulator, ledgers: list[Ledger]) -> None:
    write_policy(tmp_path, "alpha", KEY, fresh_emulator.url)
    talk = _talk("board", 3_000)
    with running_proxy([tmp_path], watch_interval_s=None) as proxy:
        client = oai(proxy, KEY)
        client.chat.completions.create(model="gpt-4o", max_tokens=8, messages=talk)  # type: ignore[arg-type]
        held = _held(ledgers)
        # The conversation's next turn is still predicted to read what the first wrote, up to its end.
        talk += [{"role": "assistant", "content": "Noted."}, {"role": "user", "content": "And the next item?"}]
        raw = client.chat.completions.with_raw_response.create(model="gpt-4o", max_tokens=8, messages=talk)  # type: ignore[arg-type]
    assert 0 < held <= WRITES_PER_REQUEST, held  # before: about 2,900, one a message past 1,024 tokens
    expected = int(dict(part.split("=") for part in raw.headers["x-slipstream-prompt-cache"].split(";"))["expected_read"])
    assert expected > 25_000, raw.headers["x-slipstream-prompt-cache"]


def test_a_teams_entries_are_bounded_together(tmp_path: Path, fresh_emulator: RunningEmulator,
                                              ledgers: list[Ledger], monkeypatch) -> None:
    monkeypatch.setattr(Ledger, "MAX_ENTRIES", 200)  # 65,536 in production
    write_policy(tmp_path, "alpha", KEY, fresh_emulator.url)
    with running_proxy([tmp_path], watch_interval_s=None) as proxy:
        client = oai(proxy, KEY)
        most = 0
        for board in BOARDS:  # distinct prompts: each writes its own entries, 178
            client.chat.completions.create(model="gpt-4o", max_tokens=8, messages=_talk(board, 250))  # type: ignore[arg-type]
            most = max(most, _held(ledgers))
        # The newest prompt's entries are the ones kept: sent again, it is predicted to be read.
        raw = client.chat.completions.with_raw_response.create(  # type: ignore[call-overload]
            model="gpt-4o", max_tokens=8, messages=_talk(BOARDS[-1], 250))
    assert 150 <= most <= 200, most  # before: 178 a prompt, 1,068 in all
    assert "expected_read=0" not in raw.headers["x-slipstream-prompt-cache"]
