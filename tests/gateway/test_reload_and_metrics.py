"""Policies reload on change without dropping in-flight requests; latency metrics and alerts."""

from __future__ import annotations

import os
import threading

import httpx
import openai
import pytest

from emulator.app import EmulatorConfig
from emulator.testing import running_emulator
from gateway.testing import running_proxy
from sdk import runtime
from tests.helpers import wait_until, write_policy

MESSAGES = [{"role": "user", "content": "hi"}]


def _accepted(client: openai.OpenAI) -> bool:
    """Whether the proxy takes this client's key now (a reload makes it valid)."""
    try:
        return bool(client.chat.completions.create(model="gpt-4o", messages=MESSAGES).choices)
    except openai.AuthenticationError:
        return False


def test_reload_on_change_keeps_in_flight_streams(tmp_path):
    with running_emulator(EmulatorConfig(per_output_token_ms=10.0, default_output_tokens=60)) as upstream:
        policy = write_policy(tmp_path, "team", "sk-old", upstream.url)
        with running_proxy([tmp_path], watch_interval_s=0.05) as proxy:
            old = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-old", max_retries=0)
            stream = old.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True)
            chunks = [next(iter(stream))]
            write_policy(tmp_path, "team", "sk-new", upstream.url)
            policy.touch()
            new = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-new", max_retries=0)
            wait_until(lambda: _accepted(new), "the new key became valid")
            chunks.extend(stream)  # the stream that began under the old policy finishes
            assert chunks[-1].choices[0].finish_reason in ("stop", "length")
            try:
                old.chat.completions.create(model="gpt-4o", messages=MESSAGES)
                raise AssertionError("the old key still works after reload")
            except openai.AuthenticationError:
                pass


def test_invalid_reload_keeps_previous_policy(tmp_path, emulator):
    policy = write_policy(tmp_path, "team", "sk-keep", emulator.url)
    with running_proxy([tmp_path], watch_interval_s=0.05) as proxy:
        policy.write_text(policy.read_text() + "nonsense_key: 1\n")
        wait_until(lambda: 'slipstream_policy_reloads_total{outcome="error"}' in httpx.get(f"{proxy.url}/metrics").text,
                   "the invalid edit was read and refused")
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-keep", max_retries=0)
        assert client.chat.completions.create(model="gpt-4o", messages=MESSAGES).choices
        assert 'slipstream_policy_reloads_total{outcome="error"}' in httpx.get(f"{proxy.url}/metrics").text


def test_unreadable_policy_does_not_end_the_watcher(tmp_path, emulator, caplog):
    """A non-UTF-8 byte ended the reload watcher silently; later valid edits were ignored."""
    policy = write_policy(tmp_path, "team", "sk-first", emulator.url)
    good = policy.read_text()
    with running_proxy([tmp_path], watch_interval_s=0.05) as proxy:
        policy.write_bytes(good.encode() + b"# caf\xe9\n")
        wait_until(lambda: "not UTF-8 text" in caplog.text, "the unreadable edit was logged")
        policy.write_text(good.replace("sk-first", "sk-second"))
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-second", max_retries=0)
        wait_until(lambda: _accepted(client), "the valid edit after the unreadable one was loaded")
        assert 'slipstream_policy_reloads_total{outcome="error"}' in httpx.get(f"{proxy.url}/metrics").text


def test_a_write_that_lands_during_a_failed_reload_is_read_next(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """An editor's save in two writes, the reload reading the first half: the files' stamps were taken
    after the failed read, when the second write had landed, so the whole file was never read, and
    that process (one worker of `--workers N`) kept the old policy while the others served the new."""
    policy = write_policy(tmp_path, "team", "sk-first", "http://127.0.0.1:9")
    good = policy.read_text()
    registry = runtime.TeamRegistry([tmp_path])
    policy.write_text(good + "nonsense_key: 1\n")  # the first write: not a policy yet
    os.utime(policy, ns=(10**18, 10**18))
    read = runtime.load_policies

    def while_the_second_write_lands(paths):
        try:
            return read(paths)
        finally:
            policy.write_text(good.replace("sk-first", "sk-second"))
            os.utime(policy, ns=(10**18 + 10**6, 10**18 + 10**6))

    monkeypatch.setattr(runtime, "load_policies", while_the_second_write_lands)
    assert not registry.reload_if_changed()  # the half-written file: refused, the old policy in force
    monkeypatch.setattr(runtime, "load_policies", read)
    assert registry.reload_if_changed()
    assert registry.authenticate("sk-second")[0].policy.team == "team"


def test_latency_histograms_and_alerts(tmp_path, emulator):
    write_policy(tmp_path, "metered", "sk-metered", emulator.url, extra="alerts: {window: 10, e2e_p50_ms: 0.001}\n")
    with running_proxy([tmp_path]) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-metered", max_retries=0)
        for _ in range(10):
            client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
        for _ in client.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True):
            pass
        text = httpx.get(f"{proxy.url}/metrics").text
    for name in ("ttft", "e2e", "itl", "tpot"):  # `gpt-*` passes the client's model on: labelled gpt/other
        assert f'slipstream_{name}_seconds_count{{route="gpt/other",team="metered"}}' in text, name
    assert 'slipstream_latency_alerts_total{metric="e2e",quantile="p50",team="metered"} 1.0' in text
    assert 'slipstream_latency_percentile_seconds{metric="ttft",quantile="p95",team="metered"}' in text


def test_concurrent_requests_through_proxy(tmp_path, emulator):
    write_policy(tmp_path, "busy", "sk-busy", emulator.url)
    with running_proxy([tmp_path]) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-busy", max_retries=0)
        errors: list[Exception] = []

        def worker() -> None:
            try:
                for _ in range(5):
                    client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
            except Exception as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert not errors
