"""Stored responses are bounded per team: chains are walked, not copied (counted in stored bytes),
and a team's quota evicts its own least recently used responses, never another team's, and refuses
a conversation that alone would not fit before anything is sent. One replica, and two over Redis.
"""

from __future__ import annotations

import sqlite3
from contextlib import ExitStack
from pathlib import Path

import openai
import pytest

from gateway.testing import running_proxy
from tests.responses.conftest import policy_text
from tests.state.conftest import redis_server, redis_url  # noqa: F401  (fixtures)

TIGHT, ROOMY = "sk-tight-team", "sk-roomy-team"
MIB = 1024 * 1024


def _client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)


def _stored_bytes(data_dir: Path, team: str) -> int:
    """Bytes of the team's records in the embedded store's file (their own items and responses)."""
    with sqlite3.connect(data_dir / "responses.sqlite3") as db:
        return db.execute("SELECT COALESCE(SUM(length(input) + length(response)), 0) FROM stored_responses WHERE team = ?",
                          (team,)).fetchone()[0]


def test_fifteen_turns_of_a_mebibyte_store_fifteen_mebibytes(tmp_path, monkeypatch, fresh_emulator):
    """Before: each turn's record copied the whole conversation, 15 turns × 1 MiB → 120 MiB in one file."""
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "roomy.yaml").write_text(policy_text("roomy", ROOMY, fresh_emulator.url))
    with running_proxy([tmp_path]) as proxy:
        client = _client(proxy.url, ROOMY)
        previous = None
        for turn in range(15):
            answer = client.responses.create(model="gpt-long", input=f"Turn {turn}. " + "fjord " * (MIB // 6),
                                             previous_response_id=previous, max_output_tokens=16)
            previous = answer.id
        stored = _stored_bytes(tmp_path / "data", "roomy")
    assert 15 * MIB <= stored < 16 * MIB
    assert answer.usage.input_tokens > 14 * (MIB // 6)  # the last turn still read the whole conversation


@pytest.mark.parametrize("replicas", [1, 2], ids=["one-replica", "two-over-redis"])
def test_a_teams_quota_bounds_only_that_team(replicas, tmp_path, monkeypatch, fresh_emulator, request):
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "tight.yaml").write_text(policy_text("tight", TIGHT, fresh_emulator.url,
                                                     extra="responses_store: {max_entries: 3, max_bytes: 300000}"))
    (tmp_path / "roomy.yaml").write_text(policy_text("roomy", ROOMY, fresh_emulator.url))
    state_url = request.getfixturevalue("redis_url") if replicas == 2 else None
    with ExitStack() as stack:
        a, b = (stack.enter_context(running_proxy([tmp_path], state_url=state_url)) for _ in range(2)) if replicas == 2 else \
            [stack.enter_context(running_proxy([tmp_path]))] * 2
        tight_a, tight_b, roomy = _client(a.url, TIGHT), _client(b.url, TIGHT), _client(b.url, ROOMY)
        kept = roomy.responses.create(model="gpt-long", input="Roomy's first.", max_output_tokens=16)
        made = [tight_a.responses.create(model="gpt-long", input=f"Tight's number {i}.", max_output_tokens=16) for i in range(4)]
        with pytest.raises(openai.NotFoundError):
            tight_b.responses.retrieve(made[0].id)  # the least recently used of the team's four went
        assert [tight_b.responses.retrieve(r.id).id for r in made[1:]] == [r.id for r in made[1:]]
        assert roomy.responses.retrieve(kept.id).id == kept.id  # another team's quota never evicts it

        big = tight_a.responses.create(model="oai-4o", input="x " * 100_000, max_output_tokens=16)  # 200 kB of 300 kB
        sent = fresh_emulator.stats()["requests_total"]
        for model in ("oai-4o", "gpt-long"):  # native (the provider holds it) and translated alike
            with pytest.raises(openai.BadRequestError, match=r"responses_store\.max_bytes"):
                tight_b.responses.create(model=model, input="y " * 60_000, previous_response_id=big.id)
        assert fresh_emulator.stats()["requests_total"] == sent  # refused before it was sent
        assert tight_b.responses.create(model="gpt-long", input="y " * 60_000, previous_response_id=big.id,
                                        store=False).output_text  # unstored, it may go on
        assert tight_b.responses.input_tokens.count(model="oai-4o", input="y " * 60_000,
                                                    previous_response_id=big.id).input_tokens > 0  # a count stores nothing
