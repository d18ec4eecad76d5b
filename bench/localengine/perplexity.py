"""Quality of quantized weights on the bundled real model (smollm2-135m-instruct, whose only published
form here is a Q4_1 GGUF): perplexity over a fixed text, and the greedy answer to "What is the
capital of France?", for each weight format.

The reference is the file dequantized to fp32 (`quantization="none"`): int8 and int4 requantize
those values, "gguf" runs the file's own blocks (Q4_1 linears as int4 groups of 32, the Q8_0
embedding as int8 rows). Variants marked "head fp32" leave the embedding / LM head unquantized, to
show what that part costs. A scored window is a prefill, which runs quantized layers as dequantized
GEMMs (bf16 on CPUs that multiply bf16 in hardware, else fp32); variants marked "every row through the decode ops" send every row through the engine's
CPU ops instead (int4 there rounds activations to int8 per 32), which is what decoding runs.

Corpus: bench/localengine/data/perplexity_corpus.txt, 3,575 SmolLM2 tokens of plain English prose
(an explainer, a story, a dialogue, a letter, instructions) written for this repository (same
licence as the repository). Sliding windows of 512 tokens, stride 256 (localengine/perplexity.py).

    python bench/localengine/perplexity.py --threads 2
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from localengine import LLM, SamplingParams
from localengine.kernels import cpu_ops
from localengine.models.llama import LlamaForCausalLM
from localengine.models.loader import QuantizationPlan, quantization_plan, quantize_loaded
from localengine.perplexity import perplexity

MODEL = "smollm2-135m-instruct"
CORPUS = Path(__file__).parent / "data" / "perplexity_corpus.txt"
DEFAULT_MAX_ROWS = cpu_ops.MAX_ROWS
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def build(quantization: str | None, plan: Callable[[LlamaForCausalLM], QuantizationPlan] | None = None) -> LLM:
    """An engine over the model: `quantization` as LLM takes it, or the file dequantized and then
    `plan`'s quantization applied to it (formats the public options do not name)."""
    llm = LLM(MODEL, quantization=quantization, max_model_len=1024, max_num_seqs=2, num_kvcache_blocks=80)
    if plan is not None:
        model = llm.llm_engine.model_runner.model
        quantize_loaded(model, plan(model))
    return llm


def plan(method: str, group_size: int = 32, head: bool = True) -> Callable[[LlamaForCausalLM], QuantizationPlan]:
    """`method` for the linears (and int8 for the embedding / LM head unless not `head`)."""
    def make(model: LlamaForCausalLM) -> QuantizationPlan:
        full = quantization_plan(model, Path(), method, group_size)
        after = full.after if head else tuple((n, m) for n, m in full.after if "embed" not in n and "lm_head" not in n)
        return QuantizationPlan(after=after, group_size=group_size)
    return make


VARIANTS: dict[str, Callable[[], LLM]] = {
    "fp32 (file dequantized)": lambda: build("none"),
    "int8": lambda: build("int8"),
    "int8, head fp32": lambda: build("none", plan("int8", head=False)),
    "int4 g32": lambda: build("int4"),
    "int4 g32, head fp32": lambda: build("none", plan("int4", head=False)),
    "int4 g128 (g64 where 128 does not divide)": lambda: build("none", plan("int4", 128)),
    "gguf (Q4_1 kept)": lambda: build("gguf"),
}
# A scored window is a prefill, which runs quantized layers as dequantized GEMMs (layers/quantization.py); decode rows go
# through the engine's CPU ops instead (int4: activations rounded to int8 per 32). These variants
# send every row through those ops, so the table shows what decoding with them costs.
THROUGH_DECODE_OPS = ("int8", "int4 g32", "gguf (Q4_1 kept)")
DECODE_SUFFIX = ", every row through the decode ops"
VARIANTS.update({name + DECODE_SUFFIX: VARIANTS[name] for name in THROUGH_DECODE_OPS})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="variant names (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    text = CORPUS.read_text()
    reference = None
    print(f"{'variant':44}{'perplexity':>11}{'vs fp32':>9}   answer   [load 1/5/15 min]")
    for name, make in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        start, before = time.perf_counter(), os.getloadavg()
        cpu_ops.MAX_ROWS = 1 << 30 if name.endswith(DECODE_SUFFIX) else DEFAULT_MAX_ROWS
        llm = make()
        ids = llm.get_tokenizer().encode(text)
        result = perplexity(llm, ids)
        answer = llm.chat(QUESTION, SamplingParams(temperature=0, max_tokens=24))[0].outputs[0].text
        reference = reference or result.perplexity
        load = " ".join(f"{x:.1f}" for x in before)
        print(f"{name:44}{result.perplexity:>11.3f}{(result.perplexity / reference - 1) * 100:>+8.2f}%   {answer!r}   "
              f"[{load}; {result.num_scored} tokens, {time.perf_counter() - start:.0f} s]", flush=True)
        del llm


if __name__ == "__main__":
    main()
