"""`slipstream serve --workers N`: N processes on one port sharing Redis, or a refusal without it."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import anthropic

from gateway.testing import free_port
from tests.gateway.test_cli import ROOT, _command, _wait
from tests.helpers import write_policy


def test_workers_refuse_to_split_state_silently(tmp_path):
    write_policy(tmp_path, "t", "sk-t", "http://127.0.0.1:9")
    env = {k: v for k, v in os.environ.items() if k != "SLIPSTREAM_STATE_URL"}
    done = subprocess.run([*_command(), "serve", "--policy-dir", str(tmp_path), "--workers", "2"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--state-url" in done.stderr and "--local-state" in done.stderr


def test_two_workers_share_one_limit(tmp_path, fresh_emulator, redis_url):
    write_policy(tmp_path, "t", "sk-t", fresh_emulator.url, extra="limits: {requests_per_minute: 5}\n")
    port = free_port()
    process = subprocess.Popen([*_command(), "serve", "--policy-dir", str(tmp_path), "--port", str(port), "--workers", "2",
                                "--state-url", redis_url], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait(f"http://127.0.0.1:{port}/healthz", process)
        outcomes = []
        started = time.monotonic()
        for _ in range(12):  # a fresh connection each time: the kernel spreads them over the workers
            client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="sk-t", max_retries=0)
            try:
                client.messages.create(model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
                outcomes.append(True)
            except anthropic.RateLimitError:
                outcomes.append(False)
            finally:
                client.close()
        # The bucket refills one request every 12 s: on a loaded machine the twelve calls may outlast
        # that, and each refill is one more the limit rightly lets through.
        refilled = int((time.monotonic() - started) * 5 / 60)
        assert 5 <= sum(outcomes) <= 5 + refilled, (outcomes, refilled)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
