"""Responses API ids belong to the team that made them, with two teams sharing ONE provider key
(`up-openai` at the emulator, which like OpenAI keeps one store per key).

Another team's response id, or an item in it, answers exactly like an id nobody made: a 404 from
Slipstream, and nothing reaches the provider. With one replica and with two over Redis.
"""

from __future__ import annotations

import contextlib
from typing import Any

import openai
import pytest

import sdk
from gateway.testing import running_proxy
from tests.responses.conftest import KEY, OTHER_KEY, policy_text
from tests.state.conftest import redis_server, redis_url  # noqa: F401  (fixtures)

MADE_UP = "resp_0123456789abcdef0123456789abcdef"


def _client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def _not_found(call, response_id: str) -> tuple[int, str]:
    """The 404's status and body with the id blanked: equal for a foreign id and a made-up one."""
    with pytest.raises(openai.NotFoundError) as caught:
        call(response_id)
    return caught.value.status_code, caught.value.response.text.replace(response_id, "ID")


def test_a_native_response_cannot_be_continued_read_or_deleted_by_another_team(proxy, fresh_emulator):
    mine, theirs = _client(proxy.url, KEY), _client(proxy.url, OTHER_KEY)
    secret = mine.responses.create(model="oai-4o", input="My locker code is 4417. Remember it.", max_output_tokens=30)
    sent = fresh_emulator.stats()["requests_total"]
    uses = [
        lambda rid: theirs.responses.create(model="oai-4o", input="What was the code?", previous_response_id=rid),
        lambda rid: theirs.responses.create(model="oai-4o", input="Go on.", previous_response_id=rid, stream=True),
        lambda rid: theirs.responses.input_tokens.count(model="oai-4o", input="Go on.", previous_response_id=rid),
        lambda rid: theirs.responses.compact(model="oai-4o", previous_response_id=rid),
        lambda rid: theirs.responses.retrieve(rid),
        lambda rid: theirs.responses.input_items.list(rid),
        lambda rid: theirs.responses.delete(rid),
        lambda rid: theirs.responses.create(model="gpt-4o", input="Go on.", previous_response_id=rid),  # translated
    ]
    for use in uses:
        assert _not_found(use, secret.id) == _not_found(use, MADE_UP)  # no oracle for ids
    assert fresh_emulator.stats()["requests_total"] == sent  # nothing named the id upstream

    follow = mine.responses.create(model="oai-4o", input="What was the code?", previous_response_id=secret.id)
    assert follow.usage.input_tokens > secret.usage.input_tokens  # the owner continues it at the provider
    assert mine.responses.retrieve(secret.id).id == secret.id


def test_ownership_holds_across_replicas_over_redis(tmp_path, monkeypatch, fresh_emulator, redis_url):  # noqa: F811
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "responses.yaml").write_text(policy_text("responses", KEY, fresh_emulator.url))
    (tmp_path / "other.yaml").write_text(policy_text("other", OTHER_KEY, fresh_emulator.url))
    with running_proxy([tmp_path], state_url=redis_url) as a, running_proxy([tmp_path], state_url=redis_url) as b:
        secret = _client(a.url, KEY).responses.create(model="oai-4o", input="My locker code is 4417.", max_output_tokens=30)
        theirs = _client(b.url, OTHER_KEY)
        for use in (lambda rid: theirs.responses.create(model="oai-4o", input="The code?", previous_response_id=rid),
                    lambda rid: theirs.responses.retrieve(rid)):
            assert _not_found(use, secret.id) == _not_found(use, MADE_UP)
        follow = _client(b.url, KEY).responses.create(model="oai-4o", input="The code?", previous_response_id=secret.id)
        assert follow.usage.input_tokens > secret.usage.input_tokens  # the owner's record reached replica b at once


