"""The hits the semantic cache serves that QQP's labels count as wrong, to read them (not a test).

    .venv/bin/python bench/cache_wrong_hits.py --data qqp-dev.jsonl.gz [--min-precision 0.95] [--sample 50]

Replays the held-out `test` split offline with the shipped embedder, rule vetoes and verifier
(`qqp.outcomes`, the search the cache runs: the 4 nearest stored questions, the best unvetoed one
served when its score reaches the calibrated threshold) and prints each served pair that is not a labelled duplicate, marked
`labelled-nondup` (QQP labels this very pair different) or `unlabelled` (the served entry sits in
another component of the question graph: nobody judged the pair). `--sample N` prints N of them drawn
with a fixed seed. docs/semantic-cache.md reports what reading them showed.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sdk.cache import qqp
from sdk.cache.verifier import Verifier
from sdk.embedding import Embedder
from sdk.services import default_data_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, help="the full QQP development set (default: $SLIPSTREAM_QQP)")
    parser.add_argument("--min-precision", type=float, default=0.95)
    parser.add_argument("--sample", type=int, default=0, help="print this many, drawn with seed 7 (0: all)")
    args = parser.parse_args()

    pairs = qqp.split(qqp.load_pairs(qqp.full_set(args.data)))["test"]
    embedder = Embedder.for_cache()
    verifier = Verifier.for_embedder(embedder.model_id)
    threshold = verifier.threshold(args.min_precision)
    if threshold is None:
        raise SystemExit(f"the verifier is not calibrated for min_precision {args.min_precision}")
    workload = qqp.Workload.of(pairs)
    labelled = {frozenset((qqp.normalize(p.a), qqp.normalize(p.b))) for p in pairs}
    vectors = qqp.embed_cached([t for p in pairs for t in (p.a, p.b)], embedder.embed_many, default_data_dir() / "qqp", embedder.model_id)
    hits = qqp.verifier_hits(qqp.outcomes(workload, vectors, verifier), threshold)
    wrong = [
        ("labelled-nondup" if frozenset((qqp.normalize(r.query), qqp.normalize(r.served or ""))) in labelled else "unlabelled",
         r.query, r.served)
        for r in hits
        if not r.correct
    ]
    print(f"min_precision {args.min_precision}: {len(hits)} semantic hits, {len(wrong)} wrong by the labels "
          f"({sum(k == 'labelled-nondup' for k, _, _ in wrong)} labelled non-duplicate, {sum(k == 'unlabelled' for k, _, _ in wrong)} unlabelled)")
    shown = random.Random(7).sample(wrong, args.sample) if 0 < args.sample < len(wrong) else wrong
    for kind, query, entry in shown:
        print(f"{kind:15s} asked {query!r}, served {entry!r}")


if __name__ == "__main__":
    main()
