"""Speculative decoding: tokens/s with and without, acceptance and copying measured.

`--model demo` (default): target `demo` (1.8M params); proposers: n-gram lookup, the draft model
`demo-draft` (0.16M, same tokenizer), and the MLP speculator `demo-speculator` (drafts from the
target's hidden states); 8 code prompts cycled, ignore_eos. The demo model does not copy its prompt
(given a code block twice and its first line a third time it writes something else); what n-gram
lookup finds is its greedy output repeating itself, so the batch-1 case is the prompt whose
continuation repeats most ("def main(").

`--model smollm2-135m-instruct`: the bundled real model at batch 1 on input-grounded chat prompts
(rename a variable in a function, quote a paragraph) and one open question; n-gram lookup, and with
`--speculator NAME|DIR` an MLP speculator for it, alone and with lookup (`prompt_lookup`): its name
`smollm2-135m-instruct-speculator` once built (`slipstream engine build-speculator`: this benchmark
does not train one, and leaves those rows out while it is not built), or a checkpoint directory
written by `python -m localengine.demo.train_speculator --target smollm2-135m-instruct ...`
(docs/localengine.md); answers end at the end-of-turn token.

Greedy, fp32 on CPU. Each configuration must produce the same tokens as no speculation (checked);
the difference is how many target passes it takes. "copied" is the share of the baseline's output
tokens that a one-token n-gram lookup over everything before them predicts: the proof that the
case copies at all. Every configuration runs once as a warm-up, then --repeats rounds, each running
every configuration once; a speedup is the median over rounds of that round's ratio to no
speculation (a demo run takes ~0.1 s, and this machine's speed moves by a quarter between such
moments: best-of runs taken at different moments gave 1.35x and 2.11x for the same code), in
wall-clock and in CPU time of this process (steadier on a loaded machine with --threads 1); tok/s
is the median run's. Acceptance columns cover the timed
runs; the proposal cost is the adaptive policy's measurement of one proposed position relative to
a target step.

    python bench/localengine/spec_decode.py                       # demo, batch 1, 4 and 8, 256 tokens
    python bench/localengine/spec_decode.py --batch 1 --max-tokens 128 --threads 1 --only mlp_speculator
    python bench/localengine/spec_decode.py --batch 1 --temperature 0.8 --only mlp ngram   # sampled requests
    python bench/localengine/spec_decode.py --model smollm2-135m-instruct --threads 1 --max-tokens 160
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from localengine import LLM, SamplingParams
from localengine.spec_decode.ngram import propose_ngram

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

FUNCTION = '''def moving_average(values, window):
    """Return the moving averages of values over a sliding window."""
    if window <= 0:
        raise ValueError("window must be positive")
    averages = []
    total = 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        if index >= window - 1:
            averages.append(total / window)
    return averages
'''
PARAGRAPH = ("The lighthouse stood on a rock at the mouth of the bay. Every evening the keeper climbed the "
             "one hundred and twelve steps, trimmed the wick, wound the clockwork that turned the lens, and "
             "wrote the weather in a leather book. Ships passing in the night saw the beam sweep across the "
             "water every ten seconds, and knew where the rocks were.")
# (name, user message): input-grounded edits and quotes, then an open question none of them copies.
# None of them is among the speculator's training prompts (localengine/demo/train_speculator.py).
CHAT_PROMPTS = [
    ("rename", "Rewrite this function with the variable `total` renamed to `running_sum`. "
               "Reply with the code only.\n\n" + FUNCTION),
    ("quote", "Repeat the following paragraph exactly, then add one sentence about the keeper.\n\n" + PARAGRAPH),
    ("open", "Explain how a refrigerator keeps food cold."),
]

DEMO_CONFIGS: list[tuple[str, dict[str, Any] | None]] = [
    ("no speculation", None),
    ("ngram k=4", {"method": "ngram", "num_speculative_tokens": 4, "adaptive": False}),
    ("ngram k=4 adaptive", {"method": "ngram", "num_speculative_tokens": 4}),
    ("ngram k=8 adaptive", {"method": "ngram", "num_speculative_tokens": 8}),
    ("draft k=3", {"method": "draft_model", "model": "demo-draft", "num_speculative_tokens": 3, "adaptive": False}),
    ("draft k=3 adaptive", {"method": "draft_model", "model": "demo-draft", "num_speculative_tokens": 3}),
    ("mlp_speculator k=4", {"method": "mlp_speculator", "model": "demo-speculator", "num_speculative_tokens": 4,
                            "adaptive": False}),
    ("mlp_speculator k=6", {"method": "mlp_speculator", "model": "demo-speculator", "num_speculative_tokens": 6,
                            "adaptive": False}),
    ("mlp_speculator k=6 adaptive", {"method": "mlp_speculator", "model": "demo-speculator",
                                     "num_speculative_tokens": 6}),
]
SMOLLM2_CONFIGS: list[tuple[str, dict[str, Any] | None]] = [
    ("no speculation", None),
    ("ngram k=4 adaptive", {"method": "ngram", "num_speculative_tokens": 4}),
    ("ngram k=8 adaptive", {"method": "ngram", "num_speculative_tokens": 8}),
]


def smollm2_speculator_configs(path: str) -> list[tuple[str, dict[str, Any] | None]]:
    return [("mlp_speculator k=4", {"method": "mlp_speculator", "model": path, "num_speculative_tokens": 4,
                                    "adaptive": False}),
            ("mlp_speculator k=4 adaptive", {"method": "mlp_speculator", "model": path, "num_speculative_tokens": 4}),
            ("mlp_speculator+lookup k=4 adaptive", {"method": "mlp_speculator", "model": path,
                                                    "num_speculative_tokens": 4, "prompt_lookup": True})]


@dataclass(slots=True)
class Timing:
    walls: list[float] = field(default_factory=list)  # one per round
    cpus: list[float] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)


def counters(llm: LLM) -> tuple[int, int, int]:
    stats = llm.llm_engine.spec_decode_stats()
    return (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) if stats else (0, 0, 0)


def copied(prompts: list[list[int]], outputs: list[list[int]]) -> float:
    """Share of output tokens a one-token n-gram lookup (2..4) over the context before them predicts."""
    hits = total = 0
    for prompt, out in zip(prompts, outputs, strict=True):
        context = list(prompt)
        for token in out:
            hits += propose_ngram(context, 2, 4, 1) == [token]
            context.append(token)
        total += len(out)
    return hits / max(total, 1)


def run_case(title: str, llms: dict[str, LLM], prompt_ids: list[list[int]], params: SamplingParams,
             repeats: int, sequential: bool, check_equal: bool) -> None:
    """`sequential`: one prompt at a time (batch 1 over several prompts), else all at once."""
    def generate(llm: LLM) -> list[list[int]]:
        batches = [[p] for p in prompt_ids] if sequential else [prompt_ids]
        return [o.outputs[0].token_ids for batch in batches for o in llm.generate(batch, params)]

    for llm in llms.values():
        generate(llm)  # warm-up; adaptive policies also measure their costs here
    runs = {name: Timing() for name in llms}
    before = {name: counters(llm) for name, llm in llms.items()}
    load_before = os.getloadavg()[0]
    # Round-robin, so a burst of load on the shared machine hits every configuration alike.
    for _ in range(repeats):
        for name, llm in llms.items():
            llm.reset_prefix_cache()
            wall, cpu = time.perf_counter(), time.process_time()
            outputs = generate(llm)
            t = runs[name]
            t.walls.append(time.perf_counter() - wall)
            t.cpus.append(time.process_time() - cpu)
            t.outputs = outputs
    base = next(iter(llms))

    def speedup(name: str, times: Callable[[Timing], list[float]]) -> float:
        return statistics.median(b / c for b, c in zip(times(runs[base]), times(runs[name]), strict=True))

    num_tokens = sum(len(o) for o in runs[base].outputs)
    print(f"\n{title}: {num_tokens} output tokens, {copied(prompt_ids, runs[base].outputs):.0%} copied; "
          f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}")
    print("| config | tok/s | speedup | speedup, CPU time | mean acceptance length | acceptance rate | drafts "
          "| proposal cost |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, llm in llms.items():
        t = runs[name]
        if check_equal:
            assert t.outputs == runs[base].outputs, f"{name}: greedy output differs from no speculation"
        drafts, drafted, accepted = (a - b for a, b in zip(counters(llm), before[name], strict=True))
        mal = f"{1 + accepted / drafts:.2f}" if drafts else "-"
        rate = f"{accepted / drafted:.2f}" if drafted else "-"
        # The policy's running measurement of one proposed position relative to a target step.
        policy = llm.llm_engine.spec_policy
        cost = f"{policy.draft_cost:.3f}" if policy and drafts else "-"
        print(f"| {name} | {num_tokens / statistics.median(t.walls):.1f} | {speedup(name, lambda r: r.walls):.2f}x "
              f"| {speedup(name, lambda r: r.cpus):.2f}x "
              f"| {mal} | {rate} | {drafts} | {cost} |")


def selected(configs: list[tuple[str, dict[str, Any] | None]], only: list[str]) -> list[tuple[str, dict[str, Any] | None]]:
    return [(name, spec) for name, spec in configs if spec is None or not only or any(word in name for word in only)]


def demo(args: argparse.Namespace) -> None:
    params = SamplingParams(temperature=args.temperature, top_k=50 if args.temperature else 0,
                            max_tokens=args.max_tokens, ignore_eos=True)
    llms = {name: LLM("demo", speculative_config=spec, num_threads=args.threads)
            for name, spec in selected(DEMO_CONFIGS, args.only)}
    tokenizer = next(iter(llms.values())).get_tokenizer()
    mode = f"temperature {args.temperature}, top-k 50" if args.temperature else "greedy"
    for batch in args.batch:
        prompt_ids = [tokenizer.encode(PROMPTS[i % len(PROMPTS)]) for i in range(batch)]
        title = (f"demo, batch {batch}, {args.max_tokens} tokens each, {mode}, median of {args.repeats} rounds, "
                 f"{args.threads} threads")
        run_case(title, llms, prompt_ids, params, args.repeats, sequential=False, check_equal=not args.temperature)


def smollm2(args: argparse.Namespace) -> None:
    from localengine.spec_decode.built import BUILT_SPECULATORS, is_built, speculator_dir

    speculator = args.speculator
    if speculator in BUILT_SPECULATORS and not is_built(speculator_dir(speculator)):
        print(f"{speculator} is not built here (`slipstream engine build-speculator {speculator}`): its rows are left out")
        speculator = None
    speculators = smollm2_speculator_configs(speculator) if speculator else []
    configs = selected(SMOLLM2_CONFIGS + speculators, args.only)
    common = {"dtype": "float32", "max_model_len": 1024, "max_num_seqs": 4, "num_kvcache_blocks": 80,
              "num_threads": args.threads}
    llms = {name: LLM(args.model, speculative_config=spec, **common) for name, spec in configs}
    tokenizer = next(iter(llms.values())).get_tokenizer()
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    for name, message in CHAT_PROMPTS:
        text = tokenizer.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True,
                                             tokenize=False)
        prompt_ids = [tokenizer.encode(text, add_special_tokens=False)]
        title = (f"{args.model}, batch 1, prompt {name!r}, greedy, up to {args.max_tokens} tokens, "
                 f"median of {args.repeats} rounds, {args.threads} threads")
        run_case(title, llms, prompt_ids, params, args.repeats, sequential=True, check_equal=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo", choices=["demo", "smollm2-135m-instruct"])
    ap.add_argument("--speculator", metavar="NAME|DIR",
                    help="smollm2: its MLP speculator: smollm2-135m-instruct-speculator once built, or a checkpoint")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8], help="demo: requests per run (prompts cycle)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="demo, > 0: sampled requests (top-k 50); outputs then differ by design and are not compared")
    ap.add_argument("--only", nargs="+", default=[], metavar="WORD",
                    help="run only the configurations whose name contains one of these (no speculation always runs)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    (demo if args.model == "demo" else smollm2)(args)


if __name__ == "__main__":
    main()
