"""Startup costs a new user meets: import time of the drop-in SDK, and the proxy's time to ready.

    .venv/bin/python bench/startup.py [--runs 7] [--policy policies/default.yaml]

1. Import time, each in a fresh interpreter, best of --runs (the machine is shared: the minimum is
   the closest to a quiet machine): `import openai` alone (the baseline every OpenAI user pays),
   `from sdk import OpenAI`, and `from sdk import OpenAI` plus building a client for the policy.
   Also checks that no heavy module (torch, faiss, sentence_transformers, transformers) was imported.
2. Time to ready: `slipstream serve --policy POLICY` from process start until `GET /readyz` is 200,
   the parts the proxy reported, then the first request after ready against the median of the next
   five (different prompts of similar length, so no prefix-cache hits), to --model (default: the
   default policy's bundled smollm2-135m-instruct, served with no provider key).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "faiss", "sentence_transformers", "transformers")


def _import_seconds(code: str) -> tuple[float, list[str]]:
    script = (f"import json, sys, time\nstarted = time.perf_counter()\n{code}\nelapsed = time.perf_counter() - started\n"
              f"print(json.dumps([elapsed, [m for m in {HEAVY!r} if m in sys.modules]]))")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    seconds, heavy = json.loads(out.splitlines()[-1])
    return seconds, heavy


def import_times(runs: int, policy: str) -> None:
    cases = {
        "import openai (baseline)": "import openai",
        "from sdk import OpenAI": "from sdk import OpenAI",
        "from sdk import OpenAI; OpenAI(policy=...)": f"from sdk import OpenAI\nOpenAI(policy={policy!r})",
    }
    baseline = None
    for name, code in cases.items():
        samples = [_import_seconds(code) for _ in range(runs)]
        best = min(seconds for seconds, _ in samples)
        heavy = sorted({m for _, found in samples for m in found})
        baseline = baseline or best
        print(f"{name:<45} best {best * 1000:7.0f} ms  median {sorted(s for s, _ in samples)[runs // 2] * 1000:7.0f} ms"
              f"  x{best / baseline:.2f} of baseline  heavy modules: {', '.join(heavy) or 'none'}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]  # an AF_INET address: (host, port)
        return port


def _get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _ask(url: str, key: str, model: str, prompt: str) -> tuple[float, float]:
    """Seconds for one chat completion, and the proxy's own share (x-slipstream-overhead-ms)."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 16}).encode()
    request = urllib.request.Request(f"{url}/v1/chat/completions", data=body,
                                     headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()
        return time.perf_counter() - started, float(response.headers["x-slipstream-overhead-ms"]) / 1000


# Different prompts of similar length: a repeated prompt would be served from the engine's prefix cache.
PROMPTS = ["def fib(n):", "def add(a, b):", "class Stack:", "import os\nimport sys", "def main():", "for i in range(3):"]


def time_to_ready(policy: str, key: str, model: str) -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")}
    started = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--policy", policy, "--port", str(port)],
                              cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        alive = None
        while True:
            try:
                status, body = _get(f"{url}/readyz")
            except OSError:
                time.sleep(0.05)
                continue
            alive = alive or time.perf_counter() - started
            if status == 200:
                break
            time.sleep(0.05)
        ready = time.perf_counter() - started
        parts = ", ".join(f"{name} {part['seconds']:.1f} s" for name, part in body["parts"].items()) or "nothing to load"
        print(f"serve {policy}: answering after {alive:.1f} s, ready after {ready:.1f} s ({parts})")
        (first, first_own), *rest = [_ask(url, key, model, prompt) for prompt in PROMPTS]
        later = sorted(seconds for seconds, _ in rest)[len(rest) // 2]
        later_own = sorted(own for _, own in rest)[len(rest) // 2]
        print(f"requests after ready: first {first * 1000:.0f} ms (proxy's own {first_own * 1000:.1f} ms), "
              f"median of the next {len(rest)} {later * 1000:.0f} ms (proxy's own {later_own * 1000:.1f} ms): first/later x{first / later:.2f}")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--policy", default="policies/default.yaml")
    parser.add_argument("--key", default="sk-slipstream-local", help="a team key the policy accepts")
    parser.add_argument("--model", default="smollm2-135m-instruct",
                        help="a model the policy serves without provider keys (the default policy's local engine)")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    import_times(args.runs, args.policy)
    time_to_ready(args.policy, args.key, args.model)


if __name__ == "__main__":
    main()
