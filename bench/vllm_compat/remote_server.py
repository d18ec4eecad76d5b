"""Stands in for vLLM's `tests/utils.py` in the run directory (imported there as `tests.utils`):
a `RemoteOpenAIServer` with vLLM's constructor and client helpers that starts `slipstream engine serve`
instead of `vllm serve`.

The model vLLM's test names (e.g. `HuggingFaceH4/zephyr-7b-beta`) becomes the served model name, so
the tests send it unchanged; the weights are `$VLLM_COMPAT_MODEL` (default `smollm2-135m-instruct`).
vLLM's serve arguments that `engine serve` has are passed on; the others are printed and dropped.
`$VLLM_COMPAT_MAX_NEW_TOKENS` (when set) caps a chat request that names no max_tokens, with vLLM's
`--override-generation-config '{"max_new_tokens": N}'`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

import httpx
import openai

# vLLM's flag -> whether it takes a value; only those `slipstream engine serve` also has.
PASSED_ON = {"--max-model-len": True, "--max-num-seqs": True, "--enforce-eager": False,
             "--no-enable-prefix-caching": False, "--enable-prefix-caching": False}


def engine_args(vllm_serve_args: list[str]) -> tuple[list[str], list[str]]:
    """(the arguments `engine serve` gets, the ones it does not have). A token after a flag that is
    not itself a flag is that flag's value, unless the flag is known to take none."""
    kept: list[str] = []
    dropped: list[str] = []
    i = 0
    while i < len(vllm_serve_args):
        arg = vllm_serve_args[i]
        name = arg.split("=", 1)[0]
        group = [arg]
        nxt = vllm_serve_args[i + 1] if i + 1 < len(vllm_serve_args) else None
        if "=" not in arg and nxt is not None and not nxt.startswith("-") and PASSED_ON.get(name, True):
            group.append(nxt)
            i += 1
        (kept if name in PASSED_ON else dropped).extend(group)
        i += 1
    return kept, dropped


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RemoteOpenAIServer:
    DUMMY_API_KEY = "token-abc123"

    def __init__(self, model: str, vllm_serve_args: list[str], *, env_dict: dict[str, str] | None = None,
                 seed: int = 0, auto_port: bool = True, max_wait_seconds: float | None = None,
                 **_: Any) -> None:
        self.host, self.port = "127.0.0.1", _free_port()
        kept, dropped = engine_args(vllm_serve_args)
        if dropped:
            print(f"vllm_compat: not passed to engine serve: {' '.join(dropped)}", flush=True)
        exe = shutil.which("slipstream", path=os.path.dirname(sys.executable)) or "slipstream"
        cmd = [exe, "engine", "serve", "--model", os.environ.get("VLLM_COMPAT_MODEL", "smollm2-135m-instruct"),
               "--served-model-name", model, "--host", self.host, "--port", str(self.port), *kept]
        cap = int(os.environ.get("VLLM_COMPAT_MAX_NEW_TOKENS", "0"))
        if cap:  # a chat request that names no max_tokens would run to the context (minutes on a CPU)
            cmd += ["--override-generation-config", json.dumps({"max_new_tokens": cap})]
        print(f"vllm_compat: {' '.join(cmd)}", flush=True)
        env = {**os.environ, **(env_dict or {})}
        self.proc = subprocess.Popen(cmd, env=env, stdout=sys.stdout, stderr=sys.stderr)
        self._wait(max_wait_seconds or 600)

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine serve exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url_for("health"), timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        self.proc.terminate()
        raise RuntimeError("engine serve did not start in time")

    def __enter__(self) -> RemoteOpenAIServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    @property
    def url_root(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url_for(self, *parts: str) -> str:
        return self.url_root + "/" + "/".join(p.strip("/") for p in parts if p)

    def get_client(self, **kwargs: Any) -> openai.OpenAI:
        kwargs.setdefault("timeout", 600)
        return openai.OpenAI(base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0, **kwargs)

    def get_async_client(self, **kwargs: Any) -> openai.AsyncOpenAI:
        kwargs.setdefault("timeout", 600)
        return openai.AsyncOpenAI(base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0, **kwargs)
