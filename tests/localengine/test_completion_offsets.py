"""Legacy Completions `logprobs.text_offset`: each token's character offset in the choice's whole text,
the same whether the answer was streamed or not, however its chunks fell, and run after run. Through
`slipstream engine serve` with the official `openai` client; the tiny model's byte-level tokenizer
writes stray and split UTF-8 bytes, which are what made the offsets move."""

from __future__ import annotations

import random
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


def _whole_decodes(tok: Any, skip: bool, ids: list[int]) -> list[int]:
    """The offsets as defined: each token against the whole text decoded before and after it (the quadratic way
    TextOffsets computed them before it kept a window)."""
    special, offsets, before = set(tok.all_special_ids), [], ""
    for i, tid in enumerate(ids):
        text = tok.decode(ids[:i + 1], skip_special_tokens=skip)
        if text == before and before.endswith("\ufffd") and tid not in special:
            offsets.append(len(before) - 1)
        else:
            offsets.append(next((at for at, (a, b) in enumerate(zip(before, text, strict=False)) if a != b),
                                min(len(before), len(text))))
        before = text
    return offsets


class _Counting:
    """A tokenizer whose decode counts the tokens it is given: the work text_offset costs."""

    def __init__(self, tok: Any):
        self.tok, self.all_special_ids, self.decoded = tok, tok.all_special_ids, 0

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        self.decoded += len(ids)
        text: str = self.tok.decode(ids, skip_special_tokens=skip_special_tokens)
        return text


def _sentencepiece_tokenizer() -> Any:
    """A SentencePiece BPE tokenizer as a llama GGUF's is rebuilt: '▁' for spaces, byte fallback (<0xNN>), the
    leading space stripped. Its byte fallback decodes a run of byte tokens whole: one stray byte turns the run's
    every character to U+FFFD, however far back it starts."""
    from transformers import PreTrainedTokenizerFast

    from localengine.models.gguf_tokenizer import _sentencepiece

    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)),
              "▁", "▁t", "he", "▁the", "▁a", "a", "b", "c", ".", ",", "▁qu", "ick", "▁quick", "é", "▁é", "'s"]
    return PreTrainedTokenizerFast(tokenizer_object=_sentencepiece(tokens, [], True), bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("kind", ["byte-level", "sentencepiece"])
def test_offsets_are_those_of_the_whole_text_however_long_and_chunked(kind, skip):
    """Random tokens (stray and split UTF-8 bytes, merges, special tokens) fed in random chunks give the offsets the
    whole text decoded at every token gives, with the window moving on many times."""
    tok = make_tokenizer() if kind == "byte-level" else _sentencepiece_tokenizer()
    rng = random.Random(7)
    vocab = len(tok)
    if kind == "sentencepiece":  # a run of byte tokens longer than the window, then a stray byte: all U+FFFD
        run = [tok.convert_tokens_to_ids(f"<0x{b:02X}>") for b in "a\u00e9\u20ac\U0001f600".encode() * 3]
        ids = [*tok.encode("the ", add_special_tokens=False), *run, tok.convert_tokens_to_ids("<0xA3>"), *run[:2]]
        assert "\u20ac" in tok.decode(ids[:-3]) and "\u20ac" not in tok.decode(ids)
        assert TextOffsets(tok, skip, 0).add(ids) == _whole_decodes(tok, skip, ids)
    for _ in range(100):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 120))]
        expected = [3 + at for at in _whole_decodes(tok, skip, ids)]
        assert TextOffsets(tok, skip, 3).add(ids) == expected
        chunked, got = TextOffsets(tok, skip, 3), []
        while len(got) < len(ids):
            got += chunked.add(ids[len(got):len(got) + rng.randrange(1, 6)])
        assert got == expected


def test_text_offset_work_is_linear_in_the_answer():
    """Each token decoded a window of the last few tokens, not the whole answer again: the tokens decoded per token
    answered stay the same from 500 tokens to 2,000 (it grew with the answer, to about 1,000 per token at 2,000)."""
    tok = make_tokenizer()
    text = "The quick brown fox jumps over the lazy dog, caf\u00e9 \u20ac5. "
    per_token = []
    for length in (500, 2000):
        ids = (tok.encode(text, add_special_tokens=False) * length)[:length]
        counting = _Counting(tok)
        offsets = TextOffsets(counting, True, 0)
        got = [at for tid in ids for at in offsets.add([tid])]
        assert got[-1] > 0 and got == sorted(got)
        per_token.append(counting.decoded / length)
    assert per_token[1] <= per_token[0] * 1.1 and per_token[1] < 40


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
