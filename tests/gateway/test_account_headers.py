"""What an answer says about the provider account: teams that share a provider key share its
account, whose rate-limit headers every team's traffic moves (a team reading them watched the
others' request and token volume), and whose name no team's request ever carries."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from emulator.app import EmulatorConfig
from emulator.testing import running_emulator
from gateway.testing import RunningServer, running_proxy
from sdk.sse import account_limit_event, event_data, events_of
from tests.helpers import write_policy

A, B, C = "sk-alpha-account", "sk-beta-account", "sk-gamma-account"
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
MESSAGES = {"model": "claude-sonnet-4-6", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
ACCOUNT_NAMES = ("openai-organization", "openai-project", "anthropic-organization-id")


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[RunningServer]:
    directory: Path = tmp_path_factory.mktemp("accounts")
    write_policy(directory, "alpha", A, emulator.url)  # alpha and beta: the same provider keys
    write_policy(directory, "beta", B, emulator.url)
    write_policy(directory, "gamma", C, emulator.url, upstream_key="up-gamma-own")  # an account of its own
    with running_proxy([directory], watch_interval_s=None) as running:
        yield running


def _answers(proxy: RunningServer, key: str) -> Iterator[httpx.Headers]:
    """The headers of a chat completion, a streamed one, a Messages call and a files list (pass-through)."""
    headers = {"authorization": f"Bearer {key}", "anthropic-version": "2023-06-01"}
    with httpx.Client(base_url=proxy.url, headers=headers) as http:
        yield http.post("/v1/chat/completions", json=CHAT).raise_for_status().headers
        with http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as streamed:
            yield streamed.raise_for_status().headers
        yield http.post("/v1/messages", json=MESSAGES).raise_for_status().headers
        yield http.get("/v1/files").raise_for_status().headers


def _rate_limits(headers: httpx.Headers) -> list[str]:
    return [name for name in headers if name.startswith(("x-ratelimit-", "anthropic-ratelimit-"))]


def test_a_shared_accounts_rate_limits_and_name_are_not_shown(proxy):
    for headers in _answers(proxy, A):
        assert _rate_limits(headers) == []
        assert not any(name in headers for name in ACCOUNT_NAMES)
        assert headers.get("x-request-id") or headers.get("request-id") or headers.get("x-slipstream-route")


def test_a_team_with_an_account_of_its_own_sees_its_rate_limits(proxy):
    for headers in _answers(proxy, C):
        assert _rate_limits(headers)  # what the provider says of the team's own account
        assert not any(name in headers for name in ACCOUNT_NAMES)


def test_a_shared_accounts_priority_capacity_is_not_shown(tmp_path):
    """An organisation with Priority Tier answers with the state of its priority capacity
    (`anthropic-priority-*`; fast mode's `anthropic-fast-*` alike): every team's priority traffic
    moves it, as it moves the rate limits. It passed to teams sharing the account."""
    with running_emulator(EmulatorConfig(priority_tier=True)) as emulator:
        write_policy(tmp_path, "alpha", A, emulator.url)
        write_policy(tmp_path, "beta", B, emulator.url)
        write_policy(tmp_path, "gamma", C, emulator.url, upstream_key="up-gamma-own")
        with running_proxy([tmp_path], watch_interval_s=None) as proxy:
            seen = {}
            for key in (A, C):
                headers = {"authorization": f"Bearer {key}", "anthropic-version": "2023-06-01"}
                with httpx.Client(base_url=proxy.url, headers=headers) as http:
                    whole = http.post("/v1/messages", json=MESSAGES).raise_for_status().headers
                    with http.stream("POST", "/v1/messages", json={**MESSAGES, "stream": True}) as streamed:
                        seen[key] = [whole, streamed.raise_for_status().headers]
    for headers in seen[A]:
        assert not [name for name in headers if name.startswith(("anthropic-priority-", "anthropic-fast-"))]
    for headers in seen[C]:  # an account of the team's own: its own capacity, shown
        assert headers["anthropic-priority-input-tokens-remaining"] == "999000"


def test_a_shared_accounts_rate_limit_error_names_neither_the_account_nor_its_use(proxy, fresh_emulator):
    """A provider's 429 says what the headers say: OpenAI's 'Rate limit reached for gpt-4o in
    organization org-… Limit 10000, Used 10000', Anthropic's 'the rate limit for your organization
    (…)'. It passed to the team as it came: the account's name and every team's use of it. A team
    sharing the key gets the gateway's own message (the provider's type and code, and retry-after,
    kept); a team with an account of its own still reads the provider's."""
    seen = {}
    for key in (A, C):
        fresh_emulator.inject_fault("429:retry_after=30", count=3)  # every attempt: 30 s is over the retry's wait
        fresh_emulator.inject_fault("429:retry_after=30", count=3, path="/v1/messages")
        headers = {"authorization": f"Bearer {key}", "anthropic-version": "2023-06-01"}
        with httpx.Client(base_url=proxy.url, headers=headers) as http:
            seen[key] = [http.post("/v1/chat/completions", json=CHAT), http.post("/v1/messages", json=MESSAGES)]
            fresh_emulator.inject_fault("429:retry_after=30", count=1, path="/v1/completions")
            seen[key].append(http.post("/v1/completions", json={"model": "gpt-3.5-turbo-instruct", "prompt": "Hi"}))  # pass-through
        httpx.post(f"{fresh_emulator.url}/_emulator/reset").raise_for_status()
    for answer in seen[A]:
        assert answer.status_code == 429 and answer.headers["retry-after"] == "30"
        error = answer.json()["error"]
        assert "organization" not in error["message"] and "Used" not in error["message"]
        assert "rate limit" in error["message"] and error["type"] in ("requests", "rate_limit_error")
    assert seen[A][0].json()["error"]["code"] == "rate_limit_exceeded"
    assert "org-emulator" in seen[C][0].json()["error"]["message"] and "org-emulator" in seen[C][2].json()["error"]["message"]
    assert "organization" in seen[C][1].json()["error"]["message"]


