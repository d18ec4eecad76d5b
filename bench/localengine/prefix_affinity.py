"""Prefix-affinity routing over engine replicas vs least_busy and weighted, in one run.

Three `slipstream engine serve --model demo` replicas (one torch thread each) behind the gateway's
pipeline (a TeamRuntime in this process, the code the proxy runs). The workload is what makes
prefix caches matter: many conversations, each on one of several long system prompts (real
prose: chunks of the Python standard library's sources), with histories that grow turn after
turn; a few conversations run at once. Each strategy gets fresh system prompts and conversations
(so no strategy reads another's cache), and the strategies take turns over --rounds.

Measured per strategy: the engines' own prefix-cache hit rate (vllm:prefix_cache_hits /
vllm:prefix_cache_queries, in tokens, summed over the replicas) and time to first token seen by
the client (p50/p95: request sent to the first content delta).

By default each replica's KV cache (--num-kvcache-blocks) holds its third of the distinct system
prompts in play (four of twelve) with room for the histories in flight, about 40% of all of
them: the regime of a busy deployment where the traffic's prefixes outgrow one replica's cache but
not the replicas' together. A cache much smaller than a replica's share thrashes under any router
(LRU evicts a prefix just before its next use); pass a large value (e.g. 2000) for the regime
where every replica can hold everything, where routing matters only for the first request of
each prefix.

    .venv/bin/python bench/localengine/prefix_affinity.py [--rounds 2] [--num-kvcache-blocks 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

STRATEGIES = ("prefix_affinity", "least_busy", "weighted")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]  # an AF_INET address: (host, port)
        return port


def start_replicas(n: int, blocks: int) -> tuple[list[subprocess.Popen[bytes]], list[int]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    ports = [free_port() for _ in range(n)]
    procs = [subprocess.Popen([sys.executable, "-m", "gateway.cli", "engine", "serve", "--model", "demo",
                               "--port", str(p), "--num-kvcache-blocks", str(blocks)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for p in ports]
    deadline = time.monotonic() + 120
    for port in ports:
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("engine replicas did not start") from None
                time.sleep(0.2)
    return procs, ports


def prefix_counters(ports: list[int]) -> tuple[float, float]:
    hits = queries = 0.0
    for port in ports:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        hits += sum(float(v) for v in re.findall(r"^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)", text, re.M))
        queries += sum(float(v) for v in re.findall(r"^vllm:prefix_cache_queries_total\{[^}]*\} (\S+)", text, re.M))
    return hits, queries


def corpus_chunks(count: int, tokens: int, rng: random.Random) -> list[str]:
    """Real prose nobody wrote for this benchmark: chunks of the standard library's sources, cut
    to `tokens` tokens of the demo model's tokenizer (so every conversation fits its context)."""
    from transformers import AutoTokenizer

    from localengine.config import BUNDLED_MODELS

    tokenizer = AutoTokenizer.from_pretrained(str(BUNDLED_MODELS["demo"]), local_files_only=True)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.stat().st_size > 20 * tokens)
    chunks: list[str] = []
    for _ in range(count):
        text = rng.choice(files).read_text(errors="replace")
        start = rng.randrange(len(text) - 10 * tokens)
        ids = tokenizer.encode(text[start : start + 10 * tokens], add_special_tokens=False)[:tokens]
        chunks.append(str(tokenizer.decode(ids)))
    return chunks


def build_runtime(strategy: str, ports: list[int]):
    from sdk.policy import load_policy
    from sdk.runtime import TeamRuntime

    providers = "\n".join(f'  e{i}: {{kind: openai, base_url: "http://127.0.0.1:{p}/v1", api_key: "unused"}}'
                          for i, p in enumerate(ports))
    targets = ", ".join(f"{{provider: e{i}, model: demo}}" for i in range(len(ports)))
    text = f"""team: bench
api_keys: [{{value: "sk-bench"}}]
providers:
{providers}
routes:
  - match: {{model: "*"}}
    strategy: {strategy}
    targets: [{targets}]
prompt_cache: {{enabled: false}}
semantic_cache: {{enabled: false}}
"""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    return TeamRuntime.build(load_policy(Path(f.name)))


