"""Quora Question Pairs as a cache workload: the data behind training, calibration, tests and the benchmark.

Splits are by connected component of the question graph (a question that appears in several pairs
stays in one split), so nothing the verifier trained on leaks into calibration or evaluation. As a
cache workload, a split's first questions are stored and its second questions looked up; serving
an entry is right when it is the same text or labelled a duplicate (transitively, within the split).

The full development set is an input the user gives (`--data` or `SLIPSTREAM_QQP`); the repository
ships only `data/qqp-heldout-sample.jsonl.gz`, whole components of the `test` split (see data/README.md).
"""

from __future__ import annotations

import gzip
import os
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
import orjson

from sdk.cache.verifier import Verifier

REPOSITORY = Path(__file__).resolve().parents[2]
HELD_OUT_SAMPLE = REPOSITORY / "data" / "qqp-heldout-sample.jsonl.gz"  # in a source checkout, not in the wheel
# The embedder fine-tunes on `embedder`, the verifier learns on `train` and is calibrated on
# `calibration`; `test` is never seen by either (the same components as when there were three splits).
SPLITS = {"embedder": 0.45, "train": 0.15, "calibration": 0.2, "test": 0.2}
SEED = 20261105


@dataclass(frozen=True, slots=True)
class Pair:
    a: str
    b: str
    duplicate: bool


def normalize(text: str) -> str:
    return " ".join(text.lower().split())


def full_set(given: Path | None) -> Path:
    """The full QQP development set: the path given, else $SLIPSTREAM_QQP; there is no default location."""
    path = given or (Path(os.environ["SLIPSTREAM_QQP"]) if os.environ.get("SLIPSTREAM_QQP") else None)
    if path is None or not path.is_file():
        raise SystemExit(f"the QQP development set (JSON lines with a, b, duplicate; gzip) is needed: pass --data PATH or set SLIPSTREAM_QQP (got {path})")
    return path


def load_pairs(path: Path) -> list[Pair]:
    with gzip.open(path, "rb") as handle:
        rows = [orjson.loads(line) for line in handle if line.strip()]
    return [Pair(row["a"].strip(), row["b"].strip(), bool(row["duplicate"])) for row in rows if row["a"].strip() and row["b"].strip()]


