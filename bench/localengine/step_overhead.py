"""Where a decode step's time goes: model compute vs the Python around it, before and after.

Each decode step is timed at four points: the whole `LLMEngine.step()`, the scheduler's
`schedule()`, the model runner's `execute()` and the model itself (`model.forward` +
`compute_logits`: the layers' work, their own per-op dispatch included). Per step:
- inputs+sampling = execute - model: the flat batch, attention metadata, sampling, verification;
- post = step - execute - schedule: appending tokens, detokenization, stop checks, block
  bookkeeping, outputs, metrics;
- non-model = step - model, and its share of the step (the "Python overhead" of a step).
Only decode steps are timed: B requests are prefilled first, then --steps steps run with every
request decoding (ignore_eos, so the batch stays B throughout).

Each code tree runs in a child process of its own: this checkout, and the baseline (`--baseline
REF`, default `main`, its localengine/ extracted with `git archive`), so the ratios compare two
versions measured in the same run on the same machine. Both trees run at the same time (so other
jobs on a shared machine load both alike), --rounds times, and each keeps its round with the
smallest median non-model time. Greedy outputs of both are checked
equal. CPU, fp32, one torch thread. Times are the engine thread's CPU time (`time.thread_time`:
with one torch thread all of a step's work runs on it), so waiting for a core while other jobs run
is not counted; contention still inflates CPU time (caches), hence medians of per-step values and
the best round. The wall-clock median step is printed beside them.

    nice -n 10 .venv/bin/python bench/localengine/step_overhead.py --baseline d5e7cfb  # vs the engine before issue 19 item 5
    .venv/bin/python bench/localengine/step_overhead.py --models demo --batch 1 --steps 100
    .venv/bin/python bench/localengine/step_overhead.py --baseline none             # this checkout only
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
COLUMNS = ("step", "model", "schedule", "inputs+sampling", "post", "non-model")


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
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.current[name] = self.current.get(name, 0.0) + time.thread_time() - start
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
    # the instances' methods wrapped in timers (setattr: an instance attribute shadows the method)
    for owner, name, timer in ((engine.scheduler, "schedule", "schedule"), (runner, "execute", "execute"),
                               (runner.model, "forward", "model"), (runner.model, "compute_logits", "model")):
        setattr(owner, name, timers.wrap(timer, getattr(owner, name)))
    vocab = runner.model.args.vocab_size
    kind: dict[str, Any] = {}
    if args.output_kind == "final":
        try:  # what LLM.generate asks for; a baseline without it builds an output every step, as its generate did
            from localengine.sampling_params import RequestOutputKind
            kind = {"output_kind": RequestOutputKind.FINAL_ONLY}
        except ImportError:
            pass
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.warmup + args.steps + 1,
                            ignore_eos=True, seed=None, **kind)
    prompts = [[(13 * i + 7 * j) % (vocab - 1) + 1 for j in range(args.prompt_len)] for i in range(args.batch)]
    ids = []
    for i, prompt in enumerate(prompts):
        rid = f"r{i}"
        engine.add_request(rid, prompt, params)
        ids.append(rid)
    outputs: dict[str, list[int]] = {}
    step = 0
    running = engine.scheduler.running
    while engine.has_unfinished_requests():
        decoding = len(running) == args.batch and all(s.num_computed_tokens == s.num_tokens - 1 for s in running)
        timers.current = {}
        start, wall = time.thread_time(), time.perf_counter()
        outs = engine.step()
        timers.current["step"] = time.thread_time() - start
        timers.current["wall"] = time.perf_counter() - wall
        if decoding:
            step += 1
            if args.warmup < step <= args.warmup + args.steps:
                timers.steps.append(dict(timers.current))
        for out in outs:
            if out.finished:
                outputs[out.request_id] = list(out.outputs[0].token_ids)
    per_step = [{
        "step": t["step"], "model": t["model"], "schedule": t["schedule"],
        "inputs+sampling": t["execute"] - t["model"], "post": t["step"] - t["execute"] - t["schedule"],
        "non-model": t["step"] - t["model"], "wall": t["wall"],
    } for t in timers.steps]
    medians = {c: statistics.median(s[c] for s in per_step) * 1e3 for c in (*COLUMNS, "wall")}
    share = statistics.median(s["non-model"] / s["step"] for s in per_step)
    print(json.dumps({"median_ms": medians, "overhead_share": share, "steps": len(timers.steps),
                      "tokens": [outputs[r] for r in ids]}))


def start_tree(tree: Path, model: str, batch: int, args: argparse.Namespace) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--model", model, "--batch", str(batch),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--prompt-len", str(args.prompt_len),
           "--temperature", str(args.temperature), "--top-p", str(args.top_p), "--output-kind", args.output_kind]
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    return subprocess.Popen(cmd, env=env, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(child: subprocess.Popen[str], tree: Path) -> dict[str, Any]:
    out, err = child.communicate()
    if child.returncode:
        raise SystemExit(f"child failed in {tree}:\n{err[-3000:]}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


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
    ap.add_argument("--rounds", type=int, default=3, help="runs per tree (both trees at once); the fastest is kept")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--output-kind", choices=("final", "cumulative"), default="final",
                    help="final: outputs only at the end, as LLM.generate; cumulative: every step, as the server")
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
              f"temperature {args.temperature}, top_p {args.top_p}, outputs {args.output_kind}; medians of CPU ms (wall: wall-clock ms)")
        header = (f"{'model':6} {'batch':>5} {'code':18} " + " ".join(f"{c:>15}" for c in COLUMNS)
                  + f" {'share':>7} {'wall':>8}")
        print(header)
        for model in args.models:
            for batch in args.batch:
                results: dict[str, dict[str, Any]] = {}
                for _ in range(args.rounds):
                    # Both trees at once: whatever else loads the machine loads both alike.
                    procs = {name: start_tree(tree, paths[model], batch, args) for name, tree in trees.items()}
                    for name, proc in procs.items():
                        r = finish(proc, trees[name])
                        if name not in results or r["median_ms"]["non-model"] < results[name]["median_ms"]["non-model"]:
                            results[name] = r
                for name, r in results.items():
                    m = r["median_ms"]
                    print(f"{model:6} {batch:5} {name:18} " + " ".join(f"{m[c]:15.3f}" for c in COLUMNS)
                          + f" {r['overhead_share']:7.1%} {m['wall']:8.3f}")
                if len(results) == 2:
                    base, this = results.values()
                    same = "identical" if base["tokens"] == this["tokens"] else "DIFFERENT"
                    if args.temperature > 0:
                        same = "sampled (not compared)"
                    ratios = ", ".join(f"{c} {this['median_ms'][c] / base['median_ms'][c]:.2f}x"
                                       for c in ("non-model", "inputs+sampling", "post", "step"))
                    print(f"{'':6} {'':5} {'this / baseline':18} {ratios}; greedy tokens {same}")


if __name__ == "__main__":
    main()