@pytest.fixture(params=["proxy", "dropin"])
def door(request, proxy, policy_dir, tmp_path_factory, monkeypatch):
    if request.param == "proxy":
        return _client(proxy.url, KEY)
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path_factory.mktemp("dropin-data")))
    return sdk.OpenAI(policy=policy_dir / "responses.yaml", max_retries=0)


@pytest.mark.parametrize("model", ["gpt-4o", "claude-x", "oai-4o"])
def test_item_references_resolve_from_the_teams_store(door, model, fresh_emulator):
    """The Vercel AI SDK's multi-turn shape: the whole conversation again, earlier answers as
    `item_reference` items. Resolved from the team's store on every route, translated or native."""
    question = {"role": "user", "content": "Tell me about fjords."}
    first = door.responses.create(model=model, input=[question], max_output_tokens=40)
    answer = next(item for item in first.output if item.type == "message")
    follow = {"role": "user", "content": "And glaciers?"}
    second = door.responses.create(model=model, input=[question, {"type": "item_reference", "id": answer.id}, follow])
    alone = door.responses.create(model=model, input=[question, follow], store=False)
    assert second.status == "completed" and second.output_text
    assert second.usage.input_tokens > alone.usage.input_tokens  # the referenced answer travelled upstream
    items = door.responses.input_items.list(second.id, order="asc")
    assert len(items.data) == 3 and items.data[1].id == answer.id  # the reference (translated), or the item it named (native)

    with pytest.raises(openai.NotFoundError, match="msg_nobody_made_this"):
        door.responses.create(model=model, input=[question, {"type": "item_reference", "id": "msg_nobody_made_this"}])


def test_another_teams_items_cannot_be_referenced(proxy, fresh_emulator):
    mine, theirs = _client(proxy.url, KEY), _client(proxy.url, OTHER_KEY)
    first = mine.responses.create(model="claude-x", input="My locker code is 4417.", max_output_tokens=30)
    answer = next(item for item in first.output if item.type == "message")
    sent = fresh_emulator.stats()["requests_total"]
    for model in ("claude-x", "gpt-4o", "oai-4o"):
        def use(item_id, model=model):
            return theirs.responses.create(model=model, input=[{"type": "item_reference", "id": item_id}, {"role": "user", "content": "Go on."}])
        status, body = _not_found(use, answer.id)
        assert (status, body) == _not_found(use, "msg_0123456789abcdef") and "Item with id 'ID' not found" in body
    assert fresh_emulator.stats()["requests_total"] == sent


def test_compact_passes_through_natively_and_is_a_404_elsewhere(door, fresh_emulator):
    first = door.responses.create(model="oai-4o", input="Tell me about fjords.", max_output_tokens=40)
    compacted = door.responses.compact(model="oai-4o", previous_response_id=first.id)
    assert compacted.object == "response.compaction" and compacted.output[-1].type == "compaction"
    assert compacted.usage.input_tokens > 0
    for model in ("gpt-4o", "claude-x"):  # translated routes: OpenAI's answer to a path it lacks, not a 405
        with pytest.raises(openai.NotFoundError, match="compact"):
            door.responses.compact(model=model, input="Tell me about fjords.")
    mixed = door.responses.with_raw_response.compact(model="mixed-x", input="Tell me about fjords.")
    assert mixed.headers["x-slipstream-route"] == "oai/gpt-4.1-mini"  # a translated first target passes it on


def test_a_background_response_is_refused_before_it_runs_uncounted(door, fresh_emulator):
    """`background: true` runs the response at the provider after the call has answered `queued`,
    with no usage: nothing the team's limits or budget could charge, under the key every team
    shares. It was sent to a native target as it came; it is refused before anything leaves."""
    sent = fresh_emulator.stats()["requests_total"]
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError, match="background") as caught:
            door.responses.create(model="oai-4o", input="Write a long essay.", background=True, stream=stream)
        assert "Slipstream" in caught.value.message  # the gateway's refusal, not the provider's
    assert fresh_emulator.stats()["requests_total"] == sent  # nothing ran upstream
    assert door.responses.create(model="oai-4o", input="Hi.", background=False, max_output_tokens=20).status in ("completed", "incomplete")


