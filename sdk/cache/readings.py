"""Hits judged by reading: the labels the verifier's thresholds are calibrated on where QQP's fail.

On independent QQP pairs (one per component of the question graph, as a user's traffic without
repeats gives them) QQP's labels cannot certify precision 0.95 at any threshold: many pairs it
labels "not duplicate" ask the same question ("How can you be a fashion designer?" / "How could I
be a fashion designer?"), and an entry served from another pair was never labelled against the
question at all. A reading is one served hit (the question looked up, the stored question whose
answer was served) judged by a reader who did not see the QQP label: would the stored answer answer
this question? The label is joined afterwards, so both precisions can be reported.

Three files in `data/`: `qqp-read-calibration.jsonl` (hits of the `calibration` split; the
thresholds are set on it by `train_verifier`), `qqp-read-heldout.jsonl` (every hit of the
held-out sample's independent pairs at the thresholds it checks, and the hits of 1,200 random `test`
pairs at the default; `tests/cache/test_verifier.py` and `bench/semantic_cache_proxy.py` score
against it) and `qqp-read-duplicates.jsonl` (90 of the sample's labelled duplicates in a seeded
random order, lookup and stored question, judged the same way without knowing whether the cache
served them: recall over the duplicates a reader confirms, `bench/semantic_cache_proxy.py`). `python -m sdk.cache.readings` writes a blind
sheet (hits without labels, in a seeded random order) to judge.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from sdk.cache import qqp

CALIBRATION = qqp.REPOSITORY / "data" / "qqp-read-calibration.jsonl"
HELD_OUT = qqp.REPOSITORY / "data" / "qqp-read-heldout.jsonl"
DUPLICATES = qqp.REPOSITORY / "data" / "qqp-read-duplicates.jsonl"
MIN_SERVED = 30  # as train_verifier: a threshold rests on at least this many judged hits


@dataclass(frozen=True, slots=True)
class Reading:
    query: str  # the question looked up
    served: str  # the stored question whose answer was served
    same: bool  # the reader's judgement: the stored answer answers the query
    qqp: bool  # right by QQP's labels (joined after the reading)


def _rows(path: Path) -> list[dict[str, Any]]:  # calibration and held-out rows: Reading's fields; duplicates: query, stored, same
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def load(path: Path) -> list[Reading]:
    return [Reading(row["query"], row["served"], bool(row["same"]), bool(row["qqp"])) for row in _rows(path)]


def confirmed_duplicates(path: Path = DUPLICATES) -> set[str]:
    """The lookups of `qqp-read-duplicates.jsonl` whose labelled duplicate a reader judged the same question."""
    return {row["query"] for row in _rows(path) if row["same"]}


def judged(readings: list[Reading]) -> dict[tuple[str, str], bool]:
    return {(r.query, r.served): r.same for r in readings}


def independent(pairs: list[qqp.Pair]) -> list[qqp.Pair]:
    """One pair per connected component: independent pairs, no question asked twice."""
    return [part[0] for part in qqp.components(pairs)]


def threshold_for(scored: list[tuple[float, bool]], target: float) -> float | None:
    """Lowest score at which the judged hits scoring at least that reach `target` (≥ MIN_SERVED of them); None if none does."""
    ordered = sorted(scored, key=lambda hit: -hit[0])
    found, same = None, 0
    for count, (score, right) in enumerate(ordered, 1):
        same += right
        if count >= MIN_SERVED and same / count >= target:
            found = score
    return found


def sheet(hits: list[tuple[str, str]], count: int, seed: int = 29) -> list[dict[str, object]]:
    """A blind reading sheet: `count` of the hits in a seeded random order, no labels."""
    chosen = random.Random(seed).sample(hits, min(count, len(hits)))
    return [{"id": i, "query": query, "served": served} for i, (query, served) in enumerate(chosen)]


def main(argv: list[str] | None = None) -> None:
    """Write a blind sheet of the hits one split's independent pairs get from the shipped verifier."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--data", type=Path, help="the full QQP development set (default: $SLIPSTREAM_QQP); without it, the held-out sample")
    parser.add_argument("--split", default="calibration")
    parser.add_argument("--min-score", type=float, default=0.6)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--embedding-cache", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    from sdk.cache.verifier import Verifier
    from sdk.embedding import Embedder
    from sdk.services import default_data_dir

    pairs = qqp.load_pairs(qqp.HELD_OUT_SAMPLE) if args.data is None else qqp.split(qqp.load_pairs(qqp.full_set(args.data)))[args.split]
    workload = qqp.Workload.of(independent(pairs))
    embedder = Embedder.for_cache()
    vectors = qqp.embed_cached(workload.stored + workload.lookups, embedder.embed_many, args.embedding_cache or default_data_dir() / "qqp", embedder.model_id)
    results = qqp.outcomes(workload, vectors, Verifier.for_embedder(embedder.model_id))
    hits = [(r.query, r.served) for r in qqp.verifier_hits(results, args.min_score) if r.served is not None]
    args.out.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in sheet(hits, args.count)))
    print(f"{len(hits)} hits at score >= {args.min_score}; wrote {min(args.count, len(hits))} to {args.out}")


if __name__ == "__main__":
    main()
