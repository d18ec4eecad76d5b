"""Through the proxy with the official clients: headers, streaming verification, the report endpoint."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from gateway.cache_report import format_report
from gateway.testing import running_proxy
from tests.helpers import write_policy

KEY = "sk-prompt-cache-team"
STATIC = "You are the support assistant.\n" + "Answer from the manual and cite the section. " * 150


@pytest.fixture
def proxy(request, tmp_path, fresh_emulator):
    team = f"pcproxy-{request.node.name[5:12]}"  # the report's counters are per team and process-wide
    write_policy(tmp_path, team, KEY, fresh_emulator.url, extra="prompt_cache: {reorder: true}\n")
    with running_proxy([tmp_path], watch_interval_s=None) as running:
        yield running


def test_anthropic_stream_verifies_reads_and_report_endpoint(proxy, fresh_emulator):
    client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    messages: list[dict] = []
    headers = []
    for turn in range(3):
        messages.append({"role": "user", "content": f"Question {turn}: how do I reset the device? " * 5})
        system = f"{STATIC}\nSession id: sess_{turn}a7f3c9d2e1"
        with client.messages.with_streaming_response.create(
            model="claude-sonnet-5", max_tokens=16, system=system, messages=messages, stream=True
        ) as raw:
            headers.append(raw.headers["x-slipstream-prompt-cache"])
            text = "".join(line for line in raw.iter_lines())
        assert "message_stop" in text
        messages.append({"role": "assistant", "content": f"Answer {turn}."})
    fields = [dict(part.split("=") for part in h.split(";")) for h in headers]
    assert fields[0]["read"] == "0" and fields[0]["moved"] == "1"
    for f in fields[1:]:
        assert int(f["read"]) > 1000 and f["read"] == f["expected_read"]
    report = httpx.get(f"{proxy.url}/v1/slipstream/cache-report", headers={"x-api-key": KEY}).json()
    assert report["team"].startswith("pcproxy") and report["requests"] == 3
    assert report["hit_rate"] == pytest.approx(2 / 3, abs=1e-3) and report["saved_usd"] > 0
    assert "cached token share" in format_report(report)
    assert httpx.get(f"{proxy.url}/v1/slipstream/cache-report", headers={"x-api-key": "wrong"}).status_code == 401


def test_openai_prompt_cache_key_and_streamed_usage(proxy, fresh_emulator):
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
    messages = [{"role": "system", "content": STATIC}, {"role": "user", "content": "Hello"}]
    first = client.chat.completions.create(model="gpt-4o", messages=messages)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    sent = fresh_emulator.state.recent[-1]
    key = json.loads(sent["body"])["prompt_cache_key"]
    assert key.startswith("slipstream-") and "pcproxy" not in key  # a keyed digest of team + stable prefix
    stream = client.chat.completions.create(model="gpt-4o", messages=messages, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= 1024
    report = httpx.get(f"{proxy.url}/v1/slipstream/cache-report", headers={"authorization": f"Bearer {KEY}"}).json()
    assert report["requests"] == 2 and report["expected_misses"] == 0 and report["cache_read_tokens"] >= 1024


def test_a_teams_planner_keeps_a_bounded_share_of_its_prompts(tmp_path, fresh_emulator, monkeypatch):
    """The planner remembers a team's recent prompts, to explain its cache misses (the ledger's
    history), and memoises its system prompts' analysis (the volatility detector), in the process every
    team shares. Both were bounded in entries only: 32 requests in each of 256 scopes, the text of every
    block kept (images' base64 too), and 4,096 analyses, each with a copy of its text's rest past 32 KiB.
    So a team's large prompts stayed in memory long after their requests, and the in-flight body budget,
    had let them go: here every one of eight 512 KiB prompts, twice; in all, thousands of requests' worth.
    The history keeps at most HISTORY_CHARS of text for a team now (2 MiB for this test), and an
    analysis no unscanned rest."""
    from sdk.promptcache import ledger

    monkeypatch.setattr(ledger, "HISTORY_CHARS", 2 << 20, raising=False)  # absent on the old code: it kept all
    write_policy(tmp_path, "hoarder", KEY, fresh_emulator.url)
    size = 512 << 10
    with running_proxy([tmp_path], watch_interval_s=None) as proxy:
        client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
        for i in range(8):
            system = f"You answer from manual {i}.\n" + f"Chapter {i}: the device resets when held. " * (size // 44)
            client.messages.create(model="claude-sonnet-5", max_tokens=4, system=system,
                                   messages=[{"role": "user", "content": f"Question {i}: how do I reset it?"}])
        optimizer = proxy.app.state.registry.teams["hoarder"].pipeline.terminal.planner.optimizer
        history = [sum(len(block.text) for block in snapshot.blocks)
                   for scope in optimizer.ledger.scopes.values() for snapshot in scope.history]
        analysed = sum(len(line) for analysis in optimizer.detector._analyses.values() for line in analysis.lines)
    assert 0 < sum(history) <= 2 << 20  # before: all eight, 4 MiB
    assert len(history) >= 3  # the newest that fit
    assert analysed <= 8 * 32 * 1024  # the scanned head of each prompt only; before, every prompt whole
