"""The engine on a CUDA GPU against Hugging Face `generate` on the same GPU, same random bf16 weights.

The model has SmolLM2-135M-Instruct's shape (30 layers, hidden 576, 9 query / 3 KV heads, MLP 1536,
vocabulary 49,152, tied embeddings) with random weights: the real file does not travel to a GPU
machine that cannot download, and speed does not depend on the weights' values (outputs run to
their length: ignore_eos). Measured, each side warmed up first:

1. Batch-1 decode tokens/s: the engine with decode CUDA graphs, the engine eager
   (`enforce_eager=True`), HF `generate` (its default dynamic cache, no compilation).
2. TTFT of a 500-token prompt (prefill + one token), medians of 5: engine vs HF.
3. Mixed traffic: N requests, prompts U[32, 512], outputs U[16, 256] (throughput.py's workload):
   the engine's continuous batching vs HF static batches of 16 in arrival order.

    python bench/localengine/cuda.py            # needs a CUDA GPU; prints one JSON line at the end
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench.localengine.throughput, from a checkout

import torch

from bench.localengine.throughput import run_engine, ttft, workload

VOCAB = 49152


def build_smollm2_shaped(out: Path, layers: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                         rms_norm_eps=1e-5, tie_word_embeddings=True, eos_token_id=None,
                         bos_token_id=None)
    LlamaForCausalLM(config).bfloat16().save_pretrained(out, safe_serialization=True)
    # A word-level tokenizer covering every id: the benchmark feeds ids, but outputs are detokenized.
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0").save_pretrained(out)


def timed(fn: Callable[[], object]) -> float:
    sync: Callable[[], None] = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def engine_figures(path: Path, args: argparse.Namespace, reqs, prompt500: list[int]) -> dict[str, float]:
    from localengine import LLM, SamplingParams

    figures: dict[str, float] = {}
    decode = SamplingParams(temperature=0, max_tokens=args.decode_tokens, ignore_eos=True)
    for eager in (True, False):
        llm = LLM(str(path), dtype="bfloat16", device=args.device, max_model_len=1024, max_num_seqs=args.requests,
                  enforce_eager=eager, enable_prefix_caching=False, gpu_memory_utilization=0.3)
        llm.generate([[5, 6, 7]], decode)  # warm-up: Triton compiles, graphs replay once
        figures["decode_eager" if eager else "decode_graphs"] = args.decode_tokens / timed(
            functools.partial(llm.generate, [[5, 6, 7]], decode))
        if eager:
            del llm
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
    ttft(llm, prompt500)
    figures["ttft_500_ms"] = 1000 * statistics.median(ttft(llm, prompt500) for _ in range(5))
    run_engine(llm, workload(2, VOCAB, seed=1))
    figures["mixed_s"] = timed(lambda: run_engine(llm, reqs))
    return figures


def hf_figures(path: Path, args: argparse.Namespace, reqs, prompt500: list[int]) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(args.device).eval()
    figures: dict[str, float] = {}
    with torch.inference_mode():
        one = torch.tensor([[5, 6, 7]], device=args.device)
        n = args.decode_tokens

        def decode() -> None:
            model.generate(one, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)

        decode()
        figures["decode"] = n / timed(decode)
        ids = torch.tensor([prompt500], device=args.device)

        def first_token() -> None:
            model.generate(ids, max_new_tokens=1, do_sample=False, pad_token_id=0)

        first_token()
        figures["ttft_500_ms"] = 1000 * statistics.median(timed(first_token) for _ in range(5))

        def mixed() -> None:
            for i in range(0, len(reqs), args.hf_batch):
                group = reqs[i : i + args.hf_batch]
                width = max(len(p) for p, _ in group)
                batch = torch.tensor([[0] * (width - len(p)) + p for p, _ in group], device=args.device)
                mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in group], device=args.device)
                new = max(k for _, k in group)
                model.generate(input_ids=batch, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                               do_sample=False, pad_token_id=0)

        figures["mixed_s"] = timed(mixed)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--hf-batch", type=int, default=16)
    parser.add_argument("--decode-tokens", type=int, default=256)
    parser.add_argument("--layers", type=int, default=30, help="fewer for a quick check of the script itself")
    parser.add_argument("--device", default="cuda", help="cpu: a check of the script itself, not a figure")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA GPU here: this benchmark measures the engine on one")
    reqs = workload(args.requests, VOCAB)
    out_tokens = sum(n for _, n in reqs)
    prompt500 = [(17 * i) % (VOCAB - 1) + 1 for i in range(500)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        build_smollm2_shaped(path, args.layers)
        ours = engine_figures(path, args, reqs, prompt500)
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
        theirs = hf_figures(path, args, reqs, prompt500)
    result = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device, "torch": torch.__version__,
        "decode_tok_s": {"engine_graphs": ours["decode_graphs"], "engine_eager": ours["decode_eager"],
                         "hf": theirs["decode"]},
        "ttft_500_ms": {"engine": ours["ttft_500_ms"], "hf": theirs["ttft_500_ms"]},
        "mixed_out_tok_s": {"engine": out_tokens / ours["mixed_s"], "hf": out_tokens / theirs["mixed_s"]},
    }
    result["ratios"] = {
        "decode_graphs_vs_hf": ours["decode_graphs"] / theirs["decode"],
        "decode_graphs_vs_eager": ours["decode_graphs"] / ours["decode_eager"],
        "ttft_hf_over_engine": theirs["ttft_500_ms"] / ours["ttft_500_ms"],
        "mixed_engine_vs_hf": theirs["mixed_s"] / ours["mixed_s"],
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
