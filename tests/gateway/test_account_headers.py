"""What an answer says about the provider account: teams that share a provider key share its
account, whose rate-limit headers every team's traffic moves (a team reading them watched the
others' request and token volume), and whose name no team's request ever carries."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from emulator.app import EmulatorConfig
from emulator.testing import running_emulator
from gateway.testing import RunningServer, running_proxy
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
