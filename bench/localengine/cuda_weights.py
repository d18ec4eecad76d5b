"""Weight formats on a CUDA GPU: bf16, int8 and int4 (the engine's Triton kernels,
kernels/triton_quantized.py; PyTorch's `_weight_int8pack_mm` for comparison), same random weights, same
engine settings.

1. The matmul alone, x [M, K] @ W^T for one 4096 x 4096 weight (`triton.testing.do_bench`, median
   ms): M = 1 and 16 (decode), 512 (a prefill chunk); bytes of W read per call over the time gives
   the bandwidth a decode row reaches.
2. The engine on a Llama of ~0.6B parameters (hidden 2048, MLP 5632, 12 layers, 16 / 4 heads,
   vocabulary 32,000; random bf16 weights, outputs run to their length), decode CUDA graphs on:
   batch-1 decode tokens/s over 128 tokens, batch-16 decode output tokens/s, TTFT of a 512-token
   prompt (median of 5).

    python bench/localengine/cuda_weights.py          # needs a CUDA GPU; prints one JSON object
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

FORMATS = ("bf16", "int8", "int4")


def matmul_figures() -> dict[str, dict[str, float]]:
    import triton.testing

    from localengine.kernels.triton_quantized import int4_matmul, int8_matmul
    from localengine.layers.quantization import Int4BlockWeight, Int4Values, Int8Weight

    torch.manual_seed(0)
    w = torch.randn(4096, 4096, device="cuda") * 0.02
    int8 = Int8Weight.from_float(w)
    int4 = Int4BlockWeight.from_values(Int4Values.from_float(w, 32))
    wb = w.bfloat16()
    nbytes = {"bf16": wb.numel() * 2, "int8": int8.qweight.numel(), "int8_pytorch": int8.qweight.numel(),
              "int4": int4.packed.numel()}
    out: dict[str, dict[str, float]] = {}
    for rows in (1, 16, 512):
        x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
        calls = {
            "bf16": lambda x=x: torch.nn.functional.linear(x, wb),
            "int8": lambda x=x: int8_matmul(x, int8.qweight, int8.scales_f32),
            "int8_pytorch": lambda x=x: torch._weight_int8pack_mm(x, int8.qweight, int8.scales),
            "int4": lambda x=x: int4_matmul(x, int4.packed, int4.scale, int4.offset, 32),
        }
        for name, call in calls.items():
            ms = triton.testing.do_bench(call, warmup=25, rep=100)
            out.setdefault(f"rows_{rows}", {})[f"{name}_us"] = ms * 1000
            if rows == 1:
                out["rows_1"][f"{name}_GBps"] = nbytes[name] / (ms / 1000) / 1e9
    return out


def sweep_figures() -> dict[str, object]:
    """The int4 decode kernel's output tile and pipeline stages, us; the best (least summed over the
    shapes and row counts) is set for the rest of the run."""
    import triton.testing

    from localengine.kernels import triton_quantized
    from localengine.layers.quantization import Int4BlockWeight, Int4Values

    times: dict[tuple[int, int], list[float]] = {}
    out: dict[str, object] = {}
    for n, k in ((4096, 4096), (3072, 576), (576, 1536)):
        w = Int4BlockWeight.from_values(Int4Values.from_float(torch.randn(n, k, device="cuda"), 32))
        for rows in (1, 16):
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            for stages in (1, 3):
                triton_quantized.NUM_STAGES = stages
                for block_n in (32, 64, 128):
                    def call(x=x, w=w, b=block_n) -> None:
                        triton_quantized.int4_matmul(x, w.packed, w.scale, w.offset, 32, block_n=b)
                    try:
                        us = 1000 * triton.testing.do_bench(call, warmup=10, rep=30)
                    except triton.runtime.errors.OutOfResources:
                        us = float("inf")
                    times.setdefault((stages, block_n), []).append(us)
                    out[f"{n}x{k} rows {rows} stages {stages} block_n {block_n}"] = us
    stages, block_n = min(times, key=lambda key: sum(times[key]))
    triton_quantized.NUM_STAGES, triton_quantized.BLOCK_N = stages, block_n
    out["best"] = {"num_stages": stages, "block_n": block_n, "summed_us": sum(times[stages, block_n])}
    return out


def build(out: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=12,
                         num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048,
                         tie_word_embeddings=False, eos_token_id=None, bos_token_id=None)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).bfloat16()
    model.save_pretrained(out, safe_serialization=True)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(32000)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0").save_pretrained(out)


def timed(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def engine_figures(path: Path, fmt: str) -> dict[str, float]:
    from localengine import LLM, SamplingParams

    llm = LLM(str(path), dtype="bfloat16", quantization=None if fmt == "bf16" else fmt, device="cuda",
              max_model_len=1024, max_num_seqs=16, enable_prefix_caching=False, gpu_memory_utilization=0.3)
    decode = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    llm.generate([[5, 6, 7]], decode)  # warm-up: Triton compiles
    batch = [[(7 * i + j) % 31999 + 1 for j in range(32)] for i in range(16)]
    prompt = [[(17 * i) % 31999 + 1 for i in range(512)]]
    first = SamplingParams(temperature=0, max_tokens=1)
    llm.generate(batch, decode)
    figures = {
        "decode_b1_tok_s": 128 / timed(lambda: llm.generate([[5, 6, 7]], decode)),
        "decode_b16_tok_s": 16 * 128 / timed(lambda: llm.generate(batch, decode)),
        "ttft_512_ms": 1000 * statistics.median(timed(lambda: llm.generate(prompt, first)) for _ in range(5)),
    }
    return figures  # the engine goes with this frame; the caller collects it before the next format


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    parser.add_argument("--sweep", action="store_true",
                        help="first time the int4 kernel's tile choices, and measure with the best")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU here: this benchmark measures weight formats on one")
    result: dict[str, object] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    if args.sweep:
        result["sweep"] = sweep_figures()
    result["matmul_4096x4096"] = matmul_figures()
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp))
        engines = {}
        for fmt in args.formats:
            engines[fmt] = engine_figures(Path(tmp), fmt)
            gc.collect()
            torch.cuda.empty_cache()
        result["engine_0.6b"] = engines
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
