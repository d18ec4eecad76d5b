"""Fine-tune the bundled MiniLM on QQP pairs; writes the LoRA adapter sdk/cache/minilm-qqp-lora.safetensors.

    .venv/bin/python -m sdk.cache.train_embedder --data qqp-dev.jsonl.gz --threads 2   # the shipped adapter: 520 s on 2 idle cores
    ... --max-rows 3200                                                               # fewer rows, to fit a busy machine
    ... --init sdk/cache/minilm-qqp-lora.safetensors --skip-rows 3200 --max-rows 6400   # continue on rows not yet seen

Learns only on the `embedder` split (see qqp.SPLITS): the verifier's training, calibration and the
held-out test split stay unseen. Loss: sentence-transformers' OnlineContrastiveLoss over QQP's
labelled pairs — duplicates pulled together, labelled non-duplicates (Quora chose them as related
questions: the near-misses a cache meets) pushed below cosine 0.5, only the hard ones of each batch
counting. That is the recipe of Redis's LangCache-Embed (arXiv 2504.02268). MultipleNegativesRanking
over duplicates, tried first, changed almost nothing: all-MiniLM-L6-v2 was already trained that way,
on Quora duplicates among others.
CPU only, fixed seed, a LoRA adapter (rank 16 on every linear layer of the 6 blocks) so the shipped
file is ~1.3 MB and the original model stays the fallback.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import numpy as np

from sdk.cache import qqp
from sdk.cache.adapter import ADAPTER, LowRank
from sdk.embedding import load_minilm

SEED = 20261122
RANK, ALPHA = 16, 32.0
BATCH, LEARNING_RATE, MAX_TOKENS = 64, 1e-3, 48


def length_buckets(rows: list[qqp.Pair], rng: random.Random) -> list[list[qqp.Pair]]:
    """Batches of similar length (a batch pads to its longest question), in random order."""
    ordered = sorted(rows, key=lambda pair: len(pair.a) + len(pair.b))
    batches = [ordered[start : start + BATCH] for start in range(0, len(ordered) - BATCH + 1, BATCH)]
    rng.shuffle(batches)
    return batches


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, help="the full QQP development set (default: $SLIPSTREAM_QQP)")
    parser.add_argument("--out", type=Path, default=ADAPTER)
    parser.add_argument("--max-rows", type=int, default=0, help="train on at most this many labelled pairs (0: all), to fit a time budget")
    parser.add_argument("--skip-rows", type=int, default=0, help="start this far into the seeded order (rows an earlier run already learned)")
    parser.add_argument("--init", type=Path, help="continue from this adapter instead of a fresh one (same rank)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import torch
    from sentence_transformers.losses import OnlineContrastiveLoss
    from tqdm import tqdm

    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    # One thread: on a machine shared by many jobs, two OpenMP threads spin-wait on each other (8 s a step
    # with one thread, over 70 s with two, measured at load average 11 on 2 cores).
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    pairs = qqp.split(qqp.load_pairs(qqp.full_set(args.data)))["embedder"]
    model = load_minilm()
    rows = [pair for pair in pairs if qqp.normalize(pair.a) != qqp.normalize(pair.b)]
    random.Random(SEED).shuffle(rows)
    rows = rows[args.skip_rows :]
    rows = rows[: args.max_rows] if args.max_rows else rows
    batches = length_buckets(rows, random.Random(SEED))
    print(f"embedder split: {len(pairs)} pairs; training on {len(rows)} ({sum(p.duplicate for p in rows)} duplicates)", flush=True)

    model.max_seq_length = MAX_TOKENS  # QQP questions are short; training pads to the batch's longest
    adapted = LowRank.wrap(model, RANK, ALPHA)
    if args.init is not None:
        LowRank.load(adapted, args.init)
    model.train()
    loss_fn = OnlineContrastiveLoss(model)
    parameters = [module.get_parameter(name) for module in adapted.values() for name in ("down", "up")]
    optimizer = torch.optim.AdamW(parameters, lr=LEARNING_RATE, weight_decay=0.01)
    steps = args.epochs * len(batches)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / (0.1 * steps)) * max(0.0, (steps - step) / steps))
    trained = time.perf_counter()
    progress = tqdm(total=steps, desc="fine-tuning", unit="batch")
    for _ in range(args.epochs):
        for batch in batches:
            features = [model.tokenize([pair.a for pair in batch]), model.tokenize([pair.b for pair in batch])]
            loss = loss_fn(features, torch.tensor([float(pair.duplicate) for pair in batch]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            progress.update(1)
            progress.set_postfix(loss=f"{loss.item():.3f}")
    progress.close()
    LowRank.save(adapted, RANK, ALPHA, args.out)
    size = args.out.stat().st_size / 1e6
    print(f"wrote {args.out} ({size:.1f} MB); training {time.perf_counter() - trained:.0f}s, total {time.perf_counter() - started:.0f}s", flush=True)


if __name__ == "__main__":
    main()
