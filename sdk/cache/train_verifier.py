"""Train and calibrate the semantic-cache verifier on Quora Question Pairs; writes sdk/cache/verifier-tuned.npz.

    nice -n 10 .venv/bin/python -m sdk.cache.train_verifier --data qqp-dev.jsonl.gz   # or SLIPSTREAM_QQP=...
    ... --embedder original        # the verifier for MiniLM as shipped (sdk/cache/verifier.npz)

Disjoint splits (by question-graph component, see qqp.py): the MLP learns on `train` (which the
embedder's adapter never saw), the thresholds are chosen on `calibration`, and `test` is left to
`bench/semantic_cache.py` and the tests. Training pairs are the labelled
pairs plus hard negatives mined the way a cache meets them (a question's nearest stored neighbours
that are not duplicates of it), because those, not random pairs, are what a cache wrongly serves.
Each precision target gets the lowest threshold whose served hits on the calibration workload reach
it with 97.5% confidence (Wilson lower bound), so the test precision is not an optimistic in-sample one.
Then the hits of the calibration split judged by reading (`--readings`, sdk/cache/readings.py) lower a
target's threshold where they reach it at a lower score: QQP's labels count many same questions as
wrong at the top of the ranking. `--keep-weights` recalibrates the shipped verifier without retraining.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import faiss
import numpy as np

from sdk.cache import qqp, readings, rules
from sdk.cache.adapter import ADAPTER
from sdk.cache.verifier import Verifier, pair_features, weights_for
from sdk.embedding import Embedder
from sdk.services import default_data_dir

TARGETS = (0.80, 0.85, 0.90, 0.95, 0.97, 0.98, 0.99)
MINED_PER_QUERY = 3
HIDDEN, EPOCHS, BATCH = 64, 8, 512
MIN_SERVED = 30  # a threshold must be backed by at least this many served calibration hits


def training_set(pairs: list[qqp.Pair], vectors: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    examples: list[tuple[str, str, bool]] = []
    for pair in pairs:
        examples += [(pair.a, pair.b, pair.duplicate), (pair.b, pair.a, pair.duplicate)]
    workload = qqp.Workload.of(pairs)
    texts = list(dict.fromkeys(t for p in pairs for t in (p.a, p.b)))
    matrix = np.stack([vectors[t] for t in texts])
    index = faiss.IndexFlatIP(matrix.shape[1])
    index.add(matrix)
    _, ids = index.search(matrix, MINED_PER_QUERY + 4)
    for query, row in zip(texts, ids, strict=True):
        mined = [texts[i] for i in row if i >= 0 and qqp.normalize(texts[i]) != qqp.normalize(query)]
        examples += [(query, other, workload.correct(query, other)) for other in mined[:MINED_PER_QUERY]]
    features = np.stack([pair_features(vectors[a], vectors[b], rules.check(a, b)) for a, b, _ in examples])
    return features, np.array([label for _, _, label in examples], dtype=np.int8)


def fit(features: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Full-batch-ish Adam on a 64-unit MLP with torch (already a dependency); returns (w1, b1, w2, b2)."""
    import torch

    torch.manual_seed(0)
    x, y = torch.from_numpy(features), torch.from_numpy(labels.astype(np.float32))
    first, second = torch.nn.Linear(x.shape[1], HIDDEN), torch.nn.Linear(HIDDEN, 1)
    model = torch.nn.Sequential(first, torch.nn.ReLU(), second)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for epoch in range(EPOCHS):
        order = torch.randperm(len(y))
        for start in range(0, len(y), BATCH):
            batch = order[start : start + BATCH]
            optimizer.zero_grad()
            loss = loss_fn(model(x[batch]).squeeze(1), y[batch])
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch + 1}/{EPOCHS}: last batch loss {loss.item():.4f}", flush=True)
    return (
        first.weight.detach().numpy().T.copy(), first.bias.detach().numpy().copy(),
        second.weight.detach().numpy().T.copy(), second.bias.detach().numpy().copy(),
    )  # fmt: skip


def calibrate(results: list[qqp.Outcome]) -> tuple[np.ndarray, np.ndarray]:
    """Per target, the lowest score threshold whose served hits reach it (97.5% lower confidence bound)."""
    scored = sorted(((r.score, r.correct) for r in results if r.score is not None), key=lambda x: -x[0])
    right = np.cumsum([correct for _, correct in scored])
    targets, thresholds = [], []
    for target in TARGETS:
        reach = [k for k in range(MIN_SERVED, len(scored) + 1) if qqp.wilson_lower(int(right[k - 1]), k) >= target]
        if reach:
            targets.append(target)
            thresholds.append(scored[max(reach) - 1][0])
    return np.array(targets, dtype=np.float64), np.array(thresholds, dtype=np.float64)


