"""Through the proxy with the official anthropic client: a refused answer makes none of its request's
prompt-cache writes readable."""

from __future__ import annotations

import asyncio

import anthropic
import httpx

from gateway.testing import running_proxy
from sdk.pipeline import PromptCacheReport
from sdk.policy import PromptCachePolicy
from sdk.promptcache.stage import PromptCachePlanner
from sdk.types import Endpoint, LLMRequest, LLMResponse, Timings, Usage
from tests.helpers import write_policy

KEY = "sk-refused-writes-team"
STATIC = "You are the support assistant.\n" + "Answer from the manual and cite the section. " * 300


def _fields(header: str) -> dict[str, str]:
    return dict(part.split("=") for part in header.split(";"))


def test_a_refused_answer_leaves_nothing_readable_in_the_ledger(tmp_path, fresh_emulator):
    """The first request is refused upstream (a 400: the provider cached nothing), so the same request
    sent again is predicted to read nothing and no expected miss is counted. (This held on the old code
    too: an error status raises in the provider and the writes are discarded; the test keeps it so.)"""
    write_policy(tmp_path, "refusedwrites", KEY, fresh_emulator.url, extra="prompt_cache: {}\n")
    fresh_emulator.inject_fault("400", count=1, model="claude-*")
    with running_proxy([tmp_path], watch_interval_s=None) as proxy:
        client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
        messages = [{"role": "user", "content": "How do I reset the device?"}]
        try:
            client.messages.create(model="claude-sonnet-5", max_tokens=16, system=STATIC, messages=messages)
        except anthropic.BadRequestError:
            pass
        else:
            raise AssertionError("the emulator's 400 did not reach the client")
        raw = client.messages.with_raw_response.create(model="claude-sonnet-5", max_tokens=16, system=STATIC, messages=messages)
        fields = _fields(raw.headers["x-slipstream-prompt-cache"])
        assert fields["read"] == "0" and int(fields["write"]) > 1000  # the provider had nothing to read
        assert fields["expected_read"] == "0", fields
        report = httpx.get(f"{proxy.url}/v1/slipstream/cache-report", headers={"x-api-key": KEY}).json()
        assert report["expected_misses"] == 0, report


def test_an_answer_the_provider_did_not_serve_leaves_nothing_readable():
    """An upstream error (4xx/5xx) raises and its writes were discarded already (above); an answer of
    another status passed on as it is (a redirect from a proxy in front of the provider) published them
    as readable, so the next request was predicted to read a prefix nobody had cached."""
    planner = PromptCachePlanner("refused-writes", PromptCachePolicy())
    body = {"model": "claude-sonnet-5", "max_tokens": 16, "system": STATIC,
            "messages": [{"role": "user", "content": "How do I reset the device?"}]}
    reports = [PromptCacheReport(), PromptCacheReport()]

    async def redirected(request: LLMRequest) -> LLMResponse:
        return LLMResponse(307, b"", {"location": "https://elsewhere.example"}, Usage(), "anthropic/claude-sonnet-5")

    async def main() -> None:
        for report in reports:
            await planner.planned(LLMRequest(Endpoint.MESSAGES, body), redirected, Timings(), report)

    asyncio.run(main())
    assert reports[1].expected_read == 0
    scope = planner.optimizer.ledger.scope("anthropic", "claude-sonnet-5", "")
    assert not [entry for entry in scope.entries.values() if entry.readable]
