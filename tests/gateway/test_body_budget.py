"""The request bodies a proxy process holds at once are bounded, each team its share (sdk/door/bodies.py).

Each team's body limit bounds one request; nothing bounded them all together, so one team's many
concurrent large requests could hold the memory of the process every team's requests share. Here the
budget is 2 MiB (a team alone holds up to half of it), bodies are about 400 KB and the emulator's
streams last minutes, so a request holds its body until its client closes the stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from emulator.app import EmulatorConfig
from emulator.testing import running_emulator
from gateway.app import create_app
from gateway.testing import RunningServer, serve_in_thread
from sdk.door.bodies import BodyBudget
from sdk.errors import RateLimitedError, SlipstreamError
from tests.helpers import wait_until

BUDGET = 2 << 20
TEXT = "lorem ipsum " * 33_000  # about 400 KB: two fit in a team's half of the budget, not three


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Any]]:
    slow = EmulatorConfig(per_output_token_ms=50.0, default_output_tokens=4000)  # each stream lasts minutes
    with running_emulator(slow) as emulator, pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLIPSTREAM_DATA_DIR", str(tmp_path_factory.mktemp("bodies-data")))
        directory: Path = tmp_path_factory.mktemp("bodies")
        for team in ("alpha", "beta"):
            (directory / f"{team}.yaml").write_text(f"""team: {team}
api_keys: [{{value: "sk-{team}"}}]
providers:
  claude: {{kind: anthropic, base_url: "{emulator.url}", api_key: up-anthropic}}
  gpt: {{kind: openai, base_url: "{emulator.url}/v1", api_key: up-openai}}
  translated: {{kind: openai, base_url: "{emulator.url}/v1", api_key: up-openai, responses: chat}}
routes:
  - match: {{model: "claude-*"}}
    targets: [{{provider: claude}}]
  - match: {{model: "tr-*"}}
    targets: [{{provider: translated, model: gpt-4.1}}]
  - targets: [{{provider: gpt}}]
