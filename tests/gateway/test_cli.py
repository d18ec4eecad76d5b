"""The console commands as a user runs them: `slipstream serve` and `slipstream emulate` start and answer."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from gateway.testing import free_port
from tests.helpers import requires_extra

ROOT = Path(__file__).resolve().parents[2]


def _command() -> list[str]:
    script = shutil.which("slipstream", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "gateway.cli"]


def _wait(url: str, process: subprocess.Popen, timeout_s: float = 60) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read().decode() if process.stderr else "exited"
        try:
            return httpx.get(url, timeout=1)
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"{url} never answered")


@contextmanager
def serving(policies: Path, *options: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`slipstream serve --policy-dir POLICIES OPTIONS` on a free port until the block ends; yields its URL."""
    port = free_port()
    process = subprocess.Popen([*_command(), "serve", "--policy-dir", str(policies), "--port", str(port), *options],
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, **(env or {})})
    try:
        _wait(f"http://127.0.0.1:{port}/healthz", process)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


@pytest.fixture
def run():
    processes: list[subprocess.Popen] = []

    def start(*args: str) -> subprocess.Popen:
        process = subprocess.Popen([*_command(), *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        processes.append(process)
        return process

    yield start
    for process in processes:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


@requires_extra("engine")  # policies/ holds the default team, served by the local engine
def test_serve_with_no_policy_arguments_uses_policies_dir(run):
    port = free_port()
    process = run("serve", "--port", str(port))
    health = _wait(f"http://127.0.0.1:{port}/healthz", process)
    assert health.json() == {"status": "ok"}  # liveness only: team names are nobody's business here
    models = httpx.get(f"http://127.0.0.1:{port}/v1/models", headers={"authorization": "Bearer sk-slipstream-local"})
    assert models.status_code == 200  # the bundled default team's key is served


def test_emulate_then_serve_against_it(run, tmp_path):
    from tests.helpers import write_policy

    emulator_port, proxy_port = free_port(), free_port()
    emulator = run("emulate", "--port", str(emulator_port))
    _wait(f"http://127.0.0.1:{emulator_port}/_emulator/stats", emulator)
    policy = write_policy(tmp_path, "cli", "sk-cli", f"http://127.0.0.1:{emulator_port}")
    proxy = run("serve", "--policy", str(policy), "--port", str(proxy_port))
    _wait(f"http://127.0.0.1:{proxy_port}/healthz", proxy)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{proxy_port}/v1", api_key="sk-cli", max_retries=0)
    assert client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}]).choices


def test_serve_refuses_an_invalid_policy(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("team: x\nproviders: {}\nroutes: []\n")
    result = subprocess.run([*_command(), "serve", "--policy", str(bad)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "bad.yaml: providers:" in result.stderr



def test_serve_refuses_a_body_budget_that_is_not_positive(tmp_path):
    result = subprocess.run([*_command(), "serve", "--max-body-bytes-in-flight", "0"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert "--max-body-bytes-in-flight must be a positive number of bytes, not 0" in result.stderr

@requires_extra("engine")  # the default policy's local model
@pytest.mark.timeout(900)  # a real model's first load converts its GGUF file: minutes on a loaded 2-core machine
def test_serve_with_no_provider_keys_answers_from_smollm2(run):
    """The quickstart: no provider key, `slipstream serve`; the default policy's local model is loaded
    before /readyz says ready, answers through both doors and stops on its own (end of turn); a name
    no route matches is a 404, a hosted model without its key a 502 that names the key."""
    port = free_port()
    env_keys = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")
    saved = {k: os.environ.pop(k) for k in env_keys if k in os.environ}
    try:
        process = run("serve", "--port", str(port))
    finally:
        os.environ.update(saved)
    _wait(f"http://127.0.0.1:{port}/healthz", process)
    ready = _wait_ready(f"http://127.0.0.1:{port}/readyz", process)
    assert ready["parts"]["local engine 'smollm2-135m-instruct'"]["state"] == "ready"
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-slipstream-local", max_retries=0, timeout=120)
    assert {"smollm2-135m-instruct", "all-minilm-l6-v2"} <= {m.id for m in client.models.list().data}
    question = [{"role": "user", "content": "What is the capital of France?"}]
    raw = client.chat.completions.with_raw_response.create(model="smollm2-135m-instruct", messages=question,
                                                           max_tokens=48, temperature=0)
    assert raw.headers["x-slipstream-route"] == "local/smollm2-135m-instruct"
    completion = raw.parse()
    assert completion.choices[0].finish_reason == "stop" and "Paris" in (completion.choices[0].message.content or "")
    message = anthropic_client(port).messages.create(model="smollm2-135m-instruct", max_tokens=48, messages=question,
                                                     extra_body={"temperature": 0})
    assert message.stop_reason == "end_turn" and "Paris" in message.content[0].text
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=question, max_tokens=4)
    with pytest.raises(openai.APIStatusError) as hosted:
        client.chat.completions.create(model="gpt-9-ultra", messages=question, max_tokens=4)
    assert hosted.value.status_code == 502 and "OPENAI_API_KEY" in hosted.value.message


def _wait_ready(url: str, process: subprocess.Popen, timeout_s: float = 600) -> dict:
    """/readyz's body once it answers 200; before that every answer must be a 503 saying what loads."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=30) as client:
        while time.monotonic() < deadline:
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else "exited"
            res = client.get(url)
            if res.status_code == 200:
                return res.json()
            assert res.status_code == 503 and res.json()["status"] == "loading", res.text
            time.sleep(0.2)
    raise AssertionError(f"{url} never said ready")


def anthropic_client(port: int):
    import anthropic

    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="sk-slipstream-local", max_retries=0, timeout=120)


@requires_extra("engine")
def test_engine_serve_offers_every_weight_format_the_engine_takes():
    """The CLI lists the formats itself (importing the engine's config would load torch for every
    command), so this keeps the two lists equal."""
    from gateway.cli import build_parser
    from localengine.config import QUANTIZATIONS

    args = build_parser().parse_args(["engine", "serve", "--model", "demo"])
    assert args.quantization is None
    for name in QUANTIZATIONS:
        assert build_parser().parse_args(["engine", "serve", "--model", "demo", "--quantization", name]).quantization == name
    with pytest.raises(SystemExit):
        build_parser().parse_args(["engine", "serve", "--model", "demo", "--quantization", "int3"])
