"""A Responses turn in a provider-side conversation (OpenAI's Conversations API: `conversation`, an id or
`{"id"}`): the provider prepends the conversation's items to the turn's input and appends the turn's input
and output to it, so the same request body is a different question at every point of the conversation.

The gateway serves no /v1/conversations endpoint (a conversation is an object made on the provider
account without it, usable by a team whose policy lists it under `provider_objects`: sdk/state/ownership.py),
so the conversation here is created at the provider, the emulator, with the provider key."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from gateway.testing import RunningServer, running_proxy
from sdk.cache.stage import skip_reason
from sdk.types import Endpoint, LLMRequest
from tests.helpers import requires_extra
from tests.responses.conftest import policy_text

cached = requires_extra("semantic")  # the proxy's team has the response cache on, whose index is faiss

KEY, OTHER = "sk-conversing-team", "sk-unlisted-team"


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, emulator) -> Iterator[RunningServer]:
    directory = tmp_path_factory.mktemp("conversation-policies")
    cached = "semantic_cache: {enabled: true}\n"
    (directory / "conversing.yaml").write_text(policy_text("conversing", KEY, emulator.url, extra=cached + 'provider_objects: ["*"]\n'))
    (directory / "unlisted.yaml").write_text(policy_text("unlisted", OTHER, emulator.url, extra=cached))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path_factory.mktemp("conversation-data")))
        with running_proxy([directory]) as running:
            yield running


def _at_provider(emulator: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{emulator.url}/v1", api_key="up-openai", max_retries=0)


def _answered(emulator: Any) -> int:
    return sum(1 for r in emulator.app.state.recent if r["path"] == "/v1/responses")


@cached
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("model", ["oai-conv", "auto-conv"])
@pytest.mark.parametrize("as_object", [False, True])
def test_a_turn_in_a_provider_conversation_is_never_answered_from_the_cache(proxy: RunningServer, fresh_emulator: Any,
                                                                           stream: bool, model: str, as_object: bool) -> None:
    """The same question asked twice in one conversation: the second time the provider reads the first
    turn too (and appends the second to the conversation). The cache keyed both by the body alone, so the
    second was its hit (`exact-hit`): the first turn's answer, which the conversation had moved past, and a
    turn the provider never saw, missing from the conversation from then on."""
    conversation = _at_provider(fresh_emulator).conversations.create(
        items=[{"type": "message", "role": "user", "content": "My locker code is 4417."}])
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
    ask: dict[str, Any] = {"model": model, "input": "What is my locker code?", "temperature": 0}
    named: Any = {"id": conversation.id} if as_object else conversation.id
    texts = []
    for _ in range(2):
        if stream:
            with client.responses.with_streaming_response.create(**ask, conversation=named, stream=True) as raw:
                assert raw.headers.get("x-slipstream-cache") == "miss"
                finals = [event.response for event in raw.parse() if event.type == "response.completed"]
            texts.append(finals[0].output_text)
        else:
            raw = client.responses.with_raw_response.create(**ask, conversation=named)
            assert raw.headers.get("x-slipstream-cache") == "miss"
            texts.append(raw.parse().output_text)
    assert _answered(fresh_emulator) == 2  # the provider answered both turns
    items = _at_provider(fresh_emulator).conversations.items.list(conversation.id, order="asc").data
    # the first message, then each turn's question and answer, in order
    assert [item.type for item in items] == ["message"] * 5
    assert texts[0] != texts[1]  # the second answer read the first turn


@cached
def test_a_conversation_the_teams_policy_does_not_list_is_not_found(proxy: RunningServer, fresh_emulator: Any) -> None:
    """Conversations are made on the provider account every team shares, not through the gateway, which
    cannot tell whose one is: a team may name only those its policy lists (`provider_objects`), else the
    404, and nothing is sent (no cache answers it either)."""
    conversation = _at_provider(fresh_emulator).conversations.create()
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=OTHER, max_retries=0)
    for named in (conversation.id, {"id": conversation.id}):
        with pytest.raises(openai.NotFoundError) as refused:
            client.responses.create(model="oai-conv", input="Hi", conversation=named, temperature=0)  # type: ignore[arg-type]
        assert "provider_objects" in str(refused.value)
    assert _answered(fresh_emulator) == 0
    assert _at_provider(fresh_emulator).conversations.items.list(conversation.id).data == []


@cached
def test_the_proxy_does_not_serve_the_conversations_endpoints(proxy: RunningServer, fresh_emulator: Any) -> None:
    """A conversation made through the gateway would be on the account every team shares with no record of
    whose it is: /v1/conversations is not passed through (the provider-shaped 404), and nothing is sent."""
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.conversations.create()
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve("conv_anything")
    assert not [r for r in fresh_emulator.app.state.recent if r["path"].startswith("/v1/conversations")]


@cached
def test_a_cached_answer_still_answers_the_same_turn_outside_a_conversation(proxy: RunningServer, fresh_emulator: Any) -> None:
    """What the change leaves as it was: a turn that names no conversation is still the cache's to answer."""
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
    ask: dict[str, Any] = {"model": "oai-conv", "input": "Name a colour of the sea at dusk.", "temperature": 0}
    first = client.responses.with_raw_response.create(**ask)
    again = client.responses.with_raw_response.create(**ask)
    assert again.headers.get("x-slipstream-cache") == "exact-hit"
    assert again.parse().output_text == first.parse().output_text and _answered(fresh_emulator) == 1


@cached
def test_a_conversation_gone_at_the_provider_leaves_an_auto_provider_native(proxy: RunningServer, fresh_emulator: Any) -> None:
    """OpenAI answers a turn naming a conversation it does not have (deleted, or never made on this account)
    with a 404, as it does an item gone ("... with id '...' not found."). A provider left to discover whether
    its upstream has /responses (`responses: auto`) took that for a missing path and served every later
    request translated, for the policy's life: this turn came back as the translation's 400 for
    `conversation`, and the team's next turns lost what only the native API does. The 404 is the client's now,
    and the provider stays native."""
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError) as gone:
        client.responses.create(model="auto-conv", input="Hi", conversation="conv_gone", temperature=0)
    assert "conv_gone" in str(gone.value)
    assert client.responses.create(model="auto-conv", input="Hi", temperature=0).output_text
    assert [r["path"] for r in fresh_emulator.app.state.recent] == ["/v1/responses", "/v1/responses"]  # both native


@pytest.mark.parametrize("named", ["conv_1", {"id": "conv_1"}])
def test_the_cache_stage_leaves_a_conversation_turn_to_the_provider(named: Any) -> None:
    """The stage itself says a turn in a provider conversation is not its to key (before, only the Chat form's
    refusal of `conversation`, which keys a Responses request, kept it from being cached)."""
    assert skip_reason(LLMRequest(Endpoint.RESPONSES, {"model": "gpt-4o", "input": "Hi", "conversation": named})) == "conversation"
    assert skip_reason(LLMRequest(Endpoint.RESPONSES, {"model": "gpt-4o", "input": "Hi", "conversation": None})) is None