retry: {{max_attempts: 1}}
prompt_cache: {{enabled: false}}
""")
        app = create_app([directory], watch_interval_s=None, body_bytes_in_flight=BUDGET)
        with serve_in_thread(app) as proxy:
            yield proxy, emulator


def _openai(proxy: RunningServer, team: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key=f"sk-{team}", max_retries=0)


def _claude(proxy: RunningServer, team: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=proxy.url, api_key=f"sk-{team}", max_retries=0)


async def _chat_stream(proxy: RunningServer, team: str) -> Any:
    return await _openai(proxy, team).chat.completions.create(
        model="gpt-4.1", stream=True, messages=[{"role": "user", "content": TEXT}])


async def _claude_stream(proxy: RunningServer, team: str) -> Any:
    return await _claude(proxy, team).messages.create(
        model="claude-sonnet-4-6", max_tokens=4000, stream=True, messages=[{"role": "user", "content": TEXT}])


async def test_a_teams_large_requests_in_flight_hold_its_share_and_leave_another_team_room(stack):
    proxy, emulator = stack
    budget: BodyBudget = proxy.app.state.door.bodies
    held = [await _chat_stream(proxy, "alpha"), await _claude_stream(proxy, "alpha")]  # alpha's half of the budget, nearly
    assert budget.shares.held("alpha") > BUDGET // 4

    # A third of alpha's would take it past half the budget: refused at once, in each provider's shape.
    with pytest.raises(openai.RateLimitError) as chat_refused:
        await _chat_stream(proxy, "alpha")
    assert chat_refused.value.response.headers["retry-after"] == "1"
    assert "share" in chat_refused.value.message
    with pytest.raises(anthropic.RateLimitError) as claude_refused:
        await _claude_stream(proxy, "alpha")
    assert claude_refused.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert claude_refused.value.response.headers["retry-after"] == "1"
    assert emulator.stats()["open_streams"] == 2  # neither went upstream

    # Beta holds nothing: its own large request is taken beside alpha's.
    held.append(await _chat_stream(proxy, "beta"))
    assert budget.shares.held("beta") > 0

    for stream in held:
        await stream.close()
    wait_until(lambda: budget.shares.total == 0, "every closed stream's body let go")
    held = [await _chat_stream(proxy, "alpha")]  # alpha's room is back
    await held[0].close()
    wait_until(lambda: budget.shares.total == 0, "the body let go again")


async def test_a_refusal_past_a_teams_share_says_nothing_of_the_other_teams(stack):
    """A team's share is half the budget over the teams holding bodies now, and the 429 named it in
    bytes: a team sending one request too many learned how many other teams had large requests in flight
    (1,048,576 bytes alone, 524,288 beside one other). It names the team's own bytes now, the same
    whoever else is busy."""
    proxy, _ = stack
    budget: BodyBudget = proxy.app.state.door.bodies
    held = [await _chat_stream(proxy, "alpha"), await _chat_stream(proxy, "alpha")]

    async def refused() -> str:
        with pytest.raises(openai.RateLimitError) as caught:
            await _chat_stream(proxy, "alpha")
        return caught.value.message

    alone = await refused()
    held.append(await _chat_stream(proxy, "beta"))  # another team busy now
    assert budget.shares.held("beta") > 0
    assert await refused() == alone
    assert "share" in alone and str(budget.shares.held("alpha")) in alone
    for stream in held:
        await stream.close()
    wait_until(lambda: budget.shares.total == 0, "every closed stream's body let go")


async def test_a_continuations_stored_history_counts_against_its_teams_share(stack):
    """A translated continuation holds its whole stored conversation however small its body: it is
    claimed from the budget before it is read, so a team cannot hold past its share that way."""
    proxy, _ = stack
    budget: BodyBudget = proxy.app.state.door.bodies
    client = _openai(proxy, "alpha")
    history = "an earlier turn " * 45_000  # about 700 KB stored
    first = await client.responses.create(model="tr-x", input=history, max_output_tokens=8)
    held = await _chat_stream(proxy, "alpha")  # 400 KB in flight: with the history, past alpha's share
    with pytest.raises(openai.RateLimitError) as refused:
        await client.responses.create(model="tr-x", previous_response_id=first.id, input="and then?", max_output_tokens=8)
    assert "share" in refused.value.message
    await held.close()
    wait_until(lambda: budget.shares.total == 0, "the stream's body let go")
    later = await client.responses.create(model="tr-x", previous_response_id=first.id, input="and then?", max_output_tokens=8)
    assert later.previous_response_id == first.id
    assert budget.shares.total == 0


async def test_referenced_items_are_held_before_their_records_are_read(stack, monkeypatch):
    """An `item_reference` sends a stored item: the records holding the items a request names are
    claimed from the budget before they are read. They were read first, so a request the budget then
    refused had still read up to its team's storage quota, and many small concurrent requests could
    each pull that much into the process."""
    proxy, _ = stack
    budget: BodyBudget = proxy.app.state.door.bodies
    client = _openai(proxy, "alpha")
    stored = await client.responses.create(model="tr-x", input="a stored document " * 40_000, max_output_tokens=8)  # ~700 KB
    (item,) = [item async for item in client.responses.input_items.list(stored.id)]
    store = proxy.app.state.registry.services.response_store()
    reads: list[list[str]] = []
    find_items = store.find_items

    async def counted(team: str, item_ids: list[str]) -> Any:
        reads.append(item_ids)
        return await find_items(team, item_ids)

    monkeypatch.setattr(store, "find_items", counted)
    held = await _chat_stream(proxy, "alpha")  # 400 KB in flight: with the item's record, past alpha's share
    with pytest.raises(openai.RateLimitError) as refused:
        await client.responses.create(model="tr-x", input=[{"type": "item_reference", "id": item.id}], max_output_tokens=8)
    assert "share" in refused.value.message and reads == []  # refused before anything was read
    await held.close()
    wait_until(lambda: budget.shares.total == 0, "the stream's body let go")
    answered = await client.responses.create(model="tr-x", input=[{"type": "item_reference", "id": item.id}], max_output_tokens=8)
    assert answered.output_text and reads  # with room, the item is read and sent
    assert budget.shares.total == 0


async def test_a_pass_through_body_counts_against_its_teams_share(stack):
    """The pass-through reads a legacy completion's body, and a batch create's, whole (up to the team's
    body or upload limit) and keeps it until the answer has ended, outside the budget: a team already
    at its share had every such request taken beside its others, as many as it sent. It is held in the
    budget now, from its declared length until the answer ends: refused past the team's share before
    anything is sent, and let go when the stream closes."""
    proxy, emulator = stack
    budget: BodyBudget = proxy.app.state.door.bodies

    async def completion(team: str) -> Any:
        return await _openai(proxy, team).completions.create(model="gpt-3.5-turbo-instruct", prompt=TEXT, stream=True)

    held = [await _chat_stream(proxy, "alpha"), await _claude_stream(proxy, "alpha")]  # alpha's half, nearly
    with pytest.raises(openai.RateLimitError) as refused:
        await completion("alpha")
    assert "share" in refused.value.message
    assert emulator.stats()["open_streams"] == 2  # not sent
    held.append(await completion("beta"))  # beta holds nothing: taken, and held while it streams
    assert budget.shares.held("beta") > len(TEXT)
    for stream in held:
        await stream.close()
    wait_until(lambda: budget.shares.total == 0, "every closed stream's body let go")


async def test_small_whole_answers_let_their_bodies_go(stack):
    proxy, _ = stack
    budget: BodyBudget = proxy.app.state.door.bodies
    client = _openai(proxy, "alpha")
    for _ in range(20):
        answer = await client.chat.completions.create(model="gpt-4.1", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
        assert answer.choices[0].message.content
    assert budget.shares.total == 0


def test_past_the_whole_budget_even_a_team_below_its_share_gets_a_503():
    budget = BodyBudget(100)  # half: 50
    first, second, third = budget.hold("a"), budget.hold("b"), budget.hold("c")
    first.need(50)  # a alone: up to half
    second.need(25)  # b below its share (25)
    with pytest.raises(RateLimitedError):
        second.need(26)  # b past its share: 429
    third.need(16)  # c below its share (16): 91 in all
    fourth = budget.hold("d")
    with pytest.raises(SlipstreamError) as full:
        fourth.need(12)  # d below its share (12), but 103 is past the whole budget
    assert full.value.status == 503 and full.value.headers["retry-after"] == "1"
    for hold in (first, second, third, fourth):
        hold.release()
    assert budget.shares.total == 0
