"""The response cache through the proxy with the official client: headers, precision hint, invalidation."""

from __future__ import annotations

import httpx
import openai

from gateway.testing import running_proxy
from tests.helpers import requires_extra, write_policy

QUESTION = [{"role": "user", "content": "What is the capital of Norway?"}]


@requires_extra("semantic")
def test_hit_header_precision_hint_and_invalidation(tmp_path, monkeypatch, fresh_emulator):
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))
    write_policy(tmp_path, "cached", "sk-cached", fresh_emulator.url, extra="semantic_cache: {enabled: true}\n")
    with running_proxy([tmp_path]) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-cached", max_retries=0)
        first = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=QUESTION, temperature=0)
        assert first.headers["x-slipstream-cache"] == "miss"
        key = first.headers["x-slipstream-cache-key"]
        second = client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=QUESTION, temperature=0, extra_headers={"x-slipstream-min-precision": "0.99"}
        )
        assert second.headers["x-slipstream-cache"] == "exact-hit"
        assert second.headers["x-slipstream-route"] == "cache/gpt/gpt-4o"
        assert second.parse().choices[0].message.content == first.parse().choices[0].message.content
        assert fresh_emulator.stats()["requests_total"] == 1
        sent = httpx.get(f"{fresh_emulator.url}/_emulator/requests").json()
        assert all("x-slipstream-min-precision" not in str(r).lower() for r in sent)  # stops at the gateway

        removed = httpx.request("DELETE", f"{proxy.url}/v1/slipstream/cache", params={"key": key}, headers={"authorization": "Bearer sk-cached"})
        assert removed.json() == {"removed": 1}
        third = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=QUESTION, temperature=0)
        assert third.headers["x-slipstream-cache"] == "miss"
        exposition = httpx.get(f"{proxy.url}/metrics").text
        assert 'slipstream_response_cache_lookups_total{outcome="exact-hit",team="cached"} 1.0' in exposition
        assert 'slipstream_response_cache_lookups_total{outcome="miss",team="cached"} 2.0' in exposition
        denied = httpx.request("DELETE", f"{proxy.url}/v1/slipstream/cache", headers={"authorization": "Bearer nope"})
        assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
