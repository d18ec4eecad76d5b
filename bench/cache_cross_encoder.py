"""Does a cross-encoder trained here beat the cache's verifier? (not a test; the answer so far: no)

    nice -n 10 .venv/bin/python bench/cache_cross_encoder.py --data qqp-dev.jsonl.gz --pairs 12000 --threads 2

A cross-encoder reads the two questions together, which the verifier (an MLP over the two embeddings
and lexical features) cannot. None ships offline, so this trains one the way the cache's adapter is
trained: the bundled all-MiniLM-L6-v2 with a LoRA adapter (rank 16 on every linear layer,
sdk/cache/adapter.py) and a linear head over the mean of the last hidden state of "[CLS] a [SEP] b
[SEP]", binary cross-entropy, one epoch, on `--pairs` labelled pairs of the `embedder` split plus
`--mined` nearest neighbours per question labelled by the split's duplicate clusters (the near-misses
a cache meets). Then it replays the `calibration` split as a cache workload through the cache's
candidate search (4 nearest, rule vetoes first) and prints, per scorer, the highest recall whose
served hits keep precision (by QQP's labels) at each target: the shipped verifier, the cross-encoder
(both orders averaged), and their mean. Candidates the verifier scores below 0.2 are not
cross-encoded (none is served at any target). `test` is not read.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPOSITORY = Path(__file__).resolve().parents[1]
TARGETS = (0.80, 0.85, 0.90, 0.93, 0.95)
SEED = 7


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, help="the full QQP development set (default: $SLIPSTREAM_QQP)")
    parser.add_argument("--pairs", type=int, default=12000, help="labelled pairs of the embedder split to train on")
    parser.add_argument("--mined", type=int, default=1, help="nearest non-identical neighbours per question added as examples")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    sys.path.insert(0, str(REPOSITORY))
    import faiss
    import torch
    from transformers import AutoModel, AutoTokenizer

    from sdk.cache import qqp, rules
    from sdk.cache.adapter import ADAPTER, LowRank
    from sdk.cache.verifier import Verifier, pair_features
    from sdk.embedding import Embedder, minilm_path
    from sdk.services import default_data_dir

    torch.manual_seed(SEED)
    torch.set_num_threads(args.threads)
    splits = qqp.split(qqp.load_pairs(qqp.full_set(args.data)))
    embedder = Embedder(adapter=ADAPTER)
    texts = [t for name in ("embedder", "calibration") for p in splits[name] for t in (p.a, p.b)]
    vectors = qqp.embed_cached(texts, embedder.embed_many, default_data_dir() / "qqp", embedder.model_id)

    examples = _examples(splits["embedder"], vectors, args.pairs, args.mined, qqp, faiss)
    print(f"training on {len(examples)} examples ({np.mean([e[2] for e in examples]):.2f} positive)", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path()))
    model = AutoModel.from_pretrained(str(minilm_path()))
    adapted = LowRank.wrap(model, 16, 32.0)
    head = torch.nn.Linear(model.config.hidden_size, 1)

    def logits(a: list[str], b: list[str]) -> torch.Tensor:
        features = tokenizer(a, b, padding=True, truncation=True, max_length=96, return_tensors="pt")
        hidden = model(**features).last_hidden_state
        mask = features["attention_mask"].unsqueeze(-1).float()
        scores: torch.Tensor = head((hidden * mask).sum(1) / mask.sum(1)).squeeze(-1)
        return scores

    parameters = [module.get_parameter(n) for module in adapted.values() for n in ("down", "up")] + list(head.parameters())
    optimizer = torch.optim.AdamW(parameters, lr=1e-3, weight_decay=0.01)
    steps = len(examples) // args.batch
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (0.1 * steps)) * max(0.0, (steps - s) / steps))
    loss_fn = torch.nn.BCEWithLogitsLoss()
    rng, started = random.Random(SEED), time.perf_counter()
    model.train()
    for step in range(steps):
        batch = examples[step * args.batch : (step + 1) * args.batch]
        ordered = [(a, b) if rng.random() < 0.5 else (b, a) for a, b, _ in batch]  # the score must not depend on which is stored
        loss = loss_fn(logits([a for a, _ in ordered], [b for _, b in ordered]), torch.tensor([float(e[2]) for e in batch]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if (step + 1) % 100 == 0:
            print(f"step {step + 1}/{steps}: loss {loss.item():.3f}, {time.perf_counter() - started:.0f} s", flush=True)
    model.eval()

    verifier = Verifier.for_embedder(embedder.model_id)
    workload = qqp.Workload.of(splits["calibration"])
    stored = np.stack([vectors[t] for t in workload.stored])
    index = faiss.IndexFlatIP(stored.shape[1])
    index.add(stored)
    _, ids = index.search(np.stack([vectors[t] for t in workload.lookups]), 4)
    candidates = []  # (lookup, stored question, verifier score, right by the labels)
    for lookup, row in enumerate(ids):
        query = workload.lookups[lookup]
        for text in (workload.stored[i] for i in row if i >= 0):
            check = rules.check(query, text)
            if not check.veto:
                verified = float(verifier.scores(pair_features(vectors[query], vectors[text], check)[None])[0])
                if verified >= 0.2:
                    candidates.append((lookup, text, verified, workload.correct(query, text)))
    cross = []
    with torch.inference_mode():
        for start in range(0, len(candidates), 64):
            chunk = candidates[start : start + 64]
            a, b = [workload.lookups[c[0]] for c in chunk], [c[1] for c in chunk]
            cross.append(torch.sigmoid((logits(a, b) + logits(b, a)) / 2).numpy())
    crossed = np.concatenate(cross)
    answerable = sum(workload.answerable(q) for q in workload.lookups)
    print(f"calibration split: {len(workload.lookups)} lookups, {answerable} answerable, {len(candidates)} candidates cross-encoded")
    combiners: list[tuple[str, Callable[[float, float], float]]] = [
        ("verifier", lambda v, c: v), ("cross-encoder", lambda v, c: c), ("mean", lambda v, c: (v + c) / 2)]
    for name, combine in combiners:
        best: dict[int, tuple[float, bool]] = {}
        for (lookup, _, by_verifier, correct), crossing in zip(candidates, crossed, strict=True):
            value = combine(by_verifier, float(crossing))
            if lookup not in best or value > best[lookup][0]:
                best[lookup] = (value, correct)
        ranked = sorted(best.values(), key=lambda x: -x[0])
        served_right = np.cumsum([r for _, r in ranked])
        cells = []
        for target in TARGETS:
            held = [n for n in range(30, len(ranked) + 1) if served_right[n - 1] / n >= target]
            cells.append(f"{target:.2f}: recall {served_right[max(held) - 1] / answerable if held else 0.0:.3f}")
        print(f"{name:>14}  " + " | ".join(cells), flush=True)


def _examples(pairs, vectors, count, mined, qqp, faiss) -> list[tuple[str, str, bool]]:
    chosen = [p for p in pairs if qqp.normalize(p.a) != qqp.normalize(p.b)]
    random.Random(SEED).shuffle(chosen)
    chosen = chosen[:count]
    examples = [(p.a, p.b, p.duplicate) for p in chosen]
    if mined:
        workload = qqp.Workload.of(pairs)
        questions = list(dict.fromkeys(t for p in chosen for t in (p.a, p.b)))
        every = list(dict.fromkeys(t for p in pairs for t in (p.a, p.b)))
        index = faiss.IndexFlatIP(len(vectors[every[0]]))
        index.add(np.stack([vectors[t] for t in every]))
        _, ids = index.search(np.stack([vectors[t] for t in questions]), mined + 3)
        for question, row in zip(questions, ids, strict=True):
            others = [every[i] for i in row if qqp.normalize(every[i]) != qqp.normalize(question)][:mined]
            examples += [(question, other, workload.correct(question, other)) for other in others]
    random.Random(SEED).shuffle(examples)
    return examples


if __name__ == "__main__":
    main()
