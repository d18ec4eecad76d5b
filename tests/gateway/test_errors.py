"""Every bad input gets a provider-shaped error with a clear message, and nothing hangs."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from gateway.testing import free_port, running_proxy
from tests.gateway.conftest import TEAM_KEY
from tests.helpers import write_policy

MESSAGES = [{"role": "user", "content": "hello"}]


def inject(emulator, fault: str, count: int = 1, model: str = "*") -> None:
    httpx.post(f"{emulator.url}/_emulator/faults", json={"fault": fault, "count": count, "match": {"model": model}}).raise_for_status()


def test_missing_and_wrong_team_key(proxy):
    with pytest.raises(openai.AuthenticationError) as oa_error:
        openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-wrong", max_retries=0).chat.completions.create(
            model="gpt-4o", messages=MESSAGES
        )
    assert oa_error.value.body["message"] == "invalid team key"
    missing = httpx.post(f"{proxy.url}/v1/messages", json={"model": "claude-x", "max_tokens": 5, "messages": MESSAGES})
    assert missing.status_code == 401
    assert missing.json()["type"] == "error"
    assert missing.json()["error"]["type"] == "authentication_error"
    assert "missing team key" in missing.json()["error"]["message"]


def test_malformed_json_is_400(proxy):
    response = httpx.post(
        f"{proxy.url}/v1/chat/completions", content=b"{not json", headers={"authorization": f"Bearer {TEAM_KEY}"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert "not valid JSON" in response.json()["error"]["message"]


def test_missing_model_is_400(proxy):
    response = httpx.post(f"{proxy.url}/v1/messages", json={"messages": MESSAGES}, headers={"x-api-key": TEAM_KEY})
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("model:")


def test_no_route_is_404(proxy):
    with pytest.raises(anthropic.NotFoundError) as error:
        anthropic.Anthropic(base_url=proxy.url, api_key=TEAM_KEY, max_retries=0).messages.create(
            model="llama-unknown", max_tokens=5, messages=MESSAGES
        )
    assert "no route for model 'llama-unknown'" in str(error.value)


def test_body_over_limit_is_413(tmp_path, emulator):
    write_policy(tmp_path, "small", "sk-small", emulator.url, extra="limits: {max_body_bytes: 1000}\n")
    with running_proxy([tmp_path]) as proxy:
        big = [{"role": "user", "content": "x" * 5000}]
        with pytest.raises(openai.APIStatusError) as error:
            openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-small", max_retries=0).chat.completions.create(
                model="gpt-4o", messages=big
            )
        assert error.value.status_code == 413
        assert "over this team's limit of 1000 bytes" in error.value.message


def test_unreachable_upstream_is_502(tmp_path):
    write_policy(tmp_path, "down", "sk-down", f"http://127.0.0.1:{free_port()}", extra="retry: {max_attempts: 1}\n")
    with running_proxy([tmp_path]) as proxy:
        with pytest.raises(anthropic.APIStatusError) as error:
            anthropic.Anthropic(base_url=proxy.url, api_key="sk-down", max_retries=0).messages.create(
                model="claude-x", max_tokens=5, messages=MESSAGES
            )
        assert error.value.status_code == 502
        assert "cannot reach" in error.value.message


def test_upstream_error_passes_through_with_retry_after(proxy, fresh_emulator):
    inject(fresh_emulator, "429:retry_after=30", count=2)  # 30 s is over the policy's max delay: no wait
    with pytest.raises(anthropic.RateLimitError) as error:
        anthropic.Anthropic(base_url=proxy.url, api_key=TEAM_KEY, max_retries=0).messages.create(
            model="claude-x", max_tokens=5, messages=MESSAGES
        )
    assert error.value.response.headers["retry-after"] == "30"
    assert error.value.body["error"]["type"] == "rate_limit_error"
    _assert_slipstream_headers(error.value.response.headers)


def _assert_slipstream_headers(headers) -> None:
    """A passed-through upstream error carries the x-slipstream-* headers, like every answer."""
    assert headers["x-slipstream-route"] == "claude/claude-x" and headers["x-slipstream-cache"] == "miss"
    assert float(headers["x-slipstream-overhead-ms"]) >= 0 and "expected_read=" in headers["x-slipstream-prompt-cache"]


def test_upstream_error_in_process_carries_the_same_headers(policy_dir, fresh_emulator):
    from sdk import Anthropic

    inject(fresh_emulator, "429:retry_after=30", count=2)
    with pytest.raises(anthropic.RateLimitError) as error:
        Anthropic(policy=policy_dir / "alpha.yaml", max_retries=0).messages.create(model="claude-x", max_tokens=5, messages=MESSAGES)
    _assert_slipstream_headers(error.value.response.headers)


def test_transient_failure_before_first_byte_is_retried(proxy, fresh_emulator):
    inject(fresh_emulator, "500", count=1)
    result = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=TEAM_KEY, max_retries=0).chat.completions.create(
        model="gpt-4o", messages=MESSAGES
    )
    assert result.choices[0].message.content
    stats = httpx.get(f"{fresh_emulator.url}/_emulator/stats").json()
    assert stats["faults_injected"] == 1


def test_reset_connection_is_retried_then_502(proxy, fresh_emulator):
    inject(fresh_emulator, "reset", count=5)
    with pytest.raises(openai.APIStatusError) as error:
        openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=TEAM_KEY, max_retries=0).chat.completions.create(
            model="gpt-4o", messages=MESSAGES
        )
    assert error.value.status_code == 502


@pytest.mark.parametrize("fault", ["disconnect_after:events=3", "midstream_error:events=3"])
def test_failure_after_first_byte_ends_stream_with_error_event(proxy, fresh_emulator, fault):
    inject(fresh_emulator, fault)
    client = anthropic.Anthropic(base_url=proxy.url, api_key=TEAM_KEY, max_retries=0)
    events = []
    with pytest.raises(anthropic.APIStatusError), client.messages.stream(model="claude-x", max_tokens=64, messages=MESSAGES) as stream:
        for event in stream:
            events.append(event.type)
    assert events and events[0] == "message_start"
    inject(fresh_emulator, fault)
    oa = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=TEAM_KEY, max_retries=0)
    with pytest.raises(openai.APIError):
        for _ in oa.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True):
            pass


@pytest.mark.parametrize("fault", ["disconnect_after:events=3", "midstream_error:events=3"])
def test_a_native_responses_stream_that_fails_after_its_first_byte_ends_with_response_failed(proxy, fresh_emulator, fault):
    """A native Responses upstream whose stream broke off ended with a Chat Completions error line (`data:
    {"error": …}`), which the SDK's Responses stream raised as a bare APIError and Codex cannot read; OpenAI
    ends a failed Responses stream with an `error` event and the terminal `response.failed`. The upstream's own
    in-band failure (midstream_error) reaches the client as it sent it."""
    inject(fresh_emulator, fault)
    oa = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=TEAM_KEY, max_retries=0)
    events = list(oa.responses.create(model="gpt-4o", input="Tell me about fjords.", stream=True))
    assert fresh_emulator.state.recent[-1]["path"] == "/v1/responses"  # native
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.failed"
    assert kinds[-2] == "error" or fault.startswith("midstream")  # the emulator's own failure: response.failed alone
    assert [event.sequence_number for event in events] == list(range(len(events)))
    failed = events[-1]
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert failed.response.id == events[0].response.id
    assert failed.response.error is not None and failed.response.error.code == "server_error"


async def test_a_responses_stream_that_raises_mid_stream_ends_with_response_failed():
    """The door's end of a Responses stream that raised after its first byte (a Slipstream error or a bug of
    ours) was the Chat Completions error line too."""
    from sdk.routing.translation.responses_streams import ending_as_responses
    from sdk.routing.translation.streams import ChunkError

    async def broken():
        yield (b'event: response.created\ndata: {"type":"response.created","sequence_number":0,"response":'
               b'{"id":"resp_1","object":"response","status":"in_progress","output":[]}}\n\n')
        raise RuntimeError("boom")

    out = [item async for item in ending_as_responses(broken(), {"model": "gpt-4o"}, lambda exc: ChunkError(500, str(exc)))]
    events = [json.loads(item.split(b"data: ", 1)[1]) for item in out]
    assert [e["type"] for e in events] == ["response.created", "error", "response.failed"]
    assert [e["sequence_number"] for e in events] == [0, 1, 2]
    assert events[2]["response"]["id"] == "resp_1" and events[2]["response"]["error"] == {"code": "server_error", "message": "boom"}
