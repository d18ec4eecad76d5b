"""Team limits: requests/tokens per minute per team and per key, and a concurrency cap, answered with a
provider-shaped 429 and retry-after."""

from __future__ import annotations

import anthropic
import openai
import pytest

from gateway.testing import running_proxy
from sdk.errors import RateLimitedError
from sdk.pipeline import RequestContext
from tests.routing.conftest import TWO_CLAUDES, collect, messages_request, policy_text


def test_team_rpm_through_the_proxy(tmp_path, fresh_emulator):
    (tmp_path / "routing.yaml").write_text(policy_text(fresh_emulator.url, TWO_CLAUDES, "limits: {requests_per_minute: 2}\n"))
    with running_proxy([tmp_path]) as proxy:
        an = anthropic.Anthropic(base_url=proxy.url, api_key="sk-routing", max_retries=0)
        for _ in range(2):
            an.messages.create(model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(anthropic.RateLimitError) as error:
            an.messages.create(model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert error.value.body["error"]["type"] == "rate_limit_error"
        assert "2 requests per minute" in error.value.body["error"]["message"]
        assert 1 <= int(error.value.response.headers["retry-after"]) <= 30
        oa = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-routing", max_retries=0)
        with pytest.raises(openai.RateLimitError) as oa_error:
            oa.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        assert oa_error.value.code == "rate_limit_exceeded"
    assert fresh_emulator.stats()["requests_total"] == 2  # refusals never reach the provider


async def test_per_key_tokens_per_minute(build_runtime, fresh_emulator):
    runtime = build_runtime(extra="limits: {per_key: {tokens_per_minute: 20}}\n")
    first = messages_request()
    answer, _ = await runtime.handle(first, RequestContext(request=first, team="routing", key_id="k1"))
    assert answer.usage.output_tokens + answer.usage.input_tokens > 20  # one answer spends the minute's budget
    second = messages_request()
    with pytest.raises(RateLimitedError) as error:
        await runtime.handle(second, RequestContext(request=second, team="routing", key_id="k1"))
    assert "tokens per minute" in error.value.message and error.value.headers["retry-after"]
    other = messages_request()
    await runtime.handle(other, RequestContext(request=other, team="routing", key_id="k2"))  # another key is untouched


async def test_concurrency_cap_holds_until_the_stream_ends(build_runtime, fresh_emulator):
    runtime = build_runtime(extra="limits: {max_concurrent: 1}\n")
    streaming, _ = await runtime.handle(messages_request(stream=True))
    with pytest.raises(RateLimitedError, match="in flight"):
        await runtime.handle(messages_request())
    await collect(streaming)  # the stream ends: its slot is free again
    answer, _ = await runtime.handle(messages_request())
    await collect(answer)
