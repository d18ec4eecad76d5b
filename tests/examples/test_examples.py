"""Every example in examples/ runs offline and prints what it promises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from gateway.testing import running_proxy
from tests.helpers import requires_extra, skip_without_test_package, write_policy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str, env: dict[str, str] | None = None, timeout_s: float = 120) -> str:
    command = ["bash", str(EXAMPLES / name)] if name.endswith(".sh") else [sys.executable, str(EXAMPLES / name)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **(env or {})}, cwd=EXAMPLES.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Unclosed" not in result.stderr, result.stderr
    return result.stdout


def test_sdk_dropin():
    out = run_example("sdk_dropin.py")
    for line in ("openai:", "anthropic:", "stream:", "async openai:", "async anthropic:"):
        assert line in out
    assert out.count("stream:") == 3  # broke out after the third piece


def test_proxy_with_official_clients():
    out = run_example("proxy_clients.py")
    assert "answered by gpt/gpt-4o" in out
    assert "wrong key -> 401" in out


def test_proxy_curl_session(tmp_path, emulator):
    write_policy(tmp_path, "curl", "sk-curl", emulator.url)
    with running_proxy([tmp_path]) as proxy:
        out = run_example("proxy_curl.sh", env={"SLIPSTREAM_PROXY_URL": proxy.url, "SLIPSTREAM_TEAM_KEY": "sk-curl"})
    _assert_curl_session(out)


def test_proxy_curl_session_with_other_models_and_an_error(tmp_path, emulator):
    """The models come from SLIPSTREAM_OPENAI_MODEL / SLIPSTREAM_ANTHROPIC_MODEL (the README's default
    proxy without provider keys answers only its local model), and an error answer is shown, not a
    silent stop half-way (grep found no `event:` line and `set -o pipefail` ended the script)."""
    write_policy(tmp_path, "curl", "sk-curl", emulator.url)
    with running_proxy([tmp_path]) as proxy:
        out = run_example("proxy_curl.sh", env={"SLIPSTREAM_PROXY_URL": proxy.url, "SLIPSTREAM_TEAM_KEY": "sk-curl",
                                                "SLIPSTREAM_OPENAI_MODEL": "gpt-5-mini", "SLIPSTREAM_ANTHROPIC_MODEL": "nope-9"})
    assert "x-slipstream-route: gpt/gpt-5-mini" in out
    assert "no route for model 'nope-9'" in out
    assert "# a bad request gets a provider-shaped error" in out and "not valid JSON" in out


def _assert_curl_session(out: str) -> None:
    assert '"status":"ready"' in out
    assert "x-slipstream-route: gpt/gpt-4o" in out
    assert "event: message_stop" in out
    assert "invalid_request_error" in out


def test_proxy_curl_starts_what_it_needs():
    """With no proxy URL given, the script starts the emulator and a proxy itself, and stops them."""
    bin_dir = os.path.dirname(sys.executable)  # where `slipstream` is installed next to this Python
    _assert_curl_session(run_example("proxy_curl.sh", env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}))


def test_sdk_inside_agent_frameworks():
    for framework in ("langchain_openai", "pydantic_ai", "agents"):
        skip_without_test_package(framework)
    out = run_example("sdk_frameworks.py")
    for name in ("langchain:", "pydantic-ai:", "openai-agents:"):
        line = next(line for line in out.splitlines() if line.startswith(name))
        assert len(line) > len(name) + 5  # a non-empty answer from the emulator, through the pipeline


def test_streaming_cancel():
    out = run_example("streaming_cancel.py")
    assert "upstream cancelled: 1" in out


def test_prompt_caching_agent_loop():
    out = run_example("prompt_caching.py")
    assert "turn 5: read=" in out and "moved=2" in out
    rate = int(out.split("cache hit rate: ")[1].split("%")[0])
    assert rate >= 70


@requires_extra("semantic")
def test_semantic_cache_and_compression(tmp_path):
    out = run_example("cache_and_compression.py", env={"SLIPSTREAM_DATA_DIR": str(tmp_path)})
    assert [line.split()[0] for line in out.splitlines()[1:5]] == ["miss", "exact-hit", "semantic-hit", "miss"]
    before, after = (int(part.split("=")[1]) for part in out.split("compression: ")[1].split()[0].split(";")[:2])
    assert after < before / 2


def test_routing_fallback_survives_faults():
    out = run_example("routing_fallback.py")
    assert out.count("answered by gpt/gpt-5-mini") == 4
    assert "none -> answered by claude/claude-sonnet-5" in out


@requires_extra("engine")
def test_local_engine_generate_server_and_speculation():
    out = run_example("local_engine.py", timeout_s=540)  # ~50 s quiet; 4-5x that beside a CPU hog
    assert "'def fibonacci(n):' ->" in out and "server:" in out
    methods = ("ngram", "draft_model", "mlp_speculator")
    for method in ("no speculation", *methods):
        assert f"{method}:" in out
    assert out.count("same text as without: True") == len(methods) + 1  # the baseline's line too


def test_examples_on_an_emulator_you_started():
    """SLIPSTREAM_EMULATOR_URL: the example's settings reach that emulator for its duration (with the
    emulator's fast defaults the stream ended before the client broke out, and streaming_cancel waited
    for a cancellation forever), its own come back after, and counters are the example's alone."""
    from emulator.app import EmulatorConfig
    from emulator.testing import running_emulator

    with running_emulator(EmulatorConfig()) as emulator:
        env = {"SLIPSTREAM_EMULATOR_URL": emulator.url}
        run_example("routing_fallback.py", env=env)  # earlier traffic, counted by the emulator
        out = run_example("streaming_cancel.py", env=env, timeout_s=60)
        assert "upstream cancelled: 1 " in out and "upstream completed: 0" in out
        assert "upstream attempts: 9, faults injected: 4" in run_example("routing_fallback.py", env=env)
        current = httpx.get(f"{emulator.url}/_emulator/config").json()
        assert (current["per_output_token_ms"], current["default_output_tokens"]) == (0.0, EmulatorConfig().default_output_tokens)
