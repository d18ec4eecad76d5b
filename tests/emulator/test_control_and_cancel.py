"""Cancellation counters, latency model, control endpoints and the `python -m emulator` entry."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import anthropic
import httpx
import openai
import pytest

from emulator import EmulatorConfig
from emulator.testing import RunningEmulator, running_emulator
from tests.helpers import PATIENCE_S, STALL_MS

from .conftest import KEY
from .helpers import ANTHROPIC_HEADERS, HTTP, post

MSGS = [{"role": "user", "content": "Tell me a long story"}]


@pytest.fixture(scope="module")
def slow() -> RunningEmulator:
    """Streams of 2000 tokens paced at 5 ms/token (10 s; 5 s at max_tokens=1000), so a client leaves
    mid-way however loaded the machine."""
    with running_emulator(EmulatorConfig(per_output_token_ms=5, default_output_tokens=2000)) as e:
        yield e


def test_anthropic_client_breaks_out_of_stream(slow):
    slow.reset()
    with anthropic.Anthropic(base_url=slow.url, api_key=KEY, max_retries=0) as c, \
            c.messages.stream(model="claude-sonnet-4-6", max_tokens=1000, messages=MSGS) as s:
        for ev in s:
            if ev.type == "content_block_delta":
                break
    st = slow.wait_for(lambda s: s["cancelled_streams"] == 1 and s["open_streams"] == 0)
    assert st["completed_streams"] == 0 and st["open_requests"] == 0


def test_openai_client_closes_stream(slow):
    slow.reset()
    with openai.OpenAI(base_url=slow.openai_url, api_key=KEY, max_retries=0) as c:
        stream = c.chat.completions.create(model="gpt-5-mini", messages=MSGS, stream=True)
        next(iter(stream))
        stream.close()
    st = slow.wait_for(lambda s: s["cancelled_streams"] == 1 and s["open_streams"] == 0)
    assert st["completed_streams"] == 0


async def test_async_cancel_counts_once(slow):
    slow.reset()
    async with anthropic.AsyncAnthropic(base_url=slow.url, api_key=KEY, max_retries=0) as c:
        stream = await c.messages.create(model="claude-sonnet-4-6", max_tokens=1000, messages=MSGS,
                                         stream=True)
        n = 0
        async for _ in stream:
            n += 1
            if n == 4:
                break
        await stream.close()
    slow.wait_for(lambda s: s["cancelled_streams"] == 1 and s["open_streams"] == 0)


def test_stream_pacing_and_completion(slow):
    slow.reset()
    t = time.perf_counter()
    r = post(slow.url, "/v1/messages", {"model": "claude-sonnet-4-6", "max_tokens": 40,
                                         "messages": MSGS, "stream": True}, ANTHROPIC_HEADERS)
    elapsed = time.perf_counter() - t
    assert r.status_code == 200 and elapsed >= 0.15  # 40 tokens x 5 ms (timer slack; a lower bound: load only adds)
    assert slow.stats()["completed_streams"] == 1


def test_non_streaming_cancel_while_thinking():
    """A client that leaves while the emulator is 'thinking' is counted as a cancelled request. It
    leaves once the emulator holds the request (an event), not after a timer that load could outrun."""
    with running_emulator(EmulatorConfig(ttft_base_ms=STALL_MS)) as e:
        client = socket.create_connection(("127.0.0.1", int(e.url.rsplit(":", 1)[1])), timeout=PATIENCE_S)
        body = json.dumps({"model": "claude-sonnet-4-6", "max_tokens": 10, "messages": MSGS}).encode()
        head = "".join(f"{name}: {value}\r\n" for name, value in ANTHROPIC_HEADERS.items())
        client.sendall(f"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n{head}\r\n".encode() + body)
        e.wait_for(lambda s: s["open_requests"] == 1)
        client.close()
        st = e.wait_for(lambda s: s["cancelled_requests"] == 1 and s["open_requests"] == 0)
        assert st["cancelled_streams"] == 0


def test_latency_model_cache_reads_are_fast():
    cfg = EmulatorConfig(ttft_per_uncached_token_ms=0.5)  # 2000 uncached tokens -> 1 s
    from .helpers import blocks

    content = blocks(1, 2000, marked=(1,))
    with running_emulator(cfg) as e, anthropic.Anthropic(base_url=e.url, api_key=KEY, max_retries=0) as c:
        def timed() -> float:
            t = time.perf_counter()
            c.messages.create(model="claude-sonnet-4-6", max_tokens=4,
                              messages=[{"role": "user", "content": content}])
            return time.perf_counter() - t
        cold, warm = timed(), timed()
    # The warm call skips the modelled second; both carry the machine's load alike.
    assert cold >= 1.0 and warm < cold - 0.5


def test_realistic_preset():
    r = EmulatorConfig.realistic()
    assert r.ttft_base_ms == 200 and r.per_output_token_ms == 10 and r.ttft_per_uncached_token_ms > 0
    assert EmulatorConfig().ttft_base_ms == 0 and EmulatorConfig().per_output_token_ms == 0


def test_control_endpoints(emu, anth):
    anth.messages.create(model="claude-sonnet-4-6", max_tokens=4, messages=MSGS)
    s = HTTP.get(emu.url + "/_emulator/stats").json()
    assert s["requests_total"] == 1 and s["endpoints"] == {"POST /v1/messages": 1}
    assert {"open_requests", "open_streams", "completed_streams", "cancelled_streams",
            "cancelled_requests", "faults_injected", "cache"} <= set(s)
    rec = HTTP.get(emu.url + "/_emulator/requests").json()["requests"]
    assert rec[-1]["path"] == "/v1/messages" and rec[-1]["body"]["max_tokens"] == 4
    assert KEY not in str(rec[-1]["headers"])  # credentials are masked
    HTTP.post(emu.url + "/_emulator/faults", json={"fault": "500", "count": 3}).raise_for_status()
    assert len(HTTP.get(emu.url + "/_emulator/faults").json()["faults"]) == 1
    cfg = HTTP.post(emu.url + "/_emulator/config", json={"default_output_tokens": 7}).json()
    assert cfg["default_output_tokens"] == 7
    HTTP.post(emu.url + "/_emulator/config", json={"default_output_tokens": 48}).raise_for_status()
    assert HTTP.post(emu.url + "/_emulator/config", json={"nope": 1}).status_code == 400
    assert HTTP.post(emu.url + "/_emulator/reset").json() == {"ok": True}
    s = HTTP.get(emu.url + "/_emulator/stats").json()
    assert s["requests_total"] == 0 and s["pending_faults"] == 0
    assert HTTP.get(emu.url + "/nope").status_code == 404


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_python_dash_m_serves():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "emulator", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                r = HTTP.get(f"http://127.0.0.1:{port}/v1/models",
                              headers={"authorization": "Bearer k"}, timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        assert r.status_code == 200 and r.json()["object"] == "list"
    finally:
        proc.terminate()
        proc.wait(timeout=5)
