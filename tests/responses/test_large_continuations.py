"""A continuation's size is what its target is sent, not what its client sent.

A translated target is sent the whole stored conversation in `input` however small the client's
turn; with the client's size on it, a continuation of a conversation of megabytes was translated,
serialized and planned on the event loop every team's requests share, as if it were small, instead
of in the heavy-work pool (sdk/offload.py:is_large). Its size is now the client's plus the stored
bytes of the chain and of the records holding the items it references.
"""

from __future__ import annotations

from typing import Any

import openai
import orjson
import pytest

from tests.responses.conftest import KEY

TEXT = "the history of a long conversation " * 12_000  # about 400 KB stored; the pool takes 256 KiB and more



def _client(proxy: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=KEY, max_retries=0, timeout=120)


def test_a_small_continuation_of_a_large_conversation_is_serialized_off_the_loop(proxy, fresh_emulator, pooled):
    client = _client(proxy)
    first = client.responses.create(model="gpt-4.1", input=TEXT)
    pooled.clear()
    second = client.responses.create(model="gpt-4.1", previous_response_id=first.id, input="and in short?")
    assert second.output_text
    assert orjson.dumps in pooled  # the upstream body, history and all, serialized in the pool (on the loop before)


def test_a_small_turn_referencing_a_large_item_is_serialized_off_the_loop(proxy, fresh_emulator, pooled):
    client = _client(proxy)
    first = client.responses.create(model="gpt-4.1", input=[{"type": "message", "role": "user", "id": "msg_big_one",
                                                                "content": TEXT}], store=True)
    assert first.id
    pooled.clear()
    second = client.responses.create(model="gpt-4.1", input=[{"type": "item_reference", "id": "msg_big_one"},
                                                             {"role": "user", "content": "and in short?"}])
    assert second.output_text
    assert orjson.dumps in pooled


def test_a_native_streams_large_events_are_read_off_the_loop(proxy, fresh_emulator, pooled):
    """A Responses stream's response.created and response.completed events echo the request's
    instructions (a team's megabytes): the gateway parsed them on the loop, to watch the usage and to
    record the response. They are read in the heavy-work pool when large."""
    instructions = "Follow the house style. " + "rule " * 120_000  # about 600 KB
    events = list(_client(proxy).responses.create(model="oai-x", instructions=instructions, input="hi", stream=True))
    assert events[-1].type == "response.completed" and events[-1].response.instructions == instructions
    names = [getattr(fn, "__qualname__", "") for fn in pooled]
    assert "StreamObserver.observe" in names  # usage and finish, from the completed event (on the loop before)
    assert orjson.loads in pooled  # the response recorded in the team's store


@pytest.mark.parametrize("model", ["oai-x", "gpt-4.1"])  # native; translated to Chat Completions
def test_a_large_answer_body_is_read_off_the_loop(proxy, fresh_emulator, pooled, model):
    """The same for an answer read whole: its usage and the record were parsed on the loop (and a
    translated answer written there, with the instructions it echoes)."""
    instructions = "Follow the house style. " + "rule " * 120_000
    answer = _client(proxy).responses.create(model=model, instructions=instructions, input="hi")
    assert answer.instructions == instructions
    names = [getattr(fn, "__name__", "") for fn in pooled]
    assert ("usage_from_body" in names) if model == "oai-x" else ("completion_c2r" in names)
    assert orjson.loads in pooled  # the record


def test_a_translated_stream_writes_large_instructions_once_off_the_loop(proxy, fresh_emulator, pooled):
    """A translated stream's response.created, .in_progress and .completed each echo the instructions:
    they were written three times on the loop. The translator writes them once, in the heavy-work pool."""
    instructions = "Follow the house style. " + "rule " * 120_000
    events = list(_client(proxy).responses.create(model="gpt-4.1", instructions=instructions, input="hi", stream=True))
    echoed = [e.response.instructions for e in events if e.type in ("response.created", "response.in_progress", "response.completed")]
    assert echoed == [instructions] * 3
    assert "ChatToResponses" in [getattr(fn, "__qualname__", "") for fn in pooled]


def test_a_large_records_input_items_are_written_off_the_loop(proxy, fresh_emulator, pooled):
    """GET /v1/responses/{id}/input_items (and GET /v1/responses/{id}) of a large stored record wrote it on
    the loop every team's requests share: a team's megabyte records held the others' requests."""
    client = _client(proxy)
    first = client.responses.create(model="gpt-4.1", input=TEXT)
    pooled.clear()
    items = client.responses.input_items.list(first.id)
    assert items.data[0].content[0].text == TEXT
    assert [fn.__name__ for fn in pooled if getattr(fn, "__name__", "") == "_listed"] == ["_listed"]  # on the loop before
