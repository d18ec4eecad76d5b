"""Quantized KV cache on the bundled real model (smollm2-135m-instruct, bf16 weights): greedy agreement
with the bf16 cache, KV blocks at the same memory, decode speed at batch 1 and 16.

- Agreement: chat-templated prompts, greedy, up to 64 tokens each; a prompt's tokens agree up to
  the first that differs from the bf16 cache's answer (everything after a divergence counts as
  disagreement, however similar).
- --compare-scales: the same agreement for other ways to scale the cache, simulated by rounding
  K/V before the bf16 cache stores them (what a real implementation reads back): one int8 scale
  per token and KV head (dynamic), one int8 scale per layer for K and one for V (vLLM's
  k_scale/v_scale, measured like ours), fp8 with vLLM's default scale 1.0.
- --scored: teacher-forced, over the perplexity corpus (bench/localengine/data/perplexity_corpus.txt,
  3,575 tokens, windows of 512 with stride 256): perplexity, and at every position whether the greedy
  choice equals the model-dtype cache's (`auto`) given the same text before it, so one differing
  token does not count the rest of an answer against the cache. fp32 and bf16 weights; the bf16
  `auto` row against fp32 is the yardstick: what bf16 rounding alone changes.
- --batch-noise: the greedy-agreement count above for the bf16 cache against itself, each prompt
  run alone instead of in one batch of 24 (another matmul shape, other roundings): how much of the
  strict count's gap any rounding change makes.
- Blocks: what `max_kv_cache_bytes` (64 MiB) buys for each cache dtype, as the engine sizes it.
- Speed: decode tokens/s after the first token (--decode-tokens, 128), batch 1 and 16, the cache dtypes
  interleaved run by run so that they share the machine's load; median of --runs.

    python bench/localengine/kv_cache.py --threads 2 [--blocks] [--agreement] [--compare-scales] [--speed]
                                                     [--scored] [--batch-noise]

(no part named: blocks and agreement)

Prints the machine's load average next to each figure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

MODEL = "smollm2-135m-instruct"
CORPUS = Path(__file__).parent / "data" / "perplexity_corpus.txt"
KV_DTYPES = ("auto", "int8", "fp8")
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain what a hash table is in two sentences.",
    "Give me three tips for sleeping better.",
    "Write a Python function that reverses a string.",
    "What causes the seasons on Earth?",
    "Translate 'good morning, how are you?' into Spanish.",
    "Summarise the plot of Romeo and Juliet.",
    "What is 17 times 23?",
    "Write a short story about a lighthouse keeper.",
    "List the planets of the solar system in order.",
    "How do I make a cup of green tea?",
    "What is the difference between a list and a tuple in Python?",
    "Describe the water cycle.",
    "Write a polite email declining a meeting invitation.",
    "Why is the sky blue?",
    "Name five animals that live in the ocean.",
    "What does HTTP stand for and what is it used for?",
    "Suggest a name for a bakery.",
    "Explain recursion to a child.",
    "What are the health benefits of walking?",
    "Write a SQL query that counts the rows of a table named users.",
    "Who wrote Pride and Prejudice?",
    "Give a recipe for pancakes.",
]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def make_llm(kv: str, **kwargs: Any) -> Any:
    from localengine import LLM

    args: dict[str, Any] = dict(dtype="bfloat16", kv_cache_dtype=kv, max_model_len=1024, max_num_seqs=32,
                                num_kvcache_blocks=1024)
    args.update(kwargs)
    return LLM(MODEL, **args)


def chat_ids(llm: Any) -> list[list[int]]:
    tok = llm.get_tokenizer()
    return [list(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)) for p in PROMPTS]


def generate(llm: Any, prompts: list[list[int]]) -> list[list[int]]:
    from localengine import SamplingParams

    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=64))
    return [list(o.outputs[0].token_ids) for o in outs]


def agreement(base: list[list[int]], other: list[list[int]]) -> str:
    agreed = total = same = 0
    for a, b in zip(base, other, strict=True):
        # Up to the first difference; where one answer stopped and the other went on, up to the stop.
        n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        agreed += n
        total += len(a)
        same += a == b
    return f"{100 * agreed / total:.1f}% of {total} tokens, {same}/{len(base)} answers identical"


def run_agreement(compare_scales: bool) -> None:
    # Loading dequantizes the GGUF file (a minute on a loaded 2-core machine): each engine is loaded once.
    llms = {kv: make_llm(kv) for kv in KV_DTYPES}
    prompts = chat_ids(llms["auto"])
    base = generate(llms["auto"], prompts)
    for kv in KV_DTYPES[1:]:
        print(f"kv_cache_dtype={kv} (per-channel scales): {agreement(base, generate(llms[kv], prompts))}"
              f"  (load {load()})", flush=True)
    if compare_scales:
        run_compare_scales(llms, prompts, base)


def run_batch_noise() -> None:
    llm = make_llm("auto")
    prompts = chat_ids(llm)
    base = generate(llm, prompts)
    alone = [generate(llm, [p])[0] for p in prompts]
    print(f"kv_cache_dtype=auto, each prompt alone against the batch of {len(prompts)}: {agreement(base, alone)}"
          f"  (load {load()})", flush=True)


def run_scored() -> None:
    from localengine.perplexity import perplexity

    text = CORPUS.read_text()
    fp32_auto: tuple[int, ...] = ()
    for dtype in ("float32", "bfloat16"):
        reference: tuple[int, ...] = ()
        for kv in KV_DTYPES:
            start = time.perf_counter()
            llm = make_llm(kv, dtype=dtype, max_num_seqs=2, num_kvcache_blocks=80)
            result = perplexity(llm, llm.get_tokenizer().encode(text))
            reference = reference or result.argmax
            fp32_auto = fp32_auto or result.argmax
            same = sum(a == b for a, b in zip(reference, result.argmax, strict=True))
            line = (f"{dtype} weights, kv_cache_dtype={kv}: perplexity {result.perplexity:.3f}, greedy choice equal "
                    f"to {dtype}/auto at {100 * same / len(reference):.2f}% of {len(reference)} positions")
            if dtype != "float32" and kv == "auto":
                vs_fp32 = sum(a == b for a, b in zip(fp32_auto, result.argmax, strict=True))
                line += f" (to float32/auto: {100 * vs_fp32 / len(reference):.2f}%)"
            print(f"{line}  ({time.perf_counter() - start:.0f} s, load {load()})", flush=True)
            del llm


Rounder = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def simulated(llm: Any, prompts: list[list[int]], rounder: Rounder) -> list[list[int]]:
    """The bf16-cache engine with its attention layers seeing K/V rounded by `rounder` before storing them."""
    layers = llm.llm_engine.model_runner.model.attention_layers()
    for i, attn in enumerate(layers):
        forward = attn.forward

        def rounded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: Any, *, i: int = i,
                    forward: Callable[..., torch.Tensor] = forward) -> torch.Tensor:
            rk, rv = rounder(i, k, v)
            return forward(q, rk, rv, meta)

        setattr(attn, "forward", rounded)  # noqa: B010 - an instance attribute shadows the method
    llm.llm_engine.block_manager.reset_prefix_cache()  # blocks cached unrounded must not be hit
    try:
        return generate(llm, prompts)
    finally:
        for attn in layers:
            del attn.forward
        llm.llm_engine.block_manager.reset_prefix_cache()


def int8_round(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (torch.floor((x.float() / scale).clamp(-127, 127) + 0.5) * scale).to(x.dtype)


def run_compare_scales(llms: dict[str, Any], prompts: list[list[int]], base: list[list[int]]) -> None:
    def per_token(_: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def one(x: torch.Tensor) -> torch.Tensor:
            return int8_round(x, x.float().abs().amax(-1, keepdim=True).clamp(min=1e-8) / 127)
        return one(k), one(v)

    ours = llms["int8"].llm_engine.model_runner.kv_scales  # [2, layers, heads, dim]: per channel
    per_layer = ours.amax(dim=(2, 3))  # the largest channel's: one scale per layer for K, one for V

    def per_tensor(i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return int8_round(k, per_layer[0, i]), int8_round(v, per_layer[1, i])

    def fp8_unscaled(_: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def one(x: torch.Tensor) -> torch.Tensor:
            return x.float().clamp(-448, 448).to(torch.float8_e4m3fn).to(x.dtype)
        return one(k), one(v)

    rows = [("int8, per token and KV head (dynamic; 68 B per 64-dim head and token)", per_token),
            ("int8, per layer (vLLM's k_scale/v_scale, measured)", per_tensor),
            ("fp8 e4m3, scale 1.0 (vLLM's default)", fp8_unscaled)]
    for name, rounder in rows:
        print(f"{name}: {agreement(base, simulated(llms['auto'], prompts, rounder))}  (load {load()})", flush=True)


def run_blocks() -> None:
    budget = 64 << 20
    for kv in KV_DTYPES:
        runner = make_llm(kv, num_kvcache_blocks=None, max_kv_cache_bytes=budget, max_num_seqs=256).llm_engine.model_runner
        a = runner.model.args
        per_token = 2 * a.num_layers * a.num_local_kv_heads * a.head_dim * runner.kv_cache.element_size()
        blocks = runner.num_kvcache_blocks
        print(f"kv_cache_dtype={kv}: {per_token} B/token, {blocks} blocks of {runner.block_size} in 64 MiB = "
              f"{blocks * runner.block_size} tokens of context", flush=True)


def decode_rate(llm: Any, prompts: list[list[int]], tokens: int) -> float:
    from localengine import SamplingParams

    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
    firsts = [o.metrics.first_token_time for o in outs]
    lasts = [o.metrics.last_token_time for o in outs]
    decoded = sum(len(o.outputs[0].token_ids) - 1 for o in outs)
    elapsed: float = max(lasts) - max(firsts)
    return decoded / elapsed


def run_speed(runs: int, tokens: int) -> None:
    llms = {kv: make_llm(kv, enable_prefix_caching=False) for kv in KV_DTYPES}
    prompts = chat_ids(llms["auto"])
    for batch in (1, 16):
        rates: dict[str, list[float]] = {kv: [] for kv in KV_DTYPES}
        loads = []
        for llm in llms.values():
            decode_rate(llm, prompts[:batch], 8)  # warm-up
        for _ in range(runs):
            for kv, llm in llms.items():
                rates[kv].append(decode_rate(llm, prompts[:batch], tokens))
            loads.append(os.getloadavg()[0])
        summary = ", ".join(f"{kv} {statistics.median(r):.1f}" for kv, r in rates.items())
        print(f"batch {batch}: decode tok/s {summary}  (load {min(loads):.1f}-{max(loads):.1f})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--blocks", action="store_true", help="KV blocks in 64 MiB per cache dtype")
    parser.add_argument("--agreement", action="store_true", help="greedy agreement with the bf16 cache")
    parser.add_argument("--compare-scales", action="store_true", help="simulated alternatives to per-channel scales")
    parser.add_argument("--speed", action="store_true", help="decode tokens/s at batch 1 and 16")
    parser.add_argument("--scored", action="store_true", help="teacher-forced perplexity and greedy agreement")
    parser.add_argument("--batch-noise", action="store_true", help="the bf16 cache alone against batched")
    args = parser.parse_args()
    if not (args.blocks or args.agreement or args.compare_scales or args.speed or args.scored or args.batch_noise):
        args.blocks = args.agreement = True
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    print(f"{MODEL}, bf16 unless said, {args.threads} threads, torch {torch.__version__}  (load {load()})", flush=True)
    if args.blocks:
        run_blocks()
    if args.agreement or args.compare_scales:
        run_agreement(args.compare_scales)
    if args.speed:
        run_speed(args.runs, args.decode_tokens)
    if args.scored:
        run_scored()
    if args.batch_noise:
        run_batch_noise()
    print(f"done in {time.perf_counter() - start:.0f} s  (load {load()})")


if __name__ == "__main__":
    main()
