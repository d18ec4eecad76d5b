"""The bundled real model (smollm2-135m-instruct, SmolLM2-135M-Instruct from its Q4_1 GGUF) at batch 1:
the engine with the file dequantized (fp32, bf16; bf16 weights multiplied in fp32), requantized (int8, int4 weights) and with the
file's own blocks kept (gguf: Q4_1 linears as int4, the Q8_0 embedding as int8), fp32 and gguf again
over an int8 KV cache (kv_cache_dtype="int8"), against Hugging
Face transformers (fp32, the same file dequantized) and llama.cpp on the file as shipped and on an
F16 copy of it (the Q4_1 and Q8_0 blocks dequantized once into the data directory, with the same
metadata: what llama.cpp's own F16 conversion of these weights holds); the llama.cpp rows are skipped
when llama-cpp-python is not installed.

- TTFT: prompts of 500 and 1,000 tokens (--prompt-tokens), one output token, prefix cache off (cold
  prefill), median of --runs for each length.
- Decode: a chat-templated prompt, 128 output tokens (ignore_eos), tokens/s after the first token,
  median of --runs.

    python bench/localengine/smollm2.py --threads 2
    python bench/localengine/smollm2.py --threads 2 --only "engine fp32" "engine int4 weights"
    python bench/localengine/smollm2.py --threads 2 --int8-side-by-side --decode-tokens 64

Prints the machine's load average next to each figure: the numbers mean little on a busy machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench.localengine.llama_cpp_amx, from a checkout

MODEL = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def engine(dtype: str, runs: int, prompts: list[list[int]], chat: list[int], decode_tokens: int,
           quantization: str | None = "none", kv_cache_dtype: str = "auto") -> tuple[list[float], float]:
    from localengine import LLM, SamplingParams

    llm = LLM(MODEL, dtype=dtype, quantization=quantization, kv_cache_dtype=kv_cache_dtype, max_model_len=1024,
              max_num_seqs=4, enable_prefix_caching=False, num_kvcache_blocks=256)
    one = SamplingParams(temperature=0, max_tokens=1)
    many = SamplingParams(temperature=0, max_tokens=decode_tokens, ignore_eos=True)
    llm.generate([prompts[0]], one)  # warm-up: first-call setup is not what is measured
    ttft: list[list[float]] = [[] for _ in prompts]
    rate = []
    for _ in range(runs):
        for times, prompt in zip(ttft, prompts, strict=True):
            start = time.perf_counter()
            llm.generate([prompt], one)
            times.append(time.perf_counter() - start)
        out = llm.generate([chat], many)[0]
        m = out.metrics
        assert m is not None and m.first_token_time is not None and m.last_token_time is not None
        rate.append((len(out.outputs[0].token_ids) - 1) / (m.last_token_time - m.first_token_time))
    return [statistics.median(times) for times in ttft], statistics.median(rate)


def int8_side_by_side(runs: int, chat: list[int], decode_tokens: int) -> None:
    """fp32 then int8 weights on the same engine, seconds apart (the linears quantized in place), so
    both see the same machine: on a shared machine the sequential rows above drift with other jobs."""
    from localengine import LLM, SamplingParams
    from localengine.models.loader import quantization_plan, quantize_loaded

    llm = LLM(MODEL, dtype="float32", quantization="none", max_model_len=1024, max_num_seqs=4, num_kvcache_blocks=64)
    params = SamplingParams(temperature=0, max_tokens=decode_tokens, ignore_eos=True)

    def decode() -> tuple[float, list[int]]:
        rates, tokens = [], []
        for _ in range(runs):
            out = llm.generate([chat], params)[0]
            m = out.metrics
            assert m is not None and m.first_token_time is not None and m.last_token_time is not None
            rates.append((len(out.outputs[0].token_ids) - 1) / (m.last_token_time - m.first_token_time))
            tokens = out.outputs[0].token_ids
        return statistics.median(rates), tokens

    before = load()
    fp32, fp32_tokens = decode()
    model = llm.llm_engine.model_runner.model
    quantize_loaded(model, quantization_plan(model, llm.llm_engine.config.model_path, "int8"))
    int8, int8_tokens = decode()
    same = next((i for i, (a, b) in enumerate(zip(fp32_tokens, int8_tokens, strict=True)) if a != b), len(fp32_tokens))
    print(f"side by side: fp32 {fp32:.1f} tok/s, int8 weights {int8:.1f} tok/s ({int8 / fp32:.2f}x); greedy tokens "
          f"equal for the first {same} of {len(fp32_tokens)}   {before} -> {load()}")


def hf(runs: int, prompts: list[list[int]], chat: list[int], decode_tokens: int) -> tuple[list[float], float]:
    from transformers import AutoModelForCausalLM

    from localengine.config import packaged_model_path

    path = packaged_model_path(MODEL)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()

    def generate(ids: list[int], new: int) -> float:
        x = torch.tensor([ids])
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, pad_token_id=2)
        return time.perf_counter() - start

    generate(prompts[0], 1)
    ttft: list[list[float]] = [[] for _ in prompts]
    rate = []
    for _ in range(runs):
        for times, prompt in zip(ttft, prompts, strict=True):
            times.append(generate(prompt, 1))
        first = generate(chat, 1)
        rate.append((decode_tokens - 1) / (generate(chat, decode_tokens) - first))
    return [statistics.median(times) for times in ttft], statistics.median(rate)


def f16_copy() -> Path:
    """The shipped file with every quantized matrix dequantized to F16 (vectors stay F32, as llama.cpp's
    converter writes them) and its metadata unchanged but the file type; made once, then reused."""
    import gguf
    import numpy as np

    from localengine.config import packaged_model_path
    from sdk.services import default_data_dir

    target = default_data_dir() / f"{MODEL}.F16.gguf"
    if target.exists():
        return target
    reader = gguf.GGUFReader(packaged_model_path(MODEL))
    partial = target.with_suffix(".partial")
    partial.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(partial, arch=str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents()))
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        value = int(gguf.LlamaFileType.MOSTLY_F16) if field.name == gguf.Keys.General.FILE_TYPE else field.contents()
        kind = field.types[0]
        writer.add_key_value(field.name, value, kind, sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        writer.add_tensor(tensor.name, values.astype(np.float16 if values.ndim == 2 else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.rename(target)
    return target


def llama_cpp(runs: int, prompts: list[list[int]], chat: list[int], decode_tokens: int, threads: int,
              path: Path | None = None) -> tuple[list[float], float]:
    """llama.cpp (llama-cpp-python, built from source) on the same file (its Q4_1 blocks as shipped) or
    on `path`, the same threads: prefill of the same prompt token ids, then greedy decode of the chat prompt."""
    from llama_cpp import Llama

    from bench.localengine.llama_cpp_amx import cpu_has_amx, without_extra_buffers
    from localengine.config import packaged_model_path

    if cpu_has_amx():
        without_extra_buffers()
        print("llama.cpp: extra buffer types off (they crash on this AMX CPU: bench/localengine/llama_cpp_amx.py)",
              flush=True)
    llm = Llama(str(path or packaged_model_path(MODEL)), n_ctx=1024, n_batch=512, n_threads=threads, verbose=False)

    def prefill(ids: list[int]) -> float:
        llm.reset()
        start = time.perf_counter()
        llm.eval(ids)
        return time.perf_counter() - start

    prefill(prompts[0])
    ttft: list[list[float]] = [[] for _ in prompts]
    rate = []
    for _ in range(runs):
        for times, prompt in zip(ttft, prompts, strict=True):
            times.append(prefill(prompt))
        prefill(chat)
        start = time.perf_counter()
        for _ in range(decode_tokens - 1):
            llm.eval([llm.sample(temp=0.0)])
        rate.append((decode_tokens - 1) / (time.perf_counter() - start))
    return [statistics.median(times) for times in ttft], statistics.median(rate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[500, 1000], help="TTFT prompt lengths (up to 1,000)")
    parser.add_argument("--int8-side-by-side", action="store_true", help="only fp32 against int8 weights, seconds apart")
    parser.add_argument("--only", nargs="*", help="row names (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from localengine.config import Config
    from localengine.engine.llm_engine import load_tokenizer

    tok = load_tokenizer(Config(MODEL, quantization="none"))
    text = " ".join(f"Line {i}: the lighthouse keeper counted the ships that passed." for i in range(200))
    prompts = [tok.encode(text)[:length] for length in args.prompt_tokens]
    chat = tok.encode(tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False),
                      add_special_tokens=False)
    print(f"smollm2-135m-instruct, batch 1, {args.threads} threads, torch {torch.__version__}, "
          f"TTFT on {' and '.join(str(len(p)) for p in prompts)} prompt tokens, decode of {args.decode_tokens} tokens")
    if args.int8_side_by_side:
        int8_side_by_side(args.runs, chat, args.decode_tokens)
        return
    rows: dict[str, Callable[[], tuple[list[float], float]]] = {
        "engine fp32": lambda: engine("float32", args.runs, prompts, chat, args.decode_tokens),
        "engine bf16": lambda: engine("bfloat16", args.runs, prompts, chat, args.decode_tokens),
        "engine bf16 weights": lambda: engine("float32", args.runs, prompts, chat, args.decode_tokens, "bf16"),
        "engine int8 weights": lambda: engine("float32", args.runs, prompts, chat, args.decode_tokens, "int8"),
        "engine int4 weights": lambda: engine("float32", args.runs, prompts, chat, args.decode_tokens, "int4"),
        "engine gguf (Q4_1 kept)": lambda: engine("float32", args.runs, prompts, chat, args.decode_tokens, "gguf"),
        "engine fp32, int8 KV": lambda: engine("float32", args.runs, prompts, chat, args.decode_tokens, "none", "int8"),
        "engine gguf, int8 KV": lambda: engine("float32", args.runs, prompts, chat, args.decode_tokens, "gguf", "int8"),
        "HF transformers fp32": lambda: hf(args.runs, prompts, chat, args.decode_tokens),
        "llama.cpp Q4_1 (file)": lambda: llama_cpp(args.runs, prompts, chat, args.decode_tokens, args.threads),
        "llama.cpp F16 (copy)": lambda: llama_cpp(args.runs, prompts, chat, args.decode_tokens, args.threads, f16_copy()),
    }
    print(f"{'':27}" + "".join(f"{f'TTFT ms {len(p)}':>14}" for p in prompts) + f"{'decode tok/s':>14}   load (1/5/15 min)")
    for name, measure in rows.items():
        if args.only and name not in args.only:
            continue
        if name.startswith("llama.cpp") and importlib.util.find_spec("llama_cpp") is None:
            print(f"{name:27}  skipped: llama-cpp-python is not installed (pip install llama-cpp-python: a source build)")
            continue
        before = load()
        ttft, rate = measure()
        print(f"{name:27}" + "".join(f"{t * 1000:>14.0f}" for t in ttft) + f"{rate:>14.1f}   {before} -> {load()}", flush=True)


if __name__ == "__main__":
    main()
