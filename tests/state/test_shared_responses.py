"""Stored responses in Redis: a conversation begun through one proxy continues through another."""

from __future__ import annotations

import openai
import pytest

from gateway.testing import running_proxy
from tests.responses.conftest import KEY, policy_text


@pytest.mark.parametrize("model", ["oai-4o", "claude-x"])  # served natively, and translated (stored by Slipstream alone)
def test_previous_response_id_and_retrieve_across_proxies(tmp_path, monkeypatch, fresh_emulator, redis_url, model):
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "responses.yaml").write_text(policy_text("responses", KEY, fresh_emulator.url))
    with running_proxy([tmp_path], state_url=redis_url) as a, running_proxy([tmp_path], state_url=redis_url) as b:
        via_a = openai.OpenAI(base_url=f"{a.url}/v1", api_key=KEY, max_retries=0)
        via_b = openai.OpenAI(base_url=f"{b.url}/v1", api_key=KEY, max_retries=0)
        first = via_a.responses.create(model=model, input="Tell me about fjords.", max_output_tokens=40)
        assert via_b.responses.retrieve(first.id).output_text == first.output_text
        second = via_b.responses.create(model=model, input="And glaciers?", previous_response_id=first.id)
        assert second.usage.input_tokens > first.usage.input_tokens  # b found a's turn and sent it as history
        via_a.responses.delete(second.id)
        with pytest.raises(openai.NotFoundError):
            via_b.responses.retrieve(second.id)


def test_the_redis_client_does_not_keep_what_a_team_stored(tmp_path, monkeypatch, fresh_emulator, redis_url):
    """The Redis client remembers each argument it encodes (keys, field names, script digests repeat on
    every request), up to 4,096 of them in the process every team shares, and remembered every argument
    whatever its size: each stored response's record (its input, up to the team's body limit) and each
    cached answer stayed in memory twice, raw and encoded, long after its request had ended and its
    body had left the in-flight budget. Only short arguments are remembered now."""
    from sdk.state import resp

    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "responses.yaml").write_text(policy_text("responses", KEY, fresh_emulator.url))
    with running_proxy([tmp_path], state_url=redis_url) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
        for i in range(4):
            stored = client.responses.create(model="oai-4o", input=f"Document {i}: " + "fjord " * 40_000, max_output_tokens=16)
            assert client.responses.retrieve(stored.id).id == stored.id  # the record went to Redis
        kept = sorted((len(piece) for piece in resp._TEXTS.values()), reverse=True)
        assert kept[:1] < [4096], f"the client's memo holds {sum(kept)} bytes, the largest {kept[:4]}"
