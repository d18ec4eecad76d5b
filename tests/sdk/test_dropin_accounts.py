"""Drop-in clients without a policy keep apart what they store, by the key and upstream they were given.

Without a policy a drop-in client behaves as the official one would: its `api_key` and `base_url` name
the account it reaches. But every such client was team `default`, and what a team's requests leave in the
data directory (stored Responses API conversations, the ownership records of files and batches, spend) is
kept by team, in files every client of the process, and every program of the host's user, shares: a
client given another key read and continued a conversation the first client stored, which the official
client with that key could never reach. A client without a policy is now a team of its own upstream and key.
Official openai clients in process (sdk.OpenAI), the emulator as a Chat-only upstream (its /v1/responses
answers 404, so the gateway answers the Responses API from its own store).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

import sdk
from emulator.testing import RunningEmulator


def _client(emu: RunningEmulator, key: str) -> openai.OpenAI:
    return sdk.OpenAI(api_key=key, base_url=emu.openai_url, max_retries=0)


def test_a_client_of_another_key_cannot_read_or_continue_a_stored_conversation(tmp_path: Path, fresh_emulator: RunningEmulator,
                                                                            monkeypatch) -> None:
    """B read A's stored response and its input, and continued it (A's words sent upstream under B's key),
    before; each is the store's 404 now. A client of A's key and upstream (A's program run again) still reads it."""
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))
    httpx.post(f"{fresh_emulator.url}/_emulator/faults",
               json={"fault": "404", "count": 1000, "match": {"path": "/v1/responses"}}).raise_for_status()
    alpha, beta = _client(fresh_emulator, "sk-account-alpha"), _client(fresh_emulator, "sk-account-beta")
    stored = alpha.responses.create(model="gpt-4o-mini", input="Our launch is on Tuesday; keep it quiet.", max_output_tokens=16)
    assert stored.id
    with pytest.raises(openai.NotFoundError):
        beta.responses.retrieve(stored.id)  # before: the response
    with pytest.raises(openai.NotFoundError):
        beta.responses.input_items.list(stored.id)  # before: alpha's words
    with pytest.raises(openai.NotFoundError):
        beta.responses.create(model="gpt-4o-mini", previous_response_id=stored.id, input="When is the launch?")
    again = _client(fresh_emulator, "sk-account-alpha")
    assert again.responses.retrieve(stored.id).id == stored.id
    assert "Tuesday" in str(again.responses.input_items.list(stored.id).data[0].model_dump())
