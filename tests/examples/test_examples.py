"""Every example in examples/ runs offline and prints what it promises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.testing import running_proxy
from tests.helpers import write_policy

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
    assert '"status":"ok"' in out
    assert "x-slipstream-route: gpt/gpt-4o" in out
    assert "event: message_stop" in out
    assert "invalid_request_error" in out


@pytest.mark.skipif(not (EXAMPLES / "streaming_cancel.py").exists(), reason="example not written yet")
def test_streaming_cancel():
    out = run_example("streaming_cancel.py")
    assert "upstream cancelled: 1" in out