def test_a_shared_accounts_rate_limit_in_a_stream_names_neither_the_account_nor_its_use(proxy, fresh_emulator):
    """A limit the provider hits after a stream started comes as an in-band error event (Anthropic's
    `event: error`, OpenAI's error chunk and Responses `error` / `response.failed`), whose message is the
    429's: 'the rate limit for your organization (…)', 'in organization org-… Used 29000'. It passed to
    the team as it came, though the 429 of the same limit was scrubbed. A team sharing the key gets the
    gateway's message in the event (the provider's type kept), native and translated to a Chat
    client; a team with an account of its own still reads the provider's."""
    seen: dict[str, list[bytes]] = {}
    for key in (A, C):
        headers = {"authorization": f"Bearer {key}", "anthropic-version": "2023-06-01"}
        seen[key] = []
        with httpx.Client(base_url=proxy.url, headers=headers) as http:
            for path, body in (("/v1/messages", MESSAGES), ("/v1/chat/completions", {**MESSAGES, "stream_options": {"include_usage": True}})):
                fresh_emulator.inject_fault("midstream_error:events=2,type=rate_limit_error", count=1, path="/v1/messages")
                with http.stream("POST", path, json={**body, "stream": True}) as streamed:
                    seen[key].append(streamed.raise_for_status().read())
    native, translated = ([event_data(e) for e in events_of(stream) if b"rate limit" in e] for stream in seen[A])
    assert len(native) == len(translated) == 1
    error = orjson.loads(native[0])["error"]
    assert error["type"] == "rate_limit_error" and "over a rate limit of the provider account" in error["message"]
    assert b"organization" not in seen[A][0] + seen[A][1] and b"emulator" not in seen[A][0] + seen[A][1]
    assert b"rate limit for your organization (emulator)" in seen[C][0] and b"your organization (emulator)" in seen[C][1]


@pytest.mark.parametrize("event", [
    b'data: {"error":{"message":"Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, '
    b'Used 29000","type":"tokens","param":null,"code":"rate_limit_exceeded"}}\n\n',
    b'event: error\ndata: {"type":"error","code":"rate_limit_exceeded","message":"Rate limit reached for gpt-4o in '
    b'organization org-x: Used 29000","param":null,"sequence_number":3}\n\n',
    b'event: response.failed\ndata: {"type":"response.failed","sequence_number":4,"response":{"id":"resp_1","status":'
    b'"failed","error":{"code":"insufficient_quota","message":"You exceeded your current quota (organization org-x)"}}}\n\n'])
def test_openais_in_band_limit_errors_are_scrubbed_in_each_shape(event):
    """The OpenAI shapes of an in-band limit error (a Chat error chunk, a Responses `error` event and
    `response.failed`): the message is the gateway's, every other field and the event's name the provider's."""
    scrubbed = account_limit_event(event, "openai")
    assert b"org-x" not in scrubbed and b"29000" not in scrubbed and scrubbed.startswith(event.split(b"data:")[0])
    before, after = orjson.loads(event_data(event)), orjson.loads(event_data(scrubbed))
    assert after != before and {k for k in after if after[k] != before[k]} <= {"error", "message", "response"}
    assert account_limit_event(event.replace(b"rate_limit_exceeded", b"server_error").replace(b"insufficient_quota", b"server_error"),
                               "openai").count(b"org-x") == 1  # other errors pass as they came


def test_openais_in_band_rate_limits_name_neither_the_account_nor_its_use(proxy, fresh_emulator):
    """OpenAI's shapes of the same limit after a stream started: a Chat error chunk, a Responses
    `response.failed`, and a completion's error chunk, which the pass-through streams on. Each named
    'organization org-emulator … Used 10000' to a team sharing the key; the gateway's message now, the
    code kept. A team with an account of its own reads the provider's."""
    asks = (("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}}),
            ("/v1/responses", {"model": "gpt-4o-mini", "input": "Hi", "max_output_tokens": 16}),
            ("/v1/completions", {"model": "gpt-3.5-turbo-instruct", "prompt": "Hi", "max_tokens": 8}))
    seen: dict[str, list[bytes]] = {}
    for key in (A, C):
        seen[key] = []
        with httpx.Client(base_url=proxy.url, headers={"authorization": f"Bearer {key}"}) as http:
            for path, body in asks:
                fresh_emulator.inject_fault("midstream_error:events=2,type=rate_limit_exceeded", count=1, path=path)
                with http.stream("POST", path, json={**body, "stream": True}) as streamed:
                    seen[key].append(streamed.raise_for_status().read())
    for stream in seen[A]:
        assert b"rate_limit_exceeded" in stream and b"over a rate limit of the provider account" in stream
        assert b"organization" not in stream and b"Used 10000" not in stream
    assert all(b"in organization org-emulator" in stream for stream in seen[C])
