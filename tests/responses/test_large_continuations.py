"""A continuation's size is what its target is sent, not what its client sent.

A translated target is sent the whole stored conversation in `input` however small the client's
turn; with the client's size on it, a continuation of a conversation of megabytes was translated,
serialized and planned on the event loop every team's requests share, as if it were small, instead
of in the heavy-work pool (sdk/offload.py:is_large). Its size is now the client's plus the stored
bytes of the chain and of the records holding the items it references.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import openai
import orjson
import pytest

from sdk import offload
from tests.responses.conftest import KEY

TEXT = "the history of a long conversation " * 12_000  # about 400 KB stored; the pool takes 256 KiB and more


@pytest.fixture
def pooled(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Callable[..., Any]]]:
    """The functions the heavy-work pool runs from now on."""
    ran: list[Callable[..., Any]] = []
    submit = offload.HEAVY_POOL.submit

    def recorded(fn: Callable[[], Any], tenant: str | None = None) -> Any:
        ran.append(getattr(fn, "func", fn))
        return submit(fn, tenant)

    monkeypatch.setattr(offload.HEAVY_POOL, "submit", recorded)
    yield ran


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