def test_stored_response_calls_and_model_lists_count_against_the_teams_rate_limit(tmp_path, monkeypatch, fresh_emulator):
    """GET, DELETE and input_items of a native response go to the provider under the key every team
    shares, and so may a model list: they never passed the team's limits, so a team over its
    requests per minute went on calling the shared account without end. Counted as requests now."""
    monkeypatch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "limited.yaml").write_text(policy_text("limited", KEY, fresh_emulator.url,
                                                       extra="limits: {requests_per_minute: 3}"))
    with running_proxy([tmp_path], watch_interval_s=None) as proxy:
        client = _client(proxy.url, KEY)
        made = client.responses.create(model="oai-4o", input="Hi.", max_output_tokens=20)  # 1 of 3
        client.responses.retrieve(made.id)  # 2
        client.models.list()  # 3
        sent = fresh_emulator.stats()["requests_total"]
        for call in (lambda: client.responses.retrieve(made.id), lambda: client.responses.input_items.list(made.id),
                     lambda: client.responses.delete(made.id), lambda: client.models.list()):
            with pytest.raises(openai.RateLimitError, match="rate limit"):
                call()
        assert fresh_emulator.stats()["requests_total"] == sent  # none reached the provider


def test_another_teams_reasoning_items_cannot_be_named_by_id(proxy, fresh_emulator):
    """OpenAI reads a reasoning item sent by its id alone (no `encrypted_content`) from the responses
    stored on the account every team shares ("just include their IDs in subsequent messages", its
    reasoning-items cookbook), as it reads an `item_reference`: another team's `rs_` id went upstream
    as sent, so a team could have the provider continue from another team's reasoning. It is checked
    against the team's store as an `item_reference` is now; the owner's, and a self-contained item
    (its encrypted content sent, as with `store: false`), pass."""
    mine, theirs = _client(proxy.url, KEY), _client(proxy.url, OTHER_KEY)
    first = mine.responses.create(model="o4-mini", input="My locker code is 4417.", max_output_tokens=30,
                                  reasoning={"effort": "low"})
    reasoning = next(item for item in first.output if item.type == "reasoning")
    sent = fresh_emulator.stats()["requests_total"]

    def use(client: openai.OpenAI, item: dict, **extra: Any) -> Any:
        return client.responses.create(model="o4-mini", input=[item, {"role": "user", "content": "Go on."}], max_output_tokens=30,
                                       **extra)

    by_id = {"type": "reasoning", "id": reasoning.id, "summary": []}
    status, body = _not_found(lambda rid: use(theirs, {**by_id, "id": rid}), reasoning.id)
    assert (status, body) == _not_found(lambda rid: use(theirs, {**by_id, "id": rid}), "rs_0123456789abcdef")
    assert fresh_emulator.stats()["requests_total"] == sent  # nothing named the id upstream
    assert use(mine, by_id).object == "response"  # the owner's own reasoning reaches the provider
    whole = {**by_id, "id": "rs_theirs_own", "encrypted_content": "ZW11bGF0b3I="}  # self-contained, in a turn not recorded
    assert use(theirs, whole, store=False).object == "response"
    assert fresh_emulator.stats()["requests_total"] == sent + 2