def with_readings(verifier: Verifier, judged: list[readings.Reading], vectors: dict[str, np.ndarray]) -> Verifier:
    """Per target, the lower of the label-calibrated threshold and the one the judged hits reach it at."""
    scored = []
    for reading in judged:
        ranked = verifier.rank(reading.query, vectors[reading.query], [(reading.served, vectors[reading.served])])
        if ranked is not None:  # a pair a rule now vetoes is never served
            scored.append((ranked[1], reading.same))
    by_labels = dict(zip(verifier.targets.tolist(), verifier.thresholds.tolist(), strict=True))
    targets: list[float] = []
    thresholds: list[float] = []
    read: list[bool] = []
    for target in TARGETS:
        found = [(value, True) for value in [readings.threshold_for(scored, target)] if value is not None]
        found += [(by_labels[target], False)] if target in by_labels else []
        if found:
            value, from_reading = min(found)
            targets.append(target)
            thresholds.append(max([value, *thresholds]))  # a higher target never gets a lower threshold
            read.append(from_reading)
    return Verifier(verifier.w1, verifier.b1, verifier.w2, verifier.b2, np.array(targets), np.array(thresholds), verifier.embedder, np.array(read, dtype=bool))


def report(name: str, results: list[qqp.Outcome], verifier: Verifier) -> None:
    base = qqp.served_by_cosine(results, 0.8)
    print(f"[{name}] {len(results)} lookups; cosine>=0.8: hit rate {base.hit_rate:.3f}, precision {base.precision:.3f}, recall {base.recall:.3f}")
    for target, threshold in zip(verifier.targets, verifier.thresholds, strict=True):
        got = qqp.served_by_verifier(results, threshold)
        print(f"[{name}] target {target:.2f} (score>={threshold:.3f}): hit rate {got.hit_rate:.3f}, precision {got.precision:.3f}, recall {got.recall:.3f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, help="the full QQP development set (default: $SLIPSTREAM_QQP)")
    parser.add_argument("--embedder", choices=("tuned", "original"), default="tuned", help="MiniLM with the QQP adapter, or as shipped")
    parser.add_argument("--adapter", type=Path, default=ADAPTER)
    parser.add_argument("--out", type=Path, help="default: the shipped file for that embedder")
    parser.add_argument("--embedding-cache", type=Path, default=default_data_dir() / "qqp")
    parser.add_argument("--readings", type=Path, default=readings.CALIBRATION, help="hits of the calibration split judged by reading")
    parser.add_argument("--keep-weights", action="store_true", help="recalibrate the shipped verifier's thresholds only")
    parser.add_argument("--max-pairs", type=int, default=0, help="use at most this many pairs of each split (whole components; 0: all), to fit a time budget")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)  # see train_embedder: a shared machine makes two OpenMP threads spin-wait
    started = time.perf_counter()
    splits = qqp.split(qqp.load_pairs(qqp.full_set(args.data)))
    if args.max_pairs:
        splits = {name: qqp.sample(pairs, args.max_pairs) for name, pairs in splits.items()}
    embedder = Embedder(adapter=args.adapter if args.embedder == "tuned" else None)
    needed = ("calibration",) if args.keep_weights else ("train", "calibration")
    every_text = [t for name in needed for p in splits[name] for t in (p.a, p.b)]
    vectors = qqp.embed_cached(every_text, embedder.embed_many, args.embedding_cache, embedder.model_id)
    print(f"splits: {', '.join(f'{k} {len(v)}' for k, v in splits.items())}; embedded in {time.perf_counter() - started:.0f}s")

    out = args.out or weights_for(embedder.model_id)
    if args.keep_weights:
        untuned = Verifier.load(out)
    else:
        features, labels = training_set(splits["train"], vectors)
        print(f"training on {len(labels)} pairs ({labels.mean():.2f} positive)")
        w1, b1, w2, b2 = fit(features, labels)
        untuned = Verifier(w1, b1, w2, b2, np.array([]), np.array([]), embedder.model_id, np.array([], dtype=bool))

    calibration = qqp.outcomes(qqp.Workload.of(splits["calibration"]), vectors, untuned)
    targets, thresholds = calibrate(calibration)
    verifier = Verifier(untuned.w1, untuned.b1, untuned.w2, untuned.b2, targets, thresholds, embedder.model_id, np.zeros(len(targets), dtype=bool))
    report("calibration", calibration, verifier)
    if args.readings.is_file():
        verifier = with_readings(verifier, readings.load(args.readings), vectors)
        print("thresholds:", ", ".join(f"{t:.2f}: {v:.4f}{' (read)' if r else ''}" for t, v, r in zip(verifier.targets, verifier.thresholds, verifier.read, strict=True)))
    verifier.save(out)
    print(f"wrote {out} in {time.perf_counter() - started:.0f}s")


if __name__ == "__main__":
    main()
