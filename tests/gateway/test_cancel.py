"""A client that goes away cancels the upstream call, streaming or not, and leaves nothing behind."""

from __future__ import annotations

import http.client
import json
import os
from urllib.parse import urlsplit

import anthropic
import httpx
import openai
import pytest

from emulator.app import EmulatorConfig
from emulator.testing import running_emulator
from gateway.testing import running_proxy
from tests.helpers import PATIENCE_S, STALL_MS, wait_until, write_policy

MESSAGES = [{"role": "user", "content": "Write a long story."}]
KEY = "sk-cancel"


@pytest.fixture(scope="module")
def slow_stack(tmp_path_factory):
    """An emulator that streams slowly (20 ms per token, 400 tokens: 8 s a stream) behind a proxy."""
    config = EmulatorConfig(per_output_token_ms=20.0, default_output_tokens=400)
    with running_emulator(config) as upstream:
        directory = tmp_path_factory.mktemp("cancel")
        write_policy(directory, "cancel", KEY, upstream.url)
        with running_proxy([directory]) as proxy:
            yield upstream, proxy


def _stats(upstream) -> dict:
    return httpx.get(f"{upstream.url}/_emulator/stats").json()


def _wait_for(upstream, field: str, value: int) -> dict:
    """The emulator's counters once `field` reaches `value` (an event, however loaded the machine)."""
    return wait_until(lambda: (stats := _stats(upstream))[field] >= value and stats, f"{field} reached {value}")


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
    stats = wait_until(lambda: (s := _stats(upstream))["cancelled_streams"] + s["completed_streams"] >= 1 and s, "the stream ended")
    assert stats["cancelled_streams"] == 1 and stats["completed_streams"] == 0  # cancelled, not run to its end


def test_closing_anthropic_stream_cancels_upstream(slow_stack):
    upstream, proxy = slow_stack
    httpx.post(f"{upstream.url}/_emulator/reset")
    client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0)
    with client.messages.stream(model="claude-x", max_tokens=400, messages=MESSAGES) as stream:
        for index, _ in enumerate(stream.text_stream):
            if index == 2:
                break
    stats = wait_until(lambda: (s := _stats(upstream))["cancelled_streams"] + s["completed_streams"] >= 1 and s, "the stream ended")
    assert stats["cancelled_streams"] == 1 and stats["completed_streams"] == 0


def test_client_going_away_cancels_pending_non_streaming_call(slow_stack):
    """A client that gives up (a timeout, a closed connection) while the upstream has not answered
    yet: the upstream call is dropped, not left to finish. The client leaves once the emulator holds
    the call (an event), so no timer decides whether the call got there first."""
    upstream, proxy = slow_stack
    httpx.post(f"{upstream.url}/_emulator/reset")
    httpx.post(f"{upstream.url}/_emulator/faults", json={"fault": f"stall:ms={STALL_MS}", "count": 1})
    connection = http.client.HTTPConnection(urlsplit(proxy.url).netloc, timeout=PATIENCE_S)
    connection.request("POST", "/v1/chat/completions", json.dumps({"model": "gpt-4o", "messages": MESSAGES}),
                       {"authorization": f"Bearer {KEY}", "content-type": "application/json"})
    _wait_for(upstream, "open_requests", 1)
    connection.close()
    stats = _wait_for(upstream, "cancelled_requests", 1)
    assert stats["statuses"] == {}  # no answer was ever sent upstream-side


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
    wait_until(lambda: (s := _stats(upstream))["open_streams"] == 0 and s["open_requests"] == 0, "nothing open upstream")
    assert _open_fds() <= before + 2  # the client's own pooled connection may be replaced
    metrics = httpx.get(f"{proxy.url}/metrics").text
    assert 'slipstream_in_flight_requests{team="cancel"} 0.0' in metrics


@pytest.mark.parametrize("client_protocol", ["openai", "anthropic"])
def test_leaving_a_translated_stream_cancels_upstream(slow_stack, client_protocol):
    """A Chat client's stream from Claude, a Messages client's from gpt-4o: the protocol translation in
    between passes the client's leaving on to the upstream, as a native stream does."""
    upstream, proxy = slow_stack
    httpx.post(f"{upstream.url}/_emulator/reset")
    if client_protocol == "openai":
        stream = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0).chat.completions.create(
            model="claude-sonnet-4-6", messages=MESSAGES, stream=True)
    else:
        stream = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0).messages.create(
            model="gpt-4o", max_tokens=400, messages=MESSAGES, stream=True)
    for index, _ in enumerate(stream):
        if index == 3:
            break
    stream.close()
    stats = wait_until(lambda: (s := _stats(upstream))["cancelled_streams"] + s["completed_streams"] >= 1 and s, "the stream ended")
    assert stats["cancelled_streams"] == 1 and stats["completed_streams"] == 0
