"""The bundled local engine: offline generation, the OpenAI-compatible server, speculative decoding.

    python examples/local_engine.py

`demo` is a tiny model trained on the Python standard library's sources: it writes Python-ish
text, fast, on a CPU. Point `LLM(...)` at a local Hugging Face directory for a real model.
"""

from __future__ import annotations

import statistics
import time

import openai

from gateway.testing import serve_in_thread
from localengine import LLM, AsyncLLMEngine, SamplingParams
from localengine.server import create_app

PROMPTS = ["def fibonacci(n):", "class Stack:", "import os\n\ndef main():"]


def offline() -> None:
    llm = LLM("demo")
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24))
    for output in outputs:
        print(f"{output.prompt!r} -> {output.outputs[0].text!r} ({output.outputs[0].finish_reason})")


def server() -> None:
    engine = AsyncLLMEngine.from_args("demo")
    try:
        with serve_in_thread(create_app(engine, "demo")) as running:
            client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="local")
            reply = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "def add(a, b):"}], max_tokens=16)
            print("server:", repr(reply.choices[0].message.content), reply.usage.completion_tokens, "tokens")
    finally:
        engine.shutdown()


def speculative() -> None:
    """Greedy output is identical with and without speculation; only the speed changes."""
    params = SamplingParams(temperature=0, max_tokens=96, ignore_eos=True)
    prompt = ["for i in range(10):\n    print(i)\nfor i in range(10):\n    print(i)\n"]
    baseline = None
    configs = (
        None,
        {"method": "ngram", "num_speculative_tokens": 4},
        {"method": "draft_model", "model": "demo-draft", "num_speculative_tokens": 4},
        {"method": "mlp_speculator", "model": "demo-speculator", "num_speculative_tokens": 4},
    )
    for config in configs:
        llm = LLM("demo", speculative_config=config)
        llm.generate(prompt, SamplingParams(temperature=0, max_tokens=8))  # first-call set-up, not timed
        times = []
        for _ in range(3):  # a run takes a tenth of a second: the median of three
            started = time.perf_counter()
            text = llm.generate(prompt, params)[0].outputs[0].text
            times.append(time.perf_counter() - started)
        elapsed = statistics.median(times)
        baseline = text if baseline is None else baseline
        stats = llm.spec_decode_stats()
        accepted = f"acceptance {stats.acceptance_rate:.0%}, mean acceptance length {stats.mean_acceptance_length:.2f}" if stats else "-"
        name = config["method"] if config else "no speculation"
        print(f"{name:>15}: {96 / elapsed:6.1f} tok/s, {accepted}, same text as without: {text == baseline}")


if __name__ == "__main__":
    offline()
    server()
    speculative()
