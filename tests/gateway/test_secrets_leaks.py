"""Secrets stay out of what clients and logs see (issue 25, item 7).

- A state URL's password never reaches a log line, /readyz's `last_error` or an error message.
- A provider the gateway cannot reach is named in the 502 by its policy name, never by URL or address.
- A provider's 401 that echoes (part of) the gateway's key is replaced on every pipeline endpoint
  and the stored-response calls, at both doors.
"""

from __future__ import annotations

import logging
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

import sdk
from emulator.app import EmulatorConfig
from emulator.testing import running_emulator
from gateway.testing import free_port, running_proxy
from sdk.state import masked_url, open_state
from sdk.state.backend import Admission, Rate
from sdk.state.guard import GuardedState
from sdk.state.redis import RedisState
from tests.helpers import write_policy

PASSWORD = "s3cret-redis-pw"
WRONG_UPSTREAM = "sk-upstream-WRONG-9f7e"  # the emulator echoes a key's last four characters
TEAM = "sk-team-secrets"


def test_state_urls_are_masked() -> None:
    assert masked_url(f"rediss://app:{PASSWORD}@cache:6380/2?prefix=p&password=x") == "rediss://app:***@cache:6380/2?prefix=p&password=***"
    for url in (f"memcache://:{PASSWORD}@cache:11211/0", f"redis+proxy://:{PASSWORD}@cache:26379/0"):  # schemes it does not speak
        with pytest.raises(ValueError) as bad:
            open_state(url)
        assert PASSWORD not in str(bad.value) and "***" in str(bad.value)


async def test_a_state_backend_going_down_logs_no_password(caplog: pytest.LogCaptureFixture) -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0?timeout_ms=100"  # nothing listens there
    state = GuardedState(RedisState(url))
    with caplog.at_level(logging.WARNING, logger="slipstream.state"):
        assert await state.admit(Admission("", (Rate("limit:t:rpm", 60, 1),))) is None  # served locally
    assert state.status()["up"] is False
    assert any("unreachable" in record.getMessage() for record in caplog.records)
    assert all(PASSWORD not in record.getMessage() for record in caplog.records)
    assert PASSWORD not in str(state.status())
    await state.close()


def _team(directory: Path, emulator_url: str, upstream_key: str | None = None) -> Path:
    extra = "retry: {max_attempts: 1}\nprompt_cache: {enabled: false}\nmodels: {upstream_lists: true}\n"
    write_policy(directory, "secrets", TEAM, emulator_url, extra=extra, upstream_key=upstream_key)
    return directory


def test_an_unreachable_provider_is_named_not_located(tmp_path: Path) -> None:
    port = free_port()
    dead = f"http://127.0.0.1:{port}"
    with running_proxy([_team(tmp_path, dead)]) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=TEAM, max_retries=0)
        with pytest.raises(openai.APIStatusError) as failed:
            client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert failed.value.status_code == 502
    message = failed.value.body["message"]
    assert "provider 'gpt'" in message and str(port) not in message and "127.0.0.1" not in message
    drop_in = sdk.Anthropic(policy=tmp_path / "secrets.yaml", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as failed_too:
        drop_in.messages.create(model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert failed_too.value.status_code == 502 and "provider 'claude'" in str(failed_too.value.body)
    assert str(port) not in str(failed_too.value.body)


def _refused(body: object) -> None:
    text = str(body)
    assert WRONG_UPSTREAM[-4:] not in text and "Incorrect API key" not in text and "invalid x-api-key" not in text
    assert "refused the gateway's upstream credentials" in text


def test_upstream_auth_errors_are_replaced_on_every_endpoint(tmp_path: Path) -> None:
    hello = [{"role": "user", "content": "hi"}]
    with running_emulator(EmulatorConfig(api_keys=frozenset({"the-right-key"}))) as strict, \
            running_proxy([_team(tmp_path, strict.url, WRONG_UPSTREAM)]) as proxy:
        oa = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=TEAM, max_retries=0)
        an = anthropic.Anthropic(base_url=proxy.url, api_key=TEAM, max_retries=0)
        drop_in = sdk.OpenAI(policy=tmp_path / "secrets.yaml", max_retries=0)
        calls = {
            "chat": lambda: oa.chat.completions.create(model="gpt-4o", messages=hello),
            "embeddings": lambda: oa.embeddings.create(model="gpt-embed", input="hi"),
            "responses": lambda: oa.responses.create(model="gpt-4o", input="hi"),
            "messages": lambda: an.messages.create(model="claude-x", max_tokens=8, messages=hello),
            "count_tokens": lambda: an.messages.count_tokens(model="claude-x", messages=hello),
            "drop-in chat": lambda: drop_in.chat.completions.create(model="gpt-4o", messages=hello),
            "drop-in embeddings": lambda: drop_in.embeddings.create(model="gpt-embed", input="hi"),
        }
        for name, call in calls.items():
            with pytest.raises((openai.APIStatusError, anthropic.APIStatusError)) as refused:
                call()
            assert refused.value.status_code == 401, name
            _refused(refused.value.body)
        models = httpx.get(f"{proxy.url}/v1/models", headers={"authorization": f"Bearer {TEAM}"})
        assert WRONG_UPSTREAM[-4:] not in models.text and "Incorrect API key" not in models.text
