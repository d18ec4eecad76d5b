"""Concurrent streams through an OpenAI-compatible server: `slipstream engine serve` against
llama-cpp-python's server on the same file (smollm2-135m-instruct's Q4_1 GGUF), the same threads.

N chat requests (--streams, 8) start together, each streaming up to --max-tokens (128) greedy tokens
for its own question; measured per server: time to first token (p50, max), output tokens a second
over the whole burst (tokens counted as content chunks, one token each on both servers), and the
wall time. One server runs at a time, after a warm-up request. llama-cpp-python's server decodes one
request at a time (run with `--interrupt_requests False`: by default each new request cuts the stream
being served short); the engine batches them (continuous batching).

llama-cpp-python's server needs its `[server]` extra (fastapi, pydantic-settings, ...), which the
repository does not install: give the Python that has it with --llama-python (default:
$LLAMA_SERVER_PYTHON, else this one); without it the row is skipped and says so.

    python bench/localengine/serve_streams.py --threads 2 [--streams 8] [--max-tokens 128]
                                              [--quantization none gguf] [--max-num-batched-tokens 2048 256]
                                              [--llama-python /path/to/venv/bin/python]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.localengine.llama_cpp_amx import cpu_has_amx  # noqa: E402  (after the path: the script runs from a checkout)
from gateway.testing import free_port  # noqa: E402

MODEL = "smollm2-135m-instruct"
QUESTIONS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle stays upright.",
    "Describe a walk through a forest in autumn.",
    "Write a letter to a friend about a trip to the sea.",
    "Explain why the sky is blue to a child.",
    "Describe how bread is made, step by step.",
    "Write a short poem about the moon and the tides.",
    "Tell a story about a cat who learns to swim.",
    "Explain what a library is for.",
    "Describe a busy market in the morning.",
    "Write a short story about a robot who paints.",
    "Explain how rain forms.",
]


@dataclass(frozen=True, slots=True)
class Burst:
    ttfts: list[float]
    tokens: int
    seconds: float


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def wait_ready(process: subprocess.Popen[bytes], url: str, timeout_s: float = 300) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode} before it was ready ({url})")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"the server was not ready within {timeout_s:.0f} s ({url})")


async def one_stream(session: aiohttp.ClientSession, url: str, model: str, question: str, max_tokens: int) -> tuple[float, int]:
    body = {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    start = time.perf_counter()
    first, tokens = None, 0
    async with session.post(url, json=body) as response:
        response.raise_for_status()
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if any(choice.get("delta", {}).get("content") for choice in chunk.get("choices", [])):
                tokens += 1
                if first is None:
                    first = time.perf_counter() - start
    if first is None:
        raise SystemExit(f"no content streamed for {question!r}")
    return first, tokens


async def burst(port: int, model: str, streams: int, max_tokens: int) -> Burst:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await one_stream(session, url, model, "Say hello.", 8)  # warm-up
        start = time.perf_counter()
        results = await asyncio.gather(*(one_stream(session, url, model, QUESTIONS[i % len(QUESTIONS)], max_tokens)
                                         for i in range(streams)))
        seconds = time.perf_counter() - start
    return Burst([ttft for ttft, _ in results], sum(tokens for _, tokens in results), seconds)


def serve(command: list[str], health: str, port: int) -> tuple[subprocess.Popen[bytes], Path]:
    log = Path(tempfile.mkstemp(prefix="serve-streams-", suffix=".log")[1])
    with log.open("wb") as sink:  # a file, not a pipe nobody reads: a chatty server must not block on it
        process = subprocess.Popen(command, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        wait_ready(process, f"http://127.0.0.1:{port}{health}")
    except SystemExit:
        process.terminate()
        print(log.read_text()[-2000:], file=sys.stderr)
        raise
    return process, log


def measure(name: str, command: list[str], health: str, port: int, model: str, args: argparse.Namespace) -> Burst:
    before = load()
    process, log = serve(command, health, port)
    try:
        result = asyncio.run(burst(port, model, args.streams, args.max_tokens))
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.unlink(missing_ok=True)
    ttft = sorted(result.ttfts)
    print(f"{name:34}{statistics.median(ttft):>10.2f}{ttft[-1]:>10.2f}{result.tokens:>8}{result.seconds:>9.1f}"
          f"{result.tokens / result.seconds:>10.1f}   {before} -> {load()}", flush=True)
    return result


def has_llama_server(python: str) -> bool:
    try:
        probe = subprocess.run([python, "-c", "import llama_cpp.server.app"], capture_output=True, check=False)
    except OSError:  # no such Python: the row is skipped, as for one without the server
        return False
    return probe.returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--llama-python", default=os.environ.get("LLAMA_SERVER_PYTHON", sys.executable),
                        help="a Python with llama-cpp-python[server] (default: $LLAMA_SERVER_PYTHON, else this one)")
    parser.add_argument("--quantization", nargs="*", default=["none", "gguf"], help="engine rows (--quantization values)")
    parser.add_argument("--max-num-batched-tokens", nargs="*", type=int, default=[],
                        help="engine rows per token budget of a step (default: the server's own)")
    args = parser.parse_args()
    from localengine.config import packaged_model_path

    path = packaged_model_path(MODEL)
    print(f"{MODEL} ({path.name}), {args.streams} concurrent streams of up to {args.max_tokens} tokens, "
          f"{args.threads} threads, one server at a time")
    print(f"{'server':34}{'TTFT p50':>10}{'max s':>10}{'tokens':>8}{'wall s':>9}{'tok/s':>10}   load (1/5/15 min)")
    rows: dict[str, Burst] = {}
    for quantization in args.quantization:
        for budget in args.max_num_batched_tokens or [None]:
            port = free_port()
            command = [sys.executable, "-m", "gateway.cli", "engine", "serve", "--model", MODEL, "--port", str(port),
                       "--threads", str(args.threads), "--quantization", quantization]
            name = f"engine serve ({quantization})"
            if budget is not None:
                command += ["--max-num-batched-tokens", str(budget)]
                name = f"engine serve ({quantization}, {budget}/step)"
            rows[name] = measure(name, command, "/health", port, MODEL, args)
    if has_llama_server(args.llama_python):
        port = free_port()
        command = [args.llama_python, "-m", "llama_cpp.server", "--model", str(path), "--n_threads", str(args.threads),
                   "--n_ctx", "2048", "--port", str(port), "--host", "127.0.0.1",
                   "--interrupt_requests", "False"]  # by default a new request cuts the stream being served
        if cpu_has_amx():  # through the launcher that turns llama.cpp's extra buffer types off: they crash here
            command[1:1] = [str(Path(__file__).with_name("llama_cpp_amx.py"))]
            print("llama-cpp-python server: llama.cpp's extra buffer types off (they crash on this AMX CPU: "
                  "bench/localengine/llama_cpp_amx.py)", flush=True)
        rows["llama-cpp-python server"] = measure("llama-cpp-python server", command, "/v1/models", port, MODEL, args)
    else:
        print(f"{'llama-cpp-python server':34}  skipped: {args.llama_python} has no llama_cpp.server "
              "(pip install 'llama-cpp-python[server]', a source build; --llama-python names another Python)")
    baseline = rows.get("llama-cpp-python server")
    if baseline is not None:
        for name, row in rows.items():
            if name != "llama-cpp-python server":
                ratio = (row.tokens / row.seconds) / (baseline.tokens / baseline.seconds)
                print(f"{name}: {ratio:.2f}x llama-cpp-python's tokens/s, TTFT p50 {statistics.median(row.ttfts):.2f} s "
                      f"against {statistics.median(baseline.ttfts):.2f} s")


if __name__ == "__main__":
    main()