async def one_turn(runtime, messages: list[dict[str, Any]], max_tokens: int) -> tuple[float, str]:
    """Time to the first content delta, and the answer's text."""
    import orjson

    from sdk.types import Endpoint, LLMRequest

    body = {"model": "demo", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    started = time.perf_counter()
    answer, _ctx = await runtime.handle(LLMRequest(Endpoint.CHAT_COMPLETIONS, body))
    ttft, text = None, []
    try:
        async for batch in answer.events:
            for line in batch.split(b"\n"):
                if not line.startswith(b"data: {"):
                    continue
                for choice in orjson.loads(line[6:]).get("choices") or []:
                    delta = (choice.get("delta") or {}).get("content")
                    if delta:
                        ttft = ttft or time.perf_counter() - started
                        text.append(delta)
    finally:
        await answer.aclose()
    return (ttft if ttft is not None else time.perf_counter() - started), "".join(text)


async def run_strategy(strategy: str, ports: list[int], args: argparse.Namespace, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    systems = corpus_chunks(args.systems, args.system_tokens, rng)
    questions = corpus_chunks(args.conversations * args.turns, 60, rng)
    runtime = build_runtime(strategy, ports)
    ttfts: list[float] = []
    gate = asyncio.Semaphore(args.concurrency)

    async def conversation(i: int) -> None:
        async with gate:
            messages = [{"role": "system", "content": systems[i % args.systems]}]
            for turn in range(args.turns):
                messages.append({"role": "user", "content": questions[i * args.turns + turn]})
                ttft, reply = await one_turn(runtime, messages, args.max_tokens)
                ttfts.append(ttft)
                messages.append({"role": "assistant", "content": reply})

    hits0, queries0 = prefix_counters(ports)
    order = list(range(args.conversations))
    rng.shuffle(order)
    await asyncio.gather(*(conversation(i) for i in order))
    hits1, queries1 = prefix_counters(ports)
    ttfts.sort()
    return {"hit_rate": (hits1 - hits0) / max(queries1 - queries0, 1), "p50": statistics.median(ttfts),
            "p95": ttfts[int(0.95 * (len(ttfts) - 1))], "requests": len(ttfts)}


async def main_async(args: argparse.Namespace) -> None:
    procs, ports = start_replicas(args.replicas, args.num_kvcache_blocks)
    results: dict[str, list[dict[str, float]]] = {s: [] for s in STRATEGIES}
    try:
        for r in range(args.rounds):
            for k, strategy in enumerate(STRATEGIES):
                res = await run_strategy(strategy, ports, args, seed=1000 * r + k)
                results[strategy].append(res)
                print(f"round {r + 1} {strategy:16s} hit rate {res['hit_rate']:.3f}  TTFT p50 {res['p50'] * 1000:7.1f} ms"
                      f"  p95 {res['p95'] * 1000:7.1f} ms  ({res['requests']} requests)", flush=True)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
    mean = {s: {k: statistics.mean(r[k] for r in rs) for k in ("hit_rate", "p50", "p95")} for s, rs in results.items()}
    best_other_hit = max(mean[s]["hit_rate"] for s in STRATEGIES[1:])
    best_other_p50 = min(mean[s]["p50"] for s in STRATEGIES[1:])
    print("\nstrategy          hit rate   TTFT p50   TTFT p95")
    for s in STRATEGIES:
        print(f"{s:16s}  {mean[s]['hit_rate']:8.3f}  {mean[s]['p50'] * 1000:7.1f} ms  {mean[s]['p95'] * 1000:7.1f} ms")
    print(f"\nprefix_affinity vs best other: hit rate {mean['prefix_affinity']['hit_rate'] / max(best_other_hit, 1e-9):.2f}x "
          f"(goal >= 2x), TTFT p50 {mean['prefix_affinity']['p50'] / best_other_p50:.2f}x (goal <= 0.6x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--systems", type=int, default=12, help="distinct system prompts")
    parser.add_argument("--system-tokens", type=int, default=900)
    parser.add_argument("--conversations", type=int, default=60)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=6, help="conversations running at once")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--num-kvcache-blocks", type=int, default=290,
                        help="per replica, 16 tokens each (290: its third of the 12 system prompts, 228 blocks, "
                             "and the histories in flight)")
    parser.add_argument("--rounds", type=int, default=1)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
