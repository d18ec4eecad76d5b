"""Does a verifier over richer pair features beat the global cosine cut? (not a test)

    nice -n 10 .venv/bin/python bench/cache_verifier_features.py --data qqp-dev.jsonl.gz

Replays the `train` split (both directions) and the `calibration` split as cache workloads through the
cache's candidate search (the 4 nearest stored questions, rule vetoes first), scores every candidate
with each scorer, and prints, per scorer, the highest recall whose served hits keep precision at 0.90 /
0.95 / 0.97 on the calibration split (an oracle threshold chosen on that split: an upper bound for
each scorer, the same for all). Scorers learn on `train` only; `test` is not read. Features: cosine,
rank and margins to the other candidates, the rule features, and lexical ones (IDF-weighted overlap
with IDF from `train`, the rarest word on either side only, Jaccard, lengths, same question word).
Embeddings are memoized like train_verifier's (minutes of CPU the first time).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from pathlib import Path

import faiss
import numpy as np

REPOSITORY = Path(__file__).resolve().parents[1]
TARGETS = (0.90, 0.95, 0.97)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, help="the full QQP development set (default: $SLIPSTREAM_QQP)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPOSITORY))
    import torch
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from sdk.cache import qqp, rules
    from sdk.cache.verifier import Verifier, pair_features
    from sdk.embedding import Embedder
    from sdk.services import default_data_dir

    torch.set_num_threads(1)
    splits = qqp.split(qqp.load_pairs(qqp.full_set(args.data)))
    embedder = Embedder.for_cache()
    texts = [t for name in ("train", "calibration") for p in splits[name] for t in (p.a, p.b)]
    vectors = qqp.embed_cached(texts, embedder.embed_many, default_data_dir() / "qqp", embedder.model_id)

    def words(text: str) -> list[str]:
        return [w.lower() for w in rules._WORD.findall(text)]

    documents = list(dict.fromkeys(t for p in splits["train"] for t in (p.a, p.b)))
    frequency = Counter(w for t in documents for w in set(words(t)))
    rarest = math.log(len(documents) + 1)

    def idf(word: str) -> float:
        return math.log((len(documents) + 1) / (frequency.get(word, 0) + 1))

    def lexical(query: str, stored: str) -> list[float]:
        wq, ws = words(query), words(stored)
        sq, ss = set(wq), set(ws)
        union = sum(idf(w) for w in sq | ss) or 1.0
        return [
            sum(idf(w) for w in sq & ss) / union,
            max((idf(w) for w in sq - ss), default=0) / rarest, max((idf(w) for w in ss - sq), default=0) / rarest,
            min(sum(idf(w) for w in sq - ss), 30) / 30, min(sum(idf(w) for w in ss - sq), 30) / 30,
            len(sq & ss) / max(len(sq | ss), 1), float(wq[:1] == ws[:1]),
            min(len(wq), 40) / 40, min(len(ws), 40) / 40, abs(len(wq) - len(ws)) / max(len(wq), len(ws), 1),
        ]  # fmt: skip

    def replay(pairs: list[qqp.Pair], both: bool) -> tuple[list[tuple[int, bool, bool, str, str]], np.ndarray]:
        """Rows (lookup, right, vetoed, query, candidate) and their features, 4 candidates a lookup."""
        workloads = [qqp.Workload.of(pairs)] + ([qqp.Workload.of([qqp.Pair(p.b, p.a, p.duplicate) for p in pairs])] if both else [])
        rows, features, lookup = [], [], 0
        for workload in workloads:
            index = faiss.IndexFlatIP(384)
            index.add(np.stack([vectors[t] for t in workload.stored]))
            sims, ids = index.search(np.stack([vectors[t] for t in workload.lookups]), 4)
            for query, row_sims, row_ids in zip(workload.lookups, sims, ids, strict=True):
                for rank, (cosine, i) in enumerate(zip(row_sims, row_ids, strict=True)):
                    stored, check = workload.stored[i], rules.check(query, workload.stored[i])
                    following = row_sims[min(rank + 1, 3)]
                    context = [cosine, rank / 3, cosine - row_sims[0], row_sims[0] - row_sims[1], cosine - following]
                    rows.append((lookup, workload.correct(query, stored), check.veto, query, stored))
                    features.append(context + list(check.vector()) + lexical(query, stored))
                lookup += 1
        return rows, np.array(features, dtype=np.float32)

    def recall_at(rows: list[tuple[int, bool, bool, str, str]], scores: np.ndarray, answerable: int, target: float) -> float:
        best: dict[int, tuple[float, bool]] = {}
        for (lookup, right, vetoed, _, _), score in zip(rows, scores, strict=True):
            if not vetoed and (lookup not in best or score > best[lookup][0]):
                best[lookup] = (float(score), right)
        ranked = np.array([right for _, right in sorted(best.values(), key=lambda x: -x[0])], dtype=float)
        served_right = np.cumsum(ranked)
        reached = np.nonzero(served_right / np.arange(1, len(ranked) + 1) >= target)[0]
        return float(served_right[reached[-1]] / answerable) if len(reached) else 0.0

    train_rows, train_x = replay(splits["train"], both=True)
    calibration_rows, calibration_x = replay(splits["calibration"], both=False)
    train_y = np.array([row[1] for row in train_rows])
    calibration = qqp.Workload.of(splits["calibration"])
    answerable = sum(map(calibration.answerable, calibration.lookups))
    print(f"train: {len(train_rows)} candidates; calibration: {len(calibration.lookups)} lookups, {answerable} answerable")

    verifier = Verifier.for_embedder(embedder.model_id)
    shipped = verifier.scores(np.stack([pair_features(vectors[q], vectors[c], rules.check(q, c)) for _, _, _, q, c in calibration_rows]))
    scores = {"cosine (global cut)": calibration_x[:, 0], "shipped MLP verifier": shipped}
    columns = {"cosine + lexical": [0, *range(13, 23)], "cosine + context + rules": list(range(13)), "all features": list(range(23))}
    for name, chosen in columns.items():
        for model_name, model in (("logistic regression", LogisticRegression(max_iter=3000)), ("gradient boosting", HistGradientBoostingClassifier(max_iter=200, learning_rate=0.05, max_leaf_nodes=15, random_state=0))):
            fitted = make_pipeline(StandardScaler(), model).fit(train_x[:, chosen], train_y)
            scores[f"{model_name}, {name}"] = fitted.predict_proba(calibration_x[:, chosen])[:, 1]
    print("| scorer | " + " | ".join(f"recall at precision {t:.2f}" for t in TARGETS) + " |")
    print("|---|" + "---|" * len(TARGETS))
    for name, score in scores.items():
        print(f"| {name} | " + " | ".join(f"{recall_at(calibration_rows, score, answerable, t):.3f}" for t in TARGETS) + " |")


if __name__ == "__main__":
    main()
