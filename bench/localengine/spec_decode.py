"""Speculative decoding on the bundled demo model: tokens/s with and without, acceptance printed.

Target `demo` (1.8M params); proposers: n-gram lookup, the draft model `demo-draft` (0.16M, same
tokenizer), and the MLP speculator `demo-speculator` (drafts from the target's hidden states);
greedy, ignore_eos, fp32 on CPU. Each configuration generates the same outputs (greedy equality
is checked here too); the difference is how many target passes it takes. Every configuration runs
once as a warm-up, then --repeats times round-robin; the best run is reported (the 2-core box is
shared: noise only slows). Acceptance columns cover the timed runs; the proposal cost is the
adaptive policy's measurement of one proposed position relative to a target step.

    python bench/localengine/spec_decode.py                       # batch 1, 4 and 8, 256 tokens
    python bench/localengine/spec_decode.py --batch 1 --max-tokens 128 --threads 1 --only mlp_speculator
    python bench/localengine/spec_decode.py --batch 1 --temperature 0.8 --only mlp ngram   # sampled requests
"""

from __future__ import annotations

import argparse
import time

import torch

from localengine import LLM, SamplingParams

PROMPTS = [
    "def main(",
    "import os\nimport sys\n\n\ndef parse_args(",
    "class Config:\n    def __init__(self, path):\n        self.path = path\n",
    "for i in range(len(items)):\n    if items[i]",
    "    def __repr__(self):\n        return",
    "try:\n    import json\nexcept ImportError:\n",
    "def read_file(path):\n    with open(path) as f:\n",
    "if __name__ == '__main__':\n",
]

CONFIGS: list[tuple[str, dict | None]] = [
    ("no speculation", None),
    ("ngram k=4", {"method": "ngram", "num_speculative_tokens": 4, "adaptive": False}),
    ("ngram k=4 adaptive", {"method": "ngram", "num_speculative_tokens": 4}),
    ("draft k=3", {"method": "draft_model", "model": "demo-draft", "num_speculative_tokens": 3, "adaptive": False}),
    ("draft k=3 adaptive", {"method": "draft_model", "model": "demo-draft", "num_speculative_tokens": 3}),
    ("mlp_speculator k=4", {"method": "mlp_speculator", "model": "demo-speculator", "num_speculative_tokens": 4,
                            "adaptive": False}),
    ("mlp_speculator k=6", {"method": "mlp_speculator", "model": "demo-speculator", "num_speculative_tokens": 6,
                            "adaptive": False}),
    ("mlp_speculator k=6 adaptive", {"method": "mlp_speculator", "model": "demo-speculator",
                                     "num_speculative_tokens": 6}),
]


def counters(llm: LLM) -> tuple[int, int, int]:
    stats = llm.llm_engine.spec_decode_stats()
    return (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) if stats else (0, 0, 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8], help="requests per run (prompts cycle)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="> 0: sampled requests (top-k 50); outputs then differ by design and are not compared")
    ap.add_argument("--only", nargs="+", default=[], metavar="WORD",
                    help="run only the configurations whose name contains one of these (no speculation always runs)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    params = SamplingParams(temperature=args.temperature, top_k=50 if args.temperature else 0,
                            max_tokens=args.max_tokens, ignore_eos=True)
    configs = [(name, spec) for name, spec in CONFIGS
               if spec is None or not args.only or any(word in name for word in args.only)]
    llms = {name: LLM("demo", speculative_config=spec, num_threads=args.threads) for name, spec in configs}
    for batch in args.batch:
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
        for llm in llms.values():
            llm.generate(prompts, params)  # warm-up; adaptive policies also measure their costs here
        best = dict.fromkeys(llms, float("inf"))
        before = {name: counters(llm) for name, llm in llms.items()}
        outputs: dict[str, list[list[int]]] = {}
        # Round-robin, so a burst of load on the shared machine hits every configuration alike.
        for _ in range(args.repeats):
            for name, llm in llms.items():
                llm.reset_prefix_cache()
                start = time.perf_counter()
                outs = llm.generate(prompts, params)
                best[name] = min(best[name], time.perf_counter() - start)
                outputs[name] = [o.outputs[0].token_ids for o in outs]
        base = configs[0][0]
        mode = f"temperature {args.temperature}, top-k 50" if args.temperature else "greedy"
        print(f"\nbatch {batch}, {args.max_tokens} tokens each, {mode}, best of {args.repeats}, {args.threads} threads")
        print("| config | tok/s | speedup | mean acceptance length | acceptance rate | drafts | proposal cost |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, llm in llms.items():
            if not args.temperature:
                assert outputs[name] == outputs[base], f"{name}: greedy output differs from no speculation"
            drafts, drafted, accepted = (a - b for a, b in zip(counters(llm), before[name], strict=True))
            mal = f"{1 + accepted / drafts:.2f}" if drafts else "-"
            rate = f"{accepted / drafted:.2f}" if drafted else "-"
            tps = batch * args.max_tokens / best[name]
            # The policy's running measurement of one proposed position relative to a target step.
            policy = llm.llm_engine.spec_policy
            cost = f"{policy.draft_cost:.3f}" if policy and drafts else "-"
            print(f"| {name} | {tps:.0f} | {best[base] / best[name]:.2f}x | {mal} | {rate} | {drafts} | {cost} |")


if __name__ == "__main__":
    main()
