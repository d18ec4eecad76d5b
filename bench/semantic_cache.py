"""Semantic cache benchmark on held-out Quora Question Pairs (not a test).

    .venv/bin/python bench/semantic_cache.py [--data qqp-dev.jsonl.gz] [--pairs N] [--concurrency 16] [--min-precision 0.95]

With `--data` (or SLIPSTREAM_QQP) naming the full QQP development set, its held-out `test` split
(never trained or calibrated on) is the workload; without, the repository's 2,000-pair sample of
that split (data/qqp-heldout-sample.jsonl.gz). The workload is used as a cache workload: its first
questions are stored through the real ResponseCache (SQLite + faiss), then its second questions are
looked up through the real path — MiniLM embedding, micro-batched across concurrent lookups, faiss
search, verifier. A served entry is right when it is a labelled duplicate of the question (or the
same text). The cosine ≥ 0.8 baseline (serve the nearest entry above the cut) is measured on the
same store, in the same run. Latency is per lookup, embedding included.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sdk.cache import qqp  # noqa: E402
from sdk.cache.keys import cache_keys  # noqa: E402
from sdk.policy import SemanticCachePolicy  # noqa: E402
from sdk.services import Services, default_data_dir  # noqa: E402
from sdk.types import Endpoint, LLMRequest  # noqa: E402

TEAM = "bench"


def request(question: str) -> LLMRequest:
    body = {"model": "claude-sonnet-4-5", "max_tokens": 256, "temperature": 0, "messages": [{"role": "user", "content": question}]}
    return LLMRequest(Endpoint.MESSAGES, body)


def response(question: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "text", "text": question}], "stop_reason": "end_turn", "usage": {}}


@dataclass(frozen=True, slots=True)
class Row:
    question: str
    status: str
    served: str | None  # the stored question whose answer the cache served
    nearest: str  # the nearest stored question, what a cosine cut would serve
    cosine: float
    seconds: float


async def run_lookups(services: Services, questions: list[str], concurrency: int, min_precision: float) -> list[Row]:
    cache = services.response_cache()
    gate = asyncio.Semaphore(concurrency)

    async def one(question: str) -> Row:
        async with gate:
            keys = cache_keys(TEAM, request(question))
            started = time.perf_counter()
            found = await cache.lookup(TEAM, keys, exact=True, semantic=True, min_precision=min_precision)
            elapsed = time.perf_counter() - started
        served = found.entry.response["content"][0]["text"] if found.entry is not None else None
        if found.vector is None:  # exact hit: the nearest entry is the same text
            return Row(question, found.status, served, question, 1.0, elapsed)
        nearest = cache.store.search(TEAM, keys.partition, found.vector, 1)[0]
        return Row(question, found.status, served, nearest.query, nearest.cosine, elapsed)

    return list(await asyncio.gather(*(one(q) for q in questions)))


def summary(name: str, served: list[tuple[str, str]], workload: qqp.Workload) -> str:
    right = sum(workload.correct(q, s) for q, s in served)
    lookups, answerable = len(workload.lookups), sum(workload.answerable(q) for q in workload.lookups)
    return f"{name}: hit rate {len(served) / lookups:.3f}, precision {right / max(len(served), 1):.3f}, recall {right / answerable:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=os.environ.get("SLIPSTREAM_QQP"), help="the full QQP development set (default: $SLIPSTREAM_QQP, else the repository's held-out sample)")
    parser.add_argument("--pairs", type=int, default=0, help="use the first N held-out pairs (0: all)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--min-precision", type=float, default=SemanticCachePolicy().min_precision)
    args = parser.parse_args()

    pairs = qqp.split(qqp.load_pairs(qqp.full_set(args.data)))["test"] if args.data else qqp.load_pairs(qqp.HELD_OUT_SAMPLE)
    pairs = pairs[: args.pairs] if args.pairs else pairs
    workload = qqp.Workload.of(pairs)
    with tempfile.TemporaryDirectory() as tmp:
        services = Services(data_dir=Path(tmp))
        embedder = services.embedder()
        stored = qqp.embed_cached(workload.stored, embedder.embed_many, default_data_dir() / "qqp")
        config = SemanticCachePolicy(enabled=True, max_entries=10**6)
        cache = services.response_cache()
        for question in workload.stored:
            cache.put(TEAM, cache_keys(TEAM, request(question)), "bench/model", response(question), stored[question], config)
        embedder.embed_many(["warm up"])
        asyncio.run(run_lookups(services, workload.lookups[:32], 1, args.min_precision))  # warm the worker thread
        started = time.perf_counter()
        results = asyncio.run(run_lookups(services, workload.lookups, args.concurrency, args.min_precision))
        wall = time.perf_counter() - started
        single = asyncio.run(run_lookups(services, workload.lookups[:200], 1, args.min_precision))
        # Machine reference for reading the latencies: raw MiniLM throughput on this machine, now.
        started = time.perf_counter()
        embedder.embed_many(workload.lookups[:640])
        raw_ms = (time.perf_counter() - started) / 640 * 1000
        cache.close()

    print(f"held-out QQP workload: {len(workload.stored)} stored, {len(results)} lookups, {sum(map(workload.answerable, workload.lookups))} answerable")
    print(summary(f"slipstream, min_precision {args.min_precision}", [(r.question, r.served) for r in results if r.served is not None], workload))
    print(f"  exact hits {sum(r.status == 'exact-hit' for r in results)}, semantic hits {sum(r.status == 'semantic-hit' for r in results)}")
    for cut in (0.8, 0.95):
        print(summary(f"cosine >= {cut} baseline", [(r.question, r.nearest) for r in results if r.cosine >= cut], workload))
    latencies = np.array([r.seconds for r in results]) * 1000
    solo = np.array([r.seconds for r in single]) * 1000
    print(f"lookup latency at concurrency {args.concurrency}: p50 {np.percentile(latencies, 50):.1f} ms, p99 {np.percentile(latencies, 99):.1f} ms ({len(results) / wall:.0f} lookups/s)")
    print(f"lookup latency at concurrency 1: p50 {np.percentile(solo, 50):.1f} ms, p99 {np.percentile(solo, 99):.1f} ms")
    print(f"machine reference: MiniLM alone, batches of 64: {raw_ms:.1f} ms/question; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