def test_another_teams_reasoning_id_does_not_enter_the_teams_store_through_a_translated_turn(proxy, fresh_emulator):
    """The check above was made on native targets only. A translated turn (`gpt-*`: Chat Completions)
    naming another team's reasoning item by id was answered and recorded with that item, which was
    then an item of the team's own store: an `item_reference` to it, or the item by id again, went to
    the native target as the item by id, and OpenAI read it from the other team's response. A turn
    that is answered names only reasoning its team's store holds, whatever its target."""
    mine, theirs = _client(proxy.url, KEY), _client(proxy.url, OTHER_KEY)
    first = mine.responses.create(model="o4-mini", input="My locker code is 4417.", max_output_tokens=30,
                                  reasoning={"effort": "low"})
    rs = next(item for item in first.output if item.type == "reasoning").id
    by_id, go_on = {"type": "reasoning", "id": rs, "summary": []}, {"role": "user", "content": "Go on."}
    fresh_emulator.app.state.recent.clear()
    with contextlib.suppress(openai.NotFoundError):  # refused now; answered and recorded on the old code
        theirs.responses.create(model="gpt-4o", input=[by_id, go_on], max_output_tokens=30)
    for item in ({"type": "item_reference", "id": rs}, by_id):
        with pytest.raises(openai.NotFoundError):
            theirs.responses.create(model="o4-mini", input=[item, go_on], max_output_tokens=30)
    assert [r["path"] for r in fresh_emulator.app.state.recent if rs.encode() in (r["body"] or b"")] == []  # never named upstream

    def translated(rid: str) -> Any:
        return theirs.responses.create(model="gpt-4o", input=[{**by_id, "id": rid}, go_on], max_output_tokens=30)

    assert _not_found(translated, rs) == _not_found(translated, "rs_0123456789abcdef")  # no oracle for ids
    assert mine.responses.create(model="gpt-4o", input=[by_id, go_on], max_output_tokens=30).object == "response"  # the owner's


def test_another_teams_generated_image_cannot_be_named_by_id(proxy, fresh_emulator):
    """OpenAI edits the image an earlier image generation call made when the call is sent by its id
    alone (`{"type": "image_generation_call", "id": "ig_…"}`, its image generation guide's "using image
    ID"), read from the responses stored on the account every team shares. Such an item went upstream
    as sent, so a team could have the provider edit, and show it, another team's generated image. It
    is held to the team's store as a reasoning item by id is; the owner's, and a call carrying its
    image (`result`), pass."""
    mine, theirs = _client(proxy.url, KEY), _client(proxy.url, OTHER_KEY)
    first = mine.responses.create(model="oai-4o", input="Draw the floor plan of my house.", tools=[{"type": "image_generation"}],
                                  max_output_tokens=30)
    image = next(item for item in first.output if item.type == "image_generation_call")
    sent = fresh_emulator.stats()["requests_total"]

    def use(client: openai.OpenAI, item: dict, **extra: Any) -> Any:
        return client.responses.create(model="oai-4o", input=[{"role": "user", "content": "Now make it realistic."}, item],
                                       tools=[{"type": "image_generation"}], max_output_tokens=30, **extra)

    by_id = {"type": "image_generation_call", "id": image.id}
    assert _not_found(lambda rid: use(theirs, {**by_id, "id": rid}), image.id) == \
        _not_found(lambda rid: use(theirs, {**by_id, "id": rid}), "ig_0123456789abcdef")  # no oracle for ids
    assert fresh_emulator.stats()["requests_total"] == sent  # nothing named the id upstream
    assert use(mine, by_id).object == "response"  # the owner edits its own image
    own = {**by_id, "id": "ig_theirs_own", "status": "completed", "result": image.result}
    assert use(theirs, own, store=False).object == "response"  # self-contained: the image travels with it
    assert fresh_emulator.stats()["requests_total"] == sent + 2


