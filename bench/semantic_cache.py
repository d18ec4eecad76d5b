"""Semantic cache benchmark on held-out Quora Question Pairs, today's cache against this one (not a test).

    nice -n 10 .venv/bin/python bench/semantic_cache.py [--data qqp-dev.jsonl.gz] [--pairs N] [--concurrency 16]

Workload: with `--data` (or SLIPSTREAM_QQP) naming the full QQP development set, its held-out `test`
split, which neither the embedder's adapter nor the verifier saw in training or calibration; without,
the repository's 2,000-pair sample of that split (data/qqp-heldout-sample.jsonl.gz). Its first
questions are stored, its second questions looked up; a served entry is right when it is a labelled
duplicate of the question (or the same text). Plus data/cache-adversarial.jsonl: store one side of
each near-miss (swapped arguments, moved negation, other quantity, unit, date or name), ask the other,
both ways; every hit there is a wrong answer.

Each cache runs in its own process through the real lookup path (ResponseCache: exact tier, MiniLM
embedding micro-batched in its worker thread, faiss, rule vetoes, verifier): "today" is the code at
`--baseline-ref` (before the QQP adapter, default af61bd5) checked out from git into a temporary
folder, "tuned" is this tree. Both in the same run, on the same machine. Precision and recall at
min_precision 0.90 / 0.95 / 0.98; latency (embedding included) from the first pass at 0.95, at
concurrency 16 and at concurrency 1, with the CPU time a lookup costs at concurrency 1 (every thread of
the process counted: on a busy machine wall time measures the queue for a core, CPU time what a lookup
costs). The 0.90 and 0.98 passes reuse the first pass's query vectors, so they measure the decisions,
not the embedding again.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    from sdk.embedding import Embedder

REPOSITORY = Path(__file__).resolve().parents[1]
ADVERSARIAL = REPOSITORY / "data" / "cache-adversarial.jsonl"
LEVELS = (0.90, 0.95, 0.98)
TEAM = "bench"


# -- child: one cache, run from whichever `sdk` is first on the path ---------------------------------


def _request(question: str):
    from sdk.types import Endpoint, LLMRequest

    body = {"model": "claude-sonnet-4-5", "max_tokens": 256, "temperature": 0, "messages": [{"role": "user", "content": question}]}
    return LLMRequest(Endpoint.MESSAGES, body)


def _answer(question: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": [{"type": "text", "text": question}], "stop_reason": "end_turn", "usage": {}}


class _KnownVectors:
    """Stands in for the embedder on the repeat passes: the query vectors the first pass computed."""

    def __init__(self, vectors: dict[str, np.ndarray], embedder):
        self.vectors, self.embedder = vectors, embedder

    async def embed(self, text: str, *tenant: str) -> np.ndarray:  # the team: since 82af9ae, not in the baseline's
        return self.vectors[text] if text in self.vectors else await self.embedder.embed(text, *tenant)


async def _lookups(cache, team: str, questions: list[str], concurrency: int, min_precision: float) -> list[dict[str, Any]]:
    from sdk.cache.keys import cache_keys

    gate = asyncio.Semaphore(concurrency)

    async def one(question: str) -> dict[str, Any]:
        async with gate:
            keys = cache_keys(team, _request(question))
            started = time.perf_counter()
            found = await cache.lookup(team, keys, exact=True, semantic=True, min_precision=min_precision)
            elapsed = time.perf_counter() - started
        served = found.entry.response["content"][0]["text"] if found.entry is not None else None
        nearest = cache.store.search(team, keys.partition, found.vector, 1) if found.vector is not None else []
        return {
            "question": question, "status": found.status, "served": served, "seconds": elapsed,
            "vector": found.vector, "nearest": nearest[0].query if nearest else question, "cosine": nearest[0].cosine if nearest else 1.0,
        }  # fmt: skip

    return list(await asyncio.gather(*(one(q) for q in questions)))


def child(workload_path: Path, out: Path, concurrency: int) -> None:
    from sdk.cache.keys import cache_keys
    from sdk.policy import SemanticCachePolicy
    from sdk.services import Services

    work = json.loads(workload_path.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        cache = Services(data_dir=Path(tmp)).response_cache()
        embedder = cache.embedder
        config = SemanticCachePolicy(enabled=True, max_entries=10**6)
        started = time.perf_counter()

        async def store_all() -> None:
            for team, stored in ((TEAM, work["stored"]), ("adversarial", work["adversarial_stored"]), ("adversarial-reversed", work["adversarial_asked"])):
                for question, vector in zip(stored, embedder.embed_many(stored), strict=True):
                    stored_id = cache.put(team, cache_keys(team, _request(question)), "bench/model", _answer(question), vector, config)
                    if inspect.isawaitable(stored_id):  # async since 2026-11-27; the baseline tree's may be sync
                        await stored_id

        asyncio.run(store_all())
        stored_s = time.perf_counter() - started
        asyncio.run(_lookups(cache, "warm-up", work["lookups"][:32], 1, 0.95))  # start the worker thread, load the model
        started = time.perf_counter()
        first = asyncio.run(_lookups(cache, TEAM, work["lookups"], concurrency, 0.95))
        wall = time.perf_counter() - started
        cpu_started = time.process_time()  # every thread of the process: embedder worker, OpenMP pools, event loop
        single = asyncio.run(_lookups(cache, TEAM, work["lookups"][:200], 1, 0.95))
        cpu_ms = (time.process_time() - cpu_started) / len(single) * 1000
        # duck-typed: a lookup calls only `embed`
        cache.embedder = cast("Embedder", _KnownVectors({r["question"]: r["vector"] for r in first if r["vector"] is not None}, embedder))
        served = {0.95: first}
        for level in (0.90, 0.98):
            served[level] = asyncio.run(_lookups(cache, TEAM, work["lookups"], concurrency, level))
        cache.embedder = embedder
        adversarial = asyncio.run(_lookups(cache, "adversarial", work["adversarial_asked"], concurrency, 0.90))
        adversarial += asyncio.run(_lookups(cache, "adversarial-reversed", work["adversarial_stored"], concurrency, 0.90))
        started = time.perf_counter()
        embedder.embed_many(work["lookups"][:640])
        raw_ms = (time.perf_counter() - started) / min(640, len(work["lookups"])) * 1000
        cache.close()
    result = {
        "embedder": getattr(embedder, "model_id", "minilm"),
        "levels": {str(level): [[r["question"], r["served"], r["status"]] for r in rows] for level, rows in served.items()},
        "nearest": [[r["question"], r["nearest"], r["cosine"]] for r in first],
        "latency_ms": [r["seconds"] * 1000 for r in first], "single_ms": [r["seconds"] * 1000 for r in single],
        "lookups_per_s": len(first) / wall, "store_s": stored_s, "raw_ms": raw_ms, "cpu_ms": cpu_ms,
        "adversarial": [[r["question"], r["served"]] for r in adversarial],
    }  # fmt: skip
    out.write_text(json.dumps(result))


# -- parent: the workload, both caches, the comparison ---------------------------------------------


def baseline_tree(ref: str, into: Path) -> Path:
    """`sdk/` as it was at `ref`, extracted from git (the repository's own history)."""
    archive = into / "baseline.tar"
    subprocess.run(["git", "-C", str(REPOSITORY), "archive", "--format=tar", "-o", str(archive), ref, "sdk"], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def run_child(tree: Path, workload: Path, out: Path, concurrency: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, __file__, "--child", str(workload), str(out), "--concurrency", str(concurrency)], env=env, check=True)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


@dataclass(frozen=True, slots=True)
class Score:
    hits: int
    precision: float
    recall: float
    hit_rate: float


def score(rows: list[list[Any]], workload) -> Score:
    hits = [(question, served) for question, served, _ in rows if served is not None]
    right = sum(workload.correct(q, s) for q, s in hits)
    answerable = sum(workload.answerable(q) for q, _, _ in rows)
    return Score(len(hits), right / max(len(hits), 1), right / max(answerable, 1), len(hits) / max(len(rows), 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=os.environ.get("SLIPSTREAM_QQP"), help="the full QQP development set (default: $SLIPSTREAM_QQP, else the repository's held-out sample)")
    parser.add_argument("--pairs", type=int, default=0, help="use the first N held-out pairs (0: all)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--baseline-ref", default="af61bd5", help="git revision of today's cache")
    parser.add_argument("--child", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # PYTHONPATH names the tree whose `sdk` this cache runs
        return child(args.child[0], args.child[1], args.concurrency)

    sys.path.insert(0, str(REPOSITORY))
    from sdk.cache import qqp

    pairs = qqp.split(qqp.load_pairs(qqp.full_set(args.data)))["test"] if args.data else qqp.load_pairs(qqp.HELD_OUT_SAMPLE)
    pairs = pairs[: args.pairs] if args.pairs else pairs
    workload = qqp.Workload.of(pairs)
    adversarial = [json.loads(line) for line in ADVERSARIAL.read_text().splitlines() if line.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        spec = folder / "workload.json"
        spec.write_text(json.dumps({
            "stored": workload.stored, "lookups": workload.lookups,
            "adversarial_stored": [p["a"] for p in adversarial], "adversarial_asked": [p["b"] for p in adversarial],
        }))  # fmt: skip
        results = {}
        for name, tree in (("today", baseline_tree(args.baseline_ref, folder)), ("tuned", REPOSITORY)):
            started = time.perf_counter()
            results[name] = run_child(tree, spec, folder / f"{name}.json", args.concurrency)
            print(f"[{name}] embedder {results[name]['embedder']}: ran in {time.perf_counter() - started:.0f}s", flush=True)

    answerable = sum(map(workload.answerable, workload.lookups))
    print(f"\nheld-out QQP workload: {len(workload.stored)} stored, {len(workload.lookups)} lookups, {answerable} answerable; {len(adversarial)} adversarial pairs, asked both ways")
    print("| cache | min_precision | hit rate | precision | recall |")
    print("|---|---|---|---|---|")
    for level in LEVELS:
        for name, result in results.items():
            got = score(result["levels"][str(level)], workload)
            print(f"| {name} | {level:.2f} | {got.hit_rate:.3f} | {got.precision:.3f} | {got.recall:.3f} |")
    for level in LEVELS:
        today, tuned = (score(results[name]["levels"][str(level)], workload) for name in ("today", "tuned"))
        print(f"min_precision {level:.2f}: tuned/today right hits {tuned.recall / max(today.recall, 1e-9):.2f}x, wrong hits {(1 - tuned.precision) * tuned.hits:.0f} vs {(1 - today.precision) * today.hits:.0f}")
    for name, result in results.items():
        for cut in (0.8, 0.95):
            rows = [[q, n if c >= cut else None, ""] for q, n, c in result["nearest"]]
            got = score(rows, workload)
            print(f"{name} embedder, cosine >= {cut} (nearest entry): hit rate {got.hit_rate:.3f}, precision {got.precision:.3f}, recall {got.recall:.3f}")
    kinds = {p["b"]: p["kind"] for p in adversarial} | {p["a"]: p["kind"] for p in adversarial}
    for name, result in results.items():
        wrong = [(q, s) for q, s in result["adversarial"] if s is not None]
        by_kind: dict[str, int] = {}
        for question, _ in wrong:
            by_kind[kinds[question]] = by_kind.get(kinds[question], 0) + 1
        print(f"{name}: adversarial hits at min_precision 0.90: {len(wrong)} of {len(result['adversarial'])} {by_kind}")
        for question, served in wrong[:5]:
            print(f"    asked {question!r}, served {served!r}")
    for name, result in results.items():
        many, one = np.array(result["latency_ms"]), np.array(result["single_ms"])
        print(
            f"{name}: lookup latency at concurrency {args.concurrency}: p50 {np.percentile(many, 50):.1f} ms, p99 {np.percentile(many, 99):.1f} ms"
            f" ({result['lookups_per_s']:.0f} lookups/s); at concurrency 1: p50 {np.percentile(one, 50):.1f} ms, p99 {np.percentile(one, 99):.1f} ms;"
            f" CPU time per lookup at concurrency 1 (all threads): {result['cpu_ms']:.1f} ms; MiniLM alone in batches of 64: {result['raw_ms']:.1f} ms/question"
        )
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