class _Groups:
    """Union-find over normalized question texts."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, x: str, y: str) -> None:
        self.parent[self.find(x)] = self.find(y)


def components(pairs: list[Pair], seed: int = SEED) -> list[list[Pair]]:
    """Pairs grouped by connected component of the question graph, components in a seeded random order."""
    groups = _Groups()
    for pair in pairs:
        groups.union(normalize(pair.a), normalize(pair.b))
    grouped: dict[str, list[Pair]] = {}
    for pair in pairs:
        grouped.setdefault(groups.find(normalize(pair.a)), []).append(pair)
    roots = sorted(grouped)
    random.Random(seed).shuffle(roots)
    return [grouped[root] for root in roots]


def split(pairs: list[Pair], seed: int = SEED) -> dict[str, list[Pair]]:
    parts = components(pairs, seed)
    names, cut, bounds = list(SPLITS), 0.0, {}
    for name in names:
        cut = round(cut + SPLITS[name], 9)
        bounds[name] = cut
    result: dict[str, list[Pair]] = {name: [] for name in names}
    for i, part in enumerate(parts):
        result[next(n for n in names if i / len(parts) < bounds[n])] += part
    # Keep the file's order inside each split, as before components were materialized.
    order = {id(p): i for i, p in enumerate(pairs)}
    return {name: sorted(found, key=lambda p: order[id(p)]) for name, found in result.items()}


def sample(pairs: list[Pair], size: int, seed: int = SEED) -> list[Pair]:
    """Whole components (so duplicate clusters stay intact) until `size` pairs."""
    chosen: list[Pair] = []
    for part in components(pairs, seed + 1):
        if len(chosen) >= size:
            break
        chosen += part
    return chosen


def write_pairs(pairs: list[Pair], path: Path) -> None:
    lines = b"".join(orjson.dumps({"a": p.a, "b": p.b, "duplicate": p.duplicate}) + b"\n" for p in pairs)
    path.write_bytes(gzip.compress(lines, mtime=0))  # mtime 0: the same pairs give the same bytes


@dataclass
class Workload:
    """Index the first questions, look up the second ones."""

    stored: list[str]
    lookups: list[str]
    same: _Groups  # duplicate clusters
    stored_clusters: set[str]

    @classmethod
    def of(cls, pairs: list[Pair]) -> Workload:
        same = _Groups()
        for pair in pairs:
            if pair.duplicate:
                same.union(normalize(pair.a), normalize(pair.b))
        stored = list(dict.fromkeys(p.a for p in pairs))
        clusters = {same.find(normalize(text)) for text in stored}
        return cls(stored=stored, lookups=[p.b for p in pairs], same=same, stored_clusters=clusters)

    def correct(self, query: str, served: str) -> bool:
        return self.same.find(normalize(query)) == self.same.find(normalize(served))

    def answerable(self, query: str) -> bool:
        """Some stored question is a right answer for this lookup."""
        return self.same.find(normalize(query)) in self.stored_clusters


def embed_cached(texts: Iterable[str], embed: Callable[[list[str]], np.ndarray], cache_dir: Path, model: str) -> dict[str, np.ndarray]:
    """Embeddings by text, memoized on disk per model: QQP has ~75k questions, minutes of CPU to embed."""
    names, vectors_path = cache_dir / f"qqp-{model}-texts.json", cache_dir / f"qqp-{model}-vectors.npy"
    known: dict[str, np.ndarray] = {}
    if names.exists() and vectors_path.exists():
        known = dict(zip(orjson.loads(names.read_bytes()), np.load(vectors_path), strict=True))
    wanted = list(dict.fromkeys(texts))
    missing = [t for t in wanted if t not in known]
    if missing:
        known.update(zip(missing, embed(missing), strict=True))
        cache_dir.mkdir(parents=True, exist_ok=True)
        names.write_bytes(orjson.dumps(list(known)))
        np.save(vectors_path, np.stack(list(known.values())))
    return {t: known[t] for t in wanted}


def wilson_lower(correct: int, total: int, z: float = 1.96) -> float:
    """One-sided 97.5% lower confidence bound of a proportion (Wilson score)."""
    if total == 0:
        return 0.0
    p = correct / total
    denominator = 1 + z * z / total
    centre = p + z * z / (2 * total)
    margin = z * np.sqrt(p * (1 - p) / total + z * z / (4 * total * total))
    return float((centre - margin) / denominator)


@dataclass(frozen=True, slots=True)
class Outcome:
    """One lookup of the workload: what the verifier would serve, and what a cosine cut would."""

    query: str
    served: str | None  # the verifier's best unvetoed candidate, whatever its score; None when every one is vetoed
    score: float | None  # that candidate's verifier score
    correct: bool  # that candidate is a right answer
    cosine: float  # the nearest entry's cosine
    nearest_correct: bool
    answerable: bool


def outcomes(workload: Workload, vectors: dict[str, np.ndarray], verifier: Verifier, k: int = 4) -> list[Outcome]:
    """Replays the workload through the same candidate search and verifier the cache uses."""
    stored = np.stack([vectors[t] for t in workload.stored])
    index = faiss.IndexFlatIP(stored.shape[1])
    index.add(stored)
    sims, ids = index.search(np.stack([vectors[t] for t in workload.lookups]), k)
    results = []
    for query, row_sims, row_ids in zip(workload.lookups, sims, ids, strict=True):
        found = [workload.stored[i] for i in row_ids if i >= 0]
        ranked = verifier.rank(query, vectors[query], [(text, vectors[text]) for text in found])
        results.append(
            Outcome(
                query=query,
                served=None if ranked is None else found[ranked[0]],
                score=None if ranked is None else ranked[1],
                correct=ranked is not None and workload.correct(query, found[ranked[0]]),
                cosine=float(row_sims[0]),
                nearest_correct=workload.correct(query, found[0]),
                answerable=workload.answerable(query),
            )
        )
    return results


@dataclass(frozen=True, slots=True)
class Served:
    hits: int
    right: int
    lookups: int
    answerable: int

    @property
    def precision(self) -> float:
        return self.right / self.hits if self.hits else 1.0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    @property
    def recall(self) -> float:
        return self.right / self.answerable if self.answerable else 0.0


def verifier_hits(results: list[Outcome], threshold: float) -> list[Outcome]:
    """The lookups the cache serves at this score threshold."""
    return [r for r in results if r.score is not None and r.score >= threshold]


def served_by_verifier(results: list[Outcome], threshold: float) -> Served:
    hits = verifier_hits(results, threshold)
    return Served(len(hits), sum(r.correct for r in hits), len(results), sum(r.answerable for r in results))


def served_by_cosine(results: list[Outcome], cutoff: float) -> Served:
    hits = [r for r in results if r.cosine >= cutoff]
    return Served(len(hits), sum(r.nearest_correct for r in hits), len(results), sum(r.answerable for r in results))


def main(argv: list[str] | None = None) -> None:
    """Write the repository's held-out sample from the full development set."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--data", type=Path, help="the full QQP development set (default: $SLIPSTREAM_QQP)")
    parser.add_argument("--size", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=HELD_OUT_SAMPLE)
    args = parser.parse_args(argv)
    chosen = sample(split(load_pairs(full_set(args.data)))["test"], args.size)
    write_pairs(chosen, args.out)
    print(f"wrote {len(chosen)} pairs of the test split to {args.out}")


if __name__ == "__main__":
    main()