def test_another_teams_mcp_call_cannot_be_approved_by_id(proxy, fresh_emulator):
    """An `mcp_approval_response` lets the MCP call its `approval_request_id` names run, and OpenAI reads
    that request (server, tool, arguments) from the responses stored on the account every team shares:
    another team's id went upstream as sent, so a team could approve, and read the output of, another
    team's pending MCP call. The id is held to the team's store as a reasoning item by id is; the
    owner's approval, and one whose request travels in the same input (`store: false`), pass."""
    mine, theirs = _client(proxy.url, KEY), _client(proxy.url, OTHER_KEY)
    tool = {"type": "mcp", "server_label": "deploy", "server_url": "https://mcp.example.com/sse", "require_approval": "always"}
    first = mine.responses.create(model="oai-4o", input="Deploy the release.", tools=[tool], max_output_tokens=30)
    pending = next(item for item in first.output if item.type == "mcp_approval_request")
    sent = fresh_emulator.stats()["requests_total"]

    def approve(client: openai.OpenAI, request_id: str, model: str = "oai-4o", **extra: Any) -> Any:
        approval = {"type": "mcp_approval_response", "approval_request_id": request_id, "approve": True}
        return client.responses.create(model=model, input=[*extra.pop("before", []), approval], tools=[tool],
                                       max_output_tokens=30, **extra)

    for model in ("oai-4o", "gpt-4o"):  # native, and a translated turn (whose items the team's store would hold)
        assert _not_found(lambda rid, m=model: approve(theirs, rid, m), pending.id) == \
            _not_found(lambda rid, m=model: approve(theirs, rid, m), "mcpr_0123456789abcdef")  # no oracle for ids
    assert fresh_emulator.stats()["requests_total"] == sent  # nothing named the id upstream

    done = approve(mine, pending.id, previous_response_id=first.id)  # the owner approves its own call
    assert [item.type for item in done.output if item.type.startswith("mcp")] == ["mcp_call"]
    carried = {"type": "mcp_approval_request", "id": "mcpr_theirs_own", "server_label": "deploy", "name": "echo",
               "arguments": "{}"}
    assert approve(theirs, "mcpr_theirs_own", before=[carried], store=False).object == "response"  # self-contained
    with pytest.raises(openai.NotFoundError):  # recorded, the whole item would make the other team's id the team's
        approve(theirs, pending.id, before=[{**carried, "id": pending.id}])
    assert fresh_emulator.stats()["requests_total"] == sent + 2


def test_an_item_sent_whole_does_not_make_another_teams_id_the_teams(proxy, fresh_emulator):
    """A reasoning item carrying encrypted content (an image call its image, an MCP approval request its
    arguments) is self-contained and passed whatever its id; a turn to be stored recorded it under that
    id, so a team sent another team's reasoning id with any encrypted content once, and then by id alone:
    its store held the id, and the provider read the other team's reasoning. A turn the team's store
    records names only ids the store holds, whole or not; one not recorded (`store: false`) is as before."""
    mine, theirs = _client(proxy.url, KEY), _client(proxy.url, OTHER_KEY)
    first = mine.responses.create(model="o4-mini", input="My locker code is 4417.", max_output_tokens=30,
                                  reasoning={"effort": "low"})
    rs = next(item for item in first.output if item.type == "reasoning").id
    whole, by_id = {"type": "reasoning", "id": rs, "summary": [], "encrypted_content": "ZW11bGF0b3I="}, {"type": "reasoning", "id": rs, "summary": []}
    go_on = {"role": "user", "content": "Go on."}
    fresh_emulator.app.state.recent.clear()
    for model in ("o4-mini", "gpt-4o"):  # native, and translated
        with pytest.raises(openai.NotFoundError):  # answered and recorded on the old code
            theirs.responses.create(model=model, input=[whole, go_on], max_output_tokens=30)
    assert theirs.responses.create(model="o4-mini", input=[whole, go_on], max_output_tokens=30, store=False).object == "response"
    for item in (by_id, {"type": "item_reference", "id": rs}):
        with pytest.raises(openai.NotFoundError):  # sent upstream by id on the old code
            theirs.responses.create(model="o4-mini", input=[item, go_on], max_output_tokens=30)
    assert len([r for r in fresh_emulator.app.state.recent if rs.encode() in (r["body"] or b"")]) == 1  # the store: false turn
    assert mine.responses.create(model="o4-mini", input=[whole, go_on], max_output_tokens=30).object == "response"  # the owner's
