"""Local engine vs Hugging Face `generate` on CPU, both on the same random-initialised weights.

1. Mixed workload: N requests, prompts U[32, 512] tokens, outputs U[16, 256] tokens (ignore_eos),
   greedy. Baseline: HF `generate` with static batches of --hf-batch requests in arrival order
   (left padding; each batch runs to its longest output). Throughput counts requested output tokens
   over wall time, prefill included, for both sides.
2. Shared prefix: TTFT of a request whose 1,000-token prefix is cold vs already in the prefix cache.

    python bench/localengine/throughput.py                 # 56M Llama (hidden 512, 8 layers)
    python bench/localengine/throughput.py --layers 4 --requests 32   # quicker
    python bench/localengine/throughput.py --model smollm2-135m-instruct --requests 32   # the bundled real model

With --model (a bundled name, a GGUF file or a Hugging Face directory) both sides run that model's
weights in fp32 (a GGUF dequantized: transformers reads it with `gguf_file=`), prompts are random
ids from its vocabulary, and the shared-prefix part is skipped.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch


def build_model(out: Path, hidden: int, layers: int, vocab: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                         num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64,
                         max_position_embeddings=2048, tie_word_embeddings=False, eos_token_id=None, bos_token_id=None)
    model = LlamaForCausalLM(config)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, hidden {hidden}, {layers} layers, "
          f"vocab {vocab}")
    model.save_pretrained(out, safe_serialization=True)
    # A word-level tokenizer covering every id: the benchmark feeds token ids, but outputs are detokenized.
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0").save_pretrained(out)


def workload(n: int, vocab: int, seed: int = 0) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(1, vocab) for _ in range(rng.randint(32, 512))], rng.randint(16, 256)) for _ in range(n)]


def run_hf(path: Path, reqs: list[tuple[list[int], int]], batch: int) -> float:
    from transformers import AutoModelForCausalLM

    if path.suffix == ".gguf":
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(reqs), batch):
            group = reqs[i : i + batch]
            width = max(len(p) for p, _ in group)
            ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in group])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in group])
            new = max(n for _, n in group)
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, pad_token_id=0)
    return time.perf_counter() - start


def run_engine(llm, reqs: list[tuple[list[int], int]]) -> float:
    from localengine import SamplingParams

    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in reqs]
    start = time.perf_counter()
    outs = llm.generate([p for p, _ in reqs], params)
    elapsed = time.perf_counter() - start
    assert [len(o.outputs[0].token_ids) for o in outs] == [n for _, n in reqs]
    return elapsed


def ttft(llm, prompt: list[int]) -> float:
    from localengine import SamplingParams

    engine = llm.llm_engine
    start = time.perf_counter()
    engine.add_request(f"ttft-{start}", prompt, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    while not any(o.outputs[0].token_ids for o in engine.step()):
        pass
    return time.perf_counter() - start


def throughput(path: Path, args: argparse.Namespace, model: str | None = None) -> None:
    """`model`: what the engine loads (a bundled name) when it is not `path` itself."""
    from localengine import LLM

    llm = LLM(model or str(path), dtype="float32", quantization="none", max_model_len=1536, max_num_seqs=args.requests,
              max_num_batched_tokens=1024, enable_prefix_caching=False)
    vocab = len(llm.get_tokenizer()) if model else args.vocab
    reqs = workload(args.requests, vocab)
    out_tokens = sum(n for _, n in reqs)
    print(f"workload: {len(reqs)} requests, {sum(len(p) for p, _ in reqs)} prompt tokens, {out_tokens} output tokens")
    run_engine(llm, workload(2, vocab, seed=1))  # warm-up
    t_engine = run_engine(llm, reqs)
    print(f"localengine: {t_engine:7.1f} s  {out_tokens / t_engine:7.1f} output tok/s")
    if not args.skip_hf:
        t_hf = run_hf(path, reqs, args.hf_batch)
        print(f"HF generate (static batch {args.hf_batch}): {t_hf:7.1f} s  {out_tokens / t_hf:7.1f} output tok/s")
        print(f"throughput ratio localengine / HF: {t_hf / t_engine:.2f}x")


def prefix_ttft(path: Path, args: argparse.Namespace) -> None:
    from localengine import LLM

    llm = LLM(str(path), dtype="float32", max_model_len=1536, max_num_seqs=8, max_num_batched_tokens=2048)
    rng = random.Random(2)
    prefix = [rng.randrange(1, args.vocab) for _ in range(1000)]
    cold, warm = [], []
    for _ in range(args.ttft_runs):
        llm.llm_engine.block_manager.reset_prefix_cache()
        cold.append(ttft(llm, prefix + [rng.randrange(1, args.vocab) for _ in range(16)]))
        warm.append(ttft(llm, prefix + [rng.randrange(1, args.vocab) for _ in range(16)]))
    c, w = sorted(cold)[len(cold) // 2], sorted(warm)[len(warm) // 2]  # medians
    print(f"shared 1000-token prefix TTFT: cold {c * 1000:.0f} ms, warm {w * 1000:.0f} ms, warm/cold = {w / c:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--hf-batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-hf", action="store_true", help="engine side only")
    parser.add_argument("--ttft-only", action="store_true", help="only the shared-prefix TTFT part")
    parser.add_argument("--ttft-runs", type=int, default=5)
    parser.add_argument("--model", help="a bundled name, GGUF file or Hugging Face directory instead of random weights")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.model:
        from localengine.config import packaged_model_path

        path = Path(args.model) if Path(args.model).exists() else packaged_model_path(args.model)
        print(f"model: {args.model} ({path.name}), fp32")
        throughput(path, args, model=args.model)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        build_model(path, args.hidden, args.layers, args.vocab)
        if not args.ttft_only:
            throughput(path, args)
        prefix_ttft(path, args)


if __name__ == "__main__":
    main()
