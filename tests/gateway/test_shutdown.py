"""`slipstream serve` on SIGTERM: requests in flight go on until `--shutdown-timeout`, then they are
ended (the upstream call cancelled) and what they used is charged before the process exits. uvicorn
cancels them and goes on to the app's shutdown without waiting, so the accounting a cut stream runs
on its way out reached a state backend already closed: the spend was lost (gateway/app.py:_lifespan).
Without the option, as before, the process waits for them as long as they take."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import httpx

from emulator.app import EmulatorConfig
from emulator.testing import running_emulator
from gateway.testing import free_port
from sdk.state.spend_file import SpendFile
from tests.gateway.test_cli import ROOT, _command, _wait
from tests.helpers import write_policy


def test_a_stream_cut_at_shutdown_is_charged_before_the_process_exits(tmp_path):
    policies, data = tmp_path / "policies", tmp_path / "data"
    policies.mkdir()
    # a stream of 1,500 tokens paced 20 ms apart: it outlasts the one second the shutdown gives it
    with running_emulator(EmulatorConfig(per_output_token_ms=20.0, default_output_tokens=1500)) as upstream:
        write_policy(policies, "t", "sk-t", upstream.url, extra='pricing: {"gpt-*": {input: 1000, output: 1000}}\n')
        port = free_port()
        process = subprocess.Popen([*_command(), "serve", "--policy-dir", str(policies), "--port", str(port), "--shutdown-timeout", "1"],
                                   cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   env={**os.environ, "SLIPSTREAM_DATA_DIR": str(data), "SLIPSTREAM_STATE_URL": ""})
        try:
            _wait(f"http://127.0.0.1:{port}/healthz", process)
            lines: list[str] = []
            streaming = threading.Event()

            def read() -> None:
                ask = {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
                try:
                    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=ask, timeout=120,
                                      headers={"authorization": "Bearer sk-t"}) as answer:
                        for line in answer.iter_lines():
                            lines.append(line)
                            if len(lines) == 10:
                                streaming.set()
                except httpx.HTTPError:
                    pass  # cut by the shutdown
                streaming.set()

            reader = threading.Thread(target=read)
            reader.start()
            assert streaming.wait(timeout=60) and len(lines) >= 10
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=120)
            reader.join(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        assert "data: [DONE]" not in lines  # the stream was ended, not run to its end
        assert upstream.stats()["cancelled_streams"] == 1 and upstream.stats()["completed_streams"] == 0
    spend = SpendFile(data / "spend.sqlite3")
    month = [fields for key, (_, fields) in spend.load(time.time()).items() if ":month:" in key]
    spend.close()
    assert len(month) == 1 and month[0]["total"] > 0 and month[0]["estimated"] == month[0]["total"]
