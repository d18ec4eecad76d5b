"""A client that goes away cancels the upstream call, streaming or not, and leaves nothing behind."""

from __future__ import annotations

import os
import time

import anthropic
import httpx
import openai
import pytest

from emulator.app import EmulatorConfig
from emulator.testing import running_emulator
from gateway.testing import running_proxy
from tests.helpers import write_policy

MESSAGES = [{"role": "user", "content": "Write a long story."}]
KEY = "sk-cancel"


@pytest.fixture(scope="module")
def slow_stack(tmp_path_factory):
    """An emulator that streams slowly (20 ms per token) behind a proxy."""
    config = EmulatorConfig(per_output_token_ms=20.0, default_output_tokens=400)
    with running_emulator(config) as upstream:
        directory = tmp_path_factory.mktemp("cancel")
        write_policy(directory, "cancel", KEY, upstream.url)
        with running_proxy([directory]) as proxy:
            yield upstream, proxy


def _stats(upstream) -> dict:
    return httpx.get(f"{upstream.url}/_emulator/stats").json()


def _wait_for(upstream, field: str, value: int, timeout_s: float = 2.0) -> float:
    """Seconds until the emulator's counter reaches `value` (fails after timeout_s)."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        if _stats(upstream)[field] >= value:
            return time.perf_counter() - started
        time.sleep(0.005)
    raise AssertionError(f"{field} did not reach {value}: {_stats(upstream)}")


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_breaking_out_of_openai_stream_cancels_upstream(slow_stack):
    upstream, proxy = slow_stack
    httpx.post(f"{upstream.url}/_emulator/reset")
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
    stream = client.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True)
    for index, _ in enumerate(stream):
        if index == 3:
            break
    stream.close()
    elapsed = _wait_for(upstream, "cancelled_streams", 1)
    assert elapsed < 0.5, f"upstream saw the cancel after {elapsed * 1000:.0f} ms"
    assert _stats(upstream)["completed_streams"] == 0


def test_closing_anthropic_stream_cancels_upstream(slow_stack):
    upstream, proxy = slow_stack
    httpx.post(f"{upstream.url}/_emulator/reset")
    client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    with client.messages.stream(model="claude-x", max_tokens=400, messages=MESSAGES) as stream:
        for index, _ in enumerate(stream.text_stream):
            if index == 2:
                break
    elapsed = _wait_for(upstream, "cancelled_streams", 1)
    assert elapsed < 0.5, f"upstream saw the cancel after {elapsed * 1000:.0f} ms"


def test_client_timeout_cancels_pending_non_streaming_call(slow_stack):
    upstream, proxy = slow_stack
    httpx.post(f"{upstream.url}/_emulator/reset")
    httpx.post(f"{upstream.url}/_emulator/faults", json={"fault": "stall:ms=5000", "count": 1})
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0, timeout=0.3)
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    elapsed = _wait_for(upstream, "cancelled_requests", 1)
    assert elapsed < 0.5, f"upstream saw the cancel after {elapsed * 1000:.0f} ms"


def test_repeated_cancels_leave_no_connections_tasks_or_gauges(slow_stack):
    upstream, proxy = slow_stack
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
    client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=5)  # warm the pools
    httpx.post(f"{upstream.url}/_emulator/reset")
    before = _open_fds()
    for _ in range(10):
        stream = client.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True)
        next(iter(stream))
        stream.close()
    _wait_for(upstream, "cancelled_streams", 10)
    time.sleep(0.2)
    stats = _stats(upstream)
    assert stats["open_streams"] == 0 and stats["open_requests"] == 0
    assert _open_fds() <= before + 2  # the client's own pooled connection may be replaced
    metrics = httpx.get(f"{proxy.url}/metrics").text
    assert 'slipstream_in_flight_requests{team="cancel"} 0.0' in metrics
