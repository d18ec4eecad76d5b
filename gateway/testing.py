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
def serve_in_thread(
    app: Any, host: str = "127.0.0.1", port: int = 0, lifespan: str = "auto", startup_timeout_s: float = 10.0
) -> Iterator[RunningServer]:
    """Serve `app` with uvicorn (uvloop + httptools) on `host:port` (0: a free port) until the block exits.

    The socket is bound here and handed to uvicorn, so the port is ours before the server starts.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    config = uvicorn.Config(
        app, loop="uvloop", http="httptools", log_level="warning", access_log=False, lifespan=lifespan, timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn:{bound}", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server on port {bound} did not start")
            time.sleep(0.005)
        yield RunningServer(url=f"http://{host}:{bound}", server=server, app=app)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@contextlib.contextmanager
def running_proxy(policy_paths: list[str | Path], *, watch_interval_s: float | None = 0.2) -> Iterator[RunningServer]:
    """The Slipstream proxy for the given policies, on a free loopback port."""
    from gateway.app import create_app

    with serve_in_thread(create_app(policy_paths, watch_interval_s=watch_interval_s)) as running:
        yield running
