"""One faiss index per partition: exact inner product while small, IVF (approximate) once large.

Vectors are unit-norm, so inner product is cosine similarity. Ids are the SQLite row ids of the
entries, so a search result names its row directly. IVF keeps removal by id, which eviction needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import faiss
import numpy as np

from sdk.embedding import DIMENSION


@dataclass
class PartitionIndex:
    approximate_from: int = 20_000  # entries; below this a flat scan is both exact and fast (< 1 ms)
    _index: faiss.Index = field(init=False)
    _vectors: dict[int, np.ndarray] = field(default_factory=dict, init=False, repr=False)
    approximate: bool = field(default=False, init=False)
    training: bool = field(default=False, init=False)  # an approximate index is being trained for it

    def __post_init__(self) -> None:
        self._index = faiss.IndexIDMap2(faiss.IndexFlatIP(DIMENSION))

    def __len__(self) -> int:
        return len(self._vectors)

    def add(self, ids: list[int], vectors: np.ndarray) -> None:
        vectors = np.ascontiguousarray(vectors.reshape(len(ids), DIMENSION), dtype=np.float32)
        for entry_id, vector in zip(ids, vectors, strict=True):
            self._vectors[entry_id] = vector
        self._index.add_with_ids(vectors, np.asarray(ids, dtype=np.int64))

    @property
    def due(self) -> bool:
        """Whether it has grown large enough for an approximate index, and none is being trained."""
        return not self.approximate and not self.training and len(self._vectors) >= self.approximate_from

    def remove(self, ids: list[int]) -> None:
        present = [i for i in ids if self._vectors.pop(i, None) is not None]
        if present:
            self._index.remove_ids(np.asarray(present, dtype=np.int64))  # type: ignore[arg-type]  # faiss's wrapper takes an id array where its stub says IDSelector

    def search(self, vector: np.ndarray, k: int) -> list[tuple[int, float]]:
        """Up to k (entry id, cosine) pairs, most similar first."""
        if not self._vectors:
            return []
        query = vector.reshape(1, DIMENSION).astype(np.float32, copy=False)
        # One query gains nothing from OpenMP: its parallel region only woke a second thread to spin,
        # ~9 ms of CPU a lookup on a 2-core machine (measured), taken from the embedder. The setting
        # is the calling thread's; restore it for whatever else runs there.
        threads = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)
        try:
            scores, ids = self._index.search(query, min(k, len(self._vectors)))
        finally:
            faiss.omp_set_num_threads(threads)
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if i >= 0]

    def snapshot(self) -> dict[int, np.ndarray]:
        """Its vectors by entry id as they are now, to train an approximate index from."""
        return dict(self._vectors)

    @staticmethod
    def trained(vectors: dict[int, np.ndarray]) -> faiss.Index:
        """An approximate (IVF) index of `vectors`: k-means over all of them, seconds at 20,000 (faiss lets
        the GIL go), so run without the lock the lookups take."""
        ids = np.fromiter(vectors, dtype=np.int64, count=len(vectors))
        data = np.stack([vectors[int(i)] for i in ids])
        nlist = int(4 * math.sqrt(len(ids)))  # faiss's rule of thumb: 4·sqrt(n) to 16·sqrt(n) lists
        quantizer = faiss.IndexFlatIP(DIMENSION)
        index = faiss.IndexIVFFlat(quantizer, DIMENSION, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(data)
        index.add_with_ids(data, ids)
        index.nprobe = max(8, nlist // 16)
        return index

    def install(self, index: faiss.Index, trained_on: dict[int, np.ndarray]) -> None:
        """Search `index` (trained on `trained_on`) from now on, with the entries added and removed since."""
        gone = [i for i in trained_on if i not in self._vectors]
        if gone:
            index.remove_ids(np.asarray(gone, dtype=np.int64))  # type: ignore[arg-type]  # as in remove(): an id array works
        new = [i for i in self._vectors if i not in trained_on]
        if new:
            index.add_with_ids(np.stack([self._vectors[i] for i in new]), np.asarray(new, dtype=np.int64))
        self._index, self.approximate = index, True
