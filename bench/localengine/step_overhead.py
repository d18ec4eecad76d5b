"""Where a decode step's time goes: model compute vs the Python around it, before and after.

A step is timed at five points: the whole `LLMEngine.step()`, the scheduler's `schedule()`, the
model runner's `execute()`, the model itself (`model.forward` + `compute_logits`: the layers'
work, their own dispatch included) and the sampler. Overhead = step - model: scheduling, block
bookkeeping, input preparation, attention metadata, sampling, detokenization, stop checks,
outputs and metrics. Only decode steps are timed: B requests are prefilled first, then --steps
steps run with every request decoding (ignore_eos, so the batch stays B throughout).

Each code tree runs in a child process of its own: this checkout, and the baseline (`--baseline
REF`, default `main`, extracted with `git archive` into a temp directory), so the ratios compare
two versions measured in the same run on the same machine. The trees take turns, --rounds times,
and each keeps its fastest round (others' load on a shared machine only ever slows a round down).
Greedy outputs of both are checked equal. CPU, fp32, one torch thread; numbers are medians over
the timed steps of the kept round.

    nice -n 10 .venv/bin/python bench/localengine/step_overhead.py                  # demo + random Llama, batch 1/16
    .venv/bin/python bench/localengine/step_overhead.py --models demo --batch 1 --steps 100
    .venv/bin/python bench/localengine/step_overhead.py --temperature 0.8 --top-p 0.9   # sampled rows
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PARTS = ("step", "schedule", "execute", "model", "sampler")


def build_random_llama(out: Path, hidden: int, layers: int, vocab: int) -> None:
    """A random Llama (fp32 safetensors) with a word-level tokenizer covering every id."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                         num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 128,
                         max_position_embeddings=2048, tie_word_embeddings=False, eos_token_id=None, bos_token_id=None)
    LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0").save_pretrained(out)


class Timers:
    def __init__(self) -> None:
        self.current: dict[str, float] = {}
        self.steps: list[dict[str, float]] = []

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.current[name] = self.current.get(name, 0.0) + time.perf_counter() - start
        return timed


def child(args: argparse.Namespace) -> None:
    import torch

    from localengine import LLM, SamplingParams

    torch.set_num_threads(1)
    llm = LLM(args.model, dtype="float32", num_threads=1, max_model_len=1024, max_num_seqs=max(args.batch, 16),
              enable_prefix_caching=True, seed=0)
    engine = llm.llm_engine
    runner = engine.model_runner
    timers = Timers()
    engine.scheduler.schedule = timers.wrap("schedule", engine.scheduler.schedule)
    runner.execute = timers.wrap("execute", runner.execute)
    runner.model.forward = timers.wrap("model", runner.model.forward)
    runner.model.compute_logits = timers.wrap("model", runner.model.compute_logits)
    sampler = runner.sampler
    runner.sampler = timers.wrap("sampler", sampler)  # called as self.sampler(logits, ...)
    vocab = runner.model.args.vocab_size
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.warmup + args.steps,
                            ignore_eos=True, seed=None)
    prompts = [[(13 * i + 7 * j) % (vocab - 1) + 1 for j in range(args.prompt_len)] for i in range(args.batch)]
    ids = []
    for i, prompt in enumerate(prompts):
        rid = f"r{i}"
        engine.add_request(rid, prompt, params)
        ids.append(rid)
    outputs: dict[str, list[int]] = {}
    step = 0
    while engine.has_unfinished_requests():
        timers.current = {}
        start = time.perf_counter()
        outs = engine.step()
        timers.current["step"] = time.perf_counter() - start
        decoding = all(s.num_computed_tokens == s.num_tokens - 1 for s in engine.scheduler.running)
        if outs and len(outs) == args.batch and decoding:
            step += 1
            if args.warmup < step <= args.warmup + args.steps:
                timers.steps.append(dict(timers.current))
        for out in outs:
            if out.finished:
                outputs[out.request_id] = list(out.outputs[0].token_ids)
    medians = {p: statistics.median(s.get(p, 0.0) for s in timers.steps) * 1e3 for p in PARTS}
    means = {p: statistics.fmean(s.get(p, 0.0) for s in timers.steps) * 1e3 for p in PARTS}
    share = statistics.median(1 - s.get("model", 0.0) / s["step"] for s in timers.steps)
    print(json.dumps({"median_ms": medians, "mean_ms": means, "overhead_share": share, "steps": len(timers.steps),
                      "tokens": [outputs[r] for r in ids]}))


def run_tree(tree: Path, model: str, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--model", model, "--batch", str(batch),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--prompt-len", str(args.prompt_len),
           "--temperature", str(args.temperature), "--top-p", str(args.top_p)]
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"child failed in {tree}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def extract(ref: str, into: Path) -> Path:
    """The baseline's localengine/ (what is measured), from git, beside nothing else."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "localengine"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["demo", "llama"],
                    help="'demo' (the bundled 1.8M model) and/or 'llama' (random 4-layer, hidden 256, vocab 32000)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--steps", type=int, default=200, help="decode steps timed per run")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3, help="turns per tree; the fastest is kept")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--baseline", default="main", help="git ref measured beside this checkout ('none': skip)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.batch = args.batch[0]
        child(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        paths = {"demo": "demo"}
        if "llama" in args.models:
            paths["llama"] = str(Path(tmp) / "llama")
            build_random_llama(Path(paths["llama"]), hidden=256, layers=4, vocab=32000)
        trees = {"this": REPO}
        if args.baseline != "none":
            trees = {f"baseline ({args.baseline})": extract(args.baseline, Path(tmp) / "baseline"), "this": REPO}
        print(f"decode steps: {args.steps} timed after {args.warmup} warm-up, prompts of {args.prompt_len} tokens, "
              f"temperature {args.temperature}, top_p {args.top_p}; medians in ms")
        header = f"{'model':6} {'batch':>5} {'code':22} " + " ".join(f"{p:>9}" for p in PARTS) + f" {'overhead':>9}"
        print(header)
        for model in args.models:
            for batch in args.batch:
                results: dict[str, dict[str, Any]] = {}
                for _ in range(args.rounds):
                    for name, tree in trees.items():
                        r = run_tree(tree, paths[model], batch, args)
                        if name not in results or r["median_ms"]["step"] < results[name]["median_ms"]["step"]:
                            results[name] = r
                for name, r in results.items():
                    m = r["median_ms"]
                    print(f"{model:6} {batch:5} {name:22} " + " ".join(f"{m[p]:9.3f}" for p in PARTS)
                          + f" {r['overhead_share']:9.1%}")
                if len(results) == 2:
                    base, this = results.values()
                    same = "identical" if base["tokens"] == this["tokens"] else "DIFFERENT"
                    if args.temperature > 0:
                        same = "sampled (not compared)"
                    ratio = this["median_ms"]["step"] / base["median_ms"]["step"]
                    over = ((this["median_ms"]["step"] - this["median_ms"]["model"])
                            / max(base["median_ms"]["step"] - base["median_ms"]["model"], 1e-9))
                    print(f"{'':6} {'':5} {'this / baseline':22} step time {ratio:.2f}x, "
                          f"non-model time {over:.2f}x; tokens {same}")


if __name__ == "__main__":
    main()
