"""The work one Responses request makes, counted (not timed): the trips to the team's response store a
continuation makes, and the walks of `fields.check` a translated request makes. Through the proxy, with
the official client, the emulator as the providers."""

from __future__ import annotations

import collections
import sys
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from gateway.testing import RunningServer, running_proxy
from sdk.responses.sqlite_store import SQLiteResponseStore
from sdk.routing.translation import fields
from tests.responses.conftest import policy_text

KEY, OTHER = "sk-work-team", "sk-work-other"
CALLS = ("get", "chain", "chain_bytes", "find_items", "item_bytes", "put")


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[RunningServer]:
    directory = tmp_path_factory.mktemp("work-policies")
    (directory / "work.yaml").write_text(policy_text("work", KEY, emulator.url))
    (directory / "other.yaml").write_text(policy_text("other", OTHER, emulator.url))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path_factory.mktemp("work-data")))
        with running_proxy([directory]) as running:
            yield running


@pytest.fixture
def store_calls(monkeypatch) -> collections.Counter[str]:
    """Calls of the response store's methods (the proxy runs in this process; its store is SQLite)."""
    counted: collections.Counter[str] = collections.Counter()
    for name in CALLS:
        def counting(*args: Any, _name: str = name, _method: Any = getattr(SQLiteResponseStore, name), **kwargs: Any) -> Any:
            counted[_name] += 1
            return _method(*args, **kwargs)
        monkeypatch.setattr(SQLiteResponseStore, name, counting)
    return counted


@pytest.fixture
def checks(monkeypatch) -> collections.Counter[str]:
    """Walks of fields.check by the shape checked, wherever a module took the function by name."""
    counted: collections.Counter[str] = collections.Counter()
    original = fields.check

    def counting(shape: fields.Shape, *args: Any, **kwargs: Any) -> list[str]:
        counted[shape.name] += 1
        return original(shape, *args, **kwargs)

    for module in list(sys.modules.values()):
        if (module.__name__ or "").startswith("sdk.") and getattr(module, "check", None) is original:
            monkeypatch.setattr(module, "check", counting)
    return counted


def _client(proxy: RunningServer, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=key, max_retries=0)


def _ask(client: openai.OpenAI, model: str, stream: bool, **kwargs: Any) -> Any:
    if not stream:
        return client.responses.create(model=model, **kwargs)
    with client.responses.stream(model=model, **kwargs) as events:
        return events.get_final_response()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("model", ["oai-work", "gpt-4o", "claude-sonnet-4-5"])
def test_a_continuation_reads_the_response_it_continues_once(proxy: RunningServer, fresh_emulator: Any,
                                                             store_calls: collections.Counter[str], model: str, stream: bool) -> None:
    """The limits stage asked the store for the conversation's size, the target for the previous response,
    and a translated target for the whole chain again, that response included: chain_bytes, get and chain
    (6 SQLite turns with the put, and 3 Redis calls before it). The limits stage reads the response once now
    and the target takes it from there; a translated target asks only for the turns before it."""
    client = _client(proxy)
    first = _ask(client, model, False, input="My locker code is 4417.")
    store_calls.clear()
    second = _ask(client, model, stream, input="What is my locker code?", previous_response_id=first.id)
    assert dict(store_calls) == {"get": 1, "put": 1}
    store_calls.clear()
    third = _ask(client, model, stream, input="And backwards?", previous_response_id=second.id)
    native = model.startswith("oai")  # the provider holds the chain: nothing of it is sent
    assert dict(store_calls) == ({"get": 1, "put": 1} if native else {"get": 1, "chain": 1, "put": 1})
    assert third.output_text and third.usage.input_tokens > second.usage.input_tokens  # the whole conversation read


def test_another_teams_response_is_still_not_found(proxy: RunningServer, fresh_emulator: Any) -> None:
    """What the limits stage read is the team's own: another team's id is asked for, and is the 404, on every target."""
    first = _client(proxy).responses.create(model="oai-work", input="Hello")
    sent = len(fresh_emulator.app.state.recent)
    for model in ("oai-work", "gpt-4o", "claude-sonnet-4-5"):
        with pytest.raises(openai.NotFoundError):
            _client(proxy, OTHER).responses.create(model=model, input="Go on", previous_response_id=first.id)
    assert len(fresh_emulator.app.state.recent) == sent


@pytest.mark.parametrize("stream", [False, True])
def test_a_translated_request_checks_each_body_once(proxy: RunningServer, fresh_emulator: Any,
                                                    checks: collections.Counter[str], stream: bool) -> None:
    """A Responses request for Claude was checked four times: its Responses body by the translation and
    again for the dropped-fields header, and the Chat body made from it by TranslatingProvider and again by
    the Chat → Messages translation. Each body once now; a continuation's expanded body as well as the
    client's own (the header names what the client's body loses)."""
    client = _client(proxy)
    tools: Any = [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}]
    raw = client.responses.with_raw_response.create(model="claude-sonnet-4-5", input="Tell me about fjords.", tools=tools,
                                                    service_tier="default", stream=stream)
    assert dict(checks) == {"RESPONSES": 1, "CHAT": 1}
    assert "service_tier" in raw.headers["x-slipstream-dropped-fields"].split(",")  # named as before
    checks.clear()
    client.responses.create(model="gpt-4o", input="Tell me about fjords.")
    assert dict(checks) == {"RESPONSES": 1}
    first = client.responses.create(model="claude-sonnet-4-5", input="Tell me about fjords.")
    checks.clear()
    client.responses.create(model="claude-sonnet-4-5", input="And glaciers?", previous_response_id=first.id)
    assert dict(checks) == {"RESPONSES": 2, "CHAT": 1}
