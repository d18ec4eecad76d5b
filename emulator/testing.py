"""Test helper: run the emulator under uvicorn in a background thread on a free loopback port.

    from emulator.testing import running_emulator

    with running_emulator() as emu:
        client = anthropic.Anthropic(base_url=emu.url, api_key="k")
        ...
        emu.wait_for(lambda s: s["cancelled_streams"] == 1)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from gateway.testing import serve_in_thread

from .app import Emulator, EmulatorConfig, EmulatorState, create_app


@dataclass
class RunningEmulator:
    """Handle to a served emulator. `url` suits the anthropic client; `openai_url` adds /v1."""

    url: str
    app: Emulator

    @property
    def openai_url(self) -> str:
        return self.url + "/v1"

    @property
    def state(self) -> EmulatorState:
        return self.app.state

    @property
    def config(self) -> EmulatorConfig:
        return self.app.config

    def stats(self) -> dict[str, Any]:
        """Same shape as GET /_emulator/stats (counters only)."""
        return self.app.stats.snapshot()

    def reset(self) -> None:
        self.app.reset()

    def inject_fault(self, fault: str, count: int = 1, model: str | None = None,
                     path: str | None = None) -> None:
        """Queue `fault` for the next `count` matching requests (as POST /_emulator/faults)."""
        self.app.state.faults.add({"fault": fault, "count": count,
                                   "match": {"model": model, "path": path}})

    def advance_clock(self, seconds: float) -> None:
        """Move the emulator's cache clock forward (TTL expiry tests)."""
        self.app.state.clock_offset += seconds

    def wait_for(self, pred: Callable[[dict[str, Any]], bool], timeout: float = 30.0) -> dict[str, Any]:
        """Poll stats until `pred(stats)` holds; returns the stats or raises AssertionError. The wait
        ends at the event: the timeout only turns a hang into a failure, far above a loaded machine's delays."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.stats()
            if pred(s):
                return s
            if time.monotonic() > deadline:
                raise AssertionError(f"emulator stats never satisfied the condition: {s}")
            time.sleep(0.005)


@contextmanager
def running_emulator(config: EmulatorConfig | None = None, host: str = "127.0.0.1",
                     port: int = 0, startup_timeout: float = 10.0) -> Iterator[RunningEmulator]:
    """Serve a fresh emulator on `host:port` (0 = free port) for the duration of the block."""
    app = create_app(config)
    with serve_in_thread(app, host, port, lifespan="off", startup_timeout_s=startup_timeout) as running:
        yield RunningEmulator(running.url, app)
