"""Run ASGI apps on loopback in a background thread: for tests, examples and users' own CI."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass
class RunningServer:
    url: str
    server: uvicorn.Server
    app: Any


@contextlib.contextmanager
def serve_in_thread(app: Any, host: str = "127.0.0.1", startup_timeout_s: float = 10.0) -> Iterator[RunningServer]:
    """Serve `app` with uvicorn (uvloop + httptools) on a free loopback port until the block exits."""
    port = free_port(host)
    config = uvicorn.Config(app, host=host, port=port, loop="uvloop", http="httptools", log_level="warning", access_log=False, lifespan="auto")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn:{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"server on port {port} did not start")
        time.sleep(0.01)
    try:
        yield RunningServer(url=f"http://{host}:{port}", server=server, app=app)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextlib.contextmanager
def running_proxy(policy_paths: list[str | Path], *, watch_interval_s: float | None = 0.2) -> Iterator[RunningServer]:
    """The Slipstream proxy for the given policies, on a free loopback port."""
    from gateway.app import create_app

    with serve_in_thread(create_app(policy_paths, watch_interval_s=watch_interval_s)) as running:
        yield running
