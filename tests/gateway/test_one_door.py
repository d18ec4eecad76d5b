"""One door core (sdk/door/) behind both doors: each case runs through the proxy over HTTP with the
official client and through the drop-in SDK in process, and must get the same answer.

Each case is one the two doors answered differently before they shared the core: a provider's
refusal of the gateway's key (only the proxy dropped the provider's headers), the 404/405 for a
path or method not served (the messages differed), the request id of a pass-through refusal
(neither door named the id of the access-log line), and a pass-through body the upstream cut
(the drop-in appended an error event of its own to the provider's bytes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import openai
import orjson
import pytest

import sdk
from emulator.app import EmulatorConfig
from emulator.testing import running_emulator
from gateway.testing import running_proxy
from sdk.observability import access_log
from tests.helpers import write_policy

KEY = "sk-team-one-door"
HELLO = [{"role": "user", "content": "hi"}]
PLAIN = "retry: {max_attempts: 1}\nprompt_cache: {enabled: false}\n"


@contextlib.contextmanager
def _client(door: str, policies: Path) -> Iterator[openai.OpenAI]:
    """The official client at the proxy, or the drop-in SDK's, for the one team in `policies`."""
    if door == "proxy":
        with running_proxy([policies]) as proxy:
            yield openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
    else:
        yield sdk.OpenAI(policy=policies / "one-door.yaml", max_retries=0)


@pytest.mark.parametrize("door", ["proxy", "dropin"])
def test_a_provider_refusing_the_gateway_key_is_answered_alike(door: str, tmp_path: Path) -> None:
    """The provider's 401 is about the gateway's own key: the gateway's body, and none of the
    provider's headers (they describe the gateway's account), at both doors."""
    with running_emulator(EmulatorConfig(api_keys=frozenset({"the-right-key"}))) as strict:
        write_policy(tmp_path, "one-door", KEY, strict.url, extra=PLAIN, upstream_key="sk-up-WRONG-9f7e")
        with _client(door, tmp_path) as client, pytest.raises(openai.AuthenticationError) as refused:
            client.chat.completions.create(model="gpt-4o", messages=HELLO)
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
    assert "refused the gateway's upstream credentials" in refused.value.message and "9f7e" not in refused.value.message
    headers = refused.value.response.headers
    assert "x-request-id" not in headers  # the emulator's, like OpenAI's, on every answer it sends
    assert headers["x-slipstream-route"] == "gpt/gpt-4o" and headers["x-slipstream-request-id"]


@pytest.mark.parametrize("door", ["proxy", "dropin"])
def test_paths_and_methods_not_served_are_answered_alike(door: str, tmp_path: Path, emulator) -> None:
    write_policy(tmp_path, "one-door", KEY, emulator.url, extra=PLAIN)
    with _client(door, tmp_path) as client:
        with pytest.raises(openai.NotFoundError) as missing:
            client.get("/nothing-here", cast_to=object)
        with pytest.raises(openai.APIStatusError) as wrong:
            client.post("/models", cast_to=object, body={})
    assert missing.value.body["message"] == "GET /v1/nothing-here is not an endpoint Slipstream serves (docs/api.md lists them)"
    assert wrong.value.status_code == 405 and wrong.value.body["message"] == "POST is not allowed on /v1/models: use GET"
    assert missing.value.response.headers["x-slipstream-request-id"] and wrong.value.response.headers["x-slipstream-request-id"]


@pytest.mark.parametrize("door", ["proxy", "dropin"])
def test_a_passthrough_refusal_names_its_access_log_line(door: str, tmp_path: Path, emulator, capsys) -> None:
    write_policy(tmp_path, "one-door", KEY, emulator.url, extra=PLAIN)
    access_log.configure("json")
    try:
        with _client(door, tmp_path) as client, pytest.raises(openai.NotFoundError) as missing:
            client.files.retrieve("file-nobody-made-this")  # not the team's: refused before it goes upstream
        access_log.flush()  # lines are written by the access log's thread
        logged = [orjson.loads(line) for line in capsys.readouterr().err.splitlines() if "passthrough:files" in line]
    finally:
        access_log.configure("off")
    (line,) = logged
    assert line["status"] == 404 and line["request_id"] == missing.value.response.headers["x-slipstream-request-id"]


@pytest.mark.parametrize("door", ["proxy", "dropin"])
def test_a_passthrough_body_cut_upstream_is_cut_at_both_doors(door: str, tmp_path: Path, fresh_emulator) -> None:
    """A pass-through body is the provider's bytes (a download, a completion stream): when the upstream
    breaks off mid-body, the client sees a broken transfer, never an error event of ours inside it."""
    write_policy(tmp_path, "one-door", KEY, fresh_emulator.url, extra=PLAIN)
    fresh_emulator.inject_fault("disconnect_after:events=2")
    with _client(door, tmp_path) as client, pytest.raises(openai.APIConnectionError) as cut:
        for _ in client.completions.create(model="gpt-3.5-turbo-instruct", prompt="Say hello.", stream=True):
            pass
    assert type(cut.value.__cause__).__name__ == "RemoteProtocolError"  # httpx's over HTTP, httpx2's in process
