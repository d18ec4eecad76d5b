"""Legacy Completions `logprobs.text_offset`: each token's character offset in the choice's whole text,
the same whether the answer was streamed or not, however its chunks fell, and run after run. Through
`slipstream engine serve` with the official `openai` client; the tiny model's byte-level tokenizer
writes stray and split UTF-8 bytes, which are what made the offsets move."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from localengine.serving_completion import TextOffsets
from tests.localengine.conftest import make_tokenizer


@pytest.fixture
def client(tiny_client: openai.OpenAI) -> openai.OpenAI:
    return tiny_client


def test_offsets_of_a_character_split_across_byte_tokens():
    tok = make_tokenizer()
    text = "a\u00e9\u20ac\U0001f600b"  # 1, 2, 3 and 4 UTF-8 bytes: the tiny vocabulary has one token per byte
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == 11 and tok.decode(ids) == text
    # Each byte token of a character starts where its character starts.
    expected = [0, 1, 1, 2, 2, 2, 3, 3, 3, 3, 4]
    assert TextOffsets(tok, True, 0).add(ids) == expected
    # One token at a time (a stream's chunks) gives the same offsets as all at once, echo shifting them all.
    one_by_one = TextOffsets(tok, True, 7)
    assert [o for tid in ids for o in one_by_one.add([tid])] == [7 + o for o in expected]
    # A stray continuation byte stays a character of its own (U+FFFD): what follows starts after it.
    stray = [*tok.encode("a", add_special_tokens=False), ids[2], *tok.encode("b", add_special_tokens=False)]
    assert tok.decode(stray) == "a\ufffdb" and TextOffsets(tok, True, 0).add(stray) == [0, 1, 2]


def _answer(client: openai.OpenAI, stream: bool, **extra: Any) -> dict[int, tuple[str, list[int], list[int]]]:
    """Each choice's text, its token ids and its text_offset (a stream's chunks joined)."""
    body: dict[str, Any] = dict(model="tiny", prompt="The quick brown", max_tokens=40, temperature=0, logprobs=2,
                                extra_body={"ignore_eos": True, "return_token_ids": True}, **extra)
    out: dict[int, tuple[str, list[int], list[int]]] = {}
    chunks = client.completions.create(stream=True, **body) if stream else [client.completions.create(**body)]
    for chunk in chunks:
        for choice in chunk.choices:
            text, ids, offsets = out.get(choice.index, ("", [], []))
            lp = choice.logprobs
            out[choice.index] = (text + choice.text, ids + list(choice.model_extra.get("token_ids") or []),
                                 offsets + list(lp.text_offset or []) if lp is not None else offsets)
    return out


@pytest.mark.parametrize("n", [1, 2])
def test_text_offset_is_the_same_streamed_or_not_and_run_after_run(client, n):
    tok = make_tokenizer()
    whole = _answer(client, stream=False, n=n)
    assert sorted(whole) == list(range(n))
    for text, ids, offsets in whole.values():
        assert len(ids) == len(offsets) == 40
        assert any(ord(c) > 127 for c in text)  # the random model writes non-ASCII bytes: the case at issue
        assert offsets == sorted(offsets) and offsets[0] == 0 and offsets[-1] <= len(text)
        for i, at in enumerate(offsets):  # what comes before token i in the text is what tokens 0..i-1 wrote
            assert tok.decode(ids[:i]).startswith(text[:at])
    for _ in range(2):
        assert _answer(client, stream=True, n=n) == whole
    assert _answer(client, stream=False, n=n) == whole


def test_echo_with_logprobs_stays_refused(client):
    """The echoed prompt would shift every offset, but it needs prompt logprobs, which are not computed."""
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt="The quick", max_tokens=2, logprobs=1, echo=True)
    assert err.value.param == "echo"
